"""`LookupPipeline`: lookup_sparse with the next batch's keys routed while
this batch trains (issue 12's pipelining; TorchRec's sparse-dist train
pipeline and DeepRec's `tf.staged` run their input stages ahead the same
way).

lookup_sparse has two kinds of stages (sok_ev.lookup):
  route_batch    reads only the batch: UniqueKeys, and with several workers
                 the key exchange and the owners' deduplication
                 (sok_ev.distributed.route_keys). Each op of it ends in a
                 host sync, and the key exchange waits for every worker.
  lookup_routed  from the tables on: the owners' lookups, the row exchange,
                 the combines, and their gradients.
A pipeline runs route_batch one batch ahead: a step looks up batch i, routed
by the step before, while it routes batch i+1, so the routing's host syncs
and key exchange leave the step's chain. The results are lookup_sparse's,
bit for bit: the tables are read and written only by the lookup half, in
step order.

Between steps the routed tensors wait in TensorFlow's staging areas (the
Stage and Unstage ops): on the lookup's device, where they stay in place
(GPU memory on a GPU), and on the CPU for what the row stages read on the
host (the counts) and for `extras`, the batch's other tensors (labels,
dense features), which come out with their batch.

Graph mode (a tf.compat.v1.Session), where the routing runs beside the step:

  pipeline = sok_ev.LookupPipeline(params, combiners=["sum"] * N)
  batch = iterator.get_next()                 # ids: N SparseTensors, labels
  fill = pipeline.prefetch(batch["ids"], extras=batch["labels"])
  embeddings, labels = pipeline.lookup()      # the batch prefetched before
  train = optimizer.minimize(loss(embeddings, labels))
  step = tf.group(train, pipeline.prefetch(batch["ids"], extras=batch["labels"]))
  sess.run(fill)                              # batch 0 routed
  sess.run(step) ...                          # trains batch i, routes i + 1
  sess.run(train)                             # the last batch: no routing

In a tf.function TensorFlow runs stateful ops (Stage, the exchanges) in
program order, so a prefetch built after the step's backward pass overlaps
only the updates; the results are the same.
"""

import itertools
import weakref

import tensorflow as tf
from tensorflow.python.framework import ops as framework_ops

from sok_ev import agreement
from sok_ev import distributed
from sok_ev import lookup as lookup_module
from sok_ev import optimizers
from sok_ev import row_exchange
from sok_ev.embedding_variable import EmbeddingVariable

_HOST_DEVICE = "/CPU:0"
_ordinals = itertools.count()
# Name -> the live pipeline staging under it: two sharing a name would take
# each other's batches.
_pipelines = weakref.WeakValueDictionary()


