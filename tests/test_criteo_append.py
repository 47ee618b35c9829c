"""benchmarks/criteo/run.py records a run: a runs.jsonl line and RESULTS.md's history and rows.

Reference: a copy of benchmarks/RESULTS.md, and a record of the CPU
defaults' configuration (the rows it stands for are named in report.ROW_RUNS).
"""
import json
import os
import shutil
import sys

from benchmarks.criteo import report

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks", "criteo"))
import run  # noqa: E402  pylint: disable=wrong-import-position


def test_a_run_of_the_cpu_defaults_appends_its_line_and_rewrites_its_rows(tmp_path):
    results = tmp_path / "RESULTS.md"
    shutil.copy(os.path.join(REPO_ROOT, "benchmarks", "RESULTS.md"), results)
    runs = tmp_path / "runs.jsonl"
    numbers = dict(auc=0.81234,
                   logloss=0.38,
                   samples_per_second=50000.0,
                   embedding_bytes=100 * 2**20)
    record = dict(date="2030-01-02 03:04",
                  machine="x86_64, 2 cores (AMD EPYC), TensorFlow 2.21.0, Python 3.11.7",
                  load_average=1.0,
                  command="python benchmarks/criteo/run.py",
                  model="dlrm",
                  style="function",
                  device="cpu",
                  workers=1,
                  exchange_dtype="float32",
                  global_batch=1024,
                  dim=32,
                  steps=1953,
                  malformed=0,
                  data="synthetic seed 0: 2,000,000 train + 100,000 eval lines, ...",
                  planted_auc=0.82,
                  results=dict(sok_ev=numbers, baseline=dict(numbers, embedding_bytes=400 * 2**20)))
    run.append_record(record, runs=str(runs), results=str(results))
    assert json.loads(runs.read_text()) == record
    text = results.read_text()
    assert report.results_line(record) in text
    row = next(line for line in text.splitlines() if "row:criteo-cpu-auc" in line)
    assert "AUC 0.8123" in row and "2030-01-02" in row
