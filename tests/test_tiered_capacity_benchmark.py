"""benchmarks/gpu/tf_tiered_capacity.py, issue 50's demonstration that one GPU
trains tables larger than its memory, checked without a GPU: its dry run (the
same graph, fill and steps on the CPU, tiny tables, no tiers) fills every
table, trains 50 steps and writes its section; its sizes follow the GPU's
memory; and it refuses, naming the numbers, a run the host or the GPU cannot
hold, or fewer than 50 steps."""
import json
import os
import subprocess
import sys

import pytest

import sok_ev_reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu", "tf_tiered_capacity.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import tf_tiered_capacity as capacity  # noqa: E402  pylint: disable=wrong-import-position

H200 = 150_109_880_320  # cuDeviceTotalMem of an H200 (nvidia-h200)


def test_the_dry_run_fills_every_table_trains_50_steps_and_writes_its_section(tmp_path):
    results = tmp_path / "RESULTS.dry.md"
    run = subprocess.run([
        sys.executable, SCRIPT, "--dry-run-on-cpu", "--rows-per-table", "2000", "--batch", "256",
        "--steps", "50", "--fill-chunk", "500", "--results",
        str(results), "--json-dir",
        str(tmp_path)
    ],
                         env=ref.child_env(CUDA_VISIBLE_DEVICES=""),
                         capture_output=True,
                         text=True,
                         timeout=300,
                         check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    section = results.read_text()
    assert "## One GPU trains tables larger than its memory" in section
    # 26 tables of 2,000 rows, all of them host rows on the CPU (no tiers).
    assert "| rows in HBM / in host memory, after the fill | 0 / 52,000 |" in section
    assert (tmp_path / "tf_tiered_capacity_results.md").read_text() == section
    figures = json.loads((tmp_path / "tf_tiered_capacity.json").read_text())
    assert figures["args"]["steps"] == 50 and figures["ms"] > 0
    assert figures["filled_host_rows"] == 26 * 2000


def test_the_default_sizes_are_1_3_times_the_gpu_with_62_percent_in_hbm():
    sizes = capacity.plan(capacity.parse_args([]), H200)
    assert 1.3 <= sizes["state_bytes"] / H200 < 1.3001
    assert sizes["state_bytes"] == 26 * sizes["rows"] * 2 * 128 * 4
    assert sizes["hbm_bytes"] == pytest.approx(0.62 * sizes["state_bytes"], rel=1e-6)
    assert sizes["host_rows"] == 26 * (sizes["rows"] - sizes["budget_rows"])
    capacity.check_fits(sizes, H200, 134e9)  # an nvidia-h200 machine's MemAvailable


def test_a_run_the_host_or_the_gpu_cannot_hold_is_refused_with_its_numbers():
    sizes = capacity.plan(capacity.parse_args([]), H200)
    with pytest.raises(SystemExit, match=r"host share needs \d+\.\d GB .* MemAvailable is 64\.0"):
        capacity.check_fits(sizes, H200, 64e9)
    greedy = capacity.plan(capacity.parse_args(["--hbm-fraction", "0.7"]), H200)
    with pytest.raises(SystemExit, match=r"HBM budgets \(136\.\d GB\) exceed 82% of the GPU's"):
        capacity.check_fits(greedy, H200, 1e12)


def test_fewer_than_50_steps_are_refused():
    with pytest.raises(SystemExit):
        capacity.parse_args(["--steps", "49"])
