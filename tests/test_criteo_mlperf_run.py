"""run.py --hotness mlperf: MLPerf DLRM-DCNv2's multi-hot shape wired into the benchmark.

References: the one-hot in-memory batches of the same seed (each feature's
first key is theirs), NumPy recomputing the companion keys from
in_memory's documented rule (offset_f + (rank + d) mod V_f, d from the
cache row of the rank), MLPerf's hotness (formats.MLPERF_HOTNESS), and the
run's own record.
"""
import json
import os
import sys

import numpy as np
import pytest

import criteo_run
from benchmarks.criteo import formats
from benchmarks.criteo import in_memory

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks", "criteo"))
import run  # noqa: E402  pylint: disable=wrong-import-position

LINES = dict(train_lines=1200, eval_lines=300, seed=4, cardinality_scale=1e-4)
HOTNESS = formats.MLPERF_HOTNESS


@pytest.fixture(scope="module")
def one_and_multi():
    return in_memory.InMemoryData(**LINES), in_memory.InMemoryData(**LINES, hotness=HOTNESS)


def first_batch(data, split="train", batch=256):
    return next(iter(data.dataset(split, batch)))


def test_each_features_first_key_is_the_one_hot_key_and_the_rest_follow(one_and_multi):
    one, multi = one_and_multi
    a, b = first_batch(one), first_batch(multi)
    keys = b["keys"].numpy()
    assert keys.shape == (256, sum(HOTNESS)) == (256, 214)
    starts = np.cumsum((0,) + HOTNESS[:-1])
    np.testing.assert_array_equal(keys[:, starts], a["keys"].numpy())
    for name in ("label", "dense"):
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())


def test_companions_follow_the_documented_rule_in_numpy(one_and_multi):
    _, multi = one_and_multi
    vocabulary, empty = multi.vocabulary, int(sum(multi.vocabulary))
    keys = multi.key_table().numpy()  # every vocabulary position's key, then ''s
    offsets = in_memory.companion_offsets(vocabulary, HOTNESS, LINES["seed"])
    rng = np.random.default_rng(0)
    start = np.cumsum([0] + list(vocabulary[:-1]))
    positions = np.stack([start[f] + rng.integers(0, vocabulary[f], 50) for f in range(26)], 1)
    positions[::7, 20] = empty  # an empty feature (C21, hotness 100) on some lines
    got = in_memory.multi_hot_keys(positions.astype(np.int32), multi.multi_hot_tables(),
                                   vocabulary).numpy()
    column = 0
    for f, h in enumerate(HOTNESS):
        rank = positions[:, f] - start[f]
        for j in range(h):
            at = start[f] + (rank +
                             offsets[rank % in_memory.COMPANION_CACHE, column]) % vocabulary[f]
            # Within the feature's own vocabulary; only the first is the key itself.
            assert ((at >= start[f]) & (at < start[f] + vocabulary[f])).all()
            want = np.where(positions[:, f] == empty, keys[-1], keys[np.minimum(at, empty)])
            np.testing.assert_array_equal(got[:, column], want, err_msg=f"feature {f} key {j}")
            column += 1
    assert column == 214
    assert (offsets[:, np.cumsum((0,) + HOTNESS[:-1])] == 0).all()
    assert (offsets[:, 1:3] >= 1).all()  # C1's companions are other keys


def test_companions_are_a_function_of_the_first_key(one_and_multi):
    _, multi = one_and_multi
    keys = np.concatenate([b["keys"].numpy() for b in multi.dataset("train", 400)])
    c21 = slice(sum(HOTNESS[:20]), sum(HOTNESS[:21]))  # C21: 100 keys
    first = keys[:, c21.start]
    for value in np.unique(first)[:20]:
        rows = keys[first == value, c21]
        assert (rows == rows[0]).all()
    assert len({tuple(r) for r in keys[:, c21]}) > 1


def test_mlperf_presets_give_mlperfs_shape_on_a_gpu():
    args = run.parse_args(["--model", "dcnv2", "--hotness", "mlperf"])
    run.apply_preset(args, "gpu")
    assert (args.dim, args.bottom, args.deep) == (128, [512, 256], [1024, 1024, 512, 256])
    assert (args.cross_layers, args.cross_rank, args.batch) == (3, 512, 65536)
    assert args.source == "memory"


def test_mlperf_on_the_cpu_makes_its_lines_in_memory():
    args = run.parse_args(["--hotness", "mlperf"])
    run.apply_preset(args, "cpu")
    assert args.source == "memory"


