"""benchmarks/criteo/run.py is deterministic: the same seed gives the same numbers on every run.

Reference: a second process running the same command. Each run is its own
process (as a user's runs are), so the thread pools, memory addresses and
hash-table layouts differ between them; the AUCs, log losses and every
step's loss must not.
"""
import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(tmp_path, name, *extra):
    out = tmp_path / name
    command = [
        sys.executable, "benchmarks/criteo/run.py", "--device", "cpu", "--train-lines", "6144",
        "--eval-lines", "2048", "--batch", "512", "--dim", "8", "--bottom", "16", "--top", "32",
        "1", "--evals", "2", "--no-append", "--no-progress", "--data-dir",
        str(tmp_path / "data"), "--out-dir",
        str(out), *extra
    ]
    result = subprocess.run(command,
                            cwd=REPO_ROOT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                            capture_output=True,
                            text=True,
                            timeout=280)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
