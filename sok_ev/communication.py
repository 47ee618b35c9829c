"""Who the workers are, and how they talk: the one place sok-ev asks.

sok-ev runs on one worker without Horovod. With Horovod (after `hvd.init()`),
`init()` takes the rank and the number of workers from it. Lookup code only
calls the functions of this module -- `rank()`, `world_size()`, `alltoall()`,
`allgather()`, `allreduce()`, and, run at once outside any graph,
`allgather_object()`, `alltoall_now()` and `shutdown()` -- so a native NCCL
or MPI backend can replace Horovod here without touching `sok_ev.distributed`.

One native backend exists, for the GPU all-to-alls whose receiving sizes
both ends know (the row messages): `alltoall(..., received_splits=...,
communicator=...)` runs sok-ev's own NcclAlltoall op (cc/nccl_exchange.h)
on a communicator made from `new_nccl_id()`, with no negotiation by
Horovod's background thread. It carries the rows of every lookup that
exchanges on a GPU (`row_transport`); SOK_EV_ROW_TRANSPORT=horovod sends
them through Horovod instead. Horovod starts the job and carries everything
else: the keys, and the rows of lookups on the CPU.

Every collective is a TensorFlow op with a gradient where one makes sense
(alltoall), usable in graph mode (`tf.compat.v1.Session`), eagerly, and
inside `tf.function`. In graph mode the ops are matched across workers by
name, so every worker must build the same graph (the usual SPMD script);
eager ones are matched by kind.

This is transport only: what may or may not be sent (Embedding Variable
gradients are never reduced) is `sok_ev.embedding_gradients`'s policy.
"""

import json
import os
import sys
import threading

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.eager import context

from sok_ev._ops import ops

_state = {"rank": 0, "world_size": 1, "initialized": False}

# What carries the row messages of GPU lookups (see the module docstring).
ROW_TRANSPORT_VARIABLE = "SOK_EV_ROW_TRANSPORT"
ROW_TRANSPORTS = ("horovod", "nccl")
# Seconds a native exchange may take before it fails on this worker.
EXCHANGE_TIMEOUT_VARIABLE = "SOK_EV_EXCHANGE_TIMEOUT"
DEFAULT_EXCHANGE_TIMEOUT_SECONDS = 60.0

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


def _check_initialized():
    """Refuses to run as one worker when Horovod runs several and init() was
  forgotten: every worker would store every key and train unsharded."""
    if _state["initialized"]:
        return
    hvd = sys.modules.get("horovod.tensorflow")  # imported by whoever ran hvd.init()
    if hvd is not None and hvd.is_initialized() and hvd.size() > 1:
        raise RuntimeError(f"sok-ev: Horovod runs {hvd.size()} workers (hvd.init() was called) "
                           "but sok_ev.init() was not: call sok_ev.init() after hvd.init() on "
                           "every worker, before building any lookup. Without it every worker "
                           "would keep a full, unsharded copy of every table.")


def initialized():
    """Whether init() has run."""
    return _state["initialized"]


def rank():
    """This worker's index in [0, world_size()).

  Raises:
    RuntimeError: Horovod runs several workers but init() was not called.
  """
    _check_initialized()
    return _state["rank"]


def world_size():
    """Number of workers the tables are spread over.

  Raises:
    RuntimeError: Horovod runs several workers but init() was not called.
  """
    _check_initialized()
    return _state["world_size"]


def _backend():
    hvd = _horovod()
    if hvd is None or not hvd.is_initialized():
        raise RuntimeError(f"sok-ev is set up for {world_size()} workers but Horovod is "
                           f"{'missing' if hvd is None else 'not initialised'}; call hvd.init() "
                           "then sok_ev.init() on every worker.")
    return hvd


def row_transport(device):
    """What carries the row messages of a lookup that exchanges on `device`:
  SOK_EV_ROW_TRANSPORT when it is set, "horovod" or "nccl" (sok-ev's own
  NCCL communicator per lookup); unset, "nccl" on a GPU (measured faster
  than Horovod's all-to-all, and exact: benchmarks/gpu/NOTES.md) and
  "horovod" on the CPU.

  Args:
    device: the device string of the lookup's exchanges ("/GPU:0", "/CPU:0").

  Raises:
    ValueError: the variable names another transport.
  """
    value = os.environ.get(ROW_TRANSPORT_VARIABLE, "")
    if not value:
        return "nccl" if "GPU" in device.upper() else "horovod"
    if value not in ROW_TRANSPORTS:
        raise ValueError(f"{ROW_TRANSPORT_VARIABLE} must be one of {', '.join(ROW_TRANSPORTS)}, "
                         f"got {value!r}")
    return value


