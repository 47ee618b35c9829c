"""Exports for serving: `with sok_ev.serving_export(unseen_keys=...)`.

Inside the context, a SavedModel export (`tf.saved_model.save`, or
`tf.compat.v1.saved_model.Builder.add_meta_graph_and_variables`, whose Saver
is built inside it) writes each Embedding Variable's keys and values only:
no optimizer slots, no feature-filter counts. Loading the export, in any
process that imported `sok_ev` (a TF Serving binary needs sok-ev's op
library linked in or loaded), restores the tables for serving: lookups insert
nothing and count nothing, a key the table lacks reads its initializer's value
(`unseen_keys="initializer"`) or zeros (`unseen_keys="zeros"`), and optimizers
refuse to update them. What the export holds is recorded in its checkpoint
(`checkpoint_format.h`), so the loader needs no option.
"""

import contextlib

_UNSEEN_KEYS = {"initializer": "serving", "zeros": "serving_zeros"}
_active = []


@contextlib.contextmanager
def serving_export(unseen_keys="initializer"):
    """Makes the SavedModel exports inside the context exports for serving.

  Args:
    unseen_keys: what a served lookup of a key the table lacks reads:
      "initializer" (the value training would have given the key) or
      "zeros".

  Raises:
    ValueError: unseen_keys is neither.
  """
    if unseen_keys not in _UNSEEN_KEYS:
        raise ValueError("serving_export: unseen_keys must be 'initializer' or 'zeros', got "
                         f"{unseen_keys!r}")
    _active.append(_UNSEEN_KEYS[unseen_keys])
    try:
        yield
    finally:
        _active.pop()


def save_kind(kind="full"):
    """The kind of table save to build (SokEv>SaveEmbeddingVariables' kind):
  a full save becomes an export for serving inside serving_export()."""
    if kind == "full" and _active:
        return _active[-1]
    return kind
