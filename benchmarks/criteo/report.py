"""What a Criteo run reports: plots, a RESULTS.md line and rows, runs.jsonl.

  plot_curves        training loss (smoothed) and eval AUC against samples
                     seen, both implementations on one figure
  plot_throughput    samples/s by worker count, from runs.jsonl rows with
                     the same model, style, device, batch and data
  results_line       one markdown line: date, machine, command, numbers, ratios
"""
import datetime
import json
import os
import platform
import re
import textwrap
from typing import Dict, List, Optional

import numpy as np

COLORS = {"sok_ev": "tab:blue", "baseline": "tab:orange"}
LABELS = {"sok_ev": "sok-ev (Embedding Variables)", "baseline": "TF hash buckets (baseline)"}


def machine() -> str:
    """CPU model and core count, GPU names if any, TensorFlow and Python versions."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpus = tf.config.list_physical_devices("GPU")
    gpu = ""
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        gpu = f", {len(gpus)}x {details.get('device_name', 'GPU')}"
    return (f"{platform.machine()}, {os.cpu_count()} cores ({cpu}){gpu}, "
            f"TensorFlow {tf.__version__}, Python {platform.python_version()}")


def cores(record: Dict) -> Optional[int]:
    """The machine's core count, from the record's `machine` ('x86_64, 2 cores (...)')."""
    match = re.search(r"(\d+) cores", record.get("machine", ""))
    return int(match.group(1)) if match else None


def oversubscribed(record: Dict) -> bool:
    """A CPU run whose workers have fewer than 2 cores each: each worker's
  step, input pipeline and Horovod thread then take turns on one core, so its
  samples/s measures the sharing more than the implementation."""
    n = cores(record)
    return record["device"] == "cpu" and record["workers"] > 1 and (n is None or
                                                                    n < 2 * record["workers"])


def device_name(record: Dict) -> str:
    """'2-core AMD EPYC' for a CPU run, '1x NVIDIA H200' for a GPU run."""
    machine = record.get("machine", "")
    if record["device"] == "gpu":
        match = re.search(r"(\d+)x ([^,]+)", machine)
        return f"{record['workers']}x {match.group(2)}" if match else "GPU"
    cpu = re.search(r"\(([^)]*)\)", machine)
    model = cpu.group(1) if cpu else "CPU"
    for word in ("(R)", "(TM)", "Processor", "Core", "CPU"):
        model = model.replace(word, "")
    return f"{cores(record)}-core {' '.join(model.split()[:3])}"


def run_label(record: Dict) -> str:
    """What a throughput plot calls a run: machine and device, workers, style,
  batch, date; oversubscribed runs say so."""
    label = (f"{device_name(record)} ({record['device'].upper()}), {record['workers']} "
             f"worker(s), {record['style']}, batch {record['global_batch']}, {record['date']}")
    return label + (" [oversubscribed]" if oversubscribed(record) else "")


# What records from before a field existed ran with.
RECORD_DEFAULTS = dict(hotness="one", compute_dtype="float32")


def model_name(record: Dict) -> str:
    """'dlrm', or 'dcnv2, MLPerf hotness, bfloat16' where they differ from the defaults."""
    name = record["model"]
    if record.get("hotness", "one") == "mlperf":
        name += ", MLPerf hotness"
    if record.get("compute_dtype", "float32") != "float32":
        name += f", {record['compute_dtype']}"
    return name


def title(record: Dict, workers: bool = True) -> str:
    """A plot title naming the run's configuration (wrapped)."""
    who = f"{record['workers']} worker(s), " if workers else ""
    return textwrap.fill(
        f"Criteo {model_name(record)}, {record['style']}, {who}global batch "
        f"{record['global_batch']}, dim {record['dim']}; {record['data']}", 100)


def _smooth(values: List[float], window: int) -> np.ndarray:
    values = np.asarray(values, np.float64)
    if len(values) < 2 or window < 2:
        return values
    window = min(window, len(values))
    kernel = np.ones(window) / window
    head = np.cumsum(values[:window - 1]) / np.arange(1, window)
    return np.concatenate([head, np.convolve(values, kernel, mode="valid")])


def _pyplot():
    """matplotlib.pyplot drawing to files, or None if matplotlib is missing."""
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    return plt


