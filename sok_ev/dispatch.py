"""`tf.nn.embedding_lookup`, `tf.nn.embedding_lookup_sparse` and
`tf.nn.safe_embedding_lookup_sparse` on Embedding Variables.

Nearly all DeepRec code reads Embedding Variables through these three calls
(and their tf.compat.v1 forms). `install_lookup_dispatch()` (run by
`sok_ev.init()` and `sok_ev.install_deeprec_api()`) registers the functions
below with TensorFlow's type-based dispatch (`tf.experimental.
dispatch_for_api`), so each of the six APIs runs them when `params` is an
Embedding Variable, a list of them, or a partitioned one
(sok_ev.PartitionedEmbeddingVariable). Every lookup goes through
`sok_ev.lookup_sparse`: missing keys are inserted (DeepRec's training
lookup), the tables may be sharded over workers, and the gradient reaches
the Embedding Variable as IndexedSlices keyed by its raw keys. Several
Embedding Variables are the parts of one, as DeepRec reads a partitioned
Embedding Variable (or a list of them): key k goes, unchanged, to part
(k mod 1000) mod N, whatever the partition_strategy
(sok_ev.partitioned_variable).

The results equal TensorFlow's on a dense `tf.Variable` holding the same
rows, with these DeepRec semantics:
* ids are raw keys of the table's key_dtype; int32 ids into an int64 table
  are widened.
* embedding_lookup_sparse returns, as TensorFlow does, one row per sample up
  to the last sample that has an id (trailing empty samples are dropped).
* safe_embedding_lookup_sparse drops ids < 0 (and weights <= 0 unless
  combiner is "sum"), as TensorFlow and DeepRec do; an empty sample gives
  zeros without looking up any key, or the row of `default_id` if given.
* sp_weights get no gradient (as in sok_ev.lookup_sparse).
"""

import typing

import tensorflow as tf
from tensorflow.python.util import dispatch as tf_dispatch

from sok_ev import lookup
from sok_ev import partitioned_variable
from sok_ev.embedding_variable import EmbeddingVariable
from sok_ev.partitioned_variable import PartitionedEmbeddingVariable

COMBINERS = ("mean", "sqrtn", "sum")

# What `params` may be for the dispatch to apply.
_PARAMS = typing.Union[EmbeddingVariable, typing.List[EmbeddingVariable],
                       PartitionedEmbeddingVariable]

_installed = []


def _tables(params, api):
    """The Embedding Variables in `params` (one, a list, or a partitioned
  one's parts), checked to be parts of one table: the same embedding_dim
  and key_dtype."""
    tables = list(params) if isinstance(params,
                                        (list, tuple, PartitionedEmbeddingVariable)) else [params]
    if not tables:
        raise ValueError(f"{api}: params is empty; pass an Embedding Variable")
    for i, table in enumerate(tables):
        if not isinstance(table, EmbeddingVariable):
            raise TypeError(f"{api}: params[{i}] is a {type(table).__name__}; params holding "
                            "an Embedding Variable must hold Embedding Variables only")
        if (table.embedding_dim, table.key_dtype) != (tables[0].embedding_dim, tables[0].key_dtype):
            raise ValueError(f"{api}: the parts of params differ: '{tables[0].name}' has "
                             f"embedding_dim {tables[0].embedding_dim} and key_dtype "
                             f"{tables[0].key_dtype.name}, '{table.name}' "
                             f"{table.embedding_dim} and {table.key_dtype.name}")
    return tables


def _rows(tables, keys, max_norm):
    """Each key's row, `shape(keys) + [embedding_dim]`, from one table or
  from the parts of a partitioned one."""
    if len(tables) == 1:
        return embedding_lookup(tables[0], keys, max_norm=max_norm)
    flat = tf.reshape(keys, [-1])
    parts = partitioned_variable.part_of_keys(flat, len(tables))
    positions = tf.range(tf.size(flat))
    keys_by_part = tf.dynamic_partition(flat, parts, len(tables))
    positions_by_part = tf.dynamic_partition(positions, parts, len(tables))
    rows = [
        embedding_lookup(table, part_keys, max_norm=max_norm)
        for table, part_keys in zip(tables, keys_by_part)
    ]
    dim = tables[0].embedding_dim
    out = tf.reshape(tf.dynamic_stitch(positions_by_part, rows),
                     tf.concat([tf.shape(keys), [dim]], 0))
    out.set_shape(keys.shape.concatenate([dim]))
    return out


def _keys(table, ids, api, argument):
    """`ids` as keys of `table`: its key_dtype (int32 widened into int64)."""
    ids = tf.convert_to_tensor(ids, name=argument)
    if ids.dtype == tf.int32 and table.key_dtype == tf.int64:
        return tf.cast(ids, tf.int64)
    if ids.dtype != table.key_dtype:
        raise TypeError(f"{api}: {argument} has dtype {ids.dtype.name}, but Embedding Variable "
                        f"'{table.name}' has key_dtype {table.key_dtype.name}")
    return ids


