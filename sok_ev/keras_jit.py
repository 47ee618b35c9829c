"""Keras's choice of XLA for models that hold Embedding Variables.

Keras 3 compiles a model's steps with XLA when `compile(jit_compile="auto")`
runs on a machine with a GPU and every layer's `supports_jit` is true, which
a user's own layer's is by default (on a CPU-only machine "auto" never picks
XLA). sok-ev's kernels have no XLA form, so a model whose own layer calls
`sok_ev.lookup_sparse` would train on a CPU and fail on a GPU.

`install_keras_jit_guard()` makes Keras's check
(`keras.src.trainers.trainer.model_supports_jit`, which both "auto" and an
explicit `jit_compile=True` consult) also answer no when a layer holds an
Embedding Variable as an attribute, directly or in a list, tuple or dict, as
sok-ev's own layers declare with `supports_jit = False`. Keras then trains
without XLA, with its usual warning for an explicit `jit_compile=True`.

A table the check cannot see at `compile` (one created in `build`, or reached
through a closure) still stops the trace with a ValueError that names the fix
(`sok_ev._ops._refuse_xla`). tf_keras (TF_USE_LEGACY_KERAS=1) never picks XLA
by itself, so nothing is installed there.
"""
import collections.abc
import importlib

from sok_ev import keras_optimizers
from sok_ev.embedding_variable import EmbeddingVariable

_KERAS_TRAINER = "keras.src.trainers.trainer"
_original = None  # Keras's model_supports_jit while the guard is installed


def _values(attribute):
    """The objects an attribute holds: itself, or a container's items."""
    if isinstance(attribute, collections.abc.Mapping):
        return list(attribute.values())
    if isinstance(attribute, collections.abc.Sequence) and not isinstance(attribute, (str, bytes)):
        return list(attribute)
    return [attribute]


def holds_embedding_variable(layer) -> bool:
    """Whether `layer` holds an Embedding Variable as an attribute, directly or
  in a list, tuple or dict (one level)."""
    return any(
        isinstance(value, EmbeddingVariable)
        for attribute in vars(layer).values()
        for value in _values(attribute))


def install_keras_jit_guard() -> None:
    """Keras 3 refuses XLA for models with a layer holding an Embedding
  Variable (see the module docstring). Idempotent; does nothing under
  tf_keras or a Keras without that check."""
    global _original
    if _original is not None or keras_optimizers.legacy_keras():
        return
    try:
        trainer = importlib.import_module(_KERAS_TRAINER)
        original = trainer.model_supports_jit
    except (ImportError, AttributeError):
        return

    def model_supports_jit(model):
        return original(model) and not any(
            holds_embedding_variable(layer) for layer in model._flatten_layers())  # pylint: disable=protected-access

    model_supports_jit.__doc__ = original.__doc__
    trainer.model_supports_jit = model_supports_jit
    _original = original


def uninstall_keras_jit_guard() -> None:
    """Restores Keras's own check."""
    global _original
    if _original is not None:
        importlib.import_module(_KERAS_TRAINER).model_supports_jit = _original
        _original = None
