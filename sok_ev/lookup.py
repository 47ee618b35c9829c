"""`lookup_sparse`: grouped, SOK-style lookups over many Embedding Variables.

One call runs each stage once for all tables, each stage one native op:

  UniqueKeys -> (one worker)   FindOrInsertCombine
             -> (workers > 1)  sok_ev.distributed exchange -> CombineRowMessage

in two halves: route_batch (UniqueKeys, and with several workers the key
exchange: nothing that reads a table) and lookup_routed (the rest).
sok_ev.LookupPipeline runs the first half one batch ahead.

The ids come as one SparseTensor (or rank-2 RaggedTensor) per table, or
packed: one RaggedTensor [num_tables, batch, None] for all of them, which
UniquePackedKeys reads in place. A tf.function takes the packed form as 3
tensors however many tables there are; TensorFlow's handling of each
function argument (about 15 us per tensor on a CPU) otherwise costs more
than the lookup's own Python.

UniqueKeys checks the batch (rows in order and inside it, one weight per
value) before any table changes, deduplicates each table's keys and indexes
the entries by sample (row offsets) and by key (order, segments). The
backward pass, CombineBackward, sums each unique key's gradient over its
entries, so every Embedding Variable gets tf.IndexedSlices keyed by its raw
keys, deduplicated and summed; the optimizer applies them with one fused op.
"""

from typing import List, NamedTuple, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from sok_ev import communication
from sok_ev import embedding_gradients
from sok_ev import row_exchange
from sok_ev._ops import host_memory_input, ops
from sok_ev.embedding_variable import EmbeddingVariable
from sok_ev.partitioned_variable import PartitionedEmbeddingVariable

COMBINERS = ("sum", "mean", "sqrtn")

# Whether one worker runs the multi-worker pipeline (sok_ev.distributed, its
# collectives over Horovod with one rank: hvd.init() must have run) instead
# of the fused lookup. Off in training. The multi-worker tests and
# benchmarks/gpu/tf_weak_scaling.py turn it on to check that pipeline and to
# time its own work (everything but the transfers) on a single GPU.
exchange_on_one_worker = False


def _as_list(value, argument):
    if isinstance(value, (list, tuple)):
        return list(value)
    raise TypeError(f"lookup_sparse: {argument} must be a list, got "
                    f"{type(value).__name__}")


def _ragged_to_sparse(value):
    """What `value.to_sparse()` gives for a rank-2 RaggedTensor, from ops with
  GPU kernels: RaggedTensorToSparse has a CPU kernel only, so on a GPU the
  ids would cross to the host and back (3x the lookup of MLPerf's 14M ids a
  batch on an H200, 2026-11-29)."""
    rows = tf.cast(value.value_rowids(), tf.int64)
    splits = tf.cast(value.row_splits, tf.int64)
    columns = tf.range(tf.size(rows, out_type=tf.int64), dtype=tf.int64) - tf.gather(splits, rows)
    longest = tf.reduce_max(tf.concat([splits[1:] - splits[:-1], [0]], 0))
    return tf.SparseTensor(tf.stack([rows, columns], 1), value.values,
                           tf.stack([tf.shape(splits, out_type=tf.int64)[0] - 1, longest]))


def _as_sparse_tensor(value, argument, what):
    """A per-table SparseTensor from a SparseTensor or a rank-2 RaggedTensor."""
    if isinstance(value, tf.RaggedTensor):
        if value.ragged_rank != 1 or value.flat_values.shape.rank != 1:
            raise ValueError(f"lookup_sparse: {argument} must be a rank-2 tf.RaggedTensor "
                             f"([batch, None]), got shape {value.shape}")
        return _ragged_to_sparse(value)
    if not isinstance(value, tf.SparseTensor):
        raise TypeError(f"lookup_sparse: {argument} must be a tf.SparseTensor or "
                        f"tf.RaggedTensor{what}, got {type(value).__name__}")
    return value


