"""The throughput plots compare like with like and say what ran where.

References: run records written out by hand, as runs.jsonl holds them (the
machine string of report.machine()), and the recorded runs the docs plot.
"""
import pytest

from benchmarks import plots
from benchmarks.criteo import report

CPU = "x86_64, 2 cores (AMD EPYC 7B13), TensorFlow 2.21.0, Python 3.11.7"
GPU = ("x86_64, 16 cores (Intel(R) Xeon(R) Processor), 1x NVIDIA H200, TensorFlow 2.21.0, "
       "Python 3.12.3")


def record(machine, device, workers, style="function", batch=1024, date="2026-11-22 18:44"):
    return dict(machine=machine,
                device=device,
                workers=workers,
                style=style,
                global_batch=batch,
                date=date)


def test_labels_name_machine_device_workers_style_and_batch():
    assert report.run_label(record(
        CPU, "cpu",
        1)) == ("2-core AMD EPYC 7B13 (CPU), 1 worker(s), function, batch 1024, 2026-11-22 18:44")
    assert report.run_label(record(GPU, "gpu", 1, batch=65536)) == (
        "1x NVIDIA H200 (GPU), 1 worker(s), function, batch 65536, 2026-11-22 18:44")


@pytest.mark.parametrize(
    "machine, device, workers, expected",
    [
        (CPU, "cpu", 2, True),  # two workers on 2 cores: one core each
        (CPU, "cpu", 1, False),
        (CPU.replace("2 cores", "4 cores"), "cpu", 2, False),
        (GPU, "gpu", 2, False),  # a GPU each
    ])
def test_cpu_workers_with_fewer_than_two_cores_each_are_oversubscribed(
        machine, device, workers, expected):
    r = record(machine, device, workers)
    assert report.oversubscribed(r) is expected
    assert report.run_label(r).endswith(" [oversubscribed]") is expected


def test_docs_plot_leaves_the_oversubscribed_run_out_and_splits_cpu_from_gpu():
    runs = plots.load_runs()
    panels = plots.throughput_panels(runs)
    assert [device for device, _ in panels] == ["cpu", "gpu"]
    shown = [r for _, chosen in panels for r in chosen]
    assert not any(report.oversubscribed(r) for r in shown)
    # The 2-worker Gloo run on the 2-core machine: only with --all, and marked.
    assert "2026-11-22 18:44" not in [r["date"] for r in shown]
    everything = plots.throughput_panels(runs, oversubscribed=True)
    cpu = dict(everything)["cpu"]
    assert [r["date"] for r in cpu if report.oversubscribed(r)] == ["2026-11-22 18:44"]
    for device, chosen in panels:
        assert {r["device"] for r in chosen} == {device}
        assert len({r["global_batch"] for r in chosen}) == 1  # one batch per panel


def test_run_plot_compares_only_runs_on_the_same_hardware(tmp_path):
    pytest.importorskip("matplotlib")
    result = dict(sok_ev=dict(samples_per_second=2.0), baseline=dict(samples_per_second=1.0))
    other = dict(record(CPU.replace("AMD EPYC 7B13", "Intel Xeon"), "cpu", 2), results=result)
    mine = [
        dict(record(CPU, "cpu", 2), results=result),
        dict(record(CPU, "cpu", 1), results=result)
    ]
    assert report.latest_by_workers([other] + mine) == {2: mine[0], 1: mine[1]}
    assert report.plot_throughput(str(tmp_path / "t.png"), [other] + mine, "title")
