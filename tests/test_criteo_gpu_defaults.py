"""benchmarks/criteo/run.py --device gpu: its defaults, and its path run on the CPU at a tiny shape.

References: the GPU defaults as docs/criteo.md states them (batches made in
memory, each implementation alone, sok-ev 2048 steps and the baseline 128 at
batch 65536), and the run's own record.
"""
import json
import os
import sys

import pytest

import criteo_run

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks", "criteo"))
import run  # noqa: E402  pylint: disable=wrong-import-position


def defaults(device, *argv):
    args = run.parse_args(list(argv))
    run.apply_preset(args, device)
    return args


def test_gpu_defaults_train_2048_steps_from_memory_and_the_baseline_128():
    args = defaults("gpu")
    assert (args.batch, args.train_lines // args.batch, args.baseline_steps) == (65536, 2048, 128)
    assert (args.source, args.schedule) == ("memory", "sequential")
    # Embeddings: near-0 accumulator (steps of about the rate); the tower: TF's 0.1.
    assert (args.learning_rate, args.initial_accumulator) == (0.05, 1e-6)
    assert (args.dense_learning_rate, args.dense_initial_accumulator) == (0.05, 0.1)
    assert args.warmup_steps == 20


def test_cpu_defaults_are_unchanged_text_and_interleaved():
    args = defaults("cpu")
    assert (args.batch, args.train_lines, args.learning_rate) == (1024, 2_000_000, 0.05)
    assert (args.source, args.schedule, args.baseline_steps) == ("text", "interleaved", None)
    assert args.dense_learning_rate is None and args.dense_initial_accumulator is None


def test_session_style_reads_text_and_memory_with_it_is_refused():
    assert defaults("gpu", "--style", "session").source == "text"
    with pytest.raises(SystemExit):
        run.parse_args(["--style", "session", "--source", "memory"])


@pytest.mark.timeout(300)
def test_gpu_path_on_the_cpu_reports_each_implementation_on_its_own(tmp_path):
    out = tmp_path / "out"
    result = criteo_run.run_py_ok("--device", "gpu", "--train-lines", "6144", "--eval-lines",
                                  "2048", "--batch", "512", "--dim", "8", "--bottom", "16", "--top",
                                  "32", "1", "--baseline-steps", "4", "--evals", "2", "--no-append",
                                  "--no-progress", "--out-dir", out)
    record = json.load(open(out / "run.json"))
    assert (record["source"], record["schedule"]) == ("memory", "sequential")
    assert "made in memory" in record["data"]
    s, b = record["results"]["sok_ev"], record["results"]["baseline"]
    assert (s["steps"], b["steps"]) == (12, 4)
    # Both evaluated after step 4 (equal steps); sok-ev also at 6 and 12.
    assert b["curve"]["eval_samples"] == [4 * 512]
    assert s["curve"]["eval_samples"] == [4 * 512, 6 * 512, 12 * 512]
    for x in (s, b):
        assert 0 < x["end_to_end_samples_per_second"] <= x["samples_per_second"] * 1.05
        assert x["input_seconds"] >= 0
    assert record["input_samples_per_second"] > 0
    assert "sok_ev after the baseline's 4 steps: AUC" in result.stdout
    assert "input pipeline alone (memory):" in result.stdout
