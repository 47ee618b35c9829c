#!/usr/bin/env python3
"""One GPU trains tables whose values and optimizer slots exceed its memory
(issue 50): DeepRec's HBM_DRAM storage (cc/tiered_table_gpu.h) keeps each
table's HBM budget of rows on the GPU and the rest in host memory.

Workload: 26 tables, dim 128, Adagrad (one slot: 1,024 B of value and slot a
row, 1,040 B with its frequency and version), graph mode, one GPU. Sizes
from the GPU's memory as CUDA reports it (cuDeviceTotalMem, about 150 GB on
an H200, above the 141 GB of its spec sheet, so the stricter reading): the
tables' state (values and slots of every key) is --times that memory, their
HBM budgets together --hbm-fraction of the state, split evenly over the
tables (LFU). Before it makes anything it refuses, naming the numbers, a
host share (the state beyond the budgets, plus index, pinned staging and
TensorFlow) larger than /proc/meminfo's MemAvailable, and budgets above
HBM_LIMIT of the GPU's memory.

The fill inserts every table's keys (ids 0..rows-1, sok-ev keys through
tf_sparse_step.raw_keys) by lookups of --fill-chunk keys a table, all tables
in one sok.lookup_sparse call (one key a bag), after one training step: a
table gets the optimizer's slot at its first update, not when the optimizer
is built, so without it the rows would be made without their slot and the
budgets, counted in rows of the current width, would hold twice the rows
(seen on an H200: every row in HBM after the fill). Then --steps timed steps
(after 3 warm-up steps) of batch --batch, one-hot, Zipf 1.1 ids over each
table's rows, --sets batches rotated, sum combiner, loss = sum of every
output, Adagrad. A Zipf rank r becomes the id (r * SCATTER + t * 7919) mod
rows of table t, SCATTER a prime above any table's rows: a bijection, so the
hot ids are spread over the table without a permutation of its rows.

It records the state's ratio to the GPU's memory, the budgets, the rows in
each tier (the tables' tier_counters), the fill's time, the median ms a step
and samples/s, the hit rate, rows moved each way, PCIe MB and host ms a step
(counter deltas over the timed steps, summed over tables), the GPU memory in
use after the fill (TensorFlow's allocator, and cuMemGetInfo, which sees
every allocation) and bytes per key in HBM against the raw 1,040, and the
process's RSS and RSS per host row (an upper bound: RSS holds TensorFlow and
the pinned staging too).

The tables allocate through TensorFlow's GPU allocator; the script sets
TF_GPU_ALLOCATOR=cuda_malloc_async (--tf-gpu-allocator): with the default BFC
allocator and memory growth, growing a table's row arena failed at 107 GB of
150 in use on an H200 (BFC's pool regions do not coalesce), while
cuda_malloc_async ran the default sizes (126 GB in use after the fill).

It prints the section and appends it to
benchmarks/RESULTS.md (history section tf-tiered-capacity; a copy and the
figures as JSON in --json-dir).

  source /tmp/gpu-tf/env.sh   # TensorFlow + the installed sok-ev wheel
  python3 benchmarks/gpu/tf_tiered_capacity.py [--times 1.3] [--hbm-fraction 0.62]
  # on a CPU machine (checks the script only: tiny tables, no tiers)
  python3 benchmarks/gpu/tf_tiered_capacity.py --dry-run-on-cpu --rows-per-table 2000 \\
      --batch 256 --steps 50 --fill-chunk 500 --results /tmp/capacity.md
"""
import argparse
import datetime
import json
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# pylint: disable=wrong-import-position
from tf_sparse_step import ACCUMULATOR, DIM, LR, TABLES, raw_keys
# The tiers' step benchmark: its counters, the Adagrad slot count and tables.
from tf_tiered_step import MOVED, SLOTS, host_ms, make_tables
# tf_sparse_step put benchmarks/ on the path.
import gpu_memory
from results import RESULTS, command, machine, publish

