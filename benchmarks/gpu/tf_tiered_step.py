#!/usr/bin/env python3
"""The sparse training step on one GPU with tables larger than their HBM
budget (DeepRec's HBM_DRAM storage, cc/tiered_table_gpu.h), against the same
step all in HBM, in one call.

Workload: tf_sparse_step.py's (26 tables, dim 128, Zipf 1.1 ids over tables
pre-filled with --rows keys in all, Adagrad, sum combiner, graph mode), one
GPU. Each run gives every table an HBM budget of --fractions of its state
(values and the Adagrad slot of its pre-filled keys: rows x 4 x dim x 2
bytes); 1.0 is the all-HBM table (no budget). Each tiered run is timed
plainly and through sok_ev.LookupPipeline (each step routes the next batch
while this one trains: "prefetch").

Per run it records the median ms a step, the ratio to the all-HBM step, the
hit rate of the step's distinct keys in HBM, the rows moved each way and the
bytes over PCIe per step (the tables' tier_counters, read before and after
the timed steps), and the PCIe floor: those bytes at the host link's copy
rate measured in the same process (a 256 MB pageable host tensor copied to
the GPU and back). It prints the table and appends it to benchmarks/RESULTS.md
(history section tf-tiered-step; a copy in --json-dir).

  source /tmp/gpu-tf/env.sh   # TensorFlow + the installed sok-ev wheel
  python3 benchmarks/gpu/tf_tiered_step.py [--fractions 1,0.5,0.25,0.1] [--steps 20]
  # on a CPU machine (checks the script only: the all-HBM run on the CPU)
  python3 benchmarks/gpu/tf_tiered_step.py --dry-run-on-cpu --fractions 1 --batch 256 \\
      --rows 52000 --steps 3
"""
import argparse
import datetime
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# pylint: disable=wrong-import-position
from tf_sparse_step import (ACCUMULATOR, add_workload_arguments, DIM, LR, TABLES, batch_ids,
                            prefill, raw_keys, rows_per_table)
from results import command, machine, publish  # tf_sparse_step put benchmarks/ on the path
import step_profile

SLOTS = 1  # Adagrad's accumulator
COPY_BYTES = 256 << 20  # the host link's copy, each way
MOVED = ("hits", "misses", "rows_to_hbm", "rows_to_host", "pcie_bytes", "choose_us",
         "write_back_us", "bring_in_us", "host_tier_us", "wait_us")


def host_ms(moved):
    """The tiers' host time a step, as printed: choose / write back / bring
  in, then two parts of their sum: the host tier's map work and the waits
  for the GPU."""
    ms = {k: moved[k] / 1e3 for k in MOVED if k.endswith("_us")}
    return (f"{ms['choose_us']:.1f} / {ms['write_back_us']:.1f} / {ms['bring_in_us']:.1f} "
            f"(host tier {ms['host_tier_us']:.1f}, waits {ms['wait_us']:.1f})")


# The pinned host link, measured by PyTorch in a child process (TensorFlow
# exposes no pinned host buffer; the tiers stage their rows in pinned memory).
PINNED_PROBE = """
import time, torch
host = torch.ones(%d // 4, pin_memory=True)
device = torch.empty_like(host, device="cuda")
rates = []
for _ in range(5):
    torch.cuda.synchronize(); start = time.perf_counter()
    device.copy_(host, non_blocking=True); host.copy_(device, non_blocking=True)
    torch.cuda.synchronize(); rates.append(2 * host.numel() * 4 / (time.perf_counter() - start))
print(sorted(rates)[2])
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_workload_arguments(parser)
    parser.set_defaults(hotness="1")
    parser.add_argument("--fractions",
                        default="1,0.5,0.25,0.1",
                        help="HBM budgets as fractions of each table's state; 1: all in HBM")
    parser.add_argument("--strategy", choices=["LFU", "LRU"], default="LFU")
    parser.add_argument("--no-prefetch",
                        dest="prefetch",
                        action="store_false",
                        help="time the tiered runs without LookupPipeline only")
    parser.add_argument("--trace",
                        action="store_true",
                        help="one more step of each tiered run traced: its ops by GPU kernel "
                        "time and by host time (benchmarks/step_profile.py)")
    parser.add_argument("--dry-run-on-cpu",
                        action="store_true",
                        help="run on a machine without GPU (only fraction 1 can run there)")
    return parser.parse_args(argv)


def state_bytes_per_table(args):
    """What a table's pre-filled keys hold: values and the Adagrad slot."""
    return rows_per_table(args) * 4 * DIM * (1 + SLOTS)


