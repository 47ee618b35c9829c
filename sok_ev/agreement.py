"""Every worker builds and runs the same lookups, or every worker fails.

A lookup over tables sharded across workers is a collective: every worker
must take part, with the same tables. Horovod matches collectives by name
and waits, without limit, for every worker to submit each one; a lookup
that only some workers build or run (evaluation on worker 0, a table looked
up by one worker only) would leave every worker waiting forever. sok-ev
turns that into an error on every worker:

1. At build (graph construction, tf.function trace, the first eager call
   from a place in the user's code), `check_lookup` runs one small allgather
   of the lookup's description: its tables (name, embedding_dim, key dtype,
   target_gpu), and how each is combined (combiner, weighted or not).
   Workers that built different lookups at the same point get a ValueError
   naming the table, the field and both values. Only a lookup new to this
   worker is checked (new tables, a new place in the code, a new tf.function
   or tf.Graph), so retracing and eager steps cost nothing.
2. If the other workers do not join the check within
   SOK_EV_LOOKUP_CHECK_TIMEOUT seconds (default 30) -- because they did not
   build this lookup and went on training -- this worker sends every
   exchange it knows of (the lookups it built, which the others are waiting
   in) a "stopped" header, so the others fail with an error naming the
   cause; then it shuts Horovod down (any other waiting collective fails)
   and raises a ValueError naming the lookup.
3. At run time every exchange starts with one header row per worker:
   the lookup's fingerprint (a hash of its tables). A worker that receives a
   different fingerprint or a "stopped" header raises InvalidArgumentError,
   before any table changes. Eager exchanges are matched by Horovod by kind,
   so two workers running different eager lookups meet and fail here.

4. A lookup every worker built in a tf.Graph but only some run (an
   evaluation op fetched on worker 0 only): a worker that waits in its key
   exchange longer than SOK_EV_LOOKUP_CHECK_TIMEOUT stops the job as in 2
   (sok_ev.exchange_watch), so every worker fails within the time limit
   with an error naming the lookup.
"""

import hashlib
import itertools
import json
import os
import re
import sys
import threading
import time

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as framework_ops

from sok_ev import communication

TIMEOUT_VARIABLE = "SOK_EV_LOOKUP_CHECK_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 30.0
# The fingerprint a worker that stopped the job sends (fingerprints are >= 0);
# UnpackKeyMessage (sok_ev/cc/kernels/exchange_kernels.cc) knows it as kStopped.
STOPPED = -1
# How long a stopping worker waits for the others to receive its header: it
# goes on as soon as every exchange took its header, but a GPU exchange's
# first use sets up NCCL's communicator, which takes seconds.
_STOP_GRACE_SECONDS = 10.0

_SOK_EV_DIR = os.path.dirname(os.path.abspath(__file__))
# Packages whose frames are not the user's code.
_LIBRARIES = ("tensorflow", "keras", "horovod")

# Lookup keys every worker agreed on -> the NCCL id of their native row
# exchange (None with Horovod's).
_checked = {}
# The first collectives of the lookups built here: name (None: eager) ->
# the device their tensors are on, which a stop message must match
# (Horovod refuses to pair a CPU alltoall with a GPU one).
_exchanges = {}
_graph_ordinals = itertools.count()  # numbers the tf.Graphs with lookups, in order
_lock = threading.Lock()


def table_signature(variable):
    """What every worker must agree on about a table: name, embedding_dim,
  key dtype and target_gpu."""
    return {
        "name": variable.name,
        "embedding_dim": int(variable.embedding_dim),
        "key_dtype": variable.key_dtype.name,
        "target_gpu": int(variable.target_gpu)
    }