def seconds_setting(variable, default):
    """The environment variable `variable` as a number of seconds, or
  `default` when it is unset or empty.

  Raises:
    ValueError: the variable is not a positive number (the message names it
      and its value).
  """
    value = os.environ.get(variable)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1
    if not seconds > 0:  # NaN too
        raise ValueError(f"{variable} must be a positive number of seconds, got {value!r}")
    return seconds


def exchange_timeout():
    """SOK_EV_EXCHANGE_TIMEOUT in seconds (default 60): how long a native
  exchange may take before it fails, and aborts its communicator.

  Raises:
    ValueError: the variable is not a positive number.
  """
    return seconds_setting(EXCHANGE_TIMEOUT_VARIABLE, DEFAULT_EXCHANGE_TIMEOUT_SECONDS)


def new_nccl_id():
    """Runs now, outside any graph being built: a fresh NCCL unique id, as
  the hex string `alltoall`'s `communicator` takes. One worker makes it and
  hands it to the others (sok_ev.agreement.check_lookup does, in the
  lookup's build-time check).

  Raises:
    tf.errors.InternalError: NCCL cannot be loaded (the message names the
      library; SOK_EV_NCCL_LIBRARY sets its path).
    tf.errors.NotFoundError: this build of sok-ev has no GPU kernels.
  """

    def make():
        with tf.device("/CPU:0"):
            return ops().sok_ev_nccl_unique_id()

    return bytes(_eager_or_private_graph(make)).hex()


# --- Collectives (TensorFlow ops) ------------------------------------------


def alltoall(tensor, splits, name=None, exact_name=False, received_splits=None, communicator=None):
    """Sends `splits[w]` leading rows of `tensor` to worker w, in order.

  Args:
    tensor: `[n, ...]`; rows `sum(splits[:w]) ... sum(splits[:w+1])` go to
      worker w. The trailing dimensions must agree across workers.
    splits: int `[world_size]`, summing to n.
    name: the op name; in graph mode it must be the same on every worker
      (None derives it from `tensor`'s name, which SPMD graphs share).
      Eager collectives are matched by kind, not name.
    exact_name: the workers match the collective by `name` alone, whatever
      the name scopes or graph around it (so `alltoall_now` can meet it).
    received_splits: with `communicator`, int32 `[world_size]`: the rows
      each worker sends here, known in advance (host memory on a GPU).
    communicator: None (Horovod), or the hex of an NCCL id (`new_nccl_id`,
      the same on every worker): sok-ev's own NCCL all-to-all on the GPU,
      which needs `received_splits` and no name. Every worker must run the
      exchanges of one communicator in the same order (those of one lookup
      form a chain); SOK_EV_EXCHANGE_TIMEOUT bounds each.

  Returns:
    `(received, received_splits)`: the rows from worker 0, then worker 1, ...,
    and how many came from each (int32 `[world_size]`). Differentiable with
    respect to `tensor` (the gradient is the reverse alltoall).

  Raises:
    ValueError: `communicator` without `received_splits`.
  """
    if communicator is not None:
        if received_splits is None:
            raise ValueError("alltoall: a native exchange (communicator) needs received_splits")
        received = ops().sok_ev_nccl_alltoall(tensor,
                                              tf.cast(splits, tf.int32),
                                              received_splits,
                                              communicator=communicator,
                                              rank=rank(),
                                              world_size=world_size(),
                                              timeout_seconds=exchange_timeout())
        return received, received_splits
    return _backend().alltoall(tensor,
                               splits=tf.cast(splits, tf.int32),
                               name=name,
                               ignore_name_scope=exact_name)


def allgather(tensor, name=None):
    """Concatenates every worker's `tensor` along dimension 0, in rank order."""
    return _backend().allgather(tensor, name=name)


def allreduce(tensor, name=None):
    """Sums `tensor` over the workers."""
    hvd = _backend()
    return hvd.allreduce(tensor, op=hvd.Sum, name=name)


class CollectiveMismatchError(ValueError):
    """Workers met in a collective while at different sok-ev steps."""


class CollectiveTimeoutError(RuntimeError):
    """A collective run by `allgather_object` was not joined by every worker
  in time. Horovod still waits for it: call `shutdown()` before going on."""