def _check_packed(params, indices, sp_weights):
    """Validates a packed batch: one RaggedTensor [num_tables, batch, None]."""
    if indices.ragged_rank != 2 or indices.flat_values.shape.rank != 1:
        raise ValueError("lookup_sparse: indices as one tf.RaggedTensor must have shape "
                         f"[num_tables, batch, None] (ragged_rank 2), got shape {indices.shape} "
                         f"with ragged_rank {indices.ragged_rank}")
    num_tables = indices.shape[0]
    if num_tables is not None and num_tables != len(params):
        raise ValueError(f"lookup_sparse: indices packs {num_tables} tables but params has "
                         f"{len(params)}; its first dimension is the table")
    for t, variable in enumerate(params):
        if indices.dtype != variable.key_dtype:
            raise TypeError(f"lookup_sparse: indices has {indices.dtype.name} values, but "
                            f"Embedding Variable '{variable.name}' (params[{t}]) has key_dtype "
                            f"{variable.key_dtype.name}")
    if sp_weights is None:
        return None
    if not isinstance(sp_weights, tf.RaggedTensor) or sp_weights.ragged_rank != 2:
        raise TypeError("lookup_sparse: with indices packed in one tf.RaggedTensor, sp_weights "
                        "must be None or a tf.RaggedTensor of the same row splits, got "
                        f"{type(sp_weights).__name__}")
    if not sp_weights.dtype.is_floating:
        raise TypeError(f"lookup_sparse: sp_weights must have float values, got "
                        f"{sp_weights.dtype.name}")
    # Where known now (eagerly, constants): the same row splits at both levels.
    # Weights of another number fail in UniquePackedKeys, which names both.
    if sp_weights.flat_values.shape[:1] != indices.flat_values.shape[:1]:
        return sp_weights
    for level, (mine,
                theirs) in enumerate(zip(sp_weights.nested_row_splits, indices.nested_row_splits)):
        mine, theirs = _known(mine), _known(theirs)
        if mine is not None and theirs is not None and (mine.shape != theirs.shape or
                                                        not np.array_equal(mine, theirs)):
            raise ValueError("lookup_sparse: sp_weights must have the row splits of indices "
                             f"(each weight belongs to the id at its place), but its "
                             f"{('table', 'sample')[level]} row splits are {mine.tolist()[:8]} "
                             f"and the ids' {theirs.tolist()[:8]}")
    return sp_weights


