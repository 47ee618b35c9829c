"""The 26 categorical features of the Criteo models, two ways.

  SokEvEmbeddings         26 sok-ev Embedding Variables (DeepRec's
                          get_embedding_variable), keyed by the keys
                          themselves, looked up in ONE sok_ev.lookup_sparse
                          call; sharded over the workers.
  HashBucketEmbeddings    the baseline users have today: 26 dense tf.Variables
                          of 2 x V_f rows (V_f the feature's true
                          cardinality), row = key mod 2 V_f (hash buckets),
                          26 tf.nn.embedding_lookup_sparse calls; replicated.

Both map a [n, 26] int64 batch of keys (the reader's `keys`:
to_hash_bucket_fast(C, 2^63 - 1), hashed in the input pipeline for both) to
26 [n, dim] float32 tensors, start from the same truncated-normal
distribution, and report their memory.
"""
from typing import List, Optional, Sequence

import tensorflow as tf

from benchmarks.criteo import formats
from benchmarks.criteo import reader

_FLOAT_BYTES = 4


def feature_columns(ids, widths, batch_on_gpu=False):
    """[n, sum(widths)] ids -> feature f's widths[f] columns, [n, widths[f]] each.

  A batch in host memory (run.py's, from tf.data) is cut on the host, and
  TensorFlow copies the pieces to the GPU itself: cut on the GPU, the whole
  batch first crossed TensorFlow's pageable copy (MLPerf's step: 52 ms, 45 ms
  cut on the host). A batch already in GPU memory is cut there by strided
  slices: the GPU kernels of SplitV (tf.split) and Unpack (tf.unstack) take
  no int64, so those ops would copy it to the host and back (MLPerf's 14M
  ids: the lookup took 21 ms, 8 ms cut on the GPU; H200, 2026-11-29)."""
    if not batch_on_gpu:
        with tf.device("/CPU:0"):
            return tf.split(ids, widths, axis=1)
    columns, first = [], 0
    for width in widths:
        columns.append(ids[:, first:first + width])
        first += width
    return columns


def _one_hot(ids, batch_on_gpu=False):
    """[n, k] int64 ids -> k SparseTensors [n, 1], one id per sample each."""
    n = tf.shape(ids, out_type=tf.int64)[0]
    indices = tf.stack([tf.range(n), tf.zeros([n], tf.int64)], axis=1)
    shape = tf.stack([n, tf.constant(1, tf.int64)])
    return [
        tf.SparseTensor(indices, tf.reshape(column, [-1]), shape)
        for column in feature_columns(ids, [1] * ids.shape[1], batch_on_gpu)
    ]


def multi_hot_ids(ids, hotness, batch_on_gpu=False):
    """[n, sum(hotness)] int64 ids, feature f's hotness[f] columns in turn ->
  one SparseTensor [n, hotness[f]] per feature, every slot filled (MLPerf's
  multi-hot features have a fixed hotness). batch_on_gpu: the ids lie in GPU
  memory (see feature_columns)."""
    n = tf.shape(ids, out_type=tf.int64)[0]
    out = []
    for columns in feature_columns(ids, [int(h) for h in hotness], batch_on_gpu):
        h = columns.shape[1]
        rows = tf.repeat(tf.range(n), h)
        slots = tf.tile(tf.range(h, dtype=tf.int64), [n])
        out.append(
            tf.SparseTensor(tf.stack([rows, slots], axis=1), tf.reshape(columns, [-1]),
                            tf.stack([n, tf.constant(h, tf.int64)])))
    return out


def _by_feature(ids, hotness, batch_on_gpu=False):
    return (_one_hot(ids, batch_on_gpu) if hotness is None else multi_hot_ids(
        ids, hotness, batch_on_gpu))


def sok_ev_bytes_per_key(dim: int, num_slots: int) -> int:
    """Bytes one key takes in the CPU Embedding Variable (cc/hash_table_cpu.*):
  its record (key, frequency and version, 8 B each, then the row: value and
  optimizer slots, dim floats each) and its index slots (8 B each) at the
  index's lowest load factor, 3/8 (it doubles past 3/4): 22 B, a conservative
  count."""
    return 3 * 8 + _FLOAT_BYTES * dim * (1 + num_slots) + 22