def fingerprint(params, exchange_dtype="float32"):
    """A 62-bit hash of the tables' signatures (and of a compressed exchange's
  dtype), the same on every worker."""
    described = [table_signature(v) for v in params]
    if exchange_dtype != "float32":  # float32 lookups keep their old fingerprints
        described.append({"exchange_dtype": exchange_dtype})
    text = json.dumps(described, sort_keys=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2


def check_timeout():
    """Seconds a worker waits for the others at a build-time check
  (SOK_EV_LOOKUP_CHECK_TIMEOUT, default 30)."""
    return communication.seconds_setting(TIMEOUT_VARIABLE, DEFAULT_TIMEOUT_SECONDS)


def _call_site():
    """file:line of the user's code that asked for the lookup."""
    skip = [_SOK_EV_DIR] + [
        os.path.dirname(os.path.abspath(sys.modules[m].__file__))
        for m in _LIBRARIES
        if getattr(sys.modules.get(m), "__file__", None)
    ]
    frame = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(tuple(skip)) and not frame.f_code.co_filename.startswith("<"):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def describe_site():
    """Where the lookup being built is, for messages: the user's file:line and
  its graph or tf.function (as the build-time check names it)."""
    return f"{_call_site()}, {_context()}"


def _context():
    """Where the lookup is built: eagerly or in a tf.Graph (by its order among
  graphs with lookups), and in which tf.functions being traced, by name."""
    graph = framework_ops.get_default_graph()
    functions = []
    while getattr(graph, "building_function", False):
        # Without the uid TensorFlow appends to some names (cond_true_41):
        # a retrace on one worker must not look like a new lookup.
        functions.append(re.sub(r"_\d+$", "", graph.name))
        graph = graph.outer_graph
    with tf.init_scope():
        eager = tf.executing_eagerly()
    if eager:
        where = "eager"
    else:
        with _lock:
            if not hasattr(graph, "_sok_ev_ordinal"):
                graph._sok_ev_ordinal = next(_graph_ordinals)  # pylint: disable=protected-access
        where = f"graph{graph._sok_ev_ordinal}"  # pylint: disable=protected-access
    return "/".join([where] + functions[::-1])


def check_lookup(params,
                 exchange_dtype="float32",
                 row_transport="horovod",
                 combiners=None,
                 weighted=None):
    """Checks that every worker builds this lookup (see the module docstring).

  Args:
    params: the lookup's Embedding Variables.
    exchange_dtype: the name of the dtype its rows travel as (lookup_sparse's
      exchange_dtype); every worker must use the same.
    row_transport: what carries its rows (sok_ev.communication.row_transport);
      every worker must use the same. With "nccl", worker 0 makes the NCCL id
      of the lookup's communicator and the check hands it to every worker.
    combiners: None, or N names ('sum', 'mean', 'sqrtn'): how each worker
      combines its own samples; every worker must use the same.
    weighted: None, or N bools: whether each table's samples are weighted
      (sp_weights); every worker must agree.

  Returns:
    The hex NCCL id of the lookup's row exchange (the same on every worker,
    and for every rebuild of this lookup here), or None with "horovod".

  Raises:
    ValueError: a target_gpu out of range; workers disagreeing on the tables
      (the message names the table, the field and both values), on their
      combiners or weights, on exchange_dtype or on row_transport; or workers
      not building this lookup within the timeout.
  """
    size = communication.world_size()
    signatures = [table_signature(v) for v in params]
    for signature in signatures:
        if not -1 <= signature["target_gpu"] < size:
            raise ValueError(f"lookup_sparse: target_gpu of Embedding Variable "
                             f"'{signature['name']}' must be -1 or in [0, {size}) for {size} "
                             f"workers, got {signature['target_gpu']}")
    combining = [{
        "combiner": c,
        "weighted": bool(w)
    } for c, w in zip(combiners or [None] * len(params), weighted or [False] * len(params))]
    site, where = _call_site(), _context()
    key = (where, site, json.dumps([signatures, combining],
                                   sort_keys=True), exchange_dtype, row_transport)
    occurrence = None
    if not tf.executing_eagerly():
        # The n-th such lookup of this graph or function trace: one built
        # again at the same place (a helper called twice) is checked again,
        # as the other workers may not build it.
        graph = framework_ops.get_default_graph()
        if not hasattr(graph, "_sok_ev_lookups_built"):
            graph._sok_ev_lookups_built = {}  # pylint: disable=protected-access
        built = graph._sok_ev_lookups_built  # pylint: disable=protected-access
        occurrence = built[key] = built.get(key, 0) + 1
        key += (occurrence,)
    if key in _checked:
        return _checked[key]
    description = {
        "tables": signatures,
        "combining": combining,
        "site": site,
        "where": where if occurrence is None else f"{where}, #{occurrence} there",
        "exchange_dtype": exchange_dtype,
        "row_transport": row_transport,
    }
    if row_transport == "nccl" and communication.rank() == 0:
        description["nccl_id"] = communication.new_nccl_id()
    timeout = check_timeout()
    try:
        everyone = communication.allgather_object(description,
                                                  name="sok_ev_lookup_check",
                                                  timeout=timeout)
    except communication.CollectiveTimeoutError:
        names = [s["name"] for s in signatures]
        message = (f"lookup_sparse: worker {communication.rank()} built a lookup of {names} "
                   f"({site}, {description['where']}) that the other workers did not build within "
                   f"{timeout:g} s: every worker must build and run the same sok-ev lookups in "
                   "the same order (an evaluation or a table looked up on some workers only "
                   f"is a rank-dependent lookup). {TIMEOUT_VARIABLE} sets the time limit.")
        stop_everyone(message)
        raise ValueError(message) from None
    _compare(signatures, [e["tables"] for e in everyone], everyone)
    me = communication.rank()
    for other, theirs in enumerate(everyone):
        for t, (mine, its) in enumerate(zip(combining, theirs["combining"])):
            for field in ("combiner", "weighted"):
                if mine[field] != its[field]:
                    what = "combiners" if field == "combiner" else "sp_weights (given or None)"
                    raise ValueError(f"lookup_sparse: the lookup of Embedding Variable "
                                     f"'{signatures[t]['name']}' (table {t} of the call) differs "
                                     f"across workers: {field} is {mine[field]!r} on worker {me} "
                                     f"({site}) but {its[field]!r} on worker {other} "
                                     f"({theirs['site']}); every worker must pass the same "
                                     f"{what}")
    for other, theirs in enumerate(everyone):
        for field, mine, how in (("exchange_dtype", exchange_dtype, "pass"),
                                 ("row_transport", row_transport, "set")):
            if theirs.get(field) != mine:
                what = "SOK_EV_ROW_TRANSPORT" if field == "row_transport" else field
                raise ValueError(f"lookup_sparse: {field} of the lookup of "
                                 f"{[s['name'] for s in signatures]} is {mine!r} on worker "
                                 f"{me} ({site}) but {theirs.get(field)!r} on worker {other} "
                                 f"({theirs['site']}); every worker must {how} the same {what}")
    _checked[key] = everyone[0].get("nccl_id")
    return _checked[key]


def _compare(signatures, theirs_by_worker, everyone):
    me = communication.rank()
    for other, theirs in enumerate(theirs_by_worker):
        if theirs == signatures:
            continue
        if len(theirs) != len(signatures):
            raise ValueError(f"lookup_sparse: worker {me} looks up {len(signatures)} tables "
                             f"({[s['name'] for s in signatures]}, {everyone[me]['site']}) but "
                             f"worker {other} looks up {len(theirs)} "
                             f"({[s['name'] for s in theirs]}, {everyone[other]['site']}) at "
                             "the same point; every worker must build the same Embedding "
                             "Variables and lookups, in the same order")
        for t, (mine, its) in enumerate(zip(signatures, theirs)):
            for field in ("name", "embedding_dim", "key_dtype", "target_gpu"):
                if mine[field] != its[field]:
                    raise ValueError(f"lookup_sparse: Embedding Variable '{mine['name']}' (table "
                                     f"{t} of the call) differs across workers: {field} is "
                                     f"{mine[field]!r} on worker {me} but {its[field]!r} on worker "
                                     f"{other}; every worker must build the same tables")


# --- Run time ------------------------------------------------------------------


def exchange_device(params):
    """The device a lookup's exchanges run on, decided once so that a stop
  message (`stop_everyone`) can match it: the GPU when a table is on one, the
  CPU when the tables are placed on it; unplaced tables (graph mode without a
  device scope) follow TensorFlow's default placement, the first GPU if there
  is one."""
    devices = [(v.device or "").upper() for v in params]
    if any("GPU" in d for d in devices):
        return "/GPU:0"
    if any(devices):
        return "/CPU:0"
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


def exchange_name(params, device):
    """The name of a lookup's first collective (keys to owners), which runs on
  `device` (`exchange_device`): unique among the lookups of one graph or
  function, the same on every worker, and known to `stop_everyone`."""
    graph = framework_ops.get_default_graph()
    ordinal = getattr(graph, "_sok_ev_exchanges", 0)
    graph._sok_ev_exchanges = ordinal + 1  # pylint: disable=protected-access
    name = f"sok_ev_keys_{ordinal}_{fingerprint(params):016x}"
    with _lock:
        _exchanges[None if tf.executing_eagerly() else name] = device
    return name


def stop_everyone(message, waiting_in=None):
    """Makes every worker fail instead of waiting: sends a "stopped" header to
  every exchange built on this worker (where the others may be waiting), then
  shuts Horovod down.

  Args:
    message: why, printed to stderr.
    waiting_in: None, or a function returning the names of the exchanges
      this worker itself waits in (sok_ev.exchange_watch): no header goes
      there (Horovod would refuse a second submission of the name), and the
      shutdown waits, within the grace time, until they ended (another
      worker's header ends them with an error naming their lookup).
  """
    print(f"sok-ev (worker {communication.rank()}): {message}", file=sys.stderr, flush=True)
    size = communication.world_size()
    me = communication.rank()
    rows = np.array([[STOPPED, 0]] * (size - 1), np.int64)
    splits = [0 if w == me else 1 for w in range(size)]
    own = set(waiting_in()) if waiting_in else set()
    with _lock:
        exchanges = [(name, device) for name, device in _exchanges.items() if name not in own]
    senders = []
    for name, device in exchanges:
        thread = threading.Thread(target=_send_quietly,
                                  args=(rows, splits, name, device),
                                  name="sok_ev_stop",
                                  daemon=True)
        thread.start()
        senders.append(thread)
    deadline = time.monotonic() + _STOP_GRACE_SECONDS
    for thread in senders:
        thread.join(max(0.0, deadline - time.monotonic()))
    while waiting_in and waiting_in() and time.monotonic() < deadline:
        time.sleep(0.05)
    communication.shutdown()


def _send_quietly(rows, splits, name, device):
    try:
        communication.alltoall_now(rows, splits, name=name, device=device)
    except Exception as error:  # pylint: disable=broad-except
        # Nobody waited in it (Horovod's shutdown ends it), or it could not
        # run: then the others stop at the shutdown, without the cause.
        if "shut down" not in str(error):
            print(
                f"sok-ev (worker {communication.rank()}): the stop message to exchange {name} "
                f"on {device} failed: {type(error).__name__}: {error}",
                file=sys.stderr,
                flush=True)