def _check_arguments(params, indices, combiners, sp_weights):
    """Validates the arguments; returns (params, indices, combiners, weights):
  indices a list of SparseTensors, or the one packed RaggedTensor (then
  weights is None or a RaggedTensor, not a list)."""
    params = _as_list(params, "params")
    if not params:
        raise ValueError("lookup_sparse: params is empty; pass one Embedding "
                         "Variable per table")
    for t, variable in enumerate(params):
        if isinstance(variable, PartitionedEmbeddingVariable):
            raise TypeError(f"lookup_sparse: params[{t}] is a partitioned Embedding Variable "
                            f"('{variable.name}', {len(variable)} parts: made with a "
                            "partitioner); lookup_sparse takes unpartitioned ones, sharded over "
                            "the workers by target_gpu. Read it with "
                            "tf.nn.embedding_lookup_sparse, or drop the partitioner.")
        if not isinstance(variable, EmbeddingVariable):
            raise TypeError(f"lookup_sparse: params[{t}] must be an Embedding "
                            "Variable (sok_ev.get_embedding_variable), got "
                            f"{type(variable).__name__}")
    if combiners is None:
        combiners = ["mean"] * len(params)
    elif isinstance(combiners, str):
        combiners = [combiners] * len(params)
    combiners = _as_list(combiners, "combiners")
    if len(combiners) != len(params):
        raise ValueError(f"lookup_sparse: combiners has {len(combiners)} entries "
                         f"but params has {len(params)}")
    for t, combiner in enumerate(combiners):
        if combiner not in COMBINERS:
            raise ValueError(f"lookup_sparse: combiners[{t}] must be one of "
                             f"{COMBINERS}, got {combiner!r}")
    if isinstance(indices, tf.RaggedTensor):
        return params, indices, combiners, _check_packed(params, indices, sp_weights)
    indices = _as_list(indices, "indices")
    if len(indices) != len(params):
        raise ValueError(f"lookup_sparse: indices has {len(indices)} entries but "
                         f"params has {len(params)}; pass one SparseTensor per "
                         "Embedding Variable")
    if sp_weights is None:
        sp_weights = [None] * len(params)
    sp_weights = _as_list(sp_weights, "sp_weights")
    if len(sp_weights) != len(params):
        raise ValueError(f"lookup_sparse: sp_weights has {len(sp_weights)} entries "
                         f"but params has {len(params)}")
    indices = list(indices)
    for t, (variable, ids, weights) in enumerate(zip(params, indices, sp_weights)):
        ids = indices[t] = _as_sparse_tensor(ids, f"indices[{t}]", "")
        rank = ids.indices.shape[-1] if ids.indices.shape.rank == 2 else None
        if rank is not None and rank != 2:
            raise ValueError(f"lookup_sparse: indices[{t}] must have rank 2 "
                             f"([batch, max_hotness]), got rank {rank}")
        if ids.values.dtype != variable.key_dtype:
            raise TypeError(f"lookup_sparse: indices[{t}] has {ids.values.dtype.name} "
                            f"values, but Embedding Variable '{variable.name}' has "
                            f"key_dtype {variable.key_dtype.name}")
        if weights is not None:
            weights = sp_weights[t] = _as_sparse_tensor(weights, f"sp_weights[{t}]", " or None")
            if not weights.values.dtype.is_floating:
                raise TypeError(f"lookup_sparse: sp_weights[{t}] must have float "
                                f"values, got {weights.values.dtype.name}")
            _check_same_indices(t, ids, weights)
    return params, indices, combiners, sp_weights


def _known(tensor):
    """`tensor`'s value as a NumPy array when it is known without running
  anything (an eager tensor, a constant), else None."""
    try:
        return tf.get_static_value(tensor)
    except (TypeError, ValueError):
        return None


def _check_same_indices(t, ids, weights):
    """Refuses sp_weights[t] whose indices or dense shape differ from
  indices[t]'s where that is known now: eagerly, and for constants while a
  graph is built (the run-time check of the dense shapes and of the number
  of entries is _matching_weights').

  Raises:
    ValueError: naming sp_weights[t] and both values.
  """
    if weights.indices is ids.indices and weights.dense_shape is ids.dense_shape:
        return
    for field in ("dense_shape", "indices"):
        mine, theirs = getattr(weights, field), getattr(ids, field)
        if mine is theirs:
            continue
        if field == "dense_shape":
            # The batch: the last dimension (a RaggedTensor's longest row, or
            # max_hotness) does not change what is combined.
            mine, theirs = mine[:1], theirs[:1]
        if field == "indices" and not (mine.shape.is_compatible_with(theirs.shape)):
            raise ValueError(f"lookup_sparse: sp_weights[{t}] must have the indices of "
                             f"indices[{t}] (one weight per id), but its indices have shape "
                             f"{mine.shape} and the ids' {theirs.shape}")
        mine, theirs = _known(mine), _known(theirs)
        if mine is None or theirs is None:
            continue
        if mine.shape != theirs.shape or not np.array_equal(mine, theirs):
            if field == "dense_shape":
                detail = (f"a batch (dense_shape[0]) of {mine.tolist()}, but indices[{t}] has "
                          f"{theirs.tolist()}")
            else:
                differ = np.nonzero(np.any(mine != theirs,
                                           axis=-1))[0] if (mine.shape == theirs.shape) else [0]
                j = int(differ[0])
                detail = (f"indices {mine.shape[0]} x {mine.shape[-1]}, indices[{t}] "
                          f"{theirs.shape[0]} x {theirs.shape[-1]}" if mine.shape != theirs.shape
                          else f"at entry {j} index {mine[j].tolist()}, but indices[{t}] "
                          f"has {theirs[j].tolist()}")
            raise ValueError(f"lookup_sparse: sp_weights[{t}] must have the same indices and "
                             f"dense_shape as indices[{t}] (each weight belongs to the id at "
                             f"its index), got {detail}")


