#!/usr/bin/env python3
"""The sparse training step inside TensorFlow on one GPU (issue 8's product
benchmark), against every baseline in the same call, on the same data.

Workload (Criteo shape): 26 tables, batch 65536, one-hot and 10-hot, dim
128, Zipf(1.1) ids over tables pre-filled with --rows keys in all (10M:
385K a table), Adagrad (lr 0.01, initial accumulator 0.1), sum combiner. Ids are drawn
once, in NumPy, from fixed seeds, identically in every process.

Every side takes the same given upstream gradient, ones for every output (the
gradient of loss = sum of every output), as torch's backward(grad) and the core
step do: the step is the sparse work alone. TensorFlow gets it through
tf.gradients(grad_ys=) / GradientTape.gradient(output_gradients=). Graph mode
also times both TensorFlow sides with that loss computed in the graph
("sum loss": 26 reductions, and 26 broadcasts for their gradients, which the
sparse sides share). The SparseTensors' indices are built once, like torch's
offsets.

Three processes in turn (TensorFlow and PyTorch never share one):
  tf     sok-ev (Embedding Variables + lookup_sparse + the stock Adagrad) in
         graph mode (Session) and tf.function; the same model on stock TF:
         dense tf.Variables + tf.nn.embedding_lookup_sparse + Adagrad. Also
         host syncs per step (SokEv>GpuHostSyncs) and the GPU table memory
         per key (TF allocator, before/after). In graph mode sok-ev also runs
         with every table on TF's own stream (SOK_EV_GPU_TABLE_STREAMS=1),
         against the default side streams (side_streams_gpu.h), and both
         sides run with the sum loss.
  core   the harness running the same stages on the same data
         (core_step.py), and the device-to-device copy bandwidth.
  torch  torch.nn.EmbeddingBag(sparse=True) + torch.optim.Adagrad, every
         feature in one table (the fastest torch layout).
Then it prints the ratios and the bandwidth floor (bytes that must move /
copy bandwidth) and appends everything to benchmarks/RESULTS.md (and a copy
to $OUT/tf_sparse_step_results.md).

  source /tmp/gpu-tf/env.sh   # TensorFlow + the installed sok-ev wheel
  python3 benchmarks/gpu/tf_sparse_step.py [--hotness 1,10] [--steps 20]
"""
import argparse
import datetime
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from results import publish  # pylint: disable=wrong-import-position

TABLES, DIM, LR, ACCUMULATOR = 26, 128, 0.01, 0.1
MASK63 = np.uint64((1 << 63) - 1)