def _as_sparse(sp, api, argument):
    """A SparseTensor from a SparseTensor or a rank-2 RaggedTensor (None stays None)."""
    if sp is None or isinstance(sp, tf.SparseTensor):
        return sp
    if isinstance(sp, tf.RaggedTensor):
        return sp.to_sparse()
    raise TypeError(f"{api}: {argument} must be a tf.SparseTensor or tf.RaggedTensor, got "
                    f"{type(sp).__name__}")


def _check_combiner(combiner, api):
    if combiner not in COMBINERS:
        raise ValueError(f"{api}: combiner must be one of 'mean', 'sqrtn' or 'sum', got "
                         f"{combiner!r}")


def _combine(tables, sample_ids, keys, weights, combiner, num_samples, max_norm):
    """Looks up `keys` and combines them per sample: `[num_samples, dim]`.

  Args:
    tables: one Embedding Variable, or the parts of a partitioned one.
    sample_ids: `[nnz]` int64, sorted: the sample each key belongs to.
    keys: `[nnz]` keys of the table's key_dtype.
    weights: None or `[nnz]` float weights.
    num_samples: int64 scalar; samples without keys give zeros.
    max_norm: None, or clip each looked-up row to this l2 norm before
      combining (tf.nn's max_norm).
  """
    nnz = tf.size(keys, out_type=tf.int64)
    if max_norm is not None or len(tables) > 1:
        # TensorFlow's own combine over the (clipped) rows of the unique keys.
        unique_keys, index = tf.unique(keys, out_idx=tf.int64)
        rows = _rows(tables, unique_keys, max_norm)
        positions = tf.stack([sample_ids, tf.range(nnz)], axis=1)
        shape = tf.stack([num_samples, tf.maximum(nnz, 1)])
        out = tf.nn.embedding_lookup_sparse(
            rows,
            tf.SparseTensor(positions, index, shape),
            None if weights is None else tf.SparseTensor(positions, weights, shape),
            combiner=combiner)
        return tf.pad(out, [[0, num_samples - tf.shape(out, out_type=tf.int64)[0]], [0, 0]])
    # The position of each key within its sample, so the SparseTensor is a
    # well-formed [num_samples, max_hotness] batch.
    hotness = tf.math.unsorted_segment_sum(tf.ones_like(sample_ids), sample_ids, num_samples)
    first = tf.cumsum(hotness, exclusive=True)
    indices = tf.stack([sample_ids, tf.range(nnz) - tf.gather(first, sample_ids)], axis=1)
    shape = tf.stack([num_samples, tf.maximum(tf.reduce_max(tf.concat([hotness, [1]], 0)), 1)])
    sp_weights = None if weights is None else tf.SparseTensor(indices, tf.cast(weights, tf.float32),
                                                              shape)
    return lookup.lookup_sparse([tables[0]], [tf.SparseTensor(indices, keys, shape)], [combiner],
                                [sp_weights])[0]


def _in_order(ids, weights):
    """`ids` and `weights` (None, or the same indices) in row-major order."""
    position = tf.sparse.reorder(
        tf.SparseTensor(ids.indices, tf.range(tf.size(ids.values, out_type=tf.int64)),
                        ids.dense_shape))

    def reordered(sp):
        return tf.SparseTensor(position.indices, tf.gather(sp.values, position.values),
                               sp.dense_shape)

    return reordered(ids), None if weights is None else reordered(weights)


# --- The three lookups, with TensorFlow 2's signatures ------------------------


@tf.autograph.experimental.do_not_convert
def embedding_lookup(params, ids, max_norm=None, name=None):
    """`tf.nn.embedding_lookup` for an Embedding Variable.

  Args:
    params: an Embedding Variable, a list of them or a
      PartitionedEmbeddingVariable (the parts of one).
    ids: int32/int64 keys of any shape `S`, or a tf.RaggedTensor of them.
    max_norm: None, or clip each row to this l2 norm.
    name: the name scope.

  Returns:
    float32 `S + [embedding_dim]`: the row of each key (inserted if absent);
    for ragged ids a RaggedTensor of their row splits, as TensorFlow.

  Raises:
    ValueError: parts of different embedding_dim or key_dtype.
    TypeError: ids of a dtype other than the table's key_dtype (or int32
      into an int64 table).
  """
    api = "tf.nn.embedding_lookup"
    tables = _tables(params, api)
    table = tables[0]
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(embedding_lookup(tables, ids.flat_values, max_norm, name))
    if len(tables) > 1:
        with tf.name_scope(name or "embedding_lookup"):
            return _rows(tables, _keys(table, ids, api, "ids"), max_norm)
    with tf.name_scope(name or "embedding_lookup"):
        keys = _keys(table, ids, api, "ids")
        flat = tf.reshape(keys, [-1])
        n = tf.size(flat, out_type=tf.int64)
        # Sample i holds key i alone: 'sum' returns the rows.
        one_per_sample = tf.SparseTensor(tf.stack(
            [tf.range(n), tf.zeros([n], tf.int64)], axis=1), flat, tf.stack([n, 1]))
        rows = lookup.lookup_sparse([table], [one_per_sample], ["sum"])[0]
        if max_norm is not None:
            rows = tf.clip_by_norm(rows, max_norm, axes=[1])
        out = tf.reshape(rows, tf.concat([tf.shape(keys), [table.embedding_dim]], 0))
        out.set_shape(keys.shape.concatenate([table.embedding_dim]))
        return out