def _matching_weights(t, ids, weights):
    """sp_weights[t]'s values as float32, checked at run time against
  indices[t]: the same batch, dense_shape[0] (UniqueKeys checks one weight
  per id). Cheap: two host scalars."""
    values = tf.cast(weights.values, tf.float32)
    if weights.dense_shape is ids.dense_shape or tf.executing_eagerly():
        return values  # the same tensor, or compared by _check_same_indices
    with tf.device("/CPU:0"):
        check = tf.debugging.assert_equal(
            tf.cast(weights.dense_shape[0], tf.int64),
            tf.cast(ids.dense_shape[0], tf.int64),
            message=f"lookup_sparse: sp_weights[{t}] must have the batch (dense_shape[0]) of "
            f"indices[{t}] (each weight belongs to the id at its index)")
    with tf.control_dependencies([check]):
        return tf.identity(values)


def _check_placement(params):
    """One worker holds every table: target_gpu must be -1 or 0."""
    size = communication.world_size()
    for variable in params:
        if not -1 <= variable.target_gpu < size:
            raise ValueError(f"lookup_sparse: target_gpu of Embedding Variable '{variable.name}' "
                             f"must be -1 or in [0, {size}) for {size} worker(s), got "
                             f"{variable.target_gpu}")


@tf.autograph.experimental.do_not_convert
def lookup_sparse(
    params: Union[EmbeddingVariable, Sequence[EmbeddingVariable]],
    indices: Union[Sequence[Union[tf.SparseTensor, tf.RaggedTensor]], tf.SparseTensor,
                   tf.RaggedTensor] = None,
    combiners: Optional[Union[str, Sequence[str]]] = None,
    sp_weights: Optional[Union[Sequence[Optional[Union[tf.SparseTensor, tf.RaggedTensor]]],
                               tf.SparseTensor, tf.RaggedTensor]] = None,
    exchange_dtype: Union[tf.DType, str] = tf.float32,
    *,
    sp_ids=None,
) -> Union[List[tf.Tensor], tf.Tensor]:
    """Looks up and combines rows of many Embedding Variables in one call.

  Shapes: table t's ids are a `[batch_t, max_hotness]` batch whose values are
  keys (int32 or int64, the variable's key_dtype); rows may be ragged, and an
  empty row gives a zero vector. Absent keys are inserted with their initial
  values.

  SOK's call forms run unchanged: `lookup_sparse(params, sp_ids, sp_weights,
  combiners)` (NVIDIA SOK 2.x's order: the third argument is told apart by
  its kind, weights or combiner names), `sp_ids=` for `indices=`, and one
  Embedding Variable with one batch, which returns one tensor.

  Args:
    params: list of N Embedding Variables, or one (then `indices` is one
      batch and the result one tensor).
    indices: the ids (alias `sp_ids`), in one of two forms:
      - a list of N, each a `tf.SparseTensor` of rank 2 with rows in order
        (as tf.sparse.reorder leaves them) or a rank-2 `tf.RaggedTensor`;
      - packed: one `tf.RaggedTensor` of shape `[N, batch, None]`
        (ragged_rank 2; e.g. `tf.ragged.stack` of the N rank-2 batches), its
        dtype every variable's key_dtype. Table t's batch is `indices[t]`.
        A tf.function receives it as 3 tensors whatever N is, where a list
        costs 2-3 tensors per table.
    combiners: list of N of 'sum', 'mean', 'sqrtn', or one string for all;
      the meaning of tf.nn.embedding_lookup_sparse. Default 'mean' for every
      table, as SOK and tf.nn.embedding_lookup_sparse default.
    sp_weights: None, or weights in the form of `indices`: a list of N
      entries each None or a float SparseTensor (RaggedTensor) with the same
      indices (row splits) as `indices[t]`; packed, one float RaggedTensor
      with the row splits of `indices`. Weights receive no gradient.
    exchange_dtype: with more than one worker, what the looked-up rows and
      their gradients cross the network as: tf.float32 (default, exact),
      tf.bfloat16 or tf.float16 (half the bytes), as a tf.DType or its name.
      Each exchanged element (of a row another worker owns; a worker's own
      rows are not exchanged) is rounded to nearest (ties to even), so with
      `eps` = 2^-8 (bfloat16) or 2^-11 (float16) a combined row is within
      `eps * sum_j |w_j * v_j|` of the float32 result (scaled as the combiner
      scales), and so is each row's gradient. float16 also overflows to inf
      at |x| >= 65520 and rounds |x| < 2^-14 to multiples of 2^-24; bfloat16
      keeps float32's range. Tables, optimizer state and the result stay
      float32. Every worker must pass the same value. With one worker nothing
      is exchanged and it has no effect (still validated).
      See sok_ev.row_exchange.

  Returns:
    A list of N float32 tensors, `[batch_t, embedding_dim_t]` (one tensor
    when params is one Embedding Variable). A table whose result the loss
    does not use gets no gradient (None), as a dense variable would, in a
    tf.function or a TF1 graph; executing eagerly, and with several
    workers, it gets zeros for the keys it looked up (TensorFlow's eager
    tape, and the owners of the keys, cannot tell an unused result from a
    zero gradient), which lazy Adam and Momentum apply.

  Raises:
    TypeError: an argument of the wrong type or dtype (named in the message),
      or an exchange_dtype that is neither a tf.DType nor a string.
    ValueError: lists of different lengths, an unknown combiner, a
      SparseTensor or list RaggedTensor not of rank 2, a packed RaggedTensor
      not of shape [N, batch, None], a target_gpu outside [-1, world size),
      an exchange_dtype other than float32, bfloat16 and float16, or
      sp_weights whose indices, batch (dense_shape[0]) or row splits differ
      from the ids' (compared in full eagerly, and where both are known while
      a graph is built). Raised before any table changes.
    tf.errors.InvalidArgumentError: at run time, before any table changes:
      a SparseTensor of rank other than 2 (fed where its rank was unknown),
      rows out of order or outside the batch, a packed batch whose first
      dimension is not N or whose row splits are malformed, weights that do
      not match the ids (their number, or their batch).

  Example:
    >>> var = sok_ev.get_embedding_variable("var_0", embedding_dim=3)
    >>> ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], [7, 7, 42], [2, 2])
    >>> emb, = sok_ev.lookup_sparse([var], [ids], combiners=["mean"])
    >>> packed = tf.ragged.constant([[[7, 7], [42]], [[], [5]]], tf.int64)
    >>> a, b = sok_ev.lookup_sparse([var, var_1], packed)  # 2 tables, batch 2
  """
    single, params, indices, combiners, sp_weights = _sok_call_forms(params, indices, combiners,
                                                                     sp_weights, sp_ids)
    plan, batch = route_batch(params, indices, combiners, sp_weights, exchange_dtype)
    embeddings = lookup_routed(plan, batch)
    return embeddings[0] if single else embeddings


