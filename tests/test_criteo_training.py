"""The Criteo benchmark trains: a tiny end-to-end run of both implementations.

In process (TF2 tf.function style): the loss goes down, the eval AUC beats
chance, sok-ev stores exactly the distinct (feature, value) pairs the run
looked up (counted in plain Python from the files), and the baseline's
memory is its allocated tables. As a user runs it (a subprocess of
benchmarks/criteo/run.py, TF1 Session style): it finishes, prints both
implementations, and writes its plots and run record.
"""
import json

import numpy as np
import pytest
import tensorflow as tf

import criteo_run

from benchmarks.criteo import embeddings
from benchmarks.criteo import metrics
from benchmarks.criteo import models
from benchmarks.criteo import reader
from benchmarks.criteo import report
from benchmarks.criteo import synthetic
from benchmarks.criteo import training

DIM, BATCH = 8, 256


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic.generate(str(tmp_path_factory.mktemp("tiny")),
                              6144,
                              2048,
                              seed=11,
                              cardinality_scale=1e-4)


def distinct_values(paths):
    """Distinct C values per feature in the files ('' included: it is a key too)."""
    seen = [set() for _ in range(reader.NUM_CATEGORICAL)]
    for path in paths:
        with open(path) as f:
            for line in f:
                for f_index, value in enumerate(line.rstrip("\n").split("\t")[14:]):
                    seen[f_index].add(value)
    return [len(s) for s in seen]


def test_both_implementations_train_and_report_their_memory(sok, data):
    files = {split: [data["files"][split]] for split in ("train", "eval")}

    def implementation(table):
        tower = models.DLRM(DIM, [16, DIM], [32, 1], seed=0)
        return training.Implementation(table,
                                       tower,
                                       0.05,
                                       BATCH,
                                       initial_accumulator=1e-6,
                                       warmup_steps=4)

    sok_ev = implementation(embeddings.SokEvEmbeddings(sok, DIM, 0.05, seed=1))
    buckets = [2 * v for v in data["vocabulary"]]
    baseline = implementation(embeddings.HashBucketEmbeddings(DIM, buckets, 0.05, seed=1))
    style = training.FunctionStyle([sok_ev, baseline],
                                   reader.criteo_dataset(files["train"], BATCH,
                                                         drop_remainder=True),
                                   reader.criteo_dataset(files["eval"], 1024), files)
    result = training.train_and_evaluate(style,
                                         BATCH, [12],
                                         metrics.auc_and_logloss,
                                         progress=False)

    assert result["steps"] == 6144 // BATCH and result["malformed"] == 0
    for name in ("sok_ev", "baseline"):
        curves = result["curves"][name]
        assert np.mean(curves.loss[-4:]) < np.mean(curves.loss[:4]) - 0.02, curves.loss
        assert curves.eval_samples == [12 * BATCH, 24 * BATCH]
        # Beats chance: an AUC over 2048 eval lines has a standard deviation of
        # about 0.013 at chance; 24 small steps reach 0.6-0.7 (TF32 on a GPU
        # moves the baseline's by a few hundredths).
        assert curves.eval_auc[-1] > 0.55, curves.eval_auc
    # Every value looked up (training and both evaluations) is one key.
    expected_keys = sum(distinct_values(files["train"] + files["eval"]))
    assert style.keys_stored(sok_ev) == expected_keys
    # A record (key, frequency, version: 8 B each; value and Adagrad slot) and
    # 8 B index slots at the lowest load factor, 3/8 (cc/hash_table_cpu.h).
    assert sok_ev.embeddings.memory_bytes(
        expected_keys, training.ADAGRAD_SLOTS) == (expected_keys * (3 * 8 + 4 * DIM * 2 + 22))
    assert baseline.embeddings.memory_bytes(training.ADAGRAD_SLOTS) == sum(buckets) * DIM * 4 * 2


def test_baseline_row_is_key_mod_buckets_of_its_feature():
    rng = np.random.default_rng(5)
    buckets = list(rng.integers(1, 50, reader.NUM_CATEGORICAL))
    table = embeddings.HashBucketEmbeddings(DIM, buckets, 0.05, seed=2)
    keys = rng.integers(0, 2**63 - 1, (7, reader.NUM_CATEGORICAL), dtype=np.int64)
    keys[0] = 0
    rows = table(keys)
    for f, (variable, b) in enumerate(zip(table.variables, buckets)):
        np.testing.assert_array_equal(rows[f].numpy(), variable.numpy()[keys[:, f] % b])


