"""`tf.compat.v1.train.init_from_checkpoint` for Embedding Variables.

DeepRec warm-starts Embedding Variables the way it warm-starts any
variable: `init_from_checkpoint(ckpt, assignment_map)` makes each mapped
variable's initializer load it from the checkpoint. TensorFlow's own code
looks for one tensor per variable, and an Embedding Variable's table is
several (`<name>/sok_ev/...`, checkpoint_format.h), so `install_hook()`
(run by `sok_ev.init()` and `sok_ev.install_deeprec_api()`) takes the
Embedding Variables out of the assignment map, the rest going through
TensorFlow's code unchanged, and gives each the initializer that restores
its table (keys, values, slots, frequencies, versions; SokEv>Restore-
EmbeddingVariables) from the checkpoint's table of the mapped name. The
assignment map's forms are TensorFlow's: `{'ckpt_name': 'var_name'}`,
`{'ckpt_name': variable}`, and scope to scope (`{'old/': 'new/'}`,
`{'/': 'new/'}`).
"""

import tensorflow as tf
from tensorflow.python.ops import variable_scope
from tensorflow.python.training import checkpoint_utils

from sok_ev import checkpoint
from sok_ev.embedding_variable import EV_INIT_VAR_OPS, EmbeddingVariable

_original = {}


def _table_assignments(assignment_map, store):
    """Splits an assignment map: ({ckpt table name: variable} for Embedding
  Variables, [(ckpt name, var or name)] for TensorFlow's code). `store`: the
  variable store's {name: variable}."""
    pairs = assignment_map.items() if hasattr(assignment_map, "items") else assignment_map
    tables, rest = {}, []
    for in_checkpoint, current in pairs:
        if isinstance(current, EmbeddingVariable):
            tables[in_checkpoint] = current
            continue
        if isinstance(current, str) and isinstance(store.get(current), EmbeddingVariable):
            tables[in_checkpoint] = store[current]
            continue
        rest.append((in_checkpoint, current))
        if not isinstance(current, str) or current in store or not in_checkpoint.endswith("/"):
            continue
        # Scope to scope: TensorFlow's naming, for the Embedding Variables
        # under `current` (checkpoint_utils._init_from_checkpoint).
        scope = current[:current.rindex("/")] if "/" in current else ""
        for name, variable in store.items():
            if not isinstance(variable, EmbeddingVariable):
                continue
            if scope and not name.startswith(scope + "/"):
                continue
            suffix = name[len(scope):]
            if current != "/":
                suffix = suffix[1:]
            tables[(in_checkpoint if in_checkpoint != "/" else "") + suffix] = variable
    return tables, rest


def _init_from_checkpoint(ckpt_dir_or_file, assignment_map):
    """TensorFlow's _init_from_checkpoint, with Embedding Variables."""
    store = variable_scope._get_default_variable_store()._vars  # pylint: disable=protected-access
    tables, rest = _table_assignments(assignment_map, store)
    ckpt_file = checkpoint_utils._get_checkpoint_filename(ckpt_dir_or_file)  # pylint: disable=protected-access
    in_checkpoint = checkpoint_utils.load_checkpoint(ckpt_dir_or_file).get_variable_to_shape_map()
    for name, variable in sorted(tables.items()):
        if f"{name}/sok_ev/header" not in in_checkpoint:
            raise ValueError(f"init_from_checkpoint: checkpoint {ckpt_dir_or_file} has no "
                             f"Embedding Variable table '{name}' (no tensor {name}/sok_ev/header) "
                             f"to initialize Embedding Variable {variable.name} from")
    # TensorFlow's code sees the store without the Embedding Variables.
    hidden = {k: v for k, v in store.items() if isinstance(v, EmbeddingVariable)}
    for key in hidden:
        del store[key]
    try:
        _original["_init_from_checkpoint"](ckpt_dir_or_file, rest)
    finally:
        store.update(hidden)
    for name, variable in sorted(tables.items()):
        _initialize_from(variable, ckpt_file, name)


def _initialize_from(variable, ckpt_file, name):
    """Makes `variable`'s initializer restore its table from the table `name`
  of the checkpoint `ckpt_file` (all of it or, on an error, nothing)."""
    if tf.executing_eagerly():
        raise ValueError(f"init_from_checkpoint: Embedding Variable {variable.name} is eager; "
                         "init_from_checkpoint sets graph initializers (restore eager "
                         "variables with tf.train.Checkpoint)")
    old = variable.initializer
    with checkpoint.on_table_device(variable), tf.name_scope(
            f"{variable.op.name}/init_from_checkpoint"):
        new = checkpoint.restore_tables(tf.constant(ckpt_file), [(name, variable)])
    variable._initializer_op = new  # pylint: disable=protected-access
    # DeepRec scripts run this collection before global_variables_initializer.
    collection = tf.compat.v1.get_collection_ref(EV_INIT_VAR_OPS)
    collection[:] = [new if op is old else op for op in collection]


def install_hook():
    """Makes init_from_checkpoint warm-start Embedding Variables. Idempotent."""
    if not _original:
        _original["_init_from_checkpoint"] = checkpoint_utils._init_from_checkpoint  # pylint: disable=protected-access
        checkpoint_utils._init_from_checkpoint = _init_from_checkpoint  # pylint: disable=protected-access


def uninstall_hook():
    """Restores TensorFlow's init_from_checkpoint."""
    if _original:
        checkpoint_utils._init_from_checkpoint = _original.pop("_init_from_checkpoint")  # pylint: disable=protected-access