def _is_weights(value):
    """Whether `value` is sp_weights: sparse or ragged weights, or a list of
  them and Nones."""
    if isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
        return True
    return (isinstance(value, (list, tuple)) and bool(value) and
            all(v is None or isinstance(v, (tf.SparseTensor, tf.RaggedTensor)) for v in value))


def _is_names(value):
    """Whether `value` is combiners: a name, or a non-empty list of names."""
    return isinstance(value, str) or (isinstance(value, (list, tuple)) and bool(value) and
                                      all(isinstance(v, str) for v in value))


def _sok_call_forms(params, indices, combiners, sp_weights, sp_ids):
    """lookup_sparse's arguments in its own form, from any of SOK's: returns
  (single, params, indices, combiners, sp_weights), single telling whether
  one Embedding Variable was passed (its result is then one tensor)."""
    if sp_ids is not None:
        if indices is not None:
            raise TypeError("lookup_sparse: pass the ids once, as indices or as sp_ids, "
                            "not both")
        indices = sp_ids
    if indices is None:
        raise TypeError("lookup_sparse: missing the ids (indices, or sp_ids as SOK names them)")
    # SOK's order is (params, sp_ids, sp_weights, combiners): the two are
    # swapped when what came as one is plainly the other.
    if ((_is_names(sp_weights) and not _is_names(combiners)) or
        (_is_weights(combiners) and not _is_weights(sp_weights))):
        combiners, sp_weights = sp_weights, combiners
    single = isinstance(params, EmbeddingVariable)
    if single:
        if not isinstance(indices, (tf.SparseTensor, tf.RaggedTensor)):
            raise TypeError("lookup_sparse: with params one Embedding Variable, indices must be "
                            f"one tf.SparseTensor or tf.RaggedTensor, got {type(indices).__name__}")
        params, indices = [params], [indices]
        if sp_weights is not None and not isinstance(sp_weights, (list, tuple)):
            sp_weights = [sp_weights]
    return single, params, indices, combiners, sp_weights