@pytest.mark.timeout(300)
def test_run_py_in_session_style_writes_numbers_and_plots(tmp_path):
    out = tmp_path / "out"
    result = criteo_run.run_py_ok("--style", "session", "--device", "cpu", "--train-lines", "4096",
                                  "--eval-lines", "1024", "--batch", "512", "--dim", "8",
                                  "--bottom", "16", "--top", "32", "1", "--evals", "2",
                                  "--no-append", "--no-progress", "--data-dir", tmp_path / "data",
                                  "--out-dir", out)
    for name in ("planted", "sok_ev", "baseline"):
        assert f"\n{name} " in result.stdout, result.stdout
    record = json.load(open(out / "run.json"))
    assert record["style"] == "session" and record["steps"] == 8
    for name in ("sok_ev", "baseline"):
        numbers = record["results"][name]
        assert 0.5 < numbers["auc"] <= 1 and numbers["samples_per_second"] > 0
        assert len(numbers["curve"]["eval_auc"]) == 2
    assert record["results"]["sok_ev"]["keys_stored"] > 0
    assert (out / "curves.png").stat().st_size > 10000
    assert (out / "throughput.png").stat().st_size > 10000
    line = report.results_line(record)
    assert record["command"] in line and record["date"] in line and "\n" not in line


def test_a_tower_compiled_by_xla_trains_as_the_plain_tower(sok, data):
    """--xla-tower: the tower's forward and backward run as one XLA program
  inside the step, the embeddings' ops outside; the same loss and the same
  updated weights as the plain tower, step after step."""
    batches = list(reader.criteo_dataset([data["files"]["train"]], BATCH).take(3))

    def implementation(xla_tower):
        tower = models.DCNv2(DIM, cross_layers=2, cross_rank=4, deep=[16], seed=3)
        table = embeddings.HashBucketEmbeddings(DIM, [64] * reader.NUM_CATEGORICAL, 0.05, seed=1)
        return training.Implementation(table, tower, 0.05, BATCH, xla_tower=xla_tower)

    plain, compiled = implementation(False), implementation(True)
    for batch in batches:
        losses = [
            tf.function(lambda impl=impl: impl.train(batch, use_tape=True)[1])()
            for impl in (plain, compiled)
        ]
        np.testing.assert_allclose(losses[1].numpy(), losses[0].numpy(), rtol=1e-5)
    for a, b in zip(plain.variables, compiled.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-6)


def test_steps_that_build_their_own_batches_train_as_steps_given_the_datasets():
    """run.py --batches-on-gpu: FunctionStyle given InMemoryData.batches (each
  step builds its batch from a row range) trains the same model to the same
  losses and weights as FunctionStyle given the tf.data pipeline, and
  evaluates the same labels and probabilities."""
    from benchmarks.criteo import in_memory  # pylint: disable=import-outside-toplevel
    data = in_memory.InMemoryData(2048, 512, seed=5, cardinality_scale=1e-4)

    def implementations():
        tower = models.DLRM(DIM, [16, DIM], [16, 1], seed=3)
        table = embeddings.HashBucketEmbeddings(DIM, [64] * reader.NUM_CATEGORICAL, 0.05, seed=1)
        return [training.Implementation(table, tower, 0.05, BATCH)]

    given = training.FunctionStyle(implementations(), data.dataset("train", BATCH),
                                   data.dataset("eval", BATCH), {})
    built = training.FunctionStyle(implementations(),
                                   None,
                                   None, {},
                                   device_batches={
                                       "train": data.batches("train", BATCH),
                                       "eval": data.batches("eval", BATCH)
                                   })
    steps = 0
    for (a, dropped_a), (b, dropped_b) in zip(given.train_batches(), built.train_batches()):
        assert dropped_a == dropped_b == 0
        np.testing.assert_allclose(built.train("baseline", b),
                                   given.train("baseline", a),
                                   rtol=1e-6)
        steps += 1
    assert steps == 2048 // BATCH
    for a, b in zip(given.implementations[0].variables, built.implementations[0].variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-7)
    labels_a, predicted_a = given.evaluate()
    labels_b, predicted_b = built.evaluate()
    np.testing.assert_array_equal(labels_b, labels_a)
    np.testing.assert_allclose(predicted_b["baseline"], predicted_a["baseline"], rtol=1e-5)
