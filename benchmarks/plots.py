"""The pictures in docs/, drawn from recorded runs (benchmarks/criteo/runs.jsonl).

  .venv/bin/python benchmarks/plots.py          # rewrites docs/img/criteo_*.png

Each picture names the runs it shows by their date (runs.jsonl's "date", the
key this script selects them by), machine and command; docs/criteo.md's
captions say the same. Small PNGs (80 dpi), so that they can be committed.
"""
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(ROOT, "benchmarks", "criteo", "runs.jsonl")
OUT = os.path.join(ROOT, "docs", "img")

# The run whose curves are shown: the README's command on the 2-core machine.
CURVES_RUN = "2026-11-25 12:31"
# The runs whose samples/s are compared, with a label each.
THROUGHPUT_RUNS = (
    ("2026-11-25 12:31", "CPU, 1 worker, tf.function"),
    ("2026-11-22 18:54", "CPU, 1 worker, Session"),
    ("2026-11-22 18:44", "CPU, 2 Gloo workers"),
    ("2026-11-25 10:29", "1 H200, batch 65536"),
)
COLORS = {"sok_ev": "tab:blue", "baseline": "tab:orange"}
LABELS = {"sok_ev": "sok-ev", "baseline": "hash-bucket tf.Variable baseline"}


def load_runs(path=RUNS):
    with open(path) as f:
        return {r["date"]: r for r in (json.loads(line) for line in f if line.strip())}


def _machine(record):
    return record["machine"].split(", TensorFlow")[0]


def _smooth(values, window):
    values = np.asarray(values, np.float64)
    if window < 2 or len(values) < window:
        return values
    return np.convolve(values, np.ones(window) / window, mode="valid")


def curves(plt, record, path):
    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(8, 3))
    for name in ("sok_ev", "baseline"):
        c = record["results"][name]["curve"]
        window = max(1, len(c["loss"]) // 20)
        loss = _smooth(c["loss"], window)
        ax_loss.plot(c["samples"][len(c["samples"]) - len(loss):],
                     loss,
                     color=COLORS[name],
                     label=LABELS[name])
        ax_auc.plot(c["eval_samples"], c["eval_auc"], "o-", color=COLORS[name], label=LABELS[name])
    ax_auc.axhline(record["planted_auc"],
                   color="gray",
                   ls="--",
                   label=f"planted model {record['planted_auc']:.4f}")
    ax_loss.set(xlabel="samples seen", ylabel="training log loss (moving avg.)")
    ax_auc.set(xlabel="samples seen", ylabel="eval AUC")
    for ax in (ax_loss, ax_auc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Criteo DLRM, synthetic data, run of {record['date']}, {_machine(record)}: "
        f"`{record['command']}`",
        fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def throughput(plt, runs, path):
    chosen = [(runs[date], label) for date, label in THROUGHPUT_RUNS]
    fig, ax = plt.subplots(figsize=(8, 3))
    y = np.arange(len(chosen))
    for i, name in enumerate(("sok_ev", "baseline")):
        values = [r["results"][name]["samples_per_second"] for r, _ in chosen]
        pos = y + (i - 0.5) * 0.38
        ax.barh(pos, values, 0.38, color=COLORS[name], label=LABELS[name])
        for p, v in zip(pos, values):
            ax.annotate(f" {v:,.0f}", (v, p), va="center", fontsize=7)
    ax.set_yticks(y, [f"{label}\n{r['date']}" for r, label in chosen], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=max(r["results"]["sok_ev"]["samples_per_second"] for r, _ in chosen) * 6)
    ax.set_xlabel("training samples/s (step time; log scale)")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(
        "Criteo DLRM, synthetic data; CPU runs on 2 AMD EPYC cores, GPU run on 1 H200 "
        "(benchmarks/criteo/runs.jsonl)",
        fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    runs = load_runs()
    os.makedirs(OUT, exist_ok=True)
    written = [os.path.join(OUT, "criteo_curves.png"), os.path.join(OUT, "criteo_throughput.png")]
    curves(plt, runs[CURVES_RUN], written[0])
    throughput(plt, runs, written[1])
    for path in written:
        print(f"{os.path.relpath(path, ROOT)}: {os.path.getsize(path):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
