"""The pictures in docs/, drawn from recorded runs (benchmarks/criteo/runs.jsonl).

  .venv/bin/python benchmarks/plots.py          # rewrites docs/img/criteo_*.png
  .venv/bin/python benchmarks/plots.py --all    # ... with oversubscribed runs too

Each picture names the runs it shows by their date (runs.jsonl's "date", the
key this script selects them by), machine and command; docs/criteo.md's
captions say the same. Small PNGs (80 dpi), so that they can be committed.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.criteo import report  # noqa: E402  pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(ROOT, "benchmarks", "criteo", "runs.jsonl")
OUT = os.path.join(ROOT, "docs", "img")

# The run whose curves are shown: the README's command on the 2-core machine.
CURVES_RUN = "2026-11-25 12:31"
# The runs whose samples/s are compared. Each is labelled from its record
# (machine and device, workers, style, batch); the runs of one device share
# a panel, so that only like is set beside like.
THROUGHPUT_RUNS = ("2026-11-25 12:31", "2026-11-22 18:54", "2026-11-22 18:44", "2026-11-25 10:29")
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


def throughput_panels(runs, dates=THROUGHPUT_RUNS, oversubscribed=False):
    """[(device, [records])]: the chosen runs by device (CPU first), in the
  order given; oversubscribed runs (report.oversubscribed) left out unless
  asked for."""
    chosen = [runs[date] for date in dates]
    if not oversubscribed:
        chosen = [r for r in chosen if not report.oversubscribed(r)]
    return [(device, [r
                      for r in chosen
                      if r["device"] == device])
            for device in ("cpu", "gpu")
            if any(r["device"] == device for r in chosen)]


def throughput(plt, runs, path, oversubscribed=False):
    panels = throughput_panels(runs, oversubscribed=oversubscribed)
    fig, axes = plt.subplots(len(panels),
                             1,
                             figsize=(8, 1.2 + 0.8 * sum(len(p) for _, p in panels)),
                             squeeze=False,
                             gridspec_kw=dict(height_ratios=[len(p) for _, p in panels]))
    for ax, (device, chosen) in zip(axes[:, 0], panels):
        y = np.arange(len(chosen))
        for i, name in enumerate(("sok_ev", "baseline")):
            values = [r["results"][name]["samples_per_second"] for r in chosen]
            pos = y + (i - 0.5) * 0.38
            ax.barh(pos,
                    values,
                    0.38,
                    color=COLORS[name],
                    label=LABELS[name],
                    hatch=["//" if report.oversubscribed(r) else "" for r in chosen])
            for p, v in zip(pos, values):
                ax.annotate(f" {v:,.0f}", (v, p), va="center", fontsize=7)
        ax.set_yticks(y, [report.run_label(r).replace(", batch", "\nbatch") for r in chosen],
                      fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, max(r["results"]["sok_ev"]["samples_per_second"] for r in chosen) * 1.7)
        ax.set_title(f"{device.upper()} runs", fontsize=7)
        ax.grid(alpha=0.3, axis="x")
    axes[0, 0].legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("training samples/s (step time)")
    fig.suptitle("Criteo DLRM, synthetic data (benchmarks/criteo/runs.jsonl)", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    # --all: the oversubscribed runs too (hatched, and labelled so).
    oversubscribed = "--all" in sys.argv[1:]
    runs = load_runs()
    os.makedirs(OUT, exist_ok=True)
    written = [os.path.join(OUT, "criteo_curves.png"), os.path.join(OUT, "criteo_throughput.png")]
    curves(plt, runs[CURVES_RUN], written[0])
    throughput(plt, runs, written[1], oversubscribed)
    for path in written:
        print(f"{os.path.relpath(path, ROOT)}: {os.path.getsize(path):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