class SokEvEmbeddings:
    """26 Embedding Variables looked up with one sok_ev.lookup_sparse call."""

    name = "sok_ev"

    def __init__(self,
                 sok,
                 dim: int,
                 stddev: float,
                 seed: int,
                 target_gpu: int = -1,
                 exchange_dtype: str = "float32",
                 hotness: Optional[Sequence[int]] = None,
                 batch_on_gpu: bool = False):
        """`sok`: the initialised sok_ev module; stddev: of the truncated normal
    initial rows (a key's row depends only on the seed and the key);
    exchange_dtype: lookup_sparse's (what rows and gradients cross the
    workers as); hotness: keys per feature (None: one; MLPerf's multi-hot:
    formats.MLPERF_HOTNESS), summed per sample; batch_on_gpu: the key batches
    lie in GPU memory (feature_columns)."""
        self._sok = sok
        self.batch_on_gpu = batch_on_gpu
        self.hotness = formats.check_hotness("SokEvEmbeddings", hotness)
        self._exchange_dtype = exchange_dtype
        self.dim = dim
        self.variables = []
        for f in range(reader.NUM_CATEGORICAL):
            initializer = tf.compat.v1.truncated_normal_initializer(stddev=stddev, seed=seed + f)
            variable = sok.get_embedding_variable(f"sok_ev_C{f + 1}",
                                                  embedding_dim=dim,
                                                  key_dtype=tf.int64,
                                                  initializer=initializer)
            variable.target_gpu = target_gpu
            self.variables.append(variable)

    def __call__(self, keys: tf.Tensor) -> List[tf.Tensor]:
        """keys: [n, 26] int64 ([n, sum(hotness)] multi-hot) -> 26 [n, dim] float32."""
        return self._sok.lookup_sparse(self.variables,
                                       _by_feature(keys, self.hotness, self.batch_on_gpu),
                                       combiners="sum",
                                       exchange_dtype=self._exchange_dtype)

    def keys_stored(self) -> List[tf.Tensor]:
        """This worker's number of keys per table (int64 scalars)."""
        return [v.total_count() for v in self.variables]

    def memory_bytes(self, keys_stored: int, num_slots: int) -> int:
        """keys stored x bytes per key (sok_ev_bytes_per_key)."""
        return keys_stored * sok_ev_bytes_per_key(self.dim, num_slots)


class HashBucketEmbeddings:
    """The stock-TensorFlow baseline: hash buckets into dense tf.Variables."""

    name = "baseline"

    def __init__(self,
                 dim: int,
                 buckets: Sequence[int],
                 stddev: float,
                 seed: int,
                 hotness: Optional[Sequence[int]] = None,
                 batch_on_gpu: bool = False):
        """buckets: rows of each table (2 x the true cardinality); hotness and
    batch_on_gpu: as SokEvEmbeddings'."""
        self.dim = dim
        self.batch_on_gpu = batch_on_gpu
        self.hotness = formats.check_hotness("HashBucketEmbeddings", hotness)
        self.buckets = list(buckets)
        if len(self.buckets) != reader.NUM_CATEGORICAL:
            raise ValueError(f"HashBucketEmbeddings: buckets needs {reader.NUM_CATEGORICAL} "
                             f"entries, got {len(self.buckets)}")
        self.variables = [
            tf.Variable(lambda b=b, f=f: tf.random.stateless_truncated_normal(
                [b, dim], seed=[seed, f], stddev=stddev),
                        name=f"baseline_C{f + 1}") for f, b in enumerate(self.buckets)
        ]

    def __call__(self, keys: tf.Tensor) -> List[tf.Tensor]:
        """keys: [n, 26] int64 ([n, sum(hotness)] multi-hot), >= 0 -> 26 [n, dim] float32."""
        # keys are uniform hashes, so key mod buckets is a hash bucket.
        buckets = self.buckets if self.hotness is None else [
            b for b, h in zip(self.buckets, self.hotness) for _ in range(h)
        ]
        ids = tf.math.floormod(keys, tf.constant(buckets, tf.int64))
        return [
            tf.nn.embedding_lookup_sparse(table, sparse, None, combiner="sum")
            for table, sparse in zip(self.variables,
                                     _by_feature(ids, self.hotness, self.batch_on_gpu))
        ]

    def memory_bytes(self, num_slots: int) -> int:
        """The allocated tables and their optimizer slots."""
        return sum(self.buckets) * self.dim * _FLOAT_BYTES * (1 + num_slots)