class LookupPlan(NamedTuple):
    """What a lookup knows when it is built (route_batch's), the same for
  every batch: its tables, combiners, weighted flags (N each),
  exchange_dtype, whether it exchanges rows between workers, and the NCCL id
  of its native row exchange (None: Horovod's, or no exchange)."""
    params: list
    combiners: list
    weighted: list
    exchange_dtype: tf.DType
    distributed: bool
    communicator: Optional[str]


class RoutedBatch(NamedTuple):
    """A batch after lookup_sparse's key stages, before any table is read: the
  tensors the rest of the lookup needs (sok_ev.LookupPipeline stages them
  between steps).

  keys, counts: N each, the unique keys and their occurrences (one worker;
    empty lists when the keys are routed).
  unique_index, order, segments, row_offsets, weights: N each, how the rows
    of the unique keys make each sample's embedding (UniqueKeys').
  routing: None with one worker; else the keys routed to their owners
    (sok_ev.distributed.KeyRouting).
  """
    keys: list
    counts: list
    unique_index: list
    order: list
    segments: list
    row_offsets: list
    weights: list
    routing: object


def route_batch(params, indices, combiners=None, sp_weights=None, exchange_dtype=tf.float32):
    """lookup_sparse's stages that read no table: the arguments checked, each
  table's keys deduplicated (UniqueKeys) and, with several workers, routed to
  their owners (sok_ev.distributed.route_keys: the key exchange).

  Args and Raises: as lookup_sparse (collective the same way).

  Returns:
    (LookupPlan, RoutedBatch), lookup_routed's arguments.
  """
    params, indices, combiners, sp_weights = _check_arguments(params, indices, combiners,
                                                              sp_weights)
    exchange_dtype = row_exchange.check_exchange_dtype(exchange_dtype)
    _check_placement(params)
    with tf.name_scope("sok_ev_route_batch"):
        if isinstance(indices, tf.RaggedTensor):
            weighted = [sp_weights is not None] * len(params)
            (unique_keys, counts, unique_index, order, segments, row_offsets,
             weights) = _unique_packed_keys(indices, sp_weights, weighted)
        else:
            weighted = [w is not None for w in sp_weights]
            weights = [
                tf.zeros([0], tf.float32) if w is None else _matching_weights(t, ids, w)
                for t, (ids, w) in enumerate(zip(indices, sp_weights))
            ]
            (unique_keys, counts, unique_index, order, segments,
             row_offsets) = ops().sok_ev_unique_keys(
                 [ids.values for ids in indices], [ids.indices for ids in indices],
                 weights, [host_memory_input(ids.dense_shape, tf.int64) for ids in indices],
                 weighted=weighted)
        combine = [list(x) for x in (unique_index, order, segments, row_offsets, weights)]
        if communication.world_size() == 1 and not exchange_on_one_worker:
            return (LookupPlan(params, combiners, weighted, exchange_dtype, False,
                               None), RoutedBatch(list(unique_keys), list(counts), *combine, None))
        from sok_ev import distributed  # pylint: disable=import-outside-toplevel
        routing, communicator = distributed.route_keys(params,
                                                       unique_keys,
                                                       counts,
                                                       exchange_dtype,
                                                       combiners=combiners,
                                                       weighted=weighted)
        return (LookupPlan(params, combiners, weighted, exchange_dtype, True,
                           communicator), RoutedBatch([], [], *combine, routing))