@pytest.mark.parametrize("argv, message", [
    (["--hotness", "mlperf", "--style", "session"], "--hotness mlperf on synthetic data needs"),
    (["--hotness", "mlperf", "--source", "text"], "--hotness mlperf on synthetic data needs"),
    (["--train-files", "a.bin", "--eval-files", "b.bin", "--hotness", "mlperf"
     ], "--hotness mlperf does not match --format raw"),
    (["--train-files", "a.bin", "--eval-files", "b.bin", "--format", "raw_multihot"
     ], "--hotness one does not match --format raw_multihot"),
    (["--compute-dtype", "bfloat16"], "--compute-dtype bfloat16 is for --model dcnv2"),
    (["--xla-tower", "--style", "session"], "--xla-tower needs --style function"),
])
def test_mismatched_hotness_data_and_model_are_refused_naming_the_flags(argv, message, capsys):
    args = run.parse_args(argv)
    run.apply_preset(args, "cpu")
    with pytest.raises(SystemExit) as exit_info:
        run.check_hotness(args)
    assert message in str(exit_info.value)


@pytest.mark.parametrize("argv, device, message", [
    (["--batches-on-gpu"], "cpu", "got device cpu"),
    (["--batches-on-gpu", "--source", "text"], "gpu", "--source text"),
    (["--batches-on-gpu", "--style", "session", "--source", "text"], "gpu", "--style session"),
])
def test_batches_on_gpu_without_a_gpu_or_in_memory_data_is_refused_naming_why(
        argv, device, message):
    args = run.parse_args(argv)
    run.apply_preset(args, device)
    with pytest.raises(SystemExit) as exit_info:
        run.check_batches_on_gpu(args, device)
    assert "--batches-on-gpu needs a GPU, --source memory and --style function" in str(
        exit_info.value)
    assert message in str(exit_info.value)


def test_batches_on_gpu_is_accepted_with_the_gpu_presets_memory_source():
    args = run.parse_args(["--batches-on-gpu", "--hotness", "mlperf", "--model", "dcnv2"])
    run.apply_preset(args, "gpu")
    run.check_batches_on_gpu(args, "gpu")  # no exit
    assert (args.source, args.style) == ("memory", "function")


@pytest.mark.timeout(300)
def test_dcnv2_with_mlperf_hotness_trains_both_implementations(tmp_path):
    out = tmp_path / "out"
    result = criteo_run.run_py_ok("--model", "dcnv2", "--hotness", "mlperf", "--compute-dtype",
                                  "bfloat16", "--train-lines", "3072", "--eval-lines", "1024",
                                  "--batch", "256", "--dim", "8", "--bottom", "16", "--deep", "16",
                                  "--cross-rank", "8", "--evals", "1", "--no-append",
                                  "--no-progress", "--out-dir", out)
    record = json.load(open(out / "run.json"))
    assert (record["hotness"], record["compute_dtype"]) == ("mlperf", "bfloat16")
    assert "MLPerf hotness (214 keys a line)" in record["data"]
    for name in ("sok_ev", "baseline"):
        x = record["results"][name]
        assert x["steps"] == 12 and np.isfinite(x["final_train_loss"]) and 0 < x["auc"] < 1
    # Multi-hot stores companions too: more keys than one-hot's 26 a line could reach.
    assert record["results"]["sok_ev"]["keys_stored"] > 0
    assert "Criteo dcnv2, MLPerf hotness, bfloat16" in result.stdout


@pytest.mark.parametrize(
    "device, argv, data_bytes, gpu_memory, expected",
    [
        ("gpu", [], 10 * 2**30, 141 * 10**9, True),
        ("gpu", [], 40 * 10**9, 141 * 10**9, False),  # more than a quarter of the GPU
        ("gpu", [], 10 * 2**30, None, False),  # the driver could not say
        ("gpu", ["--style", "session"], 10 * 2**30, 141 * 10**9, False),
        ("gpu", ["--source", "text"], 10 * 2**30, 141 * 10**9, False),
        ("cpu", [], 10 * 2**30, None, False),
        ("gpu", ["--no-batches-on-gpu"], 10 * 2**30, 141 * 10**9, False),  # asked for: kept
        ("gpu", ["--batches-on-gpu"], 40 * 10**9, 141 * 10**9, True),
    ])
def test_batches_are_built_on_the_gpu_by_default_where_they_apply_and_fit(
        device, argv, data_bytes, gpu_memory, expected):
    args = run.parse_args(argv)
    run.apply_preset(args, device)
    run.resolve_batches_on_gpu(args, device, data_bytes, gpu_memory)
    assert args.batches_on_gpu is expected


def test_in_memory_data_counts_the_bytes_its_arrays_take_on_a_device(one_and_multi):
    # positions int32 (26), integers float32 (13), label float32, a line
    lines = LINES["train_lines"] + LINES["eval_lines"]
    for data in one_and_multi:
        assert data.nbytes == lines * 4 * (26 + 13 + 1)