ROW_BYTES = 4 * DIM * (1 + SLOTS)  # value and slot: what a budget counts
RAW_ROW_BYTES = ROW_BYTES + 16  # with the row's frequency and version
MIN_STEPS = 50  # issue 50's "at least 50 steps"
WARMUP = 3
# Budgets above this share of the GPU's memory are refused: the rest holds
# the HBM index (12 B a slot), the rows' frequencies and versions, the rows
# a write-back gathers, the batches and TensorFlow. The defaults (1.3 x
# 0.62 = 0.806) are under it.
HBM_LIMIT = 0.82
HOST_INDEX = 1.1  # the host tier's bytes a row over the raw 1,040 (index, record header)
HOST_RESERVE = 10e9  # TensorFlow, Python, the batches
SCATTER = 2654435761  # a prime: rank * SCATTER mod rows is a bijection when rows < SCATTER
ZIPF = 1.1


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--times",
                        type=float,
                        default=1.3,
                        help="the tables' state (values + slots) as a multiple of the GPU's "
                        "memory (cuDeviceTotalMem)")
    parser.add_argument("--hbm-fraction",
                        type=float,
                        default=0.62,
                        help="the share of the state the HBM budgets hold together")
    parser.add_argument("--rows-per-table",
                        type=int,
                        default=None,
                        help="rows of each table (default: sized from --times)")
    parser.add_argument("--fill-chunk",
                        type=int,
                        default=131072,
                        help="keys a table inserted by each fill call")
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--steps", type=int, default=MIN_STEPS, help="timed steps, at least 50")
    parser.add_argument("--sets",
                        type=int,
                        default=16,
                        help="batches rotated through (few sets: the steps' keys soon all hit)")
    parser.add_argument("--strategy", choices=["LFU", "LRU"], default="LFU")
    parser.add_argument("--tf-gpu-allocator",
                        choices=["cuda_malloc_async", "bfc"],
                        default="cuda_malloc_async",
                        help="TensorFlow's GPU allocator, which the tables allocate through "
                        "(TF_GPU_ALLOCATOR): with BFC and memory growth an arena's growth ran "
                        "out of memory at 107 GB of 150 in use (its pool regions fragment)")
    parser.add_argument("--json-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--dry-run-on-cpu",
                        action="store_true",
                        help="run on a machine without GPU: tables on the CPU without tiers, no "
                        "memory checks (checks the script only)")
    args = parser.parse_args(argv)
    if args.steps < MIN_STEPS:
        parser.error(f"--steps {args.steps}: the demonstration needs at least {MIN_STEPS}")
    if args.dry_run_on_cpu and args.rows_per_table is None:
        parser.error("--dry-run-on-cpu needs --rows-per-table (the GPU's memory sizes the run)")
    if not 0 < args.hbm_fraction < 1:
        parser.error(f"--hbm-fraction {args.hbm_fraction}: must be in (0, 1)")
    return args


