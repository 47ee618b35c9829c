"""benchmarks/criteo/run.py is deterministic: the same seed gives the same numbers on every run.

Reference: a second process running the same command. Each run is its own
process (as a user's runs are), so the thread pools, memory addresses and
hash-table layouts differ between them; the AUCs, log losses and every
step's loss must not.
"""
import json

import pytest

import criteo_run


def run(tmp_path, name, *extra):
    out = tmp_path / name
    criteo_run.run_py_ok("--device", "cpu", "--train-lines", "6144", "--eval-lines", "2048",
                         "--batch", "512", "--dim", "8", "--bottom", "16", "--top", "32", "1",
                         "--evals", "2", "--no-append", "--no-progress", "--data-dir",
                         tmp_path / "data", "--out-dir", out, *extra)
    return json.load(open(out / "run.json"))["results"]


@pytest.mark.timeout(300)
def test_two_runs_of_the_same_command_give_identical_numbers(tmp_path):
    # The second run also differs in its thread count: the numbers must not
    # depend on how the work is split either.
    first, second = run(tmp_path, "a"), run(tmp_path, "b", "--threads", "1")
    for name in ("sok_ev", "baseline"):
        a, b = first[name], second[name]
        assert (a["auc"], a["logloss"]) == (b["auc"], b["logloss"]), name
        assert a["curve"]["loss"] == b["curve"]["loss"], name
        assert a["curve"]["eval_auc"] == b["curve"]["eval_auc"], name
