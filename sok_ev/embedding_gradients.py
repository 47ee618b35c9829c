"""An Embedding Variable's gradient, and the guard that keeps it out of
Horovod's reductions.

The gradient of a lookup reaches its Embedding Variable as
`tf.IndexedSlices(rows, keys)`, keyed by raw keys (`keyed_gradient`).

With several workers each worker's Embedding Variable gradient holds only
the keys it owns, already summed over every worker's batch by the lookup's
backward exchange; only the owner may apply it. Any Horovod reduction of it
(allreduce, allgather, broadcast, reducescatter) would apply keys into
shards that do not own them, or apply them twice. This module owns that
policy; the transport (`sok_ev.communication`) knows nothing of Embedding
Variables. The guard has three layers:

1. Marks. `sok_ev.distributed` marks the keys each owner looks up with their
   Embedding Variable (`mark`); `keyed_gradient` marks the gradient's
   indices and values the same way.
2. At the Horovod call (`install_allreduce_guards`, run by sok_ev.init() with
   Horovod): the functions of `horovod.tensorflow` that reduce, gather or
   broadcast -- the public ones and the inner ones they call -- refuse a
   marked tensor or IndexedSlices, in graph and eager mode. The inner ones are
   wrapped in the module itself, so a public function bound before
   sok_ev.init() (`from horovod.tensorflow import allreduce`) is refused too,
   and so is allreducing only the values of a gradient (keeping its indices).
   `hvd.DistributedOptimizer` and `hvd.DistributedGradientTape` refuse
   Embedding Variables among their variables.
   The op wrappers of Horovod's op library (`mpi_ops.MPI_LIB`), which every
   Python path to a Horovod reduction ends in, refuse them too: a function
   bound before sok_ev.init() from `horovod.tensorflow.mpi_ops` (`_allreduce`)
   is caught there.
3. At the update (`check_before_apply`): in graph mode and tf.function the
   gradient's indices and values are traced back to the marked tensors, and
   a Horovod reduction on the way is refused. Eagerly, where there is no
   graph to trace, every key of the gradient must be one this worker owns:
   a reduction across workers (allreduce of IndexedSlices gathers every
   worker's keys) brings in keys of other shards.
Each refusal is a ValueError naming the Embedding Variable and the fix.

Not caught: eagerly, a reduction of a gradient TensorFlow made anew (an
unmarked tensor, e.g. clipped) that keeps its indices (a reduction of its
values alone): its keys are still this worker's own.
"""

import functools
import sys

import numpy as np
import tensorflow as tf

from sok_ev import communication
from sok_ev.embedding_variable import EmbeddingVariable

# Attribute naming the Embedding Variable a key or gradient tensor belongs to.
_MARK = "_sok_ev_embedding_variable"

# Horovod ops that must never produce an Embedding Variable gradient.
_REDUCING_OPS = ("HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather",
                 "HorovodGroupedAllgather", "HorovodBroadcast", "HorovodReducescatter",
                 "HorovodGroupedReducescatter")

# horovod.tensorflow functions that reduce, gather or broadcast -> the name
# the user knows them by. The inner ones (_allreduce...) are what the public
# ones call, looked up in the module at call time.
_HOROVOD_FUNCTIONS = {
    "allreduce": "hvd.allreduce",
    "grouped_allreduce": "hvd.grouped_allreduce",
    "reducescatter": "hvd.reducescatter",
    "grouped_reducescatter": "hvd.grouped_reducescatter",
    "_allreduce": "hvd.allreduce",
    "_grouped_allreduce": "hvd.grouped_allreduce",
    "_reducescatter": "hvd.reducescatter",
    "_grouped_reducescatter": "hvd.grouped_reducescatter",
    "allgather": "hvd.allgather",
    "grouped_allgather": "hvd.grouped_allgather",
    "broadcast": "hvd.broadcast",
}

# The op wrappers of Horovod's op library that reduce, gather or broadcast
# -> the Horovod op, as errors name it.
_HOROVOD_OP_FUNCTIONS = {
    "horovod_allreduce": "Horovod's allreduce op",
    "horovod_grouped_allreduce": "Horovod's grouped allreduce op",
    "horovod_allgather": "Horovod's allgather op",
    "horovod_grouped_allgather": "Horovod's grouped allgather op",
    "horovod_broadcast": "Horovod's broadcast op",
    "horovod_reducescatter": "Horovod's reducescatter op",
    "horovod_grouped_reducescatter": "Horovod's grouped reducescatter op",
}

_guards = {}


def mark(tensor, variable):
    """Records that `tensor` holds keys or gradient rows of `variable`."""
    setattr(tensor, _MARK, variable)
    return tensor


