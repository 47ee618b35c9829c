"""benchmarks/results.py writes benchmarks/RESULTS.md: a run's entry at the end
of its benchmark's history section, a current-table row rewritten in place,
nothing deleted; and every script that writes RESULTS.md names its section."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import results  # noqa: E402  pylint: disable=wrong-import-position

sys.path.insert(0, ROOT)
from benchmarks.criteo import report  # noqa: E402  pylint: disable=wrong-import-position

SAMPLE = """# Results

## Current results

| target | figure | baseline | ratio | met? | machine | date | commit | command |
|---|---|---|---|---|---|---|---|---|
| speed <!-- row:speed --> | 1 ms | 2 ms | 2× | met | box | 2026-01-01 | abc1234 | `python a.py` |

# History

## First benchmark
<!-- history:cpu-sparse-step -->

### old run

```sh
## a shell comment, not a heading
```

## Second benchmark
<!-- history:criteo -->

- **Criteo dlrm** one line
"""


def test_an_entry_goes_at_the_end_of_its_section_one_level_down():
    section = "\n## CPU grouped sparse step, 2026-12-01 10:00\n\n- command: `x`\n\n### reading\n"
    new = results.add_entry(SAMPLE, section, "cpu-sparse-step")
    first = new[new.index("<!-- history:cpu-sparse-step -->"):new.index("## Second benchmark")]
    assert first.rstrip().endswith("### CPU grouped sparse step, 2026-12-01 10:00\n\n"
                                   "- command: `x`\n\n#### reading")
    assert first.index("### old run") < first.index("### CPU grouped")
    # Fenced code keeps its lines; what was there is all still there, in order.
    assert "## a shell comment, not a heading" in new
    assert all(line in new.split("\n") for line in SAMPLE.split("\n"))


def test_an_entry_for_the_last_section_goes_at_the_end_of_the_file():
    new = results.add_entry(SAMPLE, "- **Criteo dlrm** second line\n", "criteo")
    assert new.startswith(SAMPLE.rstrip("\n"))
    assert new.rstrip("\n").endswith("- **Criteo dlrm** one line\n\n- **Criteo dlrm** second line")


def test_a_file_without_the_section_gets_the_entry_at_its_end():
    assert results.add_entry("# scratch\n", "## x\n", "tf-sparse-step") == "# scratch\n## x\n"
    with pytest.raises(ValueError, match="unknown benchmark"):
        results.add_entry(SAMPLE, "## x\n", "no-such-benchmark")


def test_a_row_is_rewritten_in_place():
    new = results.set_row(SAMPLE,
                          "speed",
                          figure="0.5 ms",
                          ratio="4×",
                          date="2026-12-01",
                          commit="def5678",
                          command="`python a.py --x | y`")
    changed = [(a, b) for a, b in zip(SAMPLE.split("\n"), new.split("\n")) if a != b]
    assert changed == [
        (SAMPLE.split("\n")[6],
         "| speed <!-- row:speed --> | 0.5 ms | 2 ms | 4× | met | box | 2026-12-01 | def5678 | "
         "`python a.py --x \\| y` |")
    ]
    with pytest.raises(ValueError, match="no row"):
        results.set_row(SAMPLE, "nope", figure="1")
    with pytest.raises(ValueError, match="unknown columns"):
        results.set_row(SAMPLE, "speed", speed="1")


def test_append_and_publish_write_the_file(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(SAMPLE)
    results.append("## run A\n", "criteo", str(path))
    results.publish("## run B\n", str(path), str(tmp_path / "copy.md"), "cpu-sparse-step")
    text = path.read_text()
    assert text.index("### run B") < text.index("## Second benchmark") < text.index("### run A")
    assert (tmp_path / "copy.md").read_text() == "## run B\n"
    # A dry run's scratch file that does not exist yet gets the section as it is.
    results.publish("## run C\n", str(tmp_path / "dry.md"), str(tmp_path / "c.md"), "peers")
    assert (tmp_path / "dry.md").read_text() == "## run C\n"


def test_a_refused_row_or_entry_leaves_the_file_as_it_was(tmp_path):
    """A cell name that is not a column once truncated the file: it was opened
  for writing before the new text existed."""
    path = tmp_path / "RESULTS.md"
    path.write_text(SAMPLE)
    with pytest.raises(ValueError, match="unknown columns"):
        results.update_row("speed", str(path), **{"met?": "met"})
    with pytest.raises(ValueError, match="no row"):
        results.update_row("nonexistent", str(path), figure="1 ms")
    with pytest.raises(ValueError):
        results.append("## run\n", "no-such-history", str(path))
    assert path.read_text() == SAMPLE


def test_the_repository_file_has_every_section_and_well_formed_rows():
    with open(results.RESULTS) as f:
        text = f.read()
    for benchmark in results.BENCHMARKS:
        assert text.count(f"<!-- history:{benchmark} -->") == 1, benchmark
    current = text[text.index("## Current results"):text.index("# History")]
    rows = [l for l in current.split("\n") if "<!-- row:" in l]
    assert len(rows) >= 20
    for line in rows:
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        assert len(cells) == 1 + len(results.COLUMNS), line
        assert all(c.strip() for c in cells), line
    for row in report.current_rows(_record(), "abc1234"):
        assert f"<!-- row:{row} -->" in current


def test_every_writer_names_a_known_section():
    calls = subprocess.run(
        ["git", "grep", "-n", "-E", r"results(_md)?\.append\(|publish\(", "--", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False).stdout.strip().split("\n")
    calls = [c for c in calls if "def " not in c and "results.py" not in c]
    assert len(calls) >= 9, calls
    sources = {}
    for call in calls:
        path = call.split(":", 1)[0]
        sources.setdefault(path, open(os.path.join(ROOT, path)).read())
    named = set()
    for path, source in sources.items():
        for m in re.finditer(r"(?:results(?:_md)?\.append|publish)\((.*?)\)\n", source, re.S):
            found = [b for b in results.BENCHMARKS if f'"{b}"' in m[1]]
            assert len(found) == 1, (path, m[0])
            named.add(found[0])
    assert {
        "criteo", "cpu-sparse-step", "cpu-weak-scaling", "cpu-table-memory", "cpu-tf-nn",
        "tf-sparse-step", "tf-weak-scaling", "peers"
    } <= named


def _record(**changes):
    with open(os.path.join(ROOT, "benchmarks", "criteo", "runs.jsonl")) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    record = [r for r in runs if r["date"] == "2026-11-25 12:31"][0]
    record.update(changes)
    return record


def test_a_criteo_run_of_the_defaults_rewrites_its_rows():
    rows = report.current_rows(_record(), "abc1234")
    assert rows["criteo-cpu-auc"]["figure"] == "AUC 0.8191"
    assert rows["criteo-cpu-auc"]["ratio"] == "−0.0019"
    assert rows["criteo-cpu-speed"]["ratio"] == "1.22×"
    assert rows["criteo-cpu-memory"]["ratio"] == "0.287×"
    assert {r["commit"] for r in rows.values()} == {"abc1234"}
    assert {r["date"] for r in rows.values()} == {"2026-11-25"}
    # Any other configuration leaves the table alone.
    assert report.current_rows(_record(workers=2), "x") == {}
    assert report.current_rows(_record(style="session"), "x") == {}
    assert report.current_rows(_record(data="synthetic seed 1: 2,000,000 train"), "x") == {}
    assert report.current_rows(_record(hotness="mlperf"), "x") == {}


def test_a_gpu_run_with_mlperfs_hotness_rewrites_its_own_row_against_hugectrs_rate():
    gpu = dict(device="gpu",
               model="dcnv2",
               global_batch=65536,
               dim=128,
               hotness="mlperf",
               compute_dtype="bfloat16",
               data="synthetic seed 0: 134,217,728 train + 262,144 eval lines, MLPerf hotness")
    record = _record(**gpu)
    record["results"]["sok_ev"]["samples_per_second"] = 2.431e6
    rows = report.current_rows(record, "abc1234")
    assert list(rows) == ["criteo-gpu-mlperf"]
    row = rows["criteo-gpu-mlperf"]
    assert row["figure"] == "2,431,000 samples/s (bfloat16 tower)"
    assert (row["ratio"], row["met"]) == ("1.10× HugeCTR", "met")
    record["results"]["sok_ev"]["samples_per_second"] = 2.0e6
    assert report.current_rows(record, "x")["criteo-gpu-mlperf"]["met"] == "missed"
    # One-hot DLRM on the GPU is the other row.
    assert list(report.current_rows(_record(**dict(gpu, model="dlrm", hotness="one")),
                                    "x")) == ["criteo-gpu"]


def test_the_row_command_line():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "results.py"), "row"],
        capture_output=True,
        text=True,
        check=False)
    assert out.returncode == 2 and "column=value" in out.stdout