@tf.autograph.experimental.do_not_convert
def embedding_lookup_sparse(params,
                            sp_ids,
                            sp_weights,
                            combiner=None,
                            max_norm=None,
                            name=None,
                            allow_fast_lookup=False):
    """`tf.nn.embedding_lookup_sparse` for an Embedding Variable.

  Args:
    params: an Embedding Variable, a list of them or a
      PartitionedEmbeddingVariable (the parts of one).
    sp_ids: `[d0, ...]` SparseTensor (or rank-2 RaggedTensor) of keys, in
      canonical order; the first index is the sample.
    sp_weights: None, or float weights with the same indices.
    combiner: 'mean' (default), 'sqrtn' or 'sum'.
    max_norm: None, or clip each row to this l2 norm before combining.
    name: the name scope.
    allow_fast_lookup: accepted and ignored (a dense-table optimisation).

  Returns:
    float32 `[last sample with a key + 1, embedding_dim]`, as TensorFlow.

  Raises:
    ValueError: an unknown combiner, or parts that differ.
    TypeError: sp_ids not sparse or ragged, or of the wrong key dtype.
  """
    del allow_fast_lookup
    api = "tf.nn.embedding_lookup_sparse"
    combiner = "mean" if combiner is None else combiner
    _check_combiner(combiner, api)
    tables = _tables(params, api)
    table = tables[0]
    sp_ids = _as_sparse(sp_ids, api, "sp_ids")
    sp_weights = _as_sparse(sp_weights, api, "sp_weights")
    with tf.name_scope(name or "embedding_lookup_sparse"):
        sample_ids = tf.cast(sp_ids.indices[:, 0], tf.int64)
        num_samples = tf.reduce_max(tf.concat([sample_ids, [-1]], 0)) + 1
        return _combine(tables, sample_ids, _keys(table, sp_ids.values, api, "sp_ids"),
                        None if sp_weights is None else sp_weights.values, combiner, num_samples,
                        max_norm)


@tf.autograph.experimental.do_not_convert
def safe_embedding_lookup_sparse(embedding_weights,
                                 sparse_ids,
                                 sparse_weights=None,
                                 combiner="mean",
                                 default_id=None,
                                 max_norm=None,
                                 name=None,
                                 allow_fast_lookup=False):
    """`tf.nn.safe_embedding_lookup_sparse` for an Embedding Variable.

  Args:
    embedding_weights: an Embedding Variable, a list of them or a
      PartitionedEmbeddingVariable (the parts of one).
    sparse_ids: `[d0, ..., dn]` SparseTensor (or rank-2 RaggedTensor) of
      keys; ids < 0 are dropped.
    sparse_weights: None, or float weights with the same indices; weights
      <= 0 are dropped unless combiner is 'sum'.
    combiner: 'mean' (default), 'sqrtn' or 'sum'.
    default_id: None (an empty entry gives zeros) or the key whose row an
      empty entry gets.
    max_norm: None, or clip each row to this l2 norm before combining.
    name: the name scope.
    allow_fast_lookup: accepted and ignored.

  Returns:
    float32 `[d0, ..., d(n-1), embedding_dim]`.

  Raises:
    ValueError: an unknown combiner, or parts that differ.
    TypeError: ids not sparse or ragged, or of the wrong key dtype.
  """
    del allow_fast_lookup
    api = "tf.nn.safe_embedding_lookup_sparse"
    _check_combiner(combiner, api)
    tables = _tables(embedding_weights, api)
    table = tables[0]
    sparse_ids = _as_sparse(sparse_ids, api, "sparse_ids")
    sparse_weights = _as_sparse(sparse_weights, api, "sparse_weights")
    with tf.name_scope(name or "safe_embedding_lookup_sparse"):
        # Entries are aggregated along the last dimension: [prod(d0..dn-1), dn].
        original_shape = tf.cast(sparse_ids.dense_shape, tf.int64)
        outer_shape = original_shape[:-1]
        flat_ids = tf.sparse.reshape(sparse_ids,
                                     tf.stack([tf.reduce_prod(outer_shape), original_shape[-1]]))
        keys = _keys(table, flat_ids.values, api, "sparse_ids")
        flat_weights = None
        if sparse_weights is not None:
            flat_weights = tf.SparseTensor(flat_ids.indices, sparse_weights.values,
                                           flat_ids.dense_shape)
        flat_ids = tf.SparseTensor(flat_ids.indices, keys, flat_ids.dense_shape)
        # TensorFlow accepts entries in any order here (its fill_empty_rows
        # sorts them); the combine wants them in order.
        flat_ids, flat_weights = _in_order(flat_ids, flat_weights)
        keep = flat_ids.values >= 0
        if flat_weights is not None and combiner != "sum":
            keep = tf.logical_and(keep, flat_weights.values > 0)
        flat_ids = tf.sparse.retain(flat_ids, keep)
        if flat_weights is not None:
            flat_weights = tf.sparse.retain(flat_weights, keep)
        if default_id is not None:
            flat_ids, _ = tf.sparse.fill_empty_rows(flat_ids, tf.cast(default_id, keys.dtype))
            if flat_weights is not None:
                flat_weights, _ = tf.sparse.fill_empty_rows(flat_weights,
                                                            tf.cast(1, flat_weights.dtype))
        weights = None if flat_weights is None else flat_weights.values
        result = _combine(tables, flat_ids.indices[:, 0], flat_ids.values, weights, combiner,
                          flat_ids.dense_shape[0], max_norm)
        out = tf.reshape(result, tf.concat([outer_shape, [table.embedding_dim]], 0))
        rank = sparse_ids.dense_shape.shape[0]
        if rank is not None:
            out.set_shape([None] * (rank - 1) + [table.embedding_dim])
        return out