def storage_option(sok, args, fraction):
    """None (all in HBM) for fraction 1, else HBM_DRAM with that budget."""
    if fraction >= 1:
        return None
    strategy = getattr(sok.CacheStrategy, args.strategy)
    budget = int(fraction * state_bytes_per_table(args))
    return sok.EmbeddingVariableOption(storage_option=sok.StorageOption(
        storage_type=sok.StorageType.HBM_DRAM, storage_size=[budget], cache_strategy=strategy))


def make_tables(tf, sok, prefix, ev_option, on_cpu):
    """The benchmark's TABLES Embedding Variables `<prefix>_<t>`, dim DIM,
  rows drawn uniformly in ±0.05 (seed t), on the GPU (the CPU when on_cpu)."""
    with tf.device("/CPU:0" if on_cpu else "/GPU:0"):
        return [
            sok.get_embedding_variable(f"{prefix}_{t}",
                                       embedding_dim=DIM,
                                       initializer=tf.random_uniform_initializer(-0.05,
                                                                                 0.05,
                                                                                 seed=t),
                                       ev_option=ev_option) for t in range(TABLES)
        ]


def host_link_rate(tf, device):
    """Bytes/s of a pageable host tensor copied to `device` and back (the
  mean of both ways)."""
    # The host tensor exists before the clock starts: building it from NumPy
    # is a host copy of its own, which the first version timed too.
    with tf.device("/CPU:0"):
        host = tf.constant(np.ones(COPY_BYTES // 4, np.float32))
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        with tf.device(device):
            on_device = tf.identity(host)
            float(tf.reduce_sum(on_device[:1]))
        rates.append(COPY_BYTES / (time.perf_counter() - start))
        start = time.perf_counter()
        _ = on_device.numpy()
        rates.append(COPY_BYTES / (time.perf_counter() - start))
    return float(np.median(rates))


def pinned_link_rate():
    """Bytes/s of a pinned host buffer copied to the GPU and back (the
  median of 5), or None where PyTorch with CUDA is not there to measure it."""
    try:
        out = subprocess.run([sys.executable, "-c", PINNED_PROBE % COPY_BYTES],
                             capture_output=True,
                             text=True,
                             timeout=120,
                             check=True)
        return float(out.stdout.split()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def run(tf, sok, args, hot, fraction, pipelined, values):
    """One timed run in a fresh graph: ms a step and the tables' counters a
  step (summed over tables)."""
    rows = rows_per_table(args)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        holder = tf.compat.v1.placeholder(tf.int64, values.shape)
        values_var = tf.Variable(holder, trainable=False, name="batches")
        index = tf.compat.v1.placeholder(tf.int32, [])
        tables = make_tables(tf, sok, "tier", storage_option(sok, args, fraction),
                             args.dry_run_on_cpu)
        n = args.batch * hot
        j = tf.range(n, dtype=tf.int64)
        where = tf.stack([j // hot, j % hot], axis=1)
        ids = [
            tf.SparseTensor(where, values_var[index][t], [args.batch, hot]) for t in range(TABLES)
        ]
        if pipelined:
            pipeline = sok.LookupPipeline(tables, ["sum"] * TABLES)
            prime = pipeline.prefetch(ids)
            embeddings = pipeline.lookup()[0]
            prefetch = pipeline.prefetch(ids)
        else:
            embeddings = sok.lookup_sparse(tables, ids, combiners=["sum"] * TABLES)
        loss = tf.add_n([tf.reduce_sum(e) for e in embeddings])
        train = tf.compat.v1.train.AdagradOptimizer(LR, ACCUMULATOR).minimize(loss)
        if pipelined:
            train = tf.group(train, prefetch)
        fill_op = prefill(tf, sok, tables, rows)
        counters = [table.tier_counters() for table in tables]
        sess.run(tf.compat.v1.global_variables_initializer(), {holder: values})
        sess.run(fill_op)
        if pipelined:
            sess.run(prime, {index: 0})
            feed = lambda s: {index: (s + 1) % args.sets}
        else:
            feed = lambda s: {index: s % args.sets}
        times = []
        for s in range(args.steps + 3):
            if s == 3:
                before = sess.run(counters)
            start = time.perf_counter()
            sess.run([train, loss], feed(s))
            times.append(time.perf_counter() - start)
        after = sess.run(counters)
        if args.trace and fraction < 1:
            _, stats = step_profile.traced(lambda options, metadata: sess.run(
                [train, loss], feed(args.steps + 3), options=options, run_metadata=metadata))
            step_profile.print_top(step_profile.gpu_timeline(stats),
                                   f"{hot}-hot, budget {fraction:g}, prefetch {pipelined}", 12)
        moved = {
            k: sum(int(a[k]) - int(b[k]) for a, b in zip(after, before)) / args.steps for k in MOVED
        }
        moved["hbm_rows"] = sum(int(a["hbm_rows"]) for a in after)
        moved["host_rows"] = sum(int(a["host_rows"]) for a in after)
    timed = np.array(times[3:]) * 1e3
    return float(np.median(timed)), moved


def main():
    args = parse_args()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import sok_ev as sok  # pylint: disable=import-outside-toplevel
    gpus = tf.config.list_physical_devices("GPU")
    assert args.dry_run_on_cpu or gpus, "TensorFlow sees no GPU"
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    fractions = [float(f) for f in args.fractions.split(",")]
    if args.dry_run_on_cpu and any(f < 1 for f in fractions):
        raise ValueError(f"--fractions {args.fractions}: HBM_DRAM tables need a GPU; a CPU dry "
                         "run times fraction 1 only")
    pageable = host_link_rate(tf, "/CPU:0" if args.dry_run_on_cpu else "/GPU:0")
    pinned = None if args.dry_run_on_cpu else pinned_link_rate()
    link = pinned or pageable
    state_gb = TABLES * state_bytes_per_table(args) / 1e9
    lines = [
        f"\n## TF step with HBM + host tiers, {datetime.date.today()}", "",
        f"{machine()}. Command: `{command()}`. {TABLES} tables, batch {args.batch}, dim {DIM}, "
        f"{args.rows} keys pre-filled ({state_gb:.2f} GB of values and Adagrad slots), Zipf 1.1, "
        f"Adagrad, graph mode, {args.strategy}; median ms a step of {args.steps}. Budget: the "
        "fraction of each table's state HBM may hold. Counters a step, summed over tables. "
        f"Host link, {COPY_BYTES >> 20} MB each way: pageable (TensorFlow, this process) "
        f"{pageable / 1e9:.1f} GB/s, pinned (PyTorch, a child process) "
        f"{'not measured' if pinned is None else f'{pinned / 1e9:.1f} GB/s'}; PCIe floor = "
        f"bytes over PCIe ÷ the {'pinned' if pinned else 'pageable'} rate (the host tier's rows "
        "are pinned memory the GPU reads and writes). Host ms: the tiers' host time a step, "
        "summed over tables: choosing rows to write back / writing them back / bringing rows in "
        "(of which the host tier's map work, and the waits for the GPU).", "",
        "| hotness | budget | prefetch | ms/step | ratio to all-HBM | hit rate | rows to HBM | "
        "rows to host | PCIe MB/step | PCIe floor (ms) | host ms | HBM rows / host rows |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    ]
    for hot in [int(h) for h in args.hotness.split(",")]:
        ids = batch_ids(args, hot)
        values = np.stack(
            [np.stack([raw_keys(t, ids[s][t]) for t in range(TABLES)]) for s in range(args.sets)])
        base = None
        for fraction in fractions:
            for pipelined in ([False, True] if fraction < 1 and args.prefetch else [False]):
                ms, moved = run(tf, sok, args, hot, fraction, pipelined, values)
                base = ms if fraction >= 1 and base is None else base
                looked = moved["hits"] + moved["misses"]
                hit_rate = f"{100 * moved['hits'] / looked:.1f}%" if looked else "—"
                ratio = f"{ms / base:.2f}×" if base else "—"
                budget = "all HBM" if fraction >= 1 else f"{100 * fraction:.0f}%"
                lines.append(
                    f"| {hot} | {budget} | {'yes' if pipelined else 'no'} | {ms:.2f} | {ratio} | "
                    f"{hit_rate} | "
                    f"{moved['rows_to_hbm']:,.0f} | {moved['rows_to_host']:,.0f} | "
                    f"{moved['pcie_bytes'] / 1e6:.1f} | {moved['pcie_bytes'] / link * 1e3:.2f} | "
                    f"{host_ms(moved)} | "
                    f"{moved['hbm_rows']:,} / {moved['host_rows']:,} |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    publish(text, args.results, os.path.join(args.json_dir, "tf_tiered_step_results.md"),
            "tf-tiered-step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