def lookup_routed(plan, batch):
    """lookup_sparse's stages from the tables on: each sample's embeddings
  from the rows of a routed batch (with several workers, the owners' lookups
  and the row exchange: collective, every worker calls it for the batch it
  routed).

  Args:
    plan, batch: route_batch's outputs (the batch possibly staged and
      unstaged since: sok_ev.LookupPipeline).

  Returns:
    As lookup_sparse: N float32 `[batch_t, embedding_dim_t]`.
  """
    params = plan.params
    for variable in params:
        variable._record_access()  # pylint: disable=protected-access
    with tf.name_scope("sok_ev_lookup_sparse"):
        if not plan.distributed:
            return ops().sok_ev_find_or_insert_combine(
                [v.handle for v in params],
                batch.keys,
                batch.counts,
                batch.unique_index,
                batch.order,
                batch.segments,
                batch.row_offsets,
                batch.weights,
                embedding_dims=[v.embedding_dim for v in params],
                combiners=plan.combiners,
                weighted=plan.weighted)
        from sok_ev import distributed  # pylint: disable=import-outside-toplevel
        combine = row_exchange.Combine(batch.unique_index, batch.order, batch.segments,
                                       batch.row_offsets, batch.weights, plan.combiners,
                                       plan.weighted)
        return distributed.lookup_routed(params, batch.routing, combine, plan.communicator,
                                         plan.exchange_dtype)


def _unique_packed_keys(indices, sp_weights, weighted):
    """UniquePackedKeys over the RaggedTensor [num_tables, batch, None]."""
    row_splits = tf.cast(indices.values.row_splits, tf.int64)
    table_splits = tf.cast(indices.row_splits, tf.int64)
    # Each table's first key. Clipped so that a malformed table_splits
    # reaches the kernel's check (which names it) rather than Gather's.
    entry_splits = tf.gather(
        row_splits, tf.clip_by_value(table_splits, 0,
                                     tf.size(row_splits, out_type=tf.int64) - 1))
    weights = (tf.zeros([0], tf.float32) if sp_weights is None else tf.cast(
        sp_weights.flat_values, tf.float32))
    return ops().sok_ev_unique_packed_keys(indices.flat_values,
                                           row_splits,
                                           host_memory_input(table_splits, tf.int64),
                                           host_memory_input(entry_splits, tf.int64),
                                           weights,
                                           N=len(weighted),
                                           weighted=weighted)


def _combine_gradient_inputs(op, grads, first):
    """The inputs of the backward of the combining op `op`, whose per-table
  inputs unique_index, order, segments, row_offsets, weights start at input
  index `first`: its outputs' gradients (zeros where None) and those five
  lists."""
    n = op.get_attr("N")
    grads = [tf.zeros_like(out) if g is None else g for g, out in zip(grads, op.outputs)]
    return grads, [op.inputs[first + k * n:first + (k + 1) * n] for k in range(5)]


