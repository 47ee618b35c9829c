"""Keras `DenseFeatures` (tf_keras, TF_USE_LEGACY_KERAS=1) over sok-ev's
Embedding Variable columns, trained by `model.fit`.

TF_USE_LEGACY_KERAS must be set before TensorFlow is imported, so the models
train in a subprocess (tests/dense_features_worker.py); this module checks
what it wrote. The reference is the same model over TensorFlow's own
`embedding_column(categorical_column_with_identity(...))` (weighted through
`weighted_categorical_column`) on dense tables holding the same initial
rows, compiled with the same optimizer and fed the same batches (duplicate
ids, an empty row, ids never looked up); for shared columns, whose
TensorFlow counterparts are not built under eager execution, one dense table
looked up by `tf.nn.safe_embedding_lookup_sparse` per feature; for
partitioned columns (partition_num=3), the same unpartitioned dense tables. After every
step the tables' rows, the head's kernel, the loss and the optimizer's
iterations must agree.
"""
import os

import numpy as np
import pytest

import sok_ev_reference as ref

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dense_features_worker.py")
CASES = ("sgd_mean", "adagrad_sum", "sgd_weighted_sqrtn", "adagrad_weighted_mean",
         "adagrad_shared_mean", "adagrad_partitioned_sum")
PARTS = 3  # the worker's partition_num in its partitioned case


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """What the worker wrote: arrays and the json facts."""
    return ref.legacy_keras_facts(tmp_path_factory, WORKER, 71, "the DenseFeatures worker failed")


def test_the_worker_ran_tf_keras(run):
    _, facts = run
    assert facts["keras"].startswith("tf_keras"), facts["keras"]


@pytest.mark.parametrize("case", CASES)
def test_fit_through_dense_features_equals_tensorflow_columns_on_dense_tables(run, case):
    arrays, facts = run
    assert ref.assert_same_steps(arrays, case, "sok", "tf") == 4
    # The tables trained (rows moved), through sok-ev's Embedding Variables.
    assert np.abs(arrays[f"{case}/sok/rows"][-1] - arrays[f"{case}/sok/rows"][0]).max() > 1e-3
    kinds = [kind for _, kind, _ in facts[f"{case}/sok/weights"]]
    assert kinds.count("EmbeddingVariable") == facts[f"{case}/expected_tables"]
    parts = PARTS if "partitioned" in case else 1
    assert facts[f"{case}/sok/tables"] == facts[f"{case}/tf/tables"] * parts


def test_dense_features_names_the_tables_as_tensorflow_names_its_variables(run):
    _, facts = run
    sok = [name for name, _, _ in facts["sgd_mean/sok/weights"]]
    tf_names = [name for name, _, _ in facts["sgd_mean/tf/weights"]]
    assert sok == tf_names
    assert sok[0] == "features/C1_embedding/embedding_weights:0"
    shared = [
        name for name, kind, _ in facts["adagrad_shared_mean/sok/weights"]
        if kind == "EmbeddingVariable"
    ]
    assert shared == ["features/C1_shared_embedding/embedding_weights:0"]


def test_a_partitioned_column_holds_its_parts_in_the_layer_as_deeprec_names_them(run):
    """partition_num=3: each column's Embedding Variable is 3 parts, in the
  layer's trainable weights, <layer>/<column>/embedding_weights/part_<i>."""
    _, facts = run
    names = [
        name for name, kind, _ in facts["adagrad_partitioned_sum/sok/weights"]
        if kind == "EmbeddingVariable"
    ]
    assert names == [
        f"features/{c}_embedding/embedding_weights/part_{i}:0" for c in ("C1", "C2")
        for i in range(PARTS)
    ]


@pytest.mark.parametrize("fact, tables", [("checkpoint", 2), ("partitioned_checkpoint", 2 * PARTS)])
def test_checkpoint_of_the_model_restores_the_dense_features_tables(run, fact, tables):
    _, facts = run
    restored = facts[fact]
    assert (restored["keys"], restored["rows"], restored["tables"]) == (True, True, tables)
    assert restored["count"] > 0


def test_dense_features_refuses_config_and_indicator_over_an_embedding_column(run):
    _, facts = run
    assert "has no config" in facts["get_config"]
    assert "tf.train.Checkpoint" in facts["get_config"]
    assert "categorical_column_with_embedding('C1')" in facts["indicator"]
    assert "embedding_column" in facts["indicator"]