def plan(args, gpu_total):
    """The run's sizes: rows a table, each table's HBM budget (bytes and
  rows), the state, the budgets and the host share in bytes, and the host
  memory the run needs (the host rows, their index, the pinned staging,
  TensorFlow)."""
    rows = args.rows_per_table or math.ceil(args.times * gpu_total / (ROW_BYTES * TABLES))
    budget_rows = max(1, int(args.hbm_fraction * rows))
    host_rows = TABLES * max(0, rows - budget_rows)
    # Pinned staging (cc/tiered_table_gpu.cu): each table's keys and record
    # addresses, both ways, grown to 1.25x the most rows one call moved (the
    # fill's write-backs: a chunk plus an eviction's slack, at most 65,536
    # rows: kMaxEvictionSlack); and the host tier's newest chunk of records in
    # each of its 16 shards, at most 8 MiB (cc/host_tier.h), partly empty.
    moved_rows = min(budget_rows // 8, 1 << 16) + args.fill_chunk
    newest_chunks = min(16 * (8 << 20), max(0, rows - budget_rows) * RAW_ROW_BYTES)
    staging = TABLES * (1.25 * moved_rows * 2 * (8 + 8) + newest_chunks)
    return dict(rows=rows,
                budget_rows=budget_rows,
                budget_bytes=budget_rows * ROW_BYTES,
                state_bytes=TABLES * rows * ROW_BYTES,
                hbm_bytes=TABLES * budget_rows * ROW_BYTES,
                host_rows=host_rows,
                staging_bytes=staging,
                host_need=host_rows * RAW_ROW_BYTES * HOST_INDEX + staging + HOST_RESERVE)


def check_fits(sizes, gpu_total, available):
    """Raises SystemExit, naming the numbers, when the budgets would take more
  than HBM_LIMIT of the GPU's memory or the host share more than the host's
  MemAvailable (bytes)."""
    if sizes["rows"] >= SCATTER:
        raise SystemExit(f"refused: {sizes['rows']:,} rows a table; the id scatter needs fewer "
                         f"than {SCATTER:,}")
    if sizes["hbm_bytes"] > HBM_LIMIT * gpu_total:
        raise SystemExit(f"refused: the HBM budgets ({sizes['hbm_bytes'] / 1e9:.1f} GB) exceed "
                         f"{HBM_LIMIT:.0%} of the GPU's {gpu_total / 1e9:.1f} GB "
                         f"({HBM_LIMIT * gpu_total / 1e9:.1f} GB); lower --hbm-fraction or --times")
    if sizes["host_need"] > available:
        raise SystemExit(
            f"refused: the host share needs {sizes['host_need'] / 1e9:.1f} GB "
            f"({sizes['host_rows']:,} host rows x {RAW_ROW_BYTES} B x {HOST_INDEX} = "
            f"{sizes['host_rows'] * RAW_ROW_BYTES * HOST_INDEX / 1e9:.1f} GB, pinned staging "
            f"{sizes['staging_bytes'] / 1e9:.1f} GB, TensorFlow {HOST_RESERVE / 1e9:.0f} GB); "
            f"MemAvailable is {available / 1e9:.1f} GB; raise --hbm-fraction or lower --times")


def mem_available():
    """/proc/meminfo's MemAvailable in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def status(*fields):
    """Fields of /proc/self/status in bytes (VmRSS: the resident set; VmHWM:
  its peak; RssAnon, RssShmem; VmLck, VmPin: locked and pinned)."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            name = line.split(":", 1)[0]
            if name in fields:
                found[name] = int(line.split()[1]) * 1024
    return [found.get(name, 0) for name in fields]


def rss():
    """This process's resident set (VmRSS) in bytes."""
    return status("VmRSS")[0]


def host_memory():
    """A line of this process's and the system's host memory."""
    names = ("VmRSS", "VmHWM", "RssAnon", "RssShmem", "VmLck", "VmPin")
    values = status(*names)
    return ", ".join(f"{n} {v / 1e9:.1f} GB" for n, v in zip(names, values)) + (
        f"; MemAvailable {mem_available() / 1e9:.1f} GB")


def batch_ids(args, rows):
    """ids[s][t]: (batch,) int64 ids in [0, rows) of set s, table t: Zipf
  ranks scattered by (rank * SCATTER + t * 7919) mod rows, a bijection per
  table (SCATTER is a prime above rows), so no permutation of the rows is
  drawn."""
    rng = np.random.default_rng(5000)
    out = []
    for _ in range(args.sets):
        ranks = (rng.zipf(ZIPF, (TABLES, args.batch)) - 1) % rows
        out.append([(ranks[t] * SCATTER + t * 7919) % rows for t in range(TABLES)])
    return out


def storage_option(sok, args, sizes):
    """HBM_DRAM with the table's budget on a GPU; None (no tiers) in a dry run."""
    if args.dry_run_on_cpu:
        return None
    return sok.EmbeddingVariableOption(
        storage_option=sok.StorageOption(storage_type=sok.StorageType.HBM_DRAM,
                                         storage_size=[sizes["budget_bytes"]],
                                         cache_strategy=getattr(sok.CacheStrategy, args.strategy)))


def summed(counters, names):
    return {k: sum(int(c[k]) for c in counters) for k in names}


class Clock:
    """Seconds since the script started, printed with each phase."""

    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self, message):
        print(f"[{time.perf_counter() - self.start:6.1f} s] {message}", flush=True)


