"""hvd.broadcast_variables and Embedding Variables: checked, never copied.

Horovod scripts broadcast worker 0's variables after initializing or
restoring (`hvd.BroadcastGlobalVariablesHook(0)`,
`hvd.broadcast_variables(model.variables + opt.variables(), 0)`, Keras'
`BroadcastGlobalVariablesCallback`), so that every replica starts equal.
Embedding Variables and their optimizer slots have no replicas: each worker
holds exactly the keys it owns. Copying worker 0's shard would be wrong, and
there is nothing to copy. So, after `install_broadcast_guard()` (run by
`sok_ev.init()`), `hvd.broadcast_variables` broadcasts every other variable
as before and, for Embedding Variables and their slots, checks instead what
the broadcast would have hidden: that every worker restored the same
checkpoint into each table, or none did. The single-worker habit -- only
worker 0 restores, then broadcasts -- would otherwise leave every other
worker's keys unrestored; the check makes it an error on every worker.
"""

import functools

import tensorflow as tf

from sok_ev import communication
from sok_ev._ops import ops
from sok_ev.embedding_variable import EmbeddingVariable
from sok_ev.optimizers import EmbeddingVariableSlot

_originals = {}


def _tables_of(variables):
    """The Embedding Variables among `variables` (slots stand for their
  table), each once, in order."""
    tables = {}
    for variable in variables:
        if isinstance(variable, EmbeddingVariableSlot):
            variable = variable.primary
        if isinstance(variable, EmbeddingVariable):
            tables.setdefault(id(variable), variable)
    return list(tables.values())


def check_restored_alike(tables):
    """Fails on every worker unless each table was restored from the same
  checkpoint on every worker, or on none (a collective: every worker calls
  it with the same tables).

  Returns:
    The check op (graph mode), or None once it passed (eagerly).

  Raises:
    tf.errors.InvalidArgumentError: naming the tables; the stamps printed
      are per worker (0: not restored since initialized).
  """
    stamps = tf.stack([ops().sok_ev_embedding_variable_restore_stamp(t.handle) for t in tables])
    everyone = communication.allgather(tf.reshape(stamps, [1, -1]), name="sok_ev_restore_stamps")
    names = ", ".join(f"'{t.name}'" for t in tables)
    return tf.debugging.assert_equal(
        everyone,
        tf.tile(everyone[:1], [tf.shape(everyone)[0], 1]),
        message=f"Embedding Variables {names} were restored from a checkpoint on some workers "
        "but not on others (or from different checkpoints). With several workers every worker "
        "restores the same checkpoint -- Saver.restore, MonitoredTrainingSession(checkpoint_dir="
        "...) or tf.train.Checkpoint.restore on every worker -- because each holds only the keys "
        "it owns; a broadcast cannot copy them (rows: workers; 0: not restored)")


def _guarded(original):

    @functools.wraps(original)
    def broadcast_variables(variables, root_rank, *args, **kwargs):
        variables = list(variables)
        tables = _tables_of(variables)
        if not tables:
            return original(variables, root_rank, *args, **kwargs)
        others = [
            v for v in variables if not isinstance(v, (EmbeddingVariable, EmbeddingVariableSlot))
        ]
        broadcast = original(others, root_rank, *args, **kwargs)
        if communication.world_size() == 1:
            return broadcast
        check = check_restored_alike(tables)
        if tf.executing_eagerly():
            return broadcast
        return tf.group(*[op for op in (broadcast, check) if op is not None])

    return broadcast_variables


def install_broadcast_guard():
    """Wraps hvd.broadcast_variables (also what BroadcastGlobalVariablesHook
  and broadcast_global_variables call) once, if Horovod is installed:
  Embedding Variables and their slots are checked, not broadcast (see the
  module docstring). Scripts that bound `from horovod.tensorflow import
  broadcast_variables` before sok_ev.init() keep the original, which fails
  on Embedding Variables: they have no dense value to send."""
    if _originals:
        return
    try:
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    except ImportError:
        return
    _originals["broadcast_variables"] = hvd.broadcast_variables
    hvd.broadcast_variables = _guarded(hvd.broadcast_variables)