def keyed_gradient(rows, keys, after):
    """The gradient of an Embedding Variable: `tf.IndexedSlices(rows, keys)`.

  Args:
    rows: float32 `[n, dim]`, the gradient of each looked-up key's row.
    keys: `[n]` the keys (int32/int64), as the lookup saw them.
    after: the lookup op whose gradient this is. The gradient runs after
      it, so a step that fetches only the update still runs the lookup,
      which counts each key's occurrences (its frequency, which feature
      filters admit keys by): a loss linear in the embeddings has a gradient
      that reads none of the lookup's outputs, and a Session would prune it.

  Returns:
    tf.IndexedSlices whose values and indices are new tensors of the
    backward pass: a GradientTape opened outside the tf.function that did the
    lookup needs the indices produced by an op of the backward function, not
    passed through from the forward one. Both carry the keys' mark.
  """
    variable = getattr(keys, _MARK, None)
    # Not inside a TF1 while loop or cond: a control input may not cross
    # into its frame (there, the loop's own structure keeps the lookup).
    inside_v1_control_flow = getattr(after, "_control_flow_context", None) is not None
    with tf.control_dependencies([] if inside_v1_control_flow else [after]):
        rows, keys = tf.identity(rows), tf.identity(keys)
    if variable is not None:
        mark(rows, variable)
        mark(keys, variable)
    return tf.IndexedSlices(rows, keys)


# Ops TensorFlow puts between a lookup's gradient and the optimizer without
# changing it: gating (Identity) and the sum of several lookups' gradients
# (ConcatV2 of their IndexedSlices).
_PASS_THROUGH_OPS = ("Identity", "ConcatV2")


def _mark_of(tensor, depth=8):
    """The mark of `tensor`, or of the marked tensors it passes through."""
    variable = getattr(tensor, _MARK, None)
    if variable is not None or depth == 0 or tf.executing_eagerly():
        return variable
    op = getattr(tensor, "op", None)
    if op is None or op.type not in _PASS_THROUGH_OPS:
        return None
    return next((v for v in (_mark_of(t, depth - 1) for t in op.inputs) if v is not None), None)


def variable_of(value):
    """The Embedding Variable whose gradient (or part of it) `value` is, or None.

  `value` may be tf.IndexedSlices or a tensor; in graph mode what TensorFlow
  passes a gradient through unchanged (an Identity, a concatenation of
  several lookups' gradients) counts.
  """
    parts = [value.indices, value.values] if isinstance(value, tf.IndexedSlices) else [value]
    return next((v for v in map(_mark_of, parts) if v is not None), None)


def owners_of(keys, num_workers):
    """The worker that stores each key of a table sharded over `num_workers`
  (target_gpu -1): cc/partition.h's owner_of, in NumPy.

  Args:
    keys: int32 or int64 array-like `[n]`.
  Returns:
    int64 `[n]`.
  """
    x = np.asarray(keys).astype(np.int64).view(np.uint64) ^ np.uint64(0x5bd1e9955bd1e995)
    with np.errstate(over="ignore"):  # 64-bit wrap-around is the hash
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xbf58476d1ce4e5b9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94d049bb133111eb)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(num_workers)).astype(np.int64)


def _check_owned_keys(grad, variable):
    """Eagerly: refuses a gradient holding a key another worker owns."""
    size, me = communication.world_size(), communication.rank()
    keys = grad.indices.numpy()
    owners = (np.full(keys.shape, int(variable.target_gpu))
              if variable.target_gpu >= 0 else owners_of(keys, size))
    foreign = np.nonzero(owners != me)[0]
    if foreign.size:
        j = int(foreign[0])
        raise ValueError(f"The gradient of Embedding Variable '{variable.name}' on worker {me} "
                         f"holds key {keys[j]}, which worker {owners[j]} owns ({foreign.size} of "
                         f"its {keys.size} keys are another worker's): it is no longer the "
                         "lookup's own gradient, which holds only this worker's keys with every "
                         "worker's contributions already summed. A Horovod reduction (e.g. "
                         "hvd.allreduce of the IndexedSlices) would apply keys into shards that "
                         "do not own them. Allreduce only the dense gradients (see "
                         "python/examples/deeprec_sok_example.py).")


