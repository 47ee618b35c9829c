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
