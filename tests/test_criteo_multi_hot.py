"""Multi-hot Criteo features (MLPerf DLRM-DCNv2's hotness) in both embeddings of the benchmark.

Reference: per sample and feature, the sum of the rows of its keys, read from
the tables in NumPy (the baseline's rows: key mod buckets; sok-ev's: the same
lookup done one key at a time).
"""
import numpy as np
import pytest

from benchmarks.criteo import embeddings
from benchmarks.criteo import formats
from benchmarks.criteo import reader

DIM = 4
HOTNESS = formats.MLPERF_HOTNESS  # 3, 2, 1, 2, 6, ... 100, 27, ...: 214 keys


def keys(rng, n=5):
    return rng.integers(0, 2**40, (n, sum(HOTNESS)), dtype=np.int64)


def test_baseline_sums_the_rows_of_each_features_keys():
    rng = np.random.default_rng(1)
    buckets = list(rng.integers(5, 40, reader.NUM_CATEGORICAL))
    table = embeddings.HashBucketEmbeddings(DIM, buckets, 0.05, seed=3, hotness=HOTNESS)
    ids = keys(rng)
    rows = table(ids)
    start = 0
    for f, (variable, b, h) in enumerate(zip(table.variables, buckets, HOTNESS)):
        expected = variable.numpy()[ids[:, start:start + h] % b].sum(axis=1)
        np.testing.assert_allclose(rows[f].numpy(), expected, rtol=1e-5, atol=1e-6)
        start += h


def test_sok_ev_multi_hot_is_the_sum_of_its_one_hot_lookups(sok):
    rng = np.random.default_rng(2)
    multi = embeddings.SokEvEmbeddings(sok, DIM, 0.05, seed=9, hotness=HOTNESS)
    one = embeddings.SokEvEmbeddings(sok, DIM, 0.05, seed=9)  # rows depend on seed and key only
    ids = keys(rng, n=3)
    got = multi(ids)
    start = 0
    for f, h in enumerate(HOTNESS):
        expected = 0
        for j in range(h):
            column = np.zeros((3, reader.NUM_CATEGORICAL), np.int64)
            column[:, f] = ids[:, start + j]
            expected = expected + one(column)[f].numpy()
        np.testing.assert_allclose(got[f].numpy(), expected, rtol=1e-5, atol=1e-6)
        start += h


def test_hotness_is_checked_by_name():
    with pytest.raises(ValueError, match="HashBucketEmbeddings: hotness needs 26 counts >= 1"):
        embeddings.HashBucketEmbeddings(DIM, [4] * 26, 0.05, seed=0, hotness=[1] * 25)


@pytest.mark.parametrize("batch_on_gpu", [False, True], ids=["host-batch", "gpu-batch"])
@pytest.mark.parametrize("hotness", [None, HOTNESS], ids=["one-hot", "mlperf"])
def test_the_features_are_cut_from_the_id_batch_where_it_lies(hotness, batch_on_gpu):
    """TensorFlow's GPU kernels of Unpack (tf.unstack) and SplitV (tf.split)
  take no int64: a batch in GPU memory cut by them went to the host and back
  every step (MLPerf's 14M ids: about 13 ms a step on an H200, 2026-11-29),
  so it is cut by ops a GPU runs; a batch in host memory is cut on the host.
  The cut runs with soft placement off, on GPU:0 where a GPU is visible and
  the batch is there (an op without a GPU kernel fails the run); each
  feature's SparseTensor is checked against NumPy's slice of the batch."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(7)
    widths = [1] * reader.NUM_CATEGORICAL if hotness is None else list(hotness)
    batch = keys(rng, n=6)[:, :sum(widths)]
    gpu = batch_on_gpu and bool(tf.config.list_physical_devices("GPU"))
    graph = tf.Graph()
    with graph.as_default(), tf.device("/GPU:0" if gpu else "/CPU:0"):
        ids = tf.constant(batch)
        features = embeddings._by_feature(ids, hotness, batch_on_gpu)  # pylint: disable=protected-access
    cuts = [op for op in graph.get_operations() if op.type in ("Unpack", "Split", "SplitV")]
    if batch_on_gpu:
        assert cuts == []
    else:
        assert cuts and all("CPU" in op.device for op in cuts), [(op.type, op.device) for op in cuts
                                                                ]
    config = tf.compat.v1.ConfigProto(allow_soft_placement=False)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        got = sess.run(features)
    start = 0
    for feature, h in zip(got, widths):
        expected = batch[:, start:start + h]
        start += h
        np.testing.assert_array_equal(feature.dense_shape, [len(batch), h])
        np.testing.assert_array_equal(feature.values, expected.reshape(-1))
        np.testing.assert_array_equal(feature.indices,
                                      np.argwhere(np.ones_like(expected, dtype=bool)))