def check_before_apply(grad, variable, max_ops=100000):
    """Refuses an Embedding Variable gradient that went through a Horovod
  reduction, with several workers.

  In graph mode and tf.function: walks from the gradient's indices and
  values back to the marked tensors of the lookup's backward pass, through
  every input but scalars; any other op (scaling, clipping, also by a
  scalar reduced over the workers) is fine. Eagerly (no graph to walk): every
  key must be one this worker owns.

  Raises:
    ValueError: naming the variable and the Horovod op, or the key another
      worker owns.
  """
    if communication.world_size() == 1 or not isinstance(grad, tf.IndexedSlices):
        return
    if tf.executing_eagerly():
        _check_owned_keys(grad, variable)
        return
    pending = [t for t in (grad.indices, grad.values) if hasattr(t, "op")]
    seen = set()
    while pending and len(seen) < max_ops:
        tensor = pending.pop()
        if getattr(tensor, _MARK, None) is not None:
            continue
        op = tensor.op
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in _REDUCING_OPS:
            raise ValueError(f"The gradient of Embedding Variable '{variable.name}' went through "
                             f"Horovod op '{op.name}' ({op.type}). Embedding Variables are "
                             "model-parallel: each worker applies only the keys it owns, with "
                             "every worker's contributions already summed by the lookup's "
                             "backward exchange. Allreduce only the dense gradients (see "
                             "python/examples/deeprec_sok_example.py).")
        # A scalar carries no rows: a norm reduced over the workers (Keras's
        # global_clipnorm) may scale the gradient.
        pending.extend(t for t in op.inputs if t.shape.rank != 0)


# --- At the Horovod call ------------------------------------------------------


def _refuse(variables, where):
    names = ", ".join(dict.fromkeys(f"'{v.name}'" for v in variables))
    raise ValueError(f"{where} would reduce the gradient of Embedding Variable(s) {names} "
                     "across workers. "
                     "Embedding Variables are model-parallel: each worker's gradient already "
                     "holds every worker's contributions for the keys it owns, and only the "
                     "owner may apply it. Leave Embedding Variables out: allreduce only the "
                     "dense gradients, e.g. [(g if isinstance(v, sok_ev.EmbeddingVariable) "
                     "else hvd.allreduce(g), v) for g, v in opt.compute_gradients(loss)], or "
                     "pass var_list=<dense variables> to hvd.DistributedOptimizer (see "
                     "python/examples/deeprec_sok_example.py).")


def _guard_function(original, where):

    @functools.wraps(original)
    def guarded(tensor, *args, **kwargs):
        values = tensor if isinstance(tensor, (list, tuple)) else [tensor]
        variables = [v for v in map(variable_of, values) if v is not None]
        if variables:
            _refuse(variables, where)
        return original(tensor, *args, **kwargs)

    return guarded


def _embedding_variables_in(variables):
    return [v for v in tf.nest.flatten(variables) if isinstance(v, EmbeddingVariable)]


def _guard_compute_gradients(original):

    @functools.wraps(original)
    def compute_gradients(self, *args, **kwargs):
        var_list = kwargs.get("var_list", args[1] if len(args) > 1 else None)
        if var_list is None and not tf.executing_eagerly():
            var_list = tf.compat.v1.trainable_variables()
        tables = _embedding_variables_in(var_list or [])
        if tables:
            _refuse(tables, "hvd.DistributedOptimizer")
        return original(self, *args, **kwargs)

    return compute_gradients


def _guard_tape_gradient(original):

    @functools.wraps(original)
    def gradient(self, target, sources, *args, **kwargs):
        tables = _embedding_variables_in(sources)
        if tables:
            _refuse(tables, "hvd.DistributedGradientTape.gradient")
        return original(self, target, sources, *args, **kwargs)

    return gradient


def install_allreduce_guards() -> None:
    """Makes horovod.tensorflow refuse Embedding Variable gradients (layer 2
  of the module docstring). Idempotent; nothing happens without Horovod."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None or _guards:
        return
    for function, where in _HOROVOD_FUNCTIONS.items():
        original = getattr(hvd, function, None)
        if original is not None:
            _guards[function] = original
            setattr(hvd, function, _guard_function(original, where))
    for class_name in ("_DistributedOptimizer", "_DistributedAdasumOptimizer"):
        cls = getattr(hvd, class_name, None)
        if cls is not None:
            _guards[class_name] = cls.compute_gradients
            cls.compute_gradients = _guard_compute_gradients(cls.compute_gradients)
    tape = getattr(hvd, "_DistributedGradientTape", None)
    if tape is not None:
        _guards["_DistributedGradientTape"] = tape.gradient
        tape.gradient = _guard_tape_gradient(tape.gradient)
    # The op wrappers every Python path ends in: a function of mpi_ops bound
    # before this ran still looks them up in the library module.
    library = getattr(sys.modules.get("horovod.tensorflow.mpi_ops"), "MPI_LIB", None)
    for op_function, where in _HOROVOD_OP_FUNCTIONS.items():
        original = getattr(library, op_function, None)
        if original is not None:
            _guards[f"MPI_LIB.{op_function}"] = original
            setattr(library, op_function, _guard_function(original, where))