def _combine_backward(op, grads, first):
    """CombineBackward of the combining op `op` (_combine_gradient_inputs)."""
    grads, pieces = _combine_gradient_inputs(op, grads, first)
    return ops().sok_ev_combine_backward(grads,
                                         *pieces,
                                         combiners=op.get_attr("combiners"),
                                         weighted=op.get_attr("weighted"))


@tf.RegisterGradient("SokEv>FindOrInsertCombine")
def _find_or_insert_combine_gradient(op, *grads):
    """Each table gets IndexedSlices keyed by its unique keys (input N + t),
  which `sok_ev.optimizers` recognises as distinct; a table whose result has
  no gradient gets None, as a dense variable would (a zero gradient would
  still move its rows under Adam or Momentum)."""
    n = op.get_attr("N")
    # inputs: resources, unique_keys, counts, unique_index, order, segments,
    # row_offsets, weights (N each)
    grad_unique = _combine_backward(op, grads, first=3 * n)
    keys = op.inputs[n:2 * n]
    return [
        None if _unused(g, out) else embedding_gradients.keyed_gradient(u, k, after=op)
        for g, out, u, k in zip(grads, op.outputs, grad_unique, keys)
    ] + [None] * (7 * n)


def _unused(grad, output):
    """Whether `grad`, the gradient reaching the lookup result `output`, says
  the loss does not use it: None (tf.gradients, a TF1 optimizer), or the
  zeros a GradientTape fills in for an unused result inside a tf.function
  (ZerosLike of that very result). Eagerly the tape fills in a cached zero
  tensor, which cannot be told from a zero gradient, so it counts as one."""
    if grad is None:
        return True
    op = getattr(grad, "op", None)
    return (not tf.executing_eagerly() and op is not None and op.type == "ZerosLike" and
            op.inputs[0].name == output.name)


@tf.RegisterGradient("SokEv>FindOrInsert")
def _find_or_insert_gradient(op, *grads):
    """Each table's rows get IndexedSlices keyed by the looked-up keys."""
    n = op.get_attr("N")
    keys = op.inputs[n:2 * n]
    table_grads = [
        None if g is None else embedding_gradients.keyed_gradient(g, k, after=op)
        for g, k in zip(grads, keys)
    ]
    return table_grads + [None] * (2 * n)


@tf.RegisterGradient("SokEv>CombineForward")
def _combine_forward_gradient(op, *grads):
    n = op.get_attr("N")
    # inputs: unique_values, unique_index, order, segments, row_offsets,
    # weights (N each)
    return list(_combine_backward(op, grads, first=n)) + [None] * (5 * n)


@tf.RegisterGradient("SokEv>CombineRowMessage")
def _combine_row_message_gradient(op, *grads):
    """The gradients of the message and of the local rows: each unique key's
  gradient (CombineBackward's) written where its row arrived
  (CombineRowMessageGrad), the layout the rows' all-to-all sends back."""
    n, num_local = op.get_attr("N"), op.get_attr("L")
    # inputs: message, counts, positions (N), local (L), then unique_index,
    # order, segments, row_offsets, weights (N each)
    grads, pieces = _combine_gradient_inputs(op, grads, first=2 + n + num_local)
    grad_message, grad_local = ops().sok_ev_combine_row_message_grad(
        grads,
        op.inputs[1],
        op.inputs[2:2 + n],
        *pieces,
        dims=op.get_attr("dims"),
        combiners=op.get_attr("combiners"),
        weighted=op.get_attr("weighted"),
        local_worker=op.get_attr("local_worker"))
    return [grad_message, None] + [None] * n + list(grad_local)[:num_local] + [None] * (5 * n)


for _op_name in ("SokEv>UniqueKeys", "SokEv>UniquePackedKeys", "SokEv>UniqueOwnedKeys",
                 "SokEv>PartitionByOwner", "SokEv>CombineBackward", "SokEv>CombineRowMessageGrad"):
    tf.no_gradient(_op_name)
