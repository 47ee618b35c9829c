"""Who the workers are, and how they talk: the one place sok-ev asks.

sok-ev runs on one worker without Horovod. With Horovod (after `hvd.init()`),
`init()` takes the rank and the number of workers from it. Lookup code only
calls the functions of this module -- `rank()`, `world_size()`, `alltoall()`,
`allgather()`, `allreduce()`, `allgather_object()` -- so a native NCCL or MPI
backend can replace Horovod here without touching `sok_ev.distributed`.

Every collective is a TensorFlow op with a gradient where one makes sense
(alltoall), usable in graph mode (`tf.compat.v1.Session`), eagerly, and
inside `tf.function`. In graph mode the ops are matched across workers by
name, so every worker must build the same graph (the usual SPMD script).

This is transport only: what may or may not be sent (Embedding Variable
gradients are never reduced) is `sok_ev.embedding_gradients`'s policy.
"""

import json
import os

import numpy as np
import tensorflow as tf

_state = {"rank": 0, "world_size": 1, "initialized": False}

# Variables that launchers set to the number of processes they started.
_LAUNCHER_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE")


def _launched_processes():
    for variable in _LAUNCHER_SIZE_VARIABLES:
        value = os.environ.get(variable)
        if value and value.isdigit():
            return int(value), variable
    return 1, None


def _horovod():
    """horovod.tensorflow, or None when it is not installed."""
    try:
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return hvd


def init():
    """Reads rank and world size from Horovod, or sets one worker.

  Raises:
    RuntimeError: several processes were launched but Horovod is missing or
      `hvd.init()` has not run, so the workers cannot know each other.
  """
    launched, variable = _launched_processes()
    hvd = _horovod()
    if hvd is not None and hvd.is_initialized():
        _state.update(rank=hvd.rank(), world_size=hvd.size(), initialized=True)
        return
    if launched > 1:
        missing = ("Horovod is not installed (bash request.sh installs it)"
                   if hvd is None else "hvd.init() has not been called")
        raise RuntimeError(f"sok_ev.init(): {launched} processes were launched ({variable}="
                           f"{launched}), but {missing}. Call hvd.init() before sok_ev.init().")
    _state.update(rank=0, world_size=1, initialized=True)


def rank():
    """This worker's index in [0, world_size())."""
    return _state["rank"]


def world_size():
    """Number of workers the tables are spread over."""
    return _state["world_size"]


def _backend():
    hvd = _horovod()
    if hvd is None or not hvd.is_initialized():
        raise RuntimeError(f"sok-ev is set up for {world_size()} workers but Horovod is "
                           f"{'missing' if hvd is None else 'not initialised'}; call hvd.init() "
                           "then sok_ev.init() on every worker.")
    return hvd


# --- Collectives (TensorFlow ops) ------------------------------------------


def alltoall(tensor, splits, name=None):
    """Sends `splits[w]` leading rows of `tensor` to worker w, in order.

  Args:
    tensor: `[n, ...]`; rows `sum(splits[:w]) ... sum(splits[:w+1])` go to
      worker w. The trailing dimensions must agree across workers.
    splits: int `[world_size]`, summing to n.
    name: the op name; in graph mode it must be the same on every worker
      (None derives it from `tensor`'s name, which SPMD graphs share).

  Returns:
    `(received, received_splits)`: the rows from worker 0, then worker 1, ...,
    and how many came from each (int32 `[world_size]`). Differentiable with
    respect to `tensor` (the gradient is the reverse alltoall).
  """
    return _backend().alltoall(tensor, splits=tf.cast(splits, tf.int32), name=name)


def allgather(tensor, name=None):
    """Concatenates every worker's `tensor` along dimension 0, in rank order."""
    return _backend().allgather(tensor, name=name)


def allreduce(tensor, name=None):
    """Sums `tensor` over the workers."""
    hvd = _backend()
    return hvd.allreduce(tensor, op=hvd.Sum, name=name)


def allgather_object(obj, name="sok_ev_allgather_object"):
    """Runs now, outside any graph being built: returns every worker's `obj`.

  `obj` must be JSON-serialisable. Used for one-off checks while a graph or
  a `tf.function` is being built (every worker builds it, so every worker
  calls this in the same order). Graph mode runs the two allgathers in a
  private graph and session, leaving the user's graph untouched.

  Returns:
    A list of `world_size()` decoded objects, in rank order.
  """
    hvd = _backend()
    data = np.frombuffer(json.dumps(obj, sort_keys=True).encode(), np.uint8)

    def gather():
        sizes = hvd.allgather(tf.constant([data.size], tf.int64), name=f"{name}_sizes")
        payload = hvd.allgather(tf.constant(data, tf.uint8), name=f"{name}_data")
        return sizes, payload

    with tf.init_scope():  # leaves a tf.function being traced: runs eagerly
        if tf.executing_eagerly():
            sizes, payload = gather()
            sizes, payload = sizes.numpy(), payload.numpy()
        else:
            with tf.Graph().as_default():
                fetches = gather()
                with tf.compat.v1.Session() as session:
                    sizes, payload = session.run(fetches)
    objects, start = [], 0
    for size in sizes:
        objects.append(json.loads(payload[start:start + size].tobytes().decode()))
        start += size
    return objects
