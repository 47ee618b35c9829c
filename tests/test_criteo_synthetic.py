"""The synthetic Criteo generator (benchmarks/criteo/synthetic.py) writes what it claims.

References: the files re-read in plain Python, sklearn's roc_auc_score, and
the documented formulas (vocabulary sizes, Zipf law).
"""
import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from benchmarks.criteo import synthetic


def read_lines(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("synthetic")
    meta = synthetic.generate(str(directory), 3000, 2000, seed=5, cardinality_scale=2e-4)
    return meta, synthetic.PlantedModel(5, 2e-4, 1.1)


def test_same_seed_same_bytes_whatever_the_processes(tmp_path):
    a = synthetic.generate(str(tmp_path / "a"), 1500, 100, seed=1, cardinality_scale=1e-4)
    b = synthetic.generate(str(tmp_path / "b"),
                           1500,
                           100,
                           seed=1,
                           cardinality_scale=1e-4,
                           processes=2)
    c = synthetic.generate(str(tmp_path / "c"), 1500, 100, seed=2, cardinality_scale=1e-4)
    read = lambda meta: open(meta["files"]["train"], "rb").read()  # noqa: E731
    assert read(a) == read(b)
    assert read(a) != read(c)
    assert a["planted"] == b["planted"]


def test_generate_reuses_matching_data_and_redoes_other(tmp_path):
    first = synthetic.generate(str(tmp_path), 500, 100, seed=1, cardinality_scale=1e-4)
    path = first["files"]["train"]
    stamp = open(path, "rb").read()
    with open(path, "ab") as f:
        f.write(b"marker\n")  # reused: the marker stays
    synthetic.generate(str(tmp_path), 500, 100, seed=1, cardinality_scale=1e-4)
    assert open(path, "rb").read() == stamp + b"marker\n"
    synthetic.generate(str(tmp_path), 600, 100, seed=1, cardinality_scale=1e-4)
    assert len(read_lines(path)) == 600


def test_vocabulary_is_kaggle_scaled_with_a_floor():
    sizes = synthetic.vocabulary_sizes(0.01)
    for k, v in zip(synthetic.KAGGLE_CARDINALITIES, sizes):
        assert v == max(min(k, 64), math.ceil(k * 0.01))
    assert sizes[8] == 3 and sizes[2] == 101313
    with pytest.raises(ValueError, match="cardinality_scale"):
        synthetic.vocabulary_sizes(0)


def test_lines_are_criteo_lines_with_distinct_hex_keys(data):
    meta, model = data
    lines = read_lines(meta["files"]["train"])
    assert len(lines) == 3000 and all(len(fields) == 40 for fields in lines)
    for fields in lines[:200]:
        assert fields[0] in ("0", "1")
        assert all(v == "" or int(v) >= -2 for v in fields[1:14])
        assert all(v == "" or (len(v) == 8 and int(v, 16) >= 0) for v in fields[14:])
    for keys, size in zip(model.keys, meta["vocabulary"]):
        assert len(np.unique(keys)) == size  # rank -> key is one to one


def test_keys_follow_the_zipf_law(data):
    _, model = data
    rng = np.random.default_rng(0)
    ranks = model.sample(rng, 20000)[3]
    f = 2  # the largest vocabulary
    size = model.vocabulary[f]
    weights = 1.0 / np.arange(1, size + 1)**1.1
    expected = weights[:3] / weights.sum()
    observed = np.array([(ranks[:, f] == r).mean() for r in range(3)])
    np.testing.assert_allclose(observed, expected, rtol=0.1)


def test_planted_auc_is_that_of_the_logit_recomputed_from_the_file(data):
    meta, model = data
    lines = read_lines(meta["files"]["eval"])
    rank_of = [{f"{k:08x}": r for r, k in enumerate(keys)} for keys in model.keys]
    labels = np.array([int(fields[0]) for fields in lines])
    integers = np.array([[int(v) if v else 0 for v in fields[1:14]] for fields in lines])
    empty = np.array([[v == "" for v in fields[1:14]] for fields in lines])
    ranks = np.array([[rank_of[f].get(v, -1) for f, v in enumerate(fields[14:])] for fields in lines
                     ])
    # An empty categorical value is rank -1; every written key is in the vocabulary.
    assert np.array_equal(ranks == -1, np.array([[v == "" for v in x[14:]] for x in lines]))
    # The documented planted logit, written out.
    logit = np.full(len(lines), synthetic.PLANTED_BIAS)
    for j, a in synthetic.PLANTED_INTEGER.items():
        logit += a * np.log1p(np.maximum(integers[:, j], 0))
    for f, weights in model.weights.items():
        logit += np.where(ranks[:, f] >= 0, weights[ranks[:, f]], 0.0)
    f, g, _ = synthetic.PLANTED_PAIR
    both = (ranks[:, f] >= 0) & (ranks[:, g] >= 0)
    logit += np.where(both, model.pair[ranks[:, f], ranks[:, g]], 0.0)
    assert meta["planted"]["eval"]["auc"] == pytest.approx(roc_auc_score(labels, logit), abs=1e-12)
    assert meta["planted"]["eval"]["ctr"] == pytest.approx(labels.mean())
    # The planted signal is real: well above chance, below perfect.
    assert 0.7 < meta["planted"]["eval"]["auc"] < 0.9