def gpu_in_use(tf, args):
    """(TensorFlow allocator current, its peak, cuMemGetInfo used) in bytes;
  Nones in a dry run."""
    if args.dry_run_on_cpu:
        return None, None, None
    info = tf.config.experimental.get_memory_info("GPU:0")
    return info["current"], info["peak"], gpu_memory.used_bytes()


def fill(sess, args, sizes, fill_keys, fill_op, counters, clock):
    """Inserts every table's rows, --fill-chunk keys a table a call; returns
  the seconds it took."""
    rows = sizes["rows"]
    starts = range(0, rows, args.fill_chunk)
    every = max(1, len(starts) // 10)
    began = time.perf_counter()
    for i, start in enumerate(starts):
        ids = np.arange(start, min(start + args.fill_chunk, rows))
        sess.run(fill_op, {fill_keys: np.stack([raw_keys(t, ids) for t in range(TABLES)])})
        if (i + 1) % every == 0 or i + 1 == len(starts):
            seconds = time.perf_counter() - began
            done = TABLES * min(start + args.fill_chunk, rows)
            tiers = summed(sess.run(counters), ("hbm_rows", "host_rows"))
            left = seconds * (TABLES * rows - done) / done
            clock(f"fill {100 * done / (TABLES * rows):5.1f}%: {done:,} rows in {seconds:.1f} s "
                  f"({done / seconds:,.0f} rows/s, about {left:.0f} s to go); HBM "
                  f"{tiers['hbm_rows']:,}, host {tiers['host_rows']:,} rows; RSS "
                  f"{rss() / 1e9:.1f} GB")
    return time.perf_counter() - began


def run(tf, sok, args, sizes, values, clock):
    """Builds the graph, runs one step (the tables get the optimizer's slot),
  fills the tables, times the steps; returns the figures."""
    out = {}
    graph = tf.Graph()
    config = tf.compat.v1.ConfigProto()
    config.gpu_options.allow_growth = True
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=config) as sess:
        holder = tf.compat.v1.placeholder(tf.int64, values.shape)
        batches = tf.Variable(holder, trainable=False, name="batches")
        index = tf.compat.v1.placeholder(tf.int32, [])
        tables = make_tables(tf, sok, "capacity", storage_option(sok, args, sizes),
                             args.dry_run_on_cpu)
        j = tf.range(args.batch, dtype=tf.int64)
        where = tf.stack([j, tf.zeros_like(j)], axis=1)
        ids = [tf.SparseTensor(where, batches[index][t], [args.batch, 1]) for t in range(TABLES)]
        embeddings = sok.lookup_sparse(tables, ids, combiners=["sum"] * TABLES)
        loss = tf.add_n([tf.reduce_sum(e) for e in embeddings])
        # The slots are made here, before the fill: every row is created with its slot.
        train = tf.compat.v1.train.AdagradOptimizer(LR, ACCUMULATOR).minimize(loss)
        # The fill: one key a bag, a chunk of keys a table fed each call.
        fill_keys = tf.compat.v1.placeholder(tf.int64, [TABLES, None])
        n = tf.shape(fill_keys, out_type=tf.int64)[1]
        k = tf.range(n)
        fill_where = tf.stack([k, tf.zeros_like(k)], axis=1)
        fill_ids = [
            tf.SparseTensor(fill_where, fill_keys[t], tf.stack([n, 1])) for t in range(TABLES)
        ]
        fill_op = tf.add_n(
            [tf.reduce_sum(e) for e in sok.lookup_sparse(tables, fill_ids, ["sum"] * TABLES)])
        counters = [table.tier_counters() for table in tables]
        sess.run(tf.compat.v1.global_variables_initializer(), {holder: values})
        # A table gets the optimizer's slot at its first update
        # (SokEv>SparseApplyOptimizer), not when the optimizer is built: one
        # step before the fill, so that every row is created with its slot and
        # the budgets count values and slots (2 x dim floats a row).
        sess.run(train, {index: 0})
        clock("graph built, variables initialised, slots made by one step")

        rss_before, out["available_before_fill"] = rss(), mem_available()
        out["fill_s"] = fill(sess, args, sizes, fill_keys, fill_op, counters, clock)
        out.update({f"fill_{k}": v for k, v in summed(sess.run(counters), MOVED).items()})
        tiers = summed(sess.run(counters), ("hbm_rows", "host_rows"))
        out["filled_hbm_rows"], out["filled_host_rows"] = tiers["hbm_rows"], tiers["host_rows"]
        out["tf_current"], out["tf_peak"], out["cuda_used"] = gpu_in_use(tf, args)
        out["rss_before_fill"], out["rss_after_fill"] = rss_before, rss()
        out["available_after_fill"] = mem_available()
        clock(f"filled: HBM {tiers['hbm_rows']:,} rows, host {tiers['host_rows']:,} rows; GPU "
              f"in use {out['tf_current']} B (TensorFlow), {out['cuda_used']} B (CUDA); "
              f"{host_memory()}")
        if not args.dry_run_on_cpu:
            tf.config.experimental.reset_memory_stats("GPU:0")

        times = []
        for s in range(args.steps + WARMUP):
            if s == WARMUP:
                before = sess.run(counters)
            start = time.perf_counter()
            sess.run([train, loss], {index: s % args.sets})
            times.append(time.perf_counter() - start)
            if (s + 1) % 10 == 0:
                clock(f"step {s + 1}: {times[-1] * 1e3:.1f} ms")
        after = sess.run(counters)
        # Read before the Session closes: closing it frees the tables.
        _, out["tf_train_peak"], out["cuda_used_after"] = gpu_in_use(tf, args)
        out["rss_after"], out["rss_peak"] = status("VmRSS", "VmHWM")
        out["available_after"] = mem_available()
        clock(f"steps done: {host_memory()}")
    out["ms"] = float(np.median(times[WARMUP:])) * 1e3
    out["warmup_ms"] = [t * 1e3 for t in times[:WARMUP]]
    out["moved"] = {
        k: sum(int(a[k]) - int(b[k]) for a, b in zip(after, before)) / args.steps for k in MOVED
    }
    tiers = summed(after, ("hbm_rows", "host_rows"))
    out["hbm_rows"], out["host_rows"] = tiers["hbm_rows"], tiers["host_rows"]
    return out