def _run_now(function, timeout):
    """Runs `function()` (collectives, outside any graph being built); with a
  timeout, in a thread, raising CollectiveTimeoutError if it has not
  returned after `timeout` seconds."""
    if timeout is None:
        return function()
    result = {}

    def target():
        try:
            result["value"] = function()
        except BaseException as error:  # pylint: disable=broad-except
            result["error"] = error

    thread = threading.Thread(target=target, name="sok_ev_collective", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CollectiveTimeoutError(f"not every worker joined within {timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _eager_or_private_graph(build):
    """Runs `build()` now: eagerly, or in a private graph and session."""
    with tf.init_scope():  # leaves a tf.function being traced
        if tf.executing_eagerly():
            return tf.nest.map_structure(lambda t: t.numpy(), build())
    return _private_graph(build, None)


def allgather_object(obj, name="sok_ev_allgather_object", timeout=None):
    """Runs now, outside any graph being built: returns every worker's `obj`.

  `obj` must be JSON-serialisable. Used for one-off checks while a graph or
  a `tf.function` is being built (every worker builds it, so every worker
  calls this in the same order). Graph mode runs the two allgathers in a
  private graph and session, leaving the user's graph untouched.

  Args:
    name: what the gather is for. Eager Horovod pairs collectives by kind,
      not name, so each worker's object travels with it: workers at
      different gathers fail instead of reading each other's objects.
    timeout: None (wait for every worker), or seconds.

  Returns:
    A list of `world_size()` decoded objects, in rank order.

  Raises:
    CollectiveTimeoutError: some worker did not join within `timeout`.
    CollectiveMismatchError: some worker joined another gather.
  """
    hvd = _backend()
    data = np.frombuffer(
        json.dumps({
            "for": name,
            "object": obj
        }, sort_keys=True).encode(), np.uint8)

    def gather():
        sizes = hvd.allgather(tf.constant([data.size], tf.int64), name=f"{name}_sizes")
        payload = hvd.allgather(tf.constant(data, tf.uint8), name=f"{name}_data")
        return sizes, payload

    sizes, payload = _run_now(lambda: _eager_or_private_graph(gather), timeout)
    tagged, start = [], 0
    for size in sizes:
        tagged.append(json.loads(payload[start:start + size].tobytes().decode()))
        start += size
    for worker, theirs in enumerate(tagged):
        purpose = theirs.get("for") if isinstance(theirs, dict) else None
        if purpose != name:
            raise CollectiveMismatchError(
                f"sok-ev: worker {rank()} was at {name!r} when worker {worker} was at "
                f"{purpose!r}: the workers ran different sok-ev steps here (a save, restore "
                "or lookup that only some workers ran?); every worker must run the same ones, "
                "in the same order")
    return [t["object"] for t in tagged]


def alltoall_now(rows, splits, name=None, timeout=None, device=None):
    """Runs one alltoall now, outside any graph being built, and returns the
  rows received (NumPy).

  Args:
    rows: `[n, ...]` array; `splits[w]` rows go to worker w.
    name: the collective to join, as given to `alltoall(..., exact_name=True)`
      (None joins an eager alltoall, which is matched by kind).
    timeout: None, or seconds (see CollectiveTimeoutError).
    device: None, or the device ("/GPU:0", "/CPU:0") of the collective to
      join: Horovod pairs a GPU alltoall only with GPU alltoalls.
  """
    hvd = _backend()

    def exchange():
        with tf.device(device):
            received, _ = hvd.alltoall(tf.constant(rows),
                                       splits=tf.constant(splits, tf.int32),
                                       name=name,
                                       ignore_name_scope=name is not None)
        return received

    if name is None:  # an eager collective, whatever the caller's mode
        return _run_now(lambda: _eager(exchange), timeout)
    return _run_now(lambda: _private_graph(exchange, device), timeout)


def _eager(build):
    with tf.init_scope(), context.eager_mode():
        return build().numpy()


def _private_session_config(device):
    """The ConfigProto of `_private_graph`'s session: placement exactly on
  `device` when one is named (soft placement put a GPU alltoall fed by
  constants on the CPU, and Horovod refuses to pair it with the GPU one), and
  constant folding off, Grappler's and the graph optimizer's: Horovod's
  collectives are not stateful, so folding would run one fed by constants on
  the CPU while optimizing the graph."""
    config = tf.compat.v1.ConfigProto(allow_soft_placement=device is None)
    config.graph_options.rewrite_options.constant_folding = rewriter_config_pb2.RewriterConfig.OFF
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    return config


def _private_graph(build, device):
    """Runs `build()`'s fetches in a graph and session of their own
  (`_private_session_config(device)`)."""
    with tf.Graph().as_default():
        fetches = build()
        with tf.compat.v1.Session(config=_private_session_config(device)) as session:
            return session.run(fetches)


def shutdown():
    """Shuts Horovod down on this worker: every collective pending on any
  worker fails, so no worker waits forever for one that will not come."""
    hvd = _horovod()
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()


@tf.RegisterGradient("SokEv>NcclAlltoall")
def _nccl_alltoall_grad(op, grad):
    """The reverse exchange on the same communicator: each worker sends back
  the gradients of the rows it received."""
    reverse = ops().sok_ev_nccl_alltoall(grad,
                                         op.inputs[2],
                                         op.inputs[1],
                                         communicator=op.get_attr("communicator"),
                                         rank=op.get_attr("rank"),
                                         world_size=op.get_attr("world_size"),
                                         timeout_seconds=op.get_attr("timeout_seconds"))
    return [reverse, None, None]