class LookupPipeline:
    """lookup_sparse of a fixed set of tables, one batch routed ahead.

  Each prefetch() routes a batch and stages it; each lookup() takes the
  oldest staged batch (first in, first out) and returns its embeddings,
  which equal `sok_ev.lookup_sparse(params, indices, combiners, sp_weights,
  exchange_dtype)` of that batch at the time lookup() runs.

  Collective like lookup_sparse: with several workers every worker runs the
  same prefetches and lookups in the same order (prefetch runs the key
  exchange, lookup the row exchange).
  """

    def __init__(self, params, combiners=None, exchange_dtype=tf.float32, name=None):
        """Args:
      params: list of N Embedding Variables, as lookup_sparse's.
      combiners: as lookup_sparse's (default "mean" for every table).
      exchange_dtype: as lookup_sparse's.
      name: the staging areas' name (default: one per pipeline of this
        process). Two pipelines must not share one.

    Raises:
      TypeError, ValueError: params or exchange_dtype as lookup_sparse
        would refuse them (combiners are checked with each batch, as
        lookup_sparse checks them), or a name another live pipeline has.
    """
        if not isinstance(params, (list, tuple)) or not params:
            raise ValueError(f"LookupPipeline: params must be a non-empty list of Embedding "
                             f"Variables, got {params!r}")
        for t, variable in enumerate(params):
            if not isinstance(variable, EmbeddingVariable):
                raise TypeError(f"LookupPipeline: params[{t}] must be an Embedding Variable "
                                f"(sok_ev.get_embedding_variable), got {type(variable).__name__}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"LookupPipeline: name must be a non-empty string, got {name!r}")
        self._params = list(params)
        self._combiners = combiners
        self._exchange_dtype = row_exchange.check_exchange_dtype(exchange_dtype, "LookupPipeline")
        self._name = name or f"sok_ev_lookup_pipeline_{next(_ordinals)}"
        if _pipelines.get(self._name) is not None:
            raise ValueError(f"LookupPipeline: name {self._name!r} is taken by another "
                             "LookupPipeline of this process; give each its own")
        _pipelines[self._name] = self
        self._device = agreement.exchange_device(self._params)
        # Set by the first prefetch: the plan, the staged dtypes and the
        # extras' structure, which every later batch must match.
        self._plan = None
        self._layout = None
        # Per graph (a tf.Graph or a tf.function's), the Unstage ops built in
        # it: a later prefetch in that graph stages after them.
        self._unstaged = weakref.WeakKeyDictionary()

    @property
    def name(self):
        """The staging areas' name."""
        return self._name

    def prefetch(self, indices, sp_weights=None, extras=None):
        """Routes a batch and stages it for a later lookup().

    Args:
      indices: the batch's ids, as lookup_sparse's (N SparseTensors or
        rank-2 RaggedTensors, or one packed RaggedTensor).
      sp_weights: as lookup_sparse's.
      extras: None, a tensor, or a nested structure (list, tuple, dict) of
        tensors of the same batch, returned by the lookup() of this batch.

    Returns:
      The staging op (graph mode: run it, e.g. grouped with the training
      op; eagerly it has run).

    Raises:
      TypeError: an element of extras that is not a tensor (nor convertible
        to one).
      TypeError, ValueError: as lookup_sparse; or a batch whose form
        differs from the first prefetched one (weighted or not, packed or
        not, the extras' structure or dtypes), naming what differs.
    """
        # The extras first: a refused batch routes nothing (eagerly, routing
        # runs the key exchange).
        extra_values = [] if extras is None else [
            _extra_tensor(x, self._name) for x in tf.nest.flatten(extras)
        ]
        extras_form = (None if extras is None else tf.nest.map_structure(lambda _: 0, extras),
                       [v.dtype for v in extra_values])
        if self._layout is not None and extras_form != self._layout[1:]:
            raise ValueError(f"LookupPipeline '{self._name}': extras has structure "
                             f"{extras_form[0]} and dtypes {[d.name for d in extras_form[1]]}, but "
                             f"the first prefetched batch had {self._layout[1]} and "
                             f"{[d.name for d in self._layout[2]]}")
        plan, batch = lookup_module.route_batch(self._params, indices, self._combiners, sp_weights,
                                                self._exchange_dtype)
        device_part, host_part = _parts(batch)
        device_values = [t for t in tf.nest.flatten(device_part) if t is not None]
        host_values = tf.nest.flatten(host_part)
        # The batch's structure with each tensor's dtype (None where a field is
        # None), and the extras'.
        layout = (tf.nest.map_structure(lambda t: None if t is None else t.dtype,
                                        (device_part, host_part)), *extras_form)
        if self._plan is None:
            self._plan, self._layout = plan, layout
        else:
            self._check_same_form(plan, layout)
        after = self._unstaged.get(framework_ops.get_default_graph(), [])
        # An empty staged tuple is not allowed: the host side always carries a
        # count of tables.
        host_values = host_values + extra_values + [tf.constant(len(self._params), tf.int64)]
        with tf.name_scope("sok_ev_lookup_pipeline_prefetch"), tf.control_dependencies(after):
            with tf.device(self._device):
                staged = tf.raw_ops.Stage(values=device_values, shared_name=self._name)
            with tf.device(_HOST_DEVICE), tf.control_dependencies([staged]):
                return tf.raw_ops.Stage(values=host_values, shared_name=self._name + "_host")

    def lookup(self):
        """The embeddings of the oldest prefetched batch, and its extras.

    Returns:
      (N float32 tensors `[batch_t, embedding_dim_t]`, as lookup_sparse
      returns them and differentiable the same way; the batch's extras, in
      the structure given to prefetch, or None).

    Raises:
      ValueError: prefetch() was never called (nothing says what to
        unstage).
      tf.errors.InvalidArgumentError: at run time, no prefetched batch is
        waiting (instead of waiting for one forever).
    """
        if self._plan is None:
            raise ValueError(f"LookupPipeline '{self._name}': lookup() before any prefetch(); "
                             "prefetch a batch first (it defines what lookup() takes)")
        (device_form, host_form), extras_structure, extra_dtypes = self._layout
        device_dtypes = [d for d in tf.nest.flatten(device_form) if d is not None]
        host_dtypes = tf.nest.flatten(host_form) + extra_dtypes + [tf.int64]
        with tf.name_scope("sok_ev_lookup_pipeline_lookup"):
            with tf.device(self._device):
                waiting = tf.raw_ops.StageSize(dtypes=device_dtypes, shared_name=self._name)
            check = tf.debugging.assert_positive(
                waiting,
                message=f"LookupPipeline '{self._name}': lookup() found no prefetched batch; "
                "run a prefetch() for every lookup(), the first one before it")
            with tf.control_dependencies([check]):
                with tf.device(self._device):
                    device_values = tf.raw_ops.Unstage(dtypes=device_dtypes, shared_name=self._name)
                with tf.device(_HOST_DEVICE):
                    host_values = tf.raw_ops.Unstage(dtypes=host_dtypes,
                                                     shared_name=self._name + "_host")
        if not tf.executing_eagerly():
            graph = framework_ops.get_default_graph()
            self._unstaged.setdefault(graph, []).extend([device_values[0].op, host_values[0].op])
        host_values = list(host_values)[:-1]
        num_host = len(tf.nest.flatten(host_form))
        batch = _join(device_form, host_form, device_values, host_values[:num_host])
        extras = (None if extras_structure is None else tf.nest.pack_sequence_as(
            extras_structure, host_values[num_host:]))
        return lookup_module.lookup_routed(self._plan, batch), extras

    def _check_same_form(self, plan, layout):
        """Fails unless a routed batch is staged as the first one was (its
    extras are checked before it is routed)."""
        first = self._plan
        if plan.weighted != first.weighted:
            raise ValueError(f"LookupPipeline '{self._name}': sp_weights gives weighted tables "
                             f"{plan.weighted}, but the first prefetched batch gave "
                             f"{first.weighted}; every batch must weight the same tables")
        if layout != self._layout:
            raise ValueError(f"LookupPipeline '{self._name}': indices has another form than "
                             "in the first prefetched batch (packed or not, or other dtypes); "
                             "every batch must come in the same form")


def _extra_tensor(value, name):
    """An element of prefetch's extras as a tensor, or a TypeError naming it."""
    try:
        return tf.convert_to_tensor(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"LookupPipeline '{name}': extras must hold tensors (or values "
                        f"tf.convert_to_tensor takes), got {value!r} of type "
                        f"{type(value).__name__}") from error


def _parts(batch):
    """A RoutedBatch as (the batch with the fields the row stages read on the
  host set to None, {field: tensor} of those fields): what stays on the
  lookup's device, and what is staged on the CPU (nothing with one worker)."""
    if batch.routing is None:
        return batch, {}
    host = {name: getattr(batch.routing, name) for name in distributed.HOST_FIELDS}
    return batch._replace(routing=batch.routing._replace(**dict.fromkeys(host))), host


def _join(device_form, host_form, device_values, host_values):
    """_parts' inverse, from the unstaged tensors: each non-None leaf of
  device_form (a dtype) takes the next device value, host_form's the host
  values. The unique keys are marked distinct (they are UniqueKeys' or
  UniqueOwnedKeys' as staged), so the fused apply skips deduplicating them."""
    values = iter(device_values)
    batch = tf.nest.map_structure(lambda d: None if d is None else next(values), device_form)
    if host_form:
        host = tf.nest.pack_sequence_as(host_form, list(host_values))
        batch = batch._replace(routing=batch.routing._replace(**host))
    if not tf.executing_eagerly():
        for tensor in batch.keys if batch.routing is None else batch.routing.owned[0]:
            optimizers.mark_distinct_keys(tensor)
    return batch