def gb(value):
    return "—" if value is None else f"{value / 1e9:.1f} GB"


def per_key(used, rows):
    """'B a key (ratio to the raw 1,040)' of `used` bytes over `rows` rows."""
    if used is None or not rows:
        return "—"
    return f"{used / rows:,.0f} B ({used / rows / RAW_ROW_BYTES:.2f}× the raw {RAW_ROW_BYTES:,})"


def report(args, sizes, gpu_total, gpu_name, out):
    """The section (markdown) and whether the run met issue 50's demonstration."""
    state, hbm = sizes["state_bytes"], sizes["hbm_bytes"]
    ratio = state / gpu_total if gpu_total else None
    moved = out["moved"]
    looked = moved["hits"] + moved["misses"]
    host_rows = out["host_rows"]
    checks = {
        f"state ≥ {args.times:g}× the GPU's memory": ratio is not None and ratio >= args.times,
        f"≥ {MIN_STEPS} steps": args.steps >= MIN_STEPS,
        "host memory holds rows": host_rows > 0,
        "HBM within the budgets": out["hbm_rows"] <= TABLES * sizes["budget_rows"],
    }
    missed = [name for name, ok in checks.items() if not ok]
    verdict = "**met**" if not missed else f"**not met** ({'; '.join(missed)})"
    hit_rate = f"{100 * moved['hits'] / looked:.1f}%" if looked else "—"
    samples = args.batch / (out["ms"] / 1e3)
    fill_rows = TABLES * sizes["rows"]
    gpu = f"{gpu_name}, {gb(gpu_total)} (cuDeviceTotalMem)" if gpu_total else gpu_name
    of_gpu = f", {ratio:.2f}× the GPU's memory" if ratio else ""
    dry = " (dry run: no tiers, tables on the CPU)" if args.dry_run_on_cpu else ""
    header = (
        f"{machine()}. Command: `{command()}`. GPU: {gpu}. {TABLES} tables × "
        f"{sizes['rows']:,} rows, dim {DIM}, Adagrad ({ROW_BYTES:,} B of value and slot a row, "
        f"{RAW_ROW_BYTES:,} B with frequency and version), graph mode, TensorFlow's GPU "
        f"allocator {args.tf_gpu_allocator}. State (values + slots): {gb(state)}{of_gpu} "
        f"(--times {args.times:g}). HBM budgets: {gb(hbm)} together ({args.hbm_fraction:.0%} of "
        f"the state, {sizes['budget_rows']:,} rows a table), {args.strategy}{dry}. Fill: "
        f"{args.fill_chunk:,} keys a table a call, after one step made the optimizer's slots. "
        f"Steps: batch {args.batch:,}, one-hot, Zipf {ZIPF} ranks scattered over each table's "
        f"rows ((r × {SCATTER} + 7919 t) mod rows), {args.sets} batches rotated (so after the "
        f"first round most keys hit), sum combiner, loss = sum of the outputs; median of "
        f"{args.steps} steps after {WARMUP} warm-up. Counters a step: the tables' tier_counters "
        f"over the timed steps, summed over tables. cuMemGetInfo counts what the allocator keeps "
        f"in its pool too, so its bytes a key are an upper bound. Issue 50's demonstration: "
        f"{verdict}.")
    lines = [
        f"\n## One GPU trains tables larger than its memory (HBM + host tiers), "
        f"{datetime.date.today()}", "", header, "", "| figure | value |", "|---|---|",
        f"| state (values + Adagrad slots) | {gb(state)}"
        f"{' = %.2f× GPU memory (%s)' % (ratio, gb(gpu_total)) if ratio else ''} |",
        f"| HBM budgets | {gb(hbm)} ({args.hbm_fraction:.0%} of the state) |",
        f"| rows in HBM / in host memory, after the fill | {out['filled_hbm_rows']:,} / "
        f"{out['filled_host_rows']:,} |",
        f"| rows in HBM / in host memory, after the steps | {out['hbm_rows']:,} / "
        f"{host_rows:,} |", f"| fill | {fill_rows:,} rows in {out['fill_s']:.1f} s "
        f"({fill_rows / out['fill_s']:,.0f} rows/s); {out['fill_rows_to_host']:,} rows "
        f"written back |", f"| step | {out['ms']:.2f} ms median, {samples:,.0f} samples/s "
        f"(warm-up {', '.join(f'{t:.0f}' for t in out['warmup_ms'])} ms) |",
        f"| hit rate | {hit_rate} |",
        f"| rows to HBM / to host a step | {moved['rows_to_hbm']:,.0f} / "
        f"{moved['rows_to_host']:,.0f} |", f"| PCIe a step | {moved['pcie_bytes'] / 1e6:.1f} MB |",
        f"| host ms a step: choose / write back / bring in | {host_ms(moved)} |",
        f"| GPU in use after the fill: TensorFlow's allocator (peak) | {gb(out['tf_current'])} "
        f"({gb(out['tf_peak'])}) |",
        f"| GPU in use after the fill: CUDA (cuMemGetInfo) | {gb(out['cuda_used'])} |",
        f"| GPU peak during the steps (TensorFlow) / CUDA after them | "
        f"{gb(out['tf_train_peak'])} / {gb(out['cuda_used_after'])} |",
        f"| bytes a key in HBM (TensorFlow ÷ HBM rows) | "
        f"{per_key(out['tf_current'], out['filled_hbm_rows'])} |",
        f"| bytes a key in HBM (CUDA ÷ HBM rows) | "
        f"{per_key(out['cuda_used'], out['filled_hbm_rows'])} |",
        f"| host RSS: before the fill / after it / after the steps | "
        f"{gb(out['rss_before_fill'])} / {gb(out['rss_after_fill'])} / {gb(out['rss_after'])} |",
        f"| host memory: planned need / MemAvailable at the start | {gb(sizes['host_need'])} "
        f"(host rows × {RAW_ROW_BYTES:,} B × {HOST_INDEX}, pinned staging "
        f"{gb(sizes['staging_bytes'])}, {gb(HOST_RESERVE)} for TensorFlow) / "
        f"{gb(out['mem_available'])} |",
        f"| host memory the run took (MemAvailable's drop from before the fill): after the "
        f"fill / after the steps | "
        f"{gb(out['available_before_fill'] - out['available_after_fill'])} / "
        f"{gb(out['available_before_fill'] - out['available_after'])} |",
        f"| host RSS peak (VmHWM) | {gb(out['rss_peak'])} |",
        f"| bytes a host row, upper bound (RSS ÷ host rows) | "
        f"{per_key(out['rss_after_fill'], out['filled_host_rows'])} |",
        f"| bytes a host row (RSS growth in the fill ÷ host rows; pinned staging included) | "
        f"{per_key(out['rss_after_fill'] - out['rss_before_fill'], out['filled_host_rows'])} |"
    ]
    return "\n".join(lines) + "\n", not missed