def add_workload_arguments(parser):
    """The workload's arguments, one definition for every GPU benchmark that
  draws its data from batch_ids (tf_weak_scaling.py, peers/sok_vs_sok_ev.py),
  so that "the same data" holds by default; --batch is per GPU."""
    parser.add_argument("--batch", type=int, default=65536, help="samples per GPU")
    parser.add_argument("--rows", type=int, default=10_000_000, help="keys in all tables")
    parser.add_argument("--hotness", default="1,10")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sets", type=int, default=3, help="batches rotated through")
    parser.add_argument("--json-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "RESULTS.md"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["all", "tf", "core", "torch"], default="all")
    add_workload_arguments(parser)
    parser.add_argument("--dense-steps", type=int, default=8)
    parser.add_argument("--table-streams",
                        default="1",
                        help="SOK_EV_GPU_TABLE_STREAMS values to time in graph mode beside the "
                        "default (1: every table on TensorFlow's stream)")
    parser.add_argument("--profile",
                        action="store_true",
                        help="core part: print the step's kernels by GPU time (torch.profiler)")
    parser.add_argument("--trace-steps",
                        type=int,
                        default=0,
                        help="tf part: trace this many sok-ev steps after the timed ones, in "
                        "graph mode and in tf.function, print their GPU timeline and save their "
                        "step stats to --json-dir")
    parser.add_argument("--dry-run-on-cpu",
                        action="store_true",
                        help="run the tf part on a machine without GPU (checks the script only)")
    return parser.parse_args(argv)


def rows_per_table(args):
    return args.rows // TABLES


def batch_ids(args, hot, stream=0):
    """ids[s][t]: (batch * hot,) int64 ids in [0, rows_per_table) of set s,
    table t: Zipf ranks scattered by a fixed permutation per table. Streams
    share the permutations (the same ids are hot everywhere) and draw their
    own batches: stream r is worker r's data in tf_weak_scaling.py."""
    rows = rows_per_table(args)
    rng = np.random.default_rng(1000 + hot)
    perms = [rng.permutation(rows) for _ in range(TABLES)]
    if stream:
        rng = np.random.default_rng([1000 + hot, stream])
    return [[perms[t][(rng.zipf(1.1, args.batch * hot) - 1) % rows]
             for t in range(TABLES)]
            for _ in range(args.sets)]


def raw_keys(t, ids):
    """sok-ev's keys: raw 63-bit ids, a bijection of (table, id)."""
    with np.errstate(over="ignore"):
        mixed = np.asarray(ids, np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(
            t) * np.uint64(0x632BE59BD9B4E019)
    return (mixed & MASK63).astype(np.int64)


def prefill(tf, sok, tables, rows, rank=0, size=1):
    """One lookup inserting worker `rank`'s share of each table's `rows`
  pre-filled keys (every size-th id, so that `size` workers fill each key
  once); returns a float scalar of the rows read (run it to fill)."""
    fill = []
    for t in range(len(tables)):
        keys = raw_keys(t, np.arange(rank, rows, size))
        where = np.stack([np.arange(len(keys)), np.zeros(len(keys), np.int64)], 1)
        fill.append(tf.SparseTensor(where, keys, [len(keys), 1]))
    return tf.add_n([tf.reduce_sum(e) for e in sok.lookup_sparse(tables, fill)])


def floor_bytes(args, hot, ids):
    """Bytes a step must move at least: each unique row read for the forward
    and read + written with its Adagrad slot for the update, each output
    written and each upstream gradient read once, the keys read twice."""
    unique = sum(len(np.unique(t)) for t in ids[0])
    nnz = TABLES * args.batch * hot
    bags = TABLES * args.batch
    return unique * (4 * DIM + 2 * 8 * DIM) + 2 * bags * 4 * DIM + 2 * nnz * 8, unique


def write_json(args, name, data):
    path = os.path.join(args.json_dir, f"tf_sparse_step_{name}.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


# --------------------------------------------------------------------------- TensorFlow


def part_tf(args):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    import sok_ev as sok  # pylint: disable=import-outside-toplevel
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    assert args.dry_run_on_cpu or tf.config.list_physical_devices("GPU"), "TensorFlow sees no GPU"
    sok.init()
    rows = rows_per_table(args)
    results = dict(tf_version=tf.__version__,
                   sok_ev_file=sok.__file__,
                   default_table_streams=os.environ.get("SOK_EV_GPU_TABLE_STREAMS", "built-in"))

    def memory():
        if args.dry_run_on_cpu:
            return 0
        # The previous run's tables and function graphs sit in reference
        # cycles; freed later, they would be counted against this run (a
        # tf.function ten-hot run once read -66 B a key).
        gc.collect()
        return tf.config.experimental.get_memory_info("GPU:0")["current"]

    for hot in [int(h) for h in args.hotness.split(",")]:
        ids = batch_ids(args, hot)
        our_values = np.stack([[raw_keys(t, s[t]) for t in range(TABLES)] for s in ids])
        dense_values = np.stack([np.stack(s) for s in ids]).astype(np.int64)
        for mode in ("graph", "tf_function"):
            models = ["sok_ev", "dense"]
            if mode == "graph":
                models += [f"sok_ev_streams{n}" for n in stream_settings(args)]
                models += ["sok_ev_sumloss", "dense_sumloss", "sok_ev_packed"]
            for model in models:
                key = f"{model}_{mode}_{hot}hot"
                print(f"[tf] {key}", flush=True)
                default = os.environ.get("SOK_EV_GPU_TABLE_STREAMS")
                if model.startswith("sok_ev_streams"):
                    # Read at each op.
                    os.environ["SOK_EV_GPU_TABLE_STREAMS"] = model[len("sok_ev_streams"):]
                results[key] = run_tf(tf, sok, ops, args, hot, mode, model, rows,
                                      dense_values if model.startswith("dense") else our_values,
                                      memory)
                if default is None:
                    os.environ.pop("SOK_EV_GPU_TABLE_STREAMS", None)
                else:
                    os.environ["SOK_EV_GPU_TABLE_STREAMS"] = default
                print(f"[tf] {key}: {results[key]}", flush=True)
                write_json(args, "tf", results)


def stream_settings(args):
    """The SOK_EV_GPU_TABLE_STREAMS values graph mode also runs, beside the
    default (side_streams_gpu.h)."""
    return [int(n) for n in args.table_streams.split(",") if n]


def run_tf(tf, sok, ops, args, hot, mode, model, rows, values, memory):
    """Times one (model, mode): returns ms per step and, for sok-ev, host
    syncs per step and table bytes per key. A model is "sok_ev" or "dense",
    with "_streams<n>" (SOK_EV_GPU_TABLE_STREAMS, set by the caller),
    "_sumloss" (the loss computed in the graph) or, for sok-ev, "_packed"
    (the ids as one RaggedTensor [26, batch, hot]) in graph mode."""
    ours = model.startswith("sok_ev")
    sum_loss = model.endswith("_sumloss")
    packed = model.endswith("_packed")
    steps = args.steps if ours else args.dense_steps
    out = {}
    n = args.batch * hot
    # Built once, like torch's offsets: bag j // hot, position j % hot.
    indices = np.stack([np.arange(n) // hot, np.arange(n) % hot], axis=1).astype(np.int64)

    def build():
        if ours:
            tables = [
                sok.get_embedding_variable(f"{model}_{mode}_{hot}_t{t}",
                                           embedding_dim=DIM,
                                           initializer=tf.random_uniform_initializer(-0.05, 0.05))
                for t in range(TABLES)
            ]
        else:
            tables = [
                tf.Variable(tf.random.uniform([rows, DIM], -0.05, 0.05), name=f"dense_{t}")
                for t in range(TABLES)
            ]
        return tables

    def sparse_batch(values_var, indices_var, index):
        batch, ids = values_var[index], indices_var.read_value()
        if packed:  # every table's keys side by side, hot a sample
            return tf.RaggedTensor.from_uniform_row_length(
                tf.RaggedTensor.from_uniform_row_length(tf.reshape(batch, [-1]), hot), args.batch)
        return [tf.SparseTensor(ids, batch[t], [args.batch, hot]) for t in range(TABLES)]

    def lookup(tables, ids):
        if ours:
            return sok.lookup_sparse(tables, ids, combiners=["sum"] * TABLES)
        return [
            tf.nn.embedding_lookup_sparse(v, i, None, combiner="sum") for v, i in zip(tables, ids)
        ]

    def upstream(ones_var):
        """The outputs' gradient: ones, one tensor made once and shared by
        every table, as torch's backward(grad)."""
        return [ones_var.read_value()] * TABLES

    def prefill_op(tables):
        ops_ = []
        for t, ev in enumerate(tables):
            keys = tf.constant(raw_keys(t, np.arange(rows)))
            sp = tf.SparseTensor(
                tf.stack([tf.range(rows, dtype=tf.int64),
                          tf.zeros([rows], tf.int64)], 1), keys, [rows, 1])
            ops_.append(sok.lookup_sparse([ev], [sp])[0])
        return [tf.reduce_sum(o) for o in ops_]

    if mode == "graph":
        graph = tf.Graph()
        with graph.as_default():
            config = tf.compat.v1.ConfigProto()
            config.gpu_options.allow_growth = True
            with tf.compat.v1.Session(graph=graph, config=config) as sess:
                holder = tf.compat.v1.placeholder(tf.int64, values.shape)
                values_var = tf.Variable(holder, trainable=False, name="batches")
                indices_var = tf.Variable(indices, trainable=False, name="indices")
                ones_var = tf.Variable(tf.ones([args.batch, DIM]), trainable=False, name="ones")
                index = tf.compat.v1.placeholder(tf.int32, [])
                tables = build()
                outputs = lookup(tables, sparse_batch(values_var, indices_var, index))
                opt = tf.compat.v1.train.AdagradOptimizer(LR, ACCUMULATOR)
                if sum_loss:
                    fetch = tf.add_n([tf.reduce_sum(e) for e in outputs])
                    train = opt.minimize(fetch)
                else:
                    grads = tf.gradients(outputs, tables, grad_ys=upstream(ones_var))
                    train = opt.apply_gradients(zip(grads, tables))
                    # Every output is computed, as torch's forward is.
                    fetch = tf.group(*outputs)
                fill = prefill_op(tables) if ours else None
                syncs = ops().sok_ev_gpu_host_syncs()
                sess.run(tf.compat.v1.global_variables_initializer(), {holder: values})
                before = memory()
                if fill is not None:
                    sess.run(fill)
                times = []
                for s in range(steps + 3):
                    if s == 3:
                        syncs_before = sess.run(syncs)
                    start = time.perf_counter()
                    sess.run([train, fetch], {index: s % args.sets})
                    times.append(time.perf_counter() - start)
                out["host_syncs_per_step"] = (sess.run(syncs) - syncs_before) / steps
                out["table_bytes"] = memory() - before
                if model == "sok_ev":
                    trace_steps(
                        tf, args, hot,
                        lambda s, **kw: sess.run([train, fetch], {index: s % args.sets}, **kw))
    else:
        values_var = tf.Variable(values, trainable=False)
        indices_var = tf.Variable(indices, trainable=False)
        ones_var = tf.Variable(tf.ones([args.batch, DIM]), trainable=False)
        tables = build()
        opt = tf.compat.v1.train.AdagradOptimizer(LR, ACCUMULATOR)
        before = memory()
        if ours:
            prefill_op(tables)

        @tf.function
        def step(i):
            with tf.GradientTape() as tape:
                outputs = lookup(tables, sparse_batch(values_var, indices_var, i))
            grads = tape.gradient(outputs, tables, output_gradients=upstream(ones_var))
            opt.apply_gradients(zip(grads, tables))
            with tf.control_dependencies(outputs):  # every output is computed
                return tf.identity(i)

        times = []
        for s in range(steps + 3):
            if s == 3:
                syncs_before = int(ops().sok_ev_gpu_host_syncs())
            start = time.perf_counter()
            step(tf.constant(s % args.sets)).numpy()
            times.append(time.perf_counter() - start)
        out["host_syncs_per_step"] = (int(ops().sok_ev_gpu_host_syncs()) - syncs_before) / steps
        out["table_bytes"] = memory() - before
        if model == "sok_ev":
            trace_function_steps(tf, args, hot, lambda s: step(tf.constant(s % args.sets)).numpy())
        del tables, opt, values_var, indices_var, ones_var
    timed = np.array(times[3:]) * 1e3
    out.update(ms=float(np.median(timed)), ms_min=float(timed.min()), ms_max=float(timed.max()))
    if ours:
        raw = 8 + 2 * 4 * DIM  # key + value + Adagrad slot
        out["bytes_per_key"] = out["table_bytes"] / (TABLES * rows)
        out["bytes_per_key_ratio"] = out["bytes_per_key"] / raw
    else:
        del out["host_syncs_per_step"]
    return out


def trace_steps(tf, args, hot, run):
    """--trace-steps graph-mode steps traced (RunOptions.FULL_TRACE): each
    step's GPU timeline printed (step_profile.gpu_timeline) and its step
    stats saved as tf_sparse_step_trace_<hot>hot_<s>.pb in --json-dir."""
    import step_profile  # pylint: disable=import-outside-toplevel
    for s in range(args.trace_steps):
        _, step_stats = step_profile.traced(
            lambda options, metadata, s=s: run(s, options=options, run_metadata=metadata))
        step_profile.save_and_print_timeline(
            step_stats, os.path.join(args.json_dir, f"tf_sparse_step_trace_{hot}hot_{s}.pb"),
            f" {hot}-hot step {s}")


def trace_function_steps(tf, args, hot, run):
    """--trace-steps tf.function steps (`run(s)`) under TensorFlow's
    profiler (tf.profiler.experimental, which a Session's RunOptions cannot
    reach): their GPU timeline printed and saved, as StepStats
    (step_profile.xspace_step_stats), as tf_sparse_step_fn_trace_<hot>hot.pb
    in --json-dir."""
    if not args.trace_steps:
        return
    import step_profile  # pylint: disable=import-outside-toplevel
    traced = step_profile.trace_function(tf, run, args.trace_steps)
    if traced is None:
        print(f"[timeline] tf.function {hot}-hot: the profiler wrote no .xplane.pb")
        return
    stats, unattributed = traced
    if unattributed:
        print(f"[timeline] kernels without an op annotation; their stats: {unattributed}")
    with open(os.path.join(args.json_dir, f"tf_sparse_step_fn_trace_{hot}hot.pb"), "wb") as f:
        f.write(stats.SerializeToString())
    step_profile.print_timeline(step_profile.gpu_timeline(stats),
                                f" tf.function {hot}-hot, {args.trace_steps} steps")


# --------------------------------------------------------------------------- PyTorch


def part_core(args):
    import torch  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, HERE)
    from common import copy_bandwidth, time_ms  # pylint: disable=import-outside-toplevel
    from core_step import CoreSparseStep  # pylint: disable=import-outside-toplevel
    import sokev_gpu as sg  # pylint: disable=import-outside-toplevel
    rows = rows_per_table(args)
    results = dict(copy_TBps=copy_bandwidth() / 1e12, device=torch.cuda.get_device_name())
    tables = []
    for t in range(TABLES):
        table = sg.HashTable(DIM,
                             torch.int64,
                             init="uniform",
                             a=-0.05,
                             b=0.05,
                             seed=t,
                             capacity=rows)
        table.find_or_insert(torch.from_numpy(raw_keys(t, np.arange(rows))).cuda())
        table.add_slot("accumulator", ACCUMULATOR)
        tables.append(table)
    step = CoreSparseStep(tables, "adagrad", lr=LR)
    counter = dict(step=0)
    for hot in [int(h) for h in args.hotness.split(",")]:
        ids = batch_ids(args, hot)
        sets = []
        offsets = [torch.arange(0, args.batch * hot + 1, hot, dtype=torch.int64, device="cuda")
                  ] * TABLES
        for s in ids:
            keys = [torch.from_numpy(raw_keys(t, s[t])).cuda() for t in range(TABLES)]
            grads = [torch.ones((args.batch, DIM), device="cuda") for _ in range(TABLES)]
            sets.append((keys, grads))

        def run(batch):
            counter["step"] += 1
            step(batch[0], offsets, batch[1], counter["step"])

        median, low, high = time_ms(run, sets, warmup=3, reps=args.steps)
        if args.profile:
            profile_kernels(run, sets, hot, median)
        fb, unique = floor_bytes(args, hot, ids)
        results[f"core_{hot}hot"] = dict(ms=median,
                                         ms_min=low,
                                         ms_max=high,
                                         floor_bytes=fb,
                                         unique_keys=unique)
        print(f"[core] {hot}-hot: {median:.3f} ms [{low:.3f}, {high:.3f}]", flush=True)
    write_json(args, "core", results)


def profile_kernels(run, sets, hot, step_ms, steps=3):
    """Prints the kernels of `steps` core steps by total GPU time, and their
  sum per step beside the step's wall time: a step whose kernels take much
  less than its wall time is bound by launches and host work, not the GPU."""
    import torch  # pylint: disable=import-outside-toplevel
    from torch.profiler import ProfilerActivity, profile  # pylint: disable=import-outside-toplevel
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for s in range(steps):
            run(sets[s % len(sets)])
        torch.cuda.synchronize()
    events = prof.key_averages()
    print(events.table(sort_by="device_time_total", row_limit=30, max_name_column_width=90),
          flush=True)
    on_gpu = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
    kernel_us = sum(e.device_time_total for e in on_gpu)
    launches = sum(e.count for e in on_gpu)
    print(
        f"[core profile] {hot}-hot: kernels {kernel_us / steps / 1000:.3f} ms a step "
        f"({launches / steps:.0f} kernels and copies) of {step_ms:.3f} ms wall",
        flush=True)


def part_torch(args):
    """Two layouts, the faster one is the baseline: every feature in one
    EmbeddingBag (fewest launches; torch's sparse gradient coalescing fails
    past 2^31 values, so 10-hot runs out of it) and one EmbeddingBag per
    feature."""
    import torch  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, HERE)
    from common import time_ms  # pylint: disable=import-outside-toplevel
    rows = rows_per_table(args)
    results = {}
    for hot in [int(h) for h in args.hotness.split(",")]:
        ids = batch_ids(args, hot)
        timings = {}
        if TABLES * args.batch * hot * DIM < 2**31:
            emb = torch.nn.EmbeddingBag(TABLES * rows, DIM, mode="sum", sparse=True).cuda()
            opt = torch.optim.Adagrad(emb.parameters(),
                                      lr=LR,
                                      initial_accumulator_value=ACCUMULATOR)
            offsets = torch.arange(0,
                                   TABLES * args.batch * hot,
                                   hot,
                                   dtype=torch.int64,
                                   device="cuda")
            grad = torch.ones((TABLES * args.batch, DIM), device="cuda")
            sets = [
                torch.from_numpy(np.concatenate([t * rows + s[t]
                                                 for t in range(TABLES)])).cuda()
                for s in ids
            ]

            def run_one(index):
                emb(index, offsets).backward(grad)
                opt.step()
                opt.zero_grad(set_to_none=True)

            timings["one_table"] = time_ms(run_one, sets, warmup=3, reps=max(args.steps // 2, 5))
            del emb, opt, sets
            torch.cuda.empty_cache()
        bags = [
            torch.nn.EmbeddingBag(rows, DIM, mode="sum", sparse=True).cuda() for _ in range(TABLES)
        ]
        opt = torch.optim.Adagrad([p for b in bags for p in b.parameters()],
                                  lr=LR,
                                  initial_accumulator_value=ACCUMULATOR)
        offsets = torch.arange(0, args.batch * hot, hot, dtype=torch.int64, device="cuda")
        grad = torch.ones((args.batch, DIM), device="cuda")
        sets = [[torch.from_numpy(s[t]).cuda() for t in range(TABLES)] for s in ids]

        def run_per_table(indices):
            for bag, index in zip(bags, indices):
                bag(index, offsets).backward(grad)
            opt.step()
            opt.zero_grad(set_to_none=True)

        timings["per_table"] = time_ms(run_per_table, sets, warmup=3, reps=max(args.steps // 2, 5))
        del bags, opt, sets
        torch.cuda.empty_cache()
        layout = min(timings, key=lambda k: timings[k][0])
        median, low, high = timings[layout]
        results[f"torch_{hot}hot"] = dict(ms=median,
                                          ms_min=low,
                                          ms_max=high,
                                          layout=layout,
                                          layouts={
                                              k: v[0] for k, v in timings.items()
                                          })
        print(f"[torch] {hot}-hot: " + ", ".join(f"{k} {v[0]:.3f} ms" for k, v in timings.items()),
              flush=True)
    write_json(args, "torch", results)


# --------------------------------------------------------------------------- report


def report(args):
    load = lambda name: json.load(open(os.path.join(args.json_dir, f"tf_sparse_step_{name}.json")))
    tf_r, core, torch_r = load("tf"), load("core"), load("torch")
    bw = core["copy_TBps"] * 1e12
    command = "python3 benchmarks/gpu/tf_sparse_step.py " + " ".join(sys.argv[1:])
    lines = [
        f"\n## TF sparse step on one GPU, {datetime.date.today()}",
        "",
        f"Machine: {core['device']} (device tool), TensorFlow {tf_r['tf_version']}, sok-ev from "
        f"`{tf_r['sok_ev_file']}`. Command: `{command}`. {TABLES} tables, batch {args.batch}, dim "
        f"{DIM}, {args.rows} keys pre-filled, Zipf 1.1, Adagrad; median ms per step. Copy "
        f"bandwidth {bw / 1e12:.2f} TB/s.",
        "",
        "| hotness | mode | sok-ev | dense TF | torch EmbeddingBag (faster layout) | core step "
        "(harness) | "
        "dense ÷ sok-ev | torch ÷ sok-ev | sok-ev ÷ core | floor | % of floor | host syncs "
        "/ step | table B/key (÷ raw) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for hot in [int(h) for h in args.hotness.split(",")]:
        c = core[f"core_{hot}hot"]
        t = torch_r[f"torch_{hot}hot"]
        floor_ms = c["floor_bytes"] / bw * 1e3
        for mode in ("graph", "tf_function"):
            ours = tf_r[f"sok_ev_{mode}_{hot}hot"]
            dense = tf_r[f"dense_{mode}_{hot}hot"]
            lines.append(
                f"| {hot} | {mode} | {ours['ms']:.2f} | {dense['ms']:.2f} | {t['ms']:.2f} "
                f"({t['layout']}) | "
                f"{c['ms']:.2f} | {dense['ms'] / ours['ms']:.1f}× | {t['ms'] / ours['ms']:.2f}× | "
                f"{ours['ms'] / c['ms']:.2f}× | {floor_ms:.2f} | {100 * floor_ms / ours['ms']:.0f}% "
                f"| {ours['host_syncs_per_step']:.2f} | {ours['bytes_per_key']:.0f} "
                f"({ours['bytes_per_key_ratio']:.2f}×) |")
    hotnesses = [int(h) for h in args.hotness.split(",")]

    def streams_line(hot):
        spread = tf_r[f"sok_ev_graph_{hot}hot"]["ms"]
        others = ", ".join(f"{n} streams {tf_r[f'sok_ev_streams{n}_graph_{hot}hot']['ms']:.2f} "
                           f"({tf_r[f'sok_ev_streams{n}_graph_{hot}hot']['ms'] / spread:.2f}×)"
                           for n in stream_settings(args))
        return f"- {hot}-hot: default {spread:.2f}; {others}"

    def packed_line(hot):
        listed = tf_r[f"sok_ev_graph_{hot}hot"]["ms"]
        packed = tf_r[f"sok_ev_packed_graph_{hot}hot"]["ms"]
        return (f"- {hot}-hot: packed {packed:.2f} ms, SparseTensors {listed:.2f} ms "
                f"({listed / packed:.2f}×)")

    def sum_loss_line(hot):
        ours = tf_r[f"sok_ev_sumloss_graph_{hot}hot"]["ms"]
        dense = tf_r[f"dense_sumloss_graph_{hot}hot"]["ms"]
        torch_ms = torch_r[f"torch_{hot}hot"]["ms"]
        return (f"- {hot}-hot: sok-ev {ours:.2f}, dense TF {dense:.2f} ms: "
                f"dense ÷ sok-ev {dense / ours:.1f}×, torch ÷ sok-ev {torch_ms / ours:.2f}×")

    for heading, line_of in (
        ("Side streams (graph mode): sok-ev with its tables spread over the default side streams "
         f"({tf_r.get('default_table_streams', '?')}), against other `SOK_EV_GPU_TABLE_STREAMS` "
         "settings (1: every table on TensorFlow's stream); ms, and setting ÷ default:",
         streams_line),
        ("Packed ids (graph mode): sok-ev with every table's ids in one RaggedTensor "
         "[26, batch, hot] (lookup_sparse's packed form, read in place by UniquePackedKeys), "
         "against one SparseTensor per table:", packed_line),
        ("With the loss in the graph (graph mode; loss = sum of every output, its 26 reductions "
         "and 26 broadcast gradients on both TensorFlow sides; torch and the core step take "
         "the upstream gradient as given):", sum_loss_line),
    ):
        lines += ["", heading, ""] + [line_of(hot) for hot in hotnesses]
    text = "\n".join(lines) + "\n"
    publish(text, args.results, os.path.join(args.json_dir, "tf_sparse_step_results.md"),
            "tf-sparse-step")


def main():
    args = parse_args()
    if args.part == "tf":
        return part_tf(args)
    if args.part == "core":
        return part_core(args)
    if args.part == "torch":
        return part_torch(args)
    os.makedirs(args.json_dir, exist_ok=True)
    for part in ("tf", "core", "torch"):
        started = time.time()
        subprocess.run([sys.executable, __file__] + sys.argv[1:] + ["--part", part], check=True)
        print(f"[{part}] done in {time.time() - started:.0f} s", flush=True)
    report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