# --- TensorFlow 1's signatures -----------------------------------------------


@tf.autograph.experimental.do_not_convert
def _embedding_lookup_v1(params,
                         ids,
                         partition_strategy="mod",
                         name=None,
                         validate_indices=True,
                         max_norm=None):
    del partition_strategy, validate_indices  # parts are routed as DeepRec routes them
    return embedding_lookup(params, ids, max_norm=max_norm, name=name)


@tf.autograph.experimental.do_not_convert
def _embedding_lookup_sparse_v1(params,
                                sp_ids,
                                sp_weights,
                                partition_strategy="mod",
                                name=None,
                                combiner=None,
                                max_norm=None,
                                allow_fast_lookup=False):
    del partition_strategy
    return embedding_lookup_sparse(params, sp_ids, sp_weights, combiner, max_norm, name,
                                   allow_fast_lookup)


@tf.autograph.experimental.do_not_convert
def _safe_embedding_lookup_sparse_v1(embedding_weights,
                                     sparse_ids,
                                     sparse_weights=None,
                                     combiner="mean",
                                     default_id=None,
                                     name=None,
                                     partition_strategy="div",
                                     max_norm=None,
                                     allow_fast_lookup=False):
    del partition_strategy
    return safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights, combiner,
                                        default_id, max_norm, name, allow_fast_lookup)


def install_lookup_dispatch() -> None:
    """Makes the six tf.nn / tf.compat.v1.nn embedding lookups run the
  functions of this module when their params is an Embedding Variable, a
  list of them or a partitioned one. Other params are untouched. Idempotent.

  Uses TensorFlow's type-based dispatch; because an Embedding Variable is not
  a CompositeTensor, its class is first registered as a dispatchable type
  (`tensorflow.python.util.dispatch.register_dispatchable_type`, checked by
  tests/test_tf_nn_lookups.py against the installed TensorFlow).
  """
    if _installed:
        return
    tf_dispatch.register_dispatchable_type(EmbeddingVariable)
    tf_dispatch.register_dispatchable_type(PartitionedEmbeddingVariable)
    targets = (
        (tf.nn.embedding_lookup, embedding_lookup, "params"),
        (tf.compat.v1.nn.embedding_lookup, _embedding_lookup_v1, "params"),
        (tf.nn.embedding_lookup_sparse, embedding_lookup_sparse, "params"),
        (tf.compat.v1.nn.embedding_lookup_sparse, _embedding_lookup_sparse_v1, "params"),
        (tf.nn.safe_embedding_lookup_sparse, safe_embedding_lookup_sparse, "embedding_weights"),
        (tf.compat.v1.nn.safe_embedding_lookup_sparse, _safe_embedding_lookup_sparse_v1,
         "embedding_weights"),
    )
    for api, target, argument in targets:
        tf.experimental.dispatch_for_api(api, {argument: _PARAMS})(target)
    _installed.append(True)


def lookup_dispatch_installed() -> bool:
    """Whether install_lookup_dispatch() is in effect."""
    return bool(_installed)