def plot_curves(path: str, curves: Dict, planted_auc, title: str) -> bool:
    """Loss and AUC against samples seen, one line per implementation; False
  (and no file) without matplotlib.

  curves: {name: {'samples', 'loss', 'eval_samples', 'eval_auc'}} (lists), as
  a run record's results[name]['curve'] holds them.
  """
    plt = _pyplot()
    if plt is None:
        return False
    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in curves.items():
        window = max(1, len(c["loss"]) // 20)
        ax_loss.plot(c["samples"],
                     _smooth(c["loss"], window),
                     color=COLORS.get(name),
                     label=LABELS.get(name, name))
        ax_auc.plot(c["eval_samples"],
                    c["eval_auc"],
                    "o-",
                    color=COLORS.get(name),
                    label=LABELS.get(name, name))
    if planted_auc is not None:
        ax_auc.axhline(planted_auc, color="gray", ls="--", label=f"planted model {planted_auc:.4f}")
    ax_loss.set(xlabel="samples seen", ylabel="training log loss (moving average)")
    ax_auc.set(xlabel="samples seen", ylabel="eval AUC")
    for ax in (ax_loss, ax_auc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def hardware(record: Dict) -> str:
    """What runs must share to be compared: the CPU machine (its model and
  cores) for CPU runs, the GPU model for GPU runs."""
    if record["device"] == "gpu":
        return device_name(dict(record, workers=1))
    return record.get("machine", "").split(", TensorFlow")[0]


def latest_by_workers(runs: List[Dict]) -> Dict[int, Dict]:
    """{workers: the last run with that many} among the runs on the last
  run's hardware (see `hardware`)."""
    latest = {}
    for run in runs:
        if hardware(run) == hardware(runs[-1]):
            latest[run["workers"]] = run
    return latest


def plot_throughput(path: str, runs: List[Dict], title: str) -> bool:
    """Bars of samples/s by worker count for each implementation (the last run
  of each worker count, on the last run's hardware); oversubscribed worker
  counts are hatched and say so. False (and no file) without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return False
    latest = latest_by_workers(runs)
    workers = sorted(latest)
    names = sorted({n for r in latest.values() for n in r["results"]}, reverse=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [latest[w]["results"].get(name, {}).get("samples_per_second", 0) for w in workers]
        positions = np.arange(len(workers)) + (i - (len(names) - 1) / 2) * width
        ax.bar(positions,
               values,
               width,
               color=COLORS.get(name),
               label=LABELS.get(name, name),
               hatch=["//" if oversubscribed(latest[w]) else "" for w in workers])
        for x, v in zip(positions, values):
            ax.annotate(f"{v:,.0f}", (x, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(
        np.arange(len(workers)),
        [f"{w}\noversubscribed" if oversubscribed(latest[w]) else str(w) for w in workers])
    ax.set(xlabel="workers", ylabel="training samples/s (step time)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    ax.set_title(f"{device_name(runs[-1])} ({runs[-1]['device'].upper()}); {title}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def read_runs(path: str) -> List[Dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def append_run(path: str, record: Dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def _megabytes(n):
    return f"{n / 2**20:,.1f} MB"


def results_line(record: Dict) -> str:
    """One self-contained markdown line for benchmarks/RESULTS.md."""
    r = record["results"]
    parts = [
        f"- **Criteo {model_name(record)}** {record['date']} | {record['machine']}, load average "
        f"{record['load_average']:.1f} | "
        f"`{record['command']}` | {record['style']}, {record['workers']} worker(s), "
        f"global batch {record['global_batch']}, dim {record['dim']}, {record['steps']} steps, "
        f"{record['data']}"
    ]
    if record.get("planted_auc") is not None:
        parts.append(f"planted AUC {record['planted_auc']:.4f}")
    for name in ("sok_ev", "baseline"):
        if name in r:
            x = r[name]
            parts.append(f"{name}: AUC {x['auc']:.4f}, logloss {x['logloss']:.4f}, "
                         f"{x['samples_per_second']:,.0f} samples/s, embeddings "
                         f"{_megabytes(x['embedding_bytes'])}")
    if "sok_ev" in r and "baseline" in r:
        s, b = r["sok_ev"], r["baseline"]
        parts.append(
            f"sok_ev/baseline: speed {s['samples_per_second'] / b['samples_per_second']:.2f}x"
            f", memory {s['embedding_bytes'] / b['embedding_bytes']:.3f}x, "
            f"AUC {s['auc'] - b['auc']:+.4f}")
    return " | ".join(parts)


# The rows of benchmarks/RESULTS.md's current table that a run stands for: a
# run of run.py's defaults on the CPU, and of its --device gpu defaults.
_ONE_WORKER = dict(workers=1, style="function", exchange_dtype="float32")
_GPU_DATA = "synthetic seed 0: 134,217,728 train + 262,144 eval lines"
ROW_RUNS = {
    "cpu": (dict(_ONE_WORKER, device="cpu", model="dlrm", global_batch=1024, dim=32,
                 hotness="one"), "synthetic seed 0: 2,000,000 train + 100,000 eval lines"),
    "gpu": (dict(_ONE_WORKER,
                 device="gpu",
                 model="dlrm",
                 global_batch=65536,
                 dim=128,
                 hotness="one"), _GPU_DATA),
    # A rate, not an AUC, is its target: a run of any length stands for it.
    "gpu-mlperf": (dict(_ONE_WORKER,
                        device="gpu",
                        model="dcnv2",
                        global_batch=65536,
                        dim=128,
                        hotness="mlperf"), "synthetic seed 0: "),
}
GPU_TARGET_SAMPLES_PER_SECOND = 1.9e6  # HugeCTR's per-GPU MLPerf figure
# HugeCTR's train-only rate per H200 in MLPerf Training v5.0 (DLRM-DCNv2,
# 8x H200, 2.21M samples/s per GPU).
MLPERF_TARGET_SAMPLES_PER_SECOND = 2.2e6


def current_rows(record: Dict, commit: str) -> Dict[str, Dict[str, str]]:
    """{row id: cells} of the current table's rows this run stands for (none
  unless the run is one of ROW_RUNS' configurations, both sides trained)."""
    r = record["results"]
    if "sok_ev" not in r or "baseline" not in r or record.get("malformed"):
        return {}
    kind = next((k for k, (config, data) in ROW_RUNS.items()
                 if all(record.get(f, RECORD_DEFAULTS.get(f)) == v
                        for f, v in config.items()) and record["data"].startswith(data)), None)
    if kind is None:
        return {}
    s, b = r["sok_ev"], r["baseline"]
    common = dict(machine=record["machine"].split(", TensorFlow")[0],
                  date=record["date"][:10],
                  commit=commit,
                  command=f"`{record['command']}`")
    speed = s["samples_per_second"] / b["samples_per_second"]
    if kind == "gpu-mlperf":
        return {
            "criteo-gpu-mlperf":
                dict(figure=f"{s['samples_per_second']:,.0f} samples/s "
                     f"({record.get('compute_dtype', 'float32')} tower)",
                     baseline=f"HugeCTR 2.21M per H200 (MLPerf v5.0); hash-bucket "
                     f"`tf.Variable`s: {b['samples_per_second']:,.0f}",
                     ratio=f"{s['samples_per_second'] / 2.21e6:.2f}× HugeCTR",
                     met="met"
                     if s["samples_per_second"] >= MLPERF_TARGET_SAMPLES_PER_SECOND else "missed",
                     **common)
        }
    if kind == "gpu":
        return {
            "criteo-gpu":
                dict(figure=f"{s['samples_per_second']:,.0f} samples/s",
                     baseline=f"hash-bucket `tf.Variable`s: {b['samples_per_second']:,.0f}",
                     ratio=f"{speed:.2f}×",
                     met="met"
                     if s["samples_per_second"] >= GPU_TARGET_SAMPLES_PER_SECOND else "missed",
                     **common)
        }
    rows = {}
    if record.get("planted_auc") is not None:
        gap = s["auc"] - record["planted_auc"]
        rows["criteo-cpu-auc"] = dict(figure=f"AUC {s['auc']:.4f}",
                                      baseline=f"planted model {record['planted_auc']:.4f}",
                                      ratio=f"{gap:+.4f}".replace("-", "−"),
                                      met="met" if abs(gap) <= 0.002 else "missed",
                                      **common)
    rows["criteo-cpu-speed"] = dict(
        figure=f"{s['samples_per_second']:,.0f} samples/s",
        baseline=f"hash-bucket `tf.Variable`s: {b['samples_per_second']:,.0f}",
        ratio=f"{speed:.2f}×",
        met="met" if speed >= 1.0 else "missed",
        **common)
    memory = s["embedding_bytes"] / b["embedding_bytes"]
    rows["criteo-cpu-memory"] = dict(figure=_megabytes(s["embedding_bytes"]),
                                     baseline=_megabytes(b["embedding_bytes"]),
                                     ratio=f"{memory:.3f}×",
                                     met="met" if memory <= 1 / 3 else "missed",
                                     **common)
    return rows


def now() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