def main():
    args = parse_args()
    clock = Clock()
    gpu_total = None if args.dry_run_on_cpu else gpu_memory.total_bytes()
    if not args.dry_run_on_cpu and gpu_total is None:
        raise SystemExit("refused: CUDA's driver reports no GPU memory (no GPU or no libcuda)")
    sizes = plan(args, gpu_total)
    available = mem_available()
    ratio = f" ({sizes['state_bytes'] / gpu_total:.2f}× the GPU)" if gpu_total else ""
    clock(f"GPU memory {gb(gpu_total)}; {TABLES} tables × {sizes['rows']:,} rows: state "
          f"{gb(sizes['state_bytes'])}{ratio}, HBM "
          f"budgets {gb(sizes['hbm_bytes'])} ({sizes['budget_rows']:,} rows a table), host "
          f"share {sizes['host_rows']:,} rows, host memory needed about "
          f"{gb(sizes['host_need'])} of MemAvailable {gb(available)}")
    if not args.dry_run_on_cpu:
        check_fits(sizes, gpu_total, available)
    # Read when TensorFlow makes its GPU device.
    if args.tf_gpu_allocator == "bfc":
        os.environ.pop("TF_GPU_ALLOCATOR", None)
    else:
        os.environ["TF_GPU_ALLOCATOR"] = args.tf_gpu_allocator
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import sok_ev as sok  # pylint: disable=import-outside-toplevel
    gpus = tf.config.list_physical_devices("GPU")
    assert args.dry_run_on_cpu or gpus, "TensorFlow sees no GPU"
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    # The eager context first, with memory growth: its GPU allocator is the
    # Session's, and get_memory_info reads it.
    tf.config.list_logical_devices("GPU")
    gpu_name = (tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
                if gpus and not args.dry_run_on_cpu else "none (dry run on the CPU)")
    sok.init()
    ids = batch_ids(args, sizes["rows"])
    values = np.stack(
        [np.stack([raw_keys(t, ids[s][t]) for t in range(TABLES)]) for s in range(args.sets)])
    clock(f"{args.sets} batches drawn")
    out = run(tf, sok, args, sizes, values, clock)
    out["mem_available"] = available
    text, met = report(args, sizes, gpu_total, gpu_name, out)
    publish(text, args.results, os.path.join(args.json_dir, "tf_tiered_capacity_results.md"),
            "tf-tiered-capacity")
    with open(os.path.join(args.json_dir, "tf_tiered_capacity.json"), "w") as f:
        json.dump(dict(args=vars(args),
                       sizes=sizes,
                       gpu_total=gpu_total,
                       gpu_name=gpu_name,
                       met=met,
                       **out),
                  f,
                  indent=1)
    clock("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
