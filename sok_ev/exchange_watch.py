"""A TF1-graph lookup that some workers run and others do not ends in an
error on every worker, never a hang.

Every worker may build a lookup that only some of them run: an evaluation
op built into the training graph everywhere but fetched on worker 0 only.
The build-time check (sok_ev.agreement.check_lookup) passes, and at run time
the workers wait in different key exchanges, which Horovod matches by name,
without limit.

So each key exchange of a lookup built in a tf.Graph (not in a tf.function,
whose graphs may be exported as SavedModels, which cannot hold Python
callbacks) is bracketed by two host callbacks: `started` just before it and
`ended` once its rows arrived. A watchdog thread looks at the exchanges this
worker waits in; when one has waited longer than SOK_EV_LOOKUP_CHECK_TIMEOUT
(sok_ev.agreement.check_timeout), this worker stops the job as a failed
build-time check does (sok_ev.agreement.stop_everyone): a "stopped" header
into every other exchange it built, where the other workers may be waiting
(theirs then fail with an InvalidArgumentError naming their lookup and this
worker), then a Horovod shutdown once its own exchange has ended. The
workers in the situation above each stop the other (a worker whose
exchange another's header ended as the time limit came, before its own
watchdog looked, stops the job too, from `ended`): every one fails within
the time limit, its error naming the lookup, and the watchdog's message
(stderr) names the lookup that waited, where it was built and for how long.

A worker that waits in a lookup longer than the time limit because another
is merely slow (a long evaluation or save of its own between steps) stops
the job too: the time limit must exceed the longest such wait. The
callbacks live in the process that built the graph: a meta graph of a
multi-worker lookup imported in another process cannot run them (TensorFlow
reports the callback missing); build the graph there again instead.
"""

import itertools
import sys
import threading
import time

import numpy as np
import tensorflow as tf

from sok_ev import agreement
from sok_ev import communication

# How often the watchdog looks, at most (at least 10 times a time limit).
_POLL_SECONDS = 0.5

_lock = threading.Lock()
_exchanges = []  # registered exchange index -> (exchange name, description)
_waiting = {}  # call id -> (exchange index, monotonic start)
_call_ids = itertools.count()
_watchdog = None
_stopped = False


def watched_in_graph():
    """Whether a lookup built now gets watched exchanges: in a tf.Graph, not a
  tf.function (or eagerly, where the build-time check meets every call)."""
    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    return not getattr(graph, "building_function", False)


def started(exchange, description):
    """A host op to run just before key exchange `exchange` (its name, as
  sok_ev.agreement.exchange_name gave it): records that this worker waits in
  it from then on. `description` names the lookup (its tables, where it was
  built) in the watchdog's message.

  Returns:
    int64 scalar, the call's id, for `ended`.
  """
    with _lock:
        index = len(_exchanges)
        _exchanges.append((exchange, description))
    with tf.device("/CPU:0"):
        return tf.numpy_function(_start, [np.int64(index)], tf.int64, stateful=True)


def ended(call, received):
    """A host op to run once the exchange's rows arrived: this worker no
  longer waits in it.

  Args:
    call: `started`'s output.
    received: the rows the exchange received, `[n, ...]` with n unknown while
      building (its shape, read on the host once they arrived, is all that is
      read; a known size would be folded to a constant, running too early).

  Returns:
    int64 scalar, for control dependencies.
  """
    arrived = tf.shape(received, out_type=tf.int64)
    with tf.device("/CPU:0"):
        return tf.numpy_function(_end, [call, arrived], tf.int64, stateful=True)


def _start(index):
    global _watchdog
    call = next(_call_ids)
    with _lock:
        _waiting[call] = (int(index), time.monotonic())
        if _watchdog is None:
            _watchdog = threading.Thread(target=_watch, name="sok_ev_exchange_watch", daemon=True)
            _watchdog.start()
    return np.int64(call)


def _end(call, unused_shape):
    with _lock:
        index, since = _waiting.pop(int(call), (None, None))
    # An exchange that ended as the time limit came may have been ended by
    # another worker's "stopped" header before this worker's watchdog
    # looked: this worker then stops the job too, so that the exchange the
    # other one waits in ends with an error naming its lookup.
    if index is not None:
        waited = time.monotonic() - since
        if waited > agreement.check_timeout() - 2 * _poll_seconds():
            _stop(waited, _exchanges[index][1])
    return np.int64(0)


def _waiting_in():
    """Names of the exchanges this worker waits in now."""
    with _lock:
        return {_exchanges[index][0] for index, _ in _waiting.values()}


def _poll_seconds():
    return min(_POLL_SECONDS, agreement.check_timeout() / 10)


def _watch():
    while not _stopped:
        time.sleep(_poll_seconds())
        timeout = agreement.check_timeout()
        now = time.monotonic()
        with _lock:
            late = [(now - since, _exchanges[index][1])
                    for index, since in _waiting.values()
                    if now - since > timeout]
        if late:
            _stop(*max(late))


def _stop(waited, description):
    """Stops the job once (sok_ev.agreement.stop_everyone), on a thread the
  interpreter waits for at exit, so the "stopped" headers go out even when
  this worker's own error ends its script first."""
    global _stopped
    with _lock:
        if _stopped:
            return
        _stopped = True
    timeout = agreement.check_timeout()
    message = (f"lookup_sparse: worker {communication.rank()} waited {waited:.1f} s in the "
               f"exchange of the lookup of {description}, which the other workers did not "
               f"run within {timeout:g} s: every worker must run the same sok-ev lookups in "
               "the same order (a graph-mode evaluation fetched on some workers only is a "
               "rank-dependent lookup; run it on every worker). "
               f"{agreement.TIMEOUT_VARIABLE} sets the time limit.")

    def stop():
        try:
            agreement.stop_everyone(message, waiting_in=_waiting_in)
        except Exception as error:  # pylint: disable=broad-except
            print(
                f"sok-ev (worker {communication.rank()}): stopping the job failed: "
                f"{type(error).__name__}: {error}",
                file=sys.stderr,
                flush=True)

    # Not a daemon, although the watchdog that may start it is one.
    threading.Thread(target=stop, name="sok_ev_stop_job", daemon=False).start()
