#!/usr/bin/env python3
"""Weak scaling of the sparse training step inside TensorFlow over Horovod
(issue 12): the same per-GPU step on 1 and on 2 GPUs, in one call.

Workload: tf_sparse_step.py's (26 tables, dim 128, Zipf 1.1 ids over tables
pre-filled with --rows keys in all, Adagrad, sum combiner, graph mode), with
`target_gpu=-1` (every table sharded over every GPU) and --batch samples per
GPU: rank r draws its own batches (tf_sparse_step.batch_ids stream r; the
same ids are hot on every rank). Ideal weak scaling keeps the step time:
efficiency = t(1 GPU) / t(N GPUs).

The driver (no arguments) launches, one after the other, each under
`horovodrun --gloo` with one GPU per rank (NCCL carries the GPU tensors):
  time      -np 1, then -np 1 per --one-gpu-variants (pipelined=1: the step
            through sok_ev.LookupPipeline, each step routing the next batch,
            the baseline of the pipelined 2-GPU runs), then -np 2: ms per
            step, steps/s, samples/s, the
            collectives the step's graph holds, and, on 2 GPUs, one
            exchange's all-to-all alone (the rows of one step over the
            transport the step's rows take: sok-ev's NCCL exchange, or
            `hvd.alltoall` when the run sets SOK_EV_ROW_TRANSPORT=horovod);
  check     -np 1 on the global batch of 2 workers (both streams, one after the
            other), then -np 2 on their halves, --check-steps steps at a small
            shape: the losses and the final lookup must agree (rtol 1e-5);
then, as far as --budget-s allows (what is skipped is listed in the report):
  time      -np 2 again per --variants (the rows over Horovod's all-to-all,
            SOK_EV_ROW_TRANSPORT=horovod; pipelined; the tables in two
            lookups, --lookup-groups: one group's exchange beside the other's
            lookup; lookup_sparse's exchange_dtype=bfloat16; run the whole
            command with HOROVOD_CYCLE_TIME=0.1 for the key exchange's sake);
  check     -np 2 with SOK_EV_ROW_TRANSPORT=horovod, against the same 1-GPU
            run (--no-check-horovod skips it);
  time      -np 1 again running the multi-worker pipeline over a one-rank
            exchange (time1_loopback; sok_ev.lookup.exchange_on_one_worker:
            the partition, the messages, the owner's deduplication, the
            combines and Horovod's collectives, with nothing to transfer),
            which splits what 2 GPUs add into the pipeline's own work and the
            rest (transfers, waiting for the peer), and again per
            --loopback-variants (SOK_EV_ROW_TRANSPORT=horovod; pipelined=1);
  check     -np 2 with exchange_dtype=bfloat16 (--check-compressed), whose
            first lookup must be within the bfloat16 bound of the 1-GPU one:
            2^-8 * hotness * 0.05 (rows start in [-0.05, 0.05]).
With --gpus 1 it runs the -np 1 time launches only (time1 and its variants,
time1_loopback and its variants). --timeline-steps N prints rank 0's GPU
timeline of N traced steps per launch (step_profile.gpu_timeline) and saves
their StepStats as trace_<tag>_<hot>hot_<step>.pb in --json-dir.
It prints the table (bytes exchanged per GPU per step from the ranks' own
routing counts; the exchange floor = those bytes ÷ the all-to-all's measured
rate) and appends it to benchmarks/RESULTS.md (a copy in
$OUT/tf_weak_scaling_results.md), with rank 0's largest op times of a few traced
steps per timed run (benchmarks/step_profile.py; --profile-steps 0 skips them).

  source /tmp/gpu-tf/env.sh   # TensorFlow, Horovod + the installed sok-ev wheel
  python3 benchmarks/gpu/tf_weak_scaling.py [--hotness 1,10] [--steps 20]
  # one GPU: the two 1-rank runs only (no 2-GPU run, no check)
  python3 benchmarks/gpu/tf_weak_scaling.py --gpus 1
  # on a CPU machine (checks the script only: Gloo, tiny shape)
  python3 benchmarks/gpu/tf_weak_scaling.py --dry-run-on-cpu --batch 256 --rows 52000 \\
      --steps 3 --check-batch 64 --check-rows 5200
"""
import argparse
import collections
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
# pylint: disable=wrong-import-position
from tf_sparse_step import (ACCUMULATOR, add_workload_arguments, DIM, LR, TABLES, batch_ids,
                            prefill, raw_keys, rows_per_table)
from results import publish  # tf_sparse_step put benchmarks/ on the path
import step_profile

ONE_GPU_PER_RANK = os.path.join(ROOT, "tests", "multiworker", "one_gpu_per_rank.sh")
CHECK_RTOL = 1e-5  # float sums in another order (per owner instead of per GPU)
INIT_SCALE = 0.05  # the tables' rows start uniform in [-INIT_SCALE, INIT_SCALE]
# Bytes of one exchanged row element, by exchange_dtype (sok_ev.row_exchange).
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Relative rounding error of one exchanged element (sok_ev.row_exchange).
RELATIVE_ERROR = {"float32": 0.0, "bfloat16": 2.0**-8, "float16": 2.0**-11}
PROFILE_TOP = 16  # op types listed per traced run
CHAINED_EXCHANGES = 8  # row all-to-alls timed back to back in one Session call


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_workload_arguments(parser)
    parser.add_argument("--gpus",
                        type=int,
                        default=2,
                        help="the scaled run's world size; 1: the one-rank runs only")
    parser.add_argument(
        "--variants",
        default="SOK_EV_ROW_TRANSPORT=horovod,pipelined=1,lookup_groups=2,"
        "exchange_dtype=bfloat16",
        help="extra 2-GPU runs, each KEY=VALUE[;KEY=VALUE], comma-separated: "
        "exchange_dtype=float32|bfloat16|float16 is lookup_sparse's, lookup_groups=G "
        "--lookup-groups, pipelined=1 --pipelined, any other key an environment variable")
    parser.add_argument(
        "--loopback-variants",
        default="SOK_EV_ROW_TRANSPORT=horovod,pipelined=1",
        help="extra one-rank pipeline runs (time1_loopback_variantN), KEY=VALUE[;KEY=VALUE], "
        "comma-separated, as --variants")
    parser.add_argument("--one-gpu-variants",
                        default="pipelined=1",
                        help="extra runs of the fused one-GPU step (time1_variantN), as "
                        "--variants: the baseline of the 2-GPU runs with the same options")
    parser.add_argument("--check-horovod",
                        action="store_true",
                        default=True,
                        help="also run the 2-GPU check with SOK_EV_ROW_TRANSPORT=horovod")
    parser.add_argument("--no-check-horovod", dest="check_horovod", action="store_false")
    parser.add_argument("--check-compressed",
                        default="bfloat16",
                        help="exchange_dtype of a second 2-GPU check against its error bound "
                        "('' skips it)")
    parser.add_argument("--check-batch", type=int, default=4096)
    parser.add_argument("--check-rows", type=int, default=260_000)
    parser.add_argument("--check-steps", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per launch")
    parser.add_argument("--budget-s",
                        type=float,
                        default=0,
                        help="seconds for the whole run (0: no limit): the one-rank pipeline, "
                        "the variants and the compressed check are skipped when the longest "
                        "launch so far no longer fits")
    parser.add_argument("--profile-steps",
                        type=int,
                        default=3,
                        help="traced steps after timing, for rank 0's op-time profile (0: none)")
    parser.add_argument("--timeline-steps",
                        type=int,
                        default=0,
                        help="traced steps after timing whose GPU timeline rank 0 prints "
                        "(step_profile.gpu_timeline: kernels in start order, idle gaps) and "
                        "saves (trace_<tag>_<hot>hot_<step>.pb in --json-dir)")
    parser.add_argument("--dry-run-on-cpu",
                        action="store_true",
                        help="CPU ranks over Gloo (checks the script only)")
    # A rank of a launch (set by the driver).
    parser.add_argument("--worker", choices=["time", "check"])
    parser.add_argument("--streams", type=int, default=0, help="check: batches fed per rank")
    parser.add_argument("--tag", default="")
    parser.add_argument("--loopback",
                        action="store_true",
                        help="one rank runs the multi-worker pipeline (exchange_on_one_worker)")
    parser.add_argument("--lookup-groups",
                        type=int,
                        default=1,
                        help="the rank's step looks its tables up in this many lookup_sparse "
                        "calls (consecutive tables each): with the native row exchange each "
                        "has its own communicator, so one group's exchange can run beside "
                        "another's lookup")
    parser.add_argument("--pipelined",
                        action="store_true",
                        help="the rank's step looks up through sok_ev.LookupPipeline: each step "
                        "routes the next batch's keys while it trains on this one")
    parser.add_argument("--function",
                        action="store_true",
                        help="the rank's step is a tf.function on eager tables (GradientTape, "
                        "the same Adagrad) instead of a tf.compat.v1.Session's graph")
    parser.add_argument("--exchange-dtype",
                        default="float32",
                        choices=sorted(ELEMENT_BYTES),
                        help="the rank's lookup_sparse exchange_dtype")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- a rank


def worker(args):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    hvd.init()
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    import sok_ev as sok  # pylint: disable=import-outside-toplevel
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    assert args.dry_run_on_cpu or tf.config.list_physical_devices("GPU"), "TensorFlow sees no GPU"
    sok.init()
    sok.lookup.exchange_on_one_worker = args.loopback
    rank, size = hvd.rank(), hvd.size()
    # check on 1 GPU: the 2 workers' batches one after the other (the global batch)
    streams = list(range(args.streams)) if args.worker == "check" and size == 1 else [rank]
    result = dict(rank=rank,
                  size=size,
                  tf_version=tf.__version__,
                  sok_ev_file=sok.__file__,
                  exchange_dtype=args.exchange_dtype)
    for hot in [int(h) for h in args.hotness.split(",")]:
        per_stream = [batch_ids(args, hot, stream) for stream in streams]
        # [set, table, entries]: the streams' ids of one table concatenated
        values = np.stack([
            np.stack([
                np.concatenate([raw_keys(t, ids[s][t])
                                for ids in per_stream])
                for t in range(TABLES)
            ])
            for s in range(args.sets)
        ])
        step = run_step_function if args.function else run_step
        result[f"{hot}hot"] = step(tf, hvd, sok, ops, args, hot, values,
                                   len(streams) * args.batch, rank, size)
        print(f"[rank {rank}/{size}] {hot}-hot: {summary(result[f'{hot}hot'])}", flush=True)
    path = os.path.join(args.json_dir, f"tf_weak_scaling_{args.tag}_rank{rank}")
    checks = {
        k: result[k].pop("check") for k in list(result) if k.endswith("hot") and "check" in result[k]
    }
    if checks:
        np.savez(path + ".npz", **{f"{k}_{n}": v for k, c in checks.items() for n, v in c.items()})
    with open(path + ".json", "w") as f:
        json.dump(result, f, indent=1)
    return 0


def summary(r):
    return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in r.items()
                     if k != "check")


def run_step(tf, hvd, sok, ops, args, hot, values, batch, rank, size):
    """Builds the step in a fresh graph and times it (or, for check, trains
  --check-steps steps and returns the losses and the last lookup)."""
    rows = rows_per_table(args)
    out = {}
    graph = tf.Graph()
    with graph.as_default():
        config = tf.compat.v1.ConfigProto()
        config.gpu_options.allow_growth = True
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            holder = tf.compat.v1.placeholder(tf.int64, values.shape)
            values_var = tf.Variable(holder, trainable=False, name="batches")
            index = tf.compat.v1.placeholder(tf.int32, [])
            tables = [
                sok.get_embedding_variable(f"ws_{hot}_t{t}",
                                           embedding_dim=DIM,
                                           initializer=tf.random_uniform_initializer(-0.05,
                                                                                     0.05,
                                                                                     seed=t),
                                           target_gpu=-1) for t in range(TABLES)
            ]
            n = batch * hot
            j = tf.range(n, dtype=tf.int64)
            where = tf.stack([j // hot, j % hot], axis=1)
            ids = [
                tf.SparseTensor(where, values_var[index][t], [batch, hot]) for t in range(TABLES)
            ]
            first_op = len(graph.get_operations())
            embeddings, prefetches, primes = [], [], []
            for group in np.array_split(np.arange(TABLES), args.lookup_groups):
                group_tables, group_ids = [tables[t] for t in group], [ids[t] for t in group]
                if not args.pipelined:
                    embeddings += sok.lookup_sparse(group_tables,
                                                    group_ids,
                                                    combiners=["sum"] * len(group),
                                                    exchange_dtype=args.exchange_dtype)
                    continue
                # The batch of `index` routed before the steps (prime), then each
                # step looks up the batch routed by the one before and routes the
                # batch of `index` (the next one).
                pipeline = sok.LookupPipeline(group_tables, ["sum"] * len(group),
                                              exchange_dtype=args.exchange_dtype)
                primes.append(pipeline.prefetch(group_ids))
                embeddings += pipeline.lookup()[0]
                prefetches.append(pipeline.prefetch(group_ids))
            loss = tf.add_n([tf.reduce_sum(e) for e in embeddings])
            train = tf.compat.v1.train.AdagradOptimizer(LR, ACCUMULATOR).minimize(loss)
            if args.pipelined:
                train = tf.group(train, *prefetches)
            kinds = collections.Counter(op.type for op in graph.get_operations()[first_op:])
            # Horovod's, and sok-ev's own NCCL exchanges (the rows' default on GPUs).
            out["collectives_per_step"] = sum(
                v for k, v in kinds.items() if k.startswith("Horovod") or k == "SokEv>NcclAlltoall")
            out["native_exchanges_per_step"] = kinds.get("SokEv>NcclAlltoall", 0)
            out["ops_per_step"] = sum(kinds.values())
            if args.loopback and not out["collectives_per_step"]:
                raise RuntimeError(f"--loopback, but the step holds no collective: {sok.__file__} "
                                   "predates sok_ev.lookup.exchange_on_one_worker")
            fill_op = prefill(tf, sok, tables, rows, rank, size)
            syncs = ops().sok_ev_gpu_host_syncs()
            sess.run(tf.compat.v1.global_variables_initializer(), {holder: values})
            sess.run(fill_op)
            if args.pipelined:
                # The step of set s routes set s + 1.
                sess.run(primes, {index: 0})
                feed = lambda s: {index: (s + 1) % args.sets}
            else:
                feed = lambda s: {index: s % args.sets}
            if args.worker == "check":
                # Set 0 looked up, check_steps steps (the set s % sets each), set 0
                # looked up again; pipelined, the last step routes set 0 for it.
                first = np.concatenate(sess.run(embeddings, {index: 0}), axis=1)
                if args.pipelined:
                    sess.run(primes, {index: 0})
                last = args.check_steps - 1
                losses = [
                    sess.run([train, loss],
                             {index: 0} if args.pipelined and s == last else feed(s))[1]
                    for s in range(args.check_steps)
                ]
                out["check"] = dict(losses=np.array(losses, np.float64),
                                    first_lookup=first,
                                    lookup=np.concatenate(sess.run(embeddings, {index: 0}), axis=1))
                return out
            times = []
            for s in range(args.steps + 3):
                if s == 3:
                    syncs_before = sess.run(syncs)
                start = time.perf_counter()
                sess.run([train, loss], feed(s))
                times.append(time.perf_counter() - start)
            out["host_syncs_per_step"] = float(sess.run(syncs) - syncs_before) / args.steps
            timed = np.array(times[3:]) * 1e3
            out.update(ms=float(np.median(timed)),
                       ms_min=float(timed.min()),
                       ms_max=float(timed.max()))
            if size > 1:
                one, chained, out["rows_to"] = alltoall_alone(tf, hvd, ops, sess, values[0], size,
                                                              args.exchange_dtype)
                out["alltoall_call_ms"] = time_alltoall(sess, one, args.steps)
                out["alltoall_ms"] = time_alltoall(sess, chained, args.steps) / CHAINED_EXCHANGES
            for s in range(args.timeline_steps):  # every rank traces, as below
                _, step_stats = step_profile.traced(lambda options, metadata, s=s: sess.run(
                    [train, loss], feed(s), options=options, run_metadata=metadata))
                if rank == 0:
                    step_profile.save_and_print_timeline(
                        step_stats, os.path.join(args.json_dir,
                                                 f"trace_{args.tag}_{hot}hot_{s}.pb"),
                        f" {hot}-hot {args.tag} step {s}")
            if args.profile_steps:  # every rank traces: the collectives need all of them
                try:
                    wall, op_ms = step_profile.profile(
                        lambda options, metadata: sess.run(
                            [train, loss], feed(0), options=options, run_metadata=metadata),
                        args.profile_steps)
                    out["profile"] = dict(traced_ms=wall, top=step_profile.top(op_ms, PROFILE_TOP))
                except Exception as error:  # pylint: disable=broad-except
                    # The timings above stand without it.
                    out["profile_error"] = f"{type(error).__name__}: {error}"[:300]
    return out


def run_step_function(tf, hvd, sok, ops, args, hot, values, batch, rank, size):
    """run_step's timing as a tf.function: eager tables, the step traced once
  (lookup_sparse, GradientTape, the same Adagrad), the batch picked by an
  index argument; one step ends when its loss is on the host. The row
  all-to-all alone is timed as in graph mode, in a Session of its own."""
    if args.pipelined or args.worker == "check" or args.loopback:
        raise ValueError("--function times the plain lookup only (no --pipelined, --loopback "
                         "or check runs)")
    rows = rows_per_table(args)
    out = {}
    values_var = tf.Variable(values, trainable=False, name=f"fn_batches_{hot}")
    tables = [
        sok.get_embedding_variable(f"fn_ws_{hot}_t{t}",
                                   embedding_dim=DIM,
                                   initializer=tf.random_uniform_initializer(-0.05, 0.05, seed=t),
                                   target_gpu=-1) for t in range(TABLES)
    ]
    optimizer = tf.compat.v1.train.AdagradOptimizer(LR, ACCUMULATOR)
    n = batch * hot
    j = tf.range(n, dtype=tf.int64)
    where = tf.stack([j // hot, j % hot], axis=1)

    @tf.function
    def step(index):
        ids = [tf.SparseTensor(where, values_var[index][t], [batch, hot]) for t in range(TABLES)]
        with tf.GradientTape() as tape:
            embeddings = sok.lookup_sparse(tables,
                                           ids,
                                           combiners=["sum"] * TABLES,
                                           exchange_dtype=args.exchange_dtype)
            loss = tf.add_n([tf.reduce_sum(e) for e in embeddings])
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss

    prefill(tf, sok, tables, rows, rank, size)
    out["collectives_per_step"] = sum(
        1 for op in step.get_concrete_function(tf.constant(0)).graph.get_operations()
        if op.type.startswith("Horovod") or op.type == "SokEv>NcclAlltoall")
    times = []
    for s in range(args.steps + 3):
        if s == 3:
            syncs_before = int(ops().sok_ev_gpu_host_syncs())
        start = time.perf_counter()
        step(tf.constant(s % args.sets)).numpy()
        times.append(time.perf_counter() - start)
    out["host_syncs_per_step"] = float(int(ops().sok_ev_gpu_host_syncs()) -
                                       syncs_before) / args.steps
    timed = np.array(times[3:]) * 1e3
    out.update(ms=float(np.median(timed)), ms_min=float(timed.min()), ms_max=float(timed.max()))
    if size > 1:
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
            one, chained, out["rows_to"] = alltoall_alone(tf, hvd, ops, sess, values[0], size,
                                                          args.exchange_dtype)
            out["alltoall_call_ms"] = time_alltoall(sess, one, args.steps)
            out["alltoall_ms"] = time_alltoall(sess, chained, args.steps) / CHAINED_EXCHANGES
    return out


def alltoall_alone(tf, hvd, ops, sess, batch_values, size, exchange_dtype):
    """One step's row exchange alone: this rank's unique keys per owner (the
  lookup's own routing, PartitionByOwner), as rows of dim 128 sent with
  sok-ev's NCCL exchange on a GPU (or hvd.alltoall on the CPU or with
  SOK_EV_ROW_TRANSPORT=horovod): float32, or float16 for a compressed
  exchange (what its 16-bit messages travel as). Like the lookup's row
  message, it leaves out the rows this rank owns itself.

  Returns (one exchange, CHAINED_EXCHANGES of them one after the other in
  one Session call, the rows of this rank's keys each worker owns, its own
  included): the chain's time per exchange leaves out the Session call's
  own cost, which a step pays once, not per exchange."""
    unique = [tf.constant(np.unique(v)) for v in batch_values]
    counts = ops().sok_ev_partition_by_owner(unique,
                                             target_workers=[-1] * len(unique),
                                             num_workers=size,
                                             N=len(unique))[-1]
    rows_to = sess.run(tf.reduce_sum(counts, axis=0))
    sent_to = rows_to.copy()
    sent_to[hvd.rank()] = 0
    wire = tf.float32 if exchange_dtype == "float32" else tf.float16
    rows = tf.Variable(tf.zeros([int(sent_to.sum()), DIM], wire), trainable=False, name="ws_rows")
    sess.run(rows.initializer)
    from sok_ev import communication  # pylint: disable=import-outside-toplevel
    if communication.row_transport(rows.device) == "nccl":
        # The transport the step's rows take: sok-ev's own NCCL exchange,
        # which is told what arrives from whom, and worker 0's communicator.
        everyone = communication.allgather_object({
            "sent_to": sent_to.tolist(),
            "id": communication.new_nccl_id() if hvd.rank() == 0 else None
        })

        def exchange(number):  # pylint: disable=unused-argument
            # One communicator: its exchanges pair by order, not by name.
            return communication.alltoall(
                rows.read_value(),
                tf.constant(sent_to, tf.int32),
                received_splits=tf.constant([e["sent_to"][hvd.rank()] for e in everyone], tf.int32),
                communicator=everyone[0]["id"])[0]
    else:

        def exchange(number):
            return hvd.alltoall(rows.read_value(),
                                splits=tf.constant(sent_to, tf.int32),
                                name=f"ws_rows_alone_{number}")

    one = tf.reduce_sum(exchange(0)[:1])
    ended = []
    for number in range(1, CHAINED_EXCHANGES + 1):
        with tf.control_dependencies(ended[-1:]):
            ended.append(tf.reduce_sum(exchange(number)[:1]))
    return one, tf.add_n(ended), rows_to.tolist()


def time_alltoall(sess, op, steps):
    """Median ms of `op` (after one run that sets NCCL up)."""
    sess.run(op)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        sess.run(op)
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


# --------------------------------------------------------------------------- the driver


def horovodrun():
    local = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return local if os.path.exists(local) else shutil.which("horovodrun")


def launch(args,
           gpus,
           mode,
           tag,
           env=None,
           streams=0,
           exchange_dtype="float32",
           loopback=False,
           lookup_groups=1,
           pipelined=False,
           function=False):
    """Runs this script's ranks under horovodrun; True when every rank wrote its
  JSON."""
    rank = [sys.executable] if args.dry_run_on_cpu else [ONE_GPU_PER_RANK, sys.executable]
    command = [
        horovodrun(), "--gloo", "-np",
        str(gpus), "-H", f"localhost:{gpus}", *rank, __file__, *sys.argv[1:], "--worker", mode,
        "--tag", tag, "--streams",
        str(streams), "--exchange-dtype", exchange_dtype, "--lookup-groups",
        str(lookup_groups)
    ] + (["--loopback"] if loopback else []) + (["--pipelined"] if pipelined else
                                                []) + (["--function"] if function else [])
    if mode == "check":
        command += ["--batch", str(args.check_batch), "--rows", str(args.check_rows)]
    print(f"[{tag}] {' '.join(command[5:])}" + (f" with {env}" if env else ""), flush=True)
    started = time.time()
    # Its own process group: a launch past its time is killed ranks and all.
    process = subprocess.Popen(command, env=dict(os.environ, **(env or {})), start_new_session=True)
    try:
        code = process.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        code = f"killed after {args.timeout} s"
    if code != 0:
        print(f"[{tag}] failed: exit {code}", flush=True)
        return False
    print(f"[{tag}] done in {time.time() - started:.0f} s", flush=True)
    return all(
        os.path.exists(os.path.join(args.json_dir, f"tf_weak_scaling_{tag}_rank{r}.json"))
        for r in range(gpus))


def variant_options(variant):
    """A variant's "KEY=VALUE[;KEY=VALUE]" as (environment, launch() options):
  exchange_dtype, lookup_groups, pipelined (=1) and function (=1) are the
  rank's options, every other key an environment variable."""
    env = dict(kv.split("=", 1) for kv in variant.split(";"))
    options = dict(exchange_dtype=env.pop("exchange_dtype", "float32"),
                   lookup_groups=int(env.pop("lookup_groups", 1)),
                   pipelined=env.pop("pipelined", "0") == "1",
                   function=env.pop("function", "0") == "1")
    return env, options


def load(args, tag, rank):
    with open(os.path.join(args.json_dir, f"tf_weak_scaling_{tag}_rank{rank}.json")) as f:
        return json.load(f)


def exchanged_bytes(rows_to, hot_rank, tables=TABLES, element_bytes=4):
    """Bytes worker `hot_rank` sends to the others in one step, from every
  rank's rows_to[r][w] (unique keys of rank r owned by w): (key,
  occurrences) rows and headers out, the rows it owns back to their
  requesters, its gradients to the owners (element_bytes each element: 2
  with a compressed exchange)."""
    size = len(rows_to)
    me = hot_rank
    keys_out = sum(rows_to[me][w] for w in range(size) if w != me)
    rows_back = sum(rows_to[w][me] for w in range(size) if w != me)
    headers = (size - 1) * (tables + 1)
    return 16 * (keys_out + headers) + element_bytes * DIM * (rows_back + keys_out)


def _check_arrays(args, gpus, suffix=""):
    """The 1-GPU check run's arrays, and each rank's of the `gpus`-GPU run
  (`suffix`: "_<exchange dtype>" for a compressed one)."""
    one = np.load(os.path.join(args.json_dir, "tf_weak_scaling_check1_rank0.npz"))
    many = [
        np.load(os.path.join(args.json_dir, f"tf_weak_scaling_check{gpus}{suffix}_rank{r}.npz"))
        for r in range(gpus)
    ]
    return one, many


def _largest_relative(values, reference):
    return float(
        np.max(np.abs(values - reference) / np.maximum(np.abs(reference), 1e-30), initial=0.0))


def compare_check(args, gpus, suffix=""):
    """The 2-GPU losses and lookups (of the check run tagged
  check{gpus}{suffix}) against the 1-GPU run of the same global batch;
  returns {hot: (max relative difference, agreed)}."""
    one, many = _check_arrays(args, gpus, suffix)
    verdict = {}
    for hot in [int(h) for h in args.hotness.split(",")]:
        lookup = one[f"{hot}hot_lookup"]
        parts = np.split(lookup, gpus, axis=0)
        losses = sum(m[f"{hot}hot_losses"] for m in many)
        agreed = np.allclose(losses, one[f"{hot}hot_losses"], rtol=CHECK_RTOL)
        worst = _largest_relative(losses, one[f"{hot}hot_losses"])
        for part, m in zip(parts, many):
            theirs = m[f"{hot}hot_lookup"]
            agreed &= part.shape == theirs.shape and np.allclose(
                theirs, part, rtol=CHECK_RTOL, atol=CHECK_RTOL * np.abs(part).max())
            if part.shape == theirs.shape:
                worst = max(worst, float(np.max(np.abs(theirs - part)) / np.abs(part).max()))
        verdict[hot] = (worst, bool(agreed))
    return verdict


def compare_compressed(args, gpus, dtype):
    """The first lookup of the 2-GPU check run with exchange_dtype `dtype`
  against the 1-GPU run's (which exchanges nothing): each output sums `hot`
  rows, each off by at most RELATIVE_ERROR * INIT_SCALE, plus float32's own
  rounding of those sums. Returns {hot: (largest difference, bound,
  largest relative loss difference after the steps)}."""
    one, many = _check_arrays(args, gpus, f"_{dtype}")
    verdict = {}
    for hot in [int(h) for h in args.hotness.split(",")]:
        parts = np.split(one[f"{hot}hot_first_lookup"], gpus, axis=0)
        worst = max(
            float(np.max(np.abs(m[f"{hot}hot_first_lookup"] - part), initial=0.0))
            for part, m in zip(parts, many))
        bound = (RELATIVE_ERROR[dtype] + CHECK_RTOL) * hot * INIT_SCALE
        losses = sum(m[f"{hot}hot_losses"] for m in many)
        verdict[hot] = (worst, bound, _largest_relative(losses, one[f"{hot}hot_losses"]))
    return verdict


def report(args, runs, verdict, compressed=None, skipped=(), horovod_verdict=None):
    gpus = args.gpus
    base = load(args, "time1", 0)
    # Horovod's settings from the environment are part of the command.
    settings = [f"{k}={v} " for k, v in sorted(os.environ.items()) if k.startswith("HOROVOD_")]
    command = ("".join(settings) + "python3 benchmarks/gpu/tf_weak_scaling.py " +
               " ".join(sys.argv[1:]))
    title = ("TF weak scaling over Horovod NCCL" if gpus > 1 else
             "TF step on one GPU, fused against the multi-worker pipeline over a one-rank "
             "exchange")
    lines = [
        f"\n## {title}, {datetime.date.today()}",
        "",
        f"TensorFlow {base['tf_version']}, sok-ev from `{base['sok_ev_file']}`. Command: "
        f"`{command}`. {TABLES} tables (`target_gpu=-1`), batch {args.batch} per GPU, dim {DIM}, "
        f"{args.rows} keys pre-filled, Zipf 1.1, Adagrad, graph mode; median ms per step of "
        f"{args.steps}. Efficiency = t(time1, the fused one-GPU step) ÷ t(the run); time1_loopback "
        "is one GPU running the multi-worker pipeline over a one-rank exchange. Bytes: what one "
        "GPU sends to the "
        "others per step (keys, rows back, gradients). Exchange floor: those bytes at the rate "
        f"of one rows-only all-to-all measured in the same launch ({CHAINED_EXCHANGES} back to "
        "back in one Session call, timed per exchange).",
        "",
        "| hotness | run | GPUs | ms/step | steps/s | samples/s | efficiency | collectives "
        "in the step | host syncs/step | bytes/GPU/step | all-to-all of one step's rows (ms) | "
        "link GB/s | exchange floor (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    step_ms, floors = {}, {}  # (hot, tag) -> the slowest rank's ms; hot -> floor ms
    alone = []  # the all-to-all alone, chained and as one Session call
    for hot in [int(h) for h in args.hotness.split(",")]:
        t1 = base[f"{hot}hot"]["ms"]
        for tag, env in runs:
            size = 1 if tag.startswith("time1") else gpus
            ranks = [load(args, tag, r)[f"{hot}hot"] for r in range(size)]
            ms = max(r["ms"] for r in ranks)  # the step ends when the slowest rank's does
            step_ms[hot, tag] = ms
            cells = [
                str(hot), tag + (f" ({env})" if env else ""),
                str(size), f"{ms:.2f}", f"{1e3 / ms:.1f}", f"{size * args.batch * 1e3 / ms:,.0f}",
                f"{100 * t1 / ms:.1f}%",
                str(ranks[0]["collectives_per_step"]), f"{ranks[0]['host_syncs_per_step']:.1f}"
            ]
            if size > 1:
                rows_to = [r["rows_to"] for r in ranks]
                element = ELEMENT_BYTES[load(args, tag, 0).get("exchange_dtype", "float32")]
                sent = max(exchanged_bytes(rows_to, r, element_bytes=element) for r in range(size))
                a2a = max(r["alltoall_ms"] for r in ranks)
                rows_bytes = max(
                    element * DIM *
                    sum(rows_to[r][w] for w in range(size) if w != r) for r in range(size))
                rate = rows_bytes / (a2a * 1e-3)
                cells += [
                    f"{sent / 1e6:.1f} MB", f"{a2a:.2f}", f"{rate / 1e9:.1f}",
                    f"{sent / rate * 1e3:.2f}"
                ]
                floors.setdefault(hot, sent / rate * 1e3)
                call = max(r["alltoall_call_ms"] for r in ranks)
                alone.append(f"- {hot}-hot {tag}: the rows all-to-all alone takes {a2a:.2f} ms "
                             f"an exchange, {CHAINED_EXCHANGES} back to back in one Session "
                             f"call (the table's figure), and {call:.2f} ms as a Session call "
                             "of its own")
            else:
                cells += ["0", "—", "—", "—"]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += alone
    for hot in [int(h) for h in args.hotness.split(",")]:
        t1, loop = step_ms[hot, "time1"], step_ms.get((hot, "time1_loopback"))
        if loop is None:
            continue
        line = (f"- {hot}-hot, what the multi-worker pipeline costs: on one GPU over a one-rank "
                f"exchange (time1_loopback: everything but the transfers) {loop:.2f} ms against "
                f"the fused step's {t1:.2f}, so {loop - t1:.2f} ms of its own work")
        t2 = step_ms.get((hot, f"time{gpus}"))
        if t2 is not None and gpus > 1:
            line += (f"; {gpus} GPUs take {t2:.2f} ms, {t2 - loop:.2f} ms more: the transfers "
                     f"and the wait for the peer (exchange floor {floors.get(hot, 0.0):.2f} ms)")
        lines.append(line)
        for tag, variant in runs:
            if tag.startswith("time1_loopback_variant"):
                ms = step_ms[hot, tag]
                lines.append(f"  - with {variant}: {ms:.2f} ms, own work {ms - t1:.2f} ms "
                             f"({ms - loop:+.2f} ms against time1_loopback)")
    # Pipelined runs (sok_ev.LookupPipeline) and tf.function runs against the
    # fused one-GPU step of the same kind (the time1_variant with that option).
    for kind, option in (("pipelined", "pipelined=1"), ("tf.function", "function=1")):
        one = next(
            (tag for tag, variant in runs if tag.startswith("time1_variant") and variant == option),
            None)
        for hot in [int(h) for h in args.hotness.split(",")]:
            for tag, variant in runs:
                if one is None or tag.startswith("time1_variant") or option not in variant.split(
                        ";"):
                    continue
                base, ms = step_ms[hot, one], step_ms[hot, tag]
                what = ("the one-rank pipeline"
                        if tag.startswith("time1_loopback") else f"{gpus} GPUs")
                lines.append(f"- {hot}-hot, {kind}: {what} ({tag}: {variant}) {ms:.2f} ms "
                             f"against the {kind} fused one-GPU step's {base:.2f} ({one}): "
                             f"{100 * base / ms:.1f}%")
    for hot, (worst, agreed) in sorted(verdict.items()):
        lines.append(f"- check, {hot}-hot: {gpus} GPUs on halves of a global batch of "
                     f"{gpus * args.check_batch} vs 1 GPU on all of it, {args.check_steps} "
                     f"steps: largest relative difference {worst:.2e} "
                     f"({'agree' if agreed else 'DISAGREE'} within {CHECK_RTOL})")
    for hot, (worst, agreed) in sorted((horovod_verdict or {}).items()):
        lines.append(f"- check, {hot}-hot, SOK_EV_ROW_TRANSPORT=horovod: the same comparison, "
                     f"largest relative difference {worst:.2e} "
                     f"({'agree' if agreed else 'DISAGREE'} within {CHECK_RTOL})")
    if gpus == 1:
        lines.append("- check: not run (it compares 2 GPUs with 1)")
    elif not verdict:
        lines.append("- check: did not run to the end (see the log)")
    if skipped:
        lines.append(f"- not run, for want of time (--budget-s {args.budget_s:.0f}): "
                     f"{', '.join(skipped)}")
    for hot, (worst, bound, loss_rel) in sorted((compressed or {}).items()):
        lines.append(
            f"- check, {hot}-hot, exchange_dtype={args.check_compressed}: the first lookup "
            f"on {gpus} GPUs differs from 1 GPU's by at most {worst:.2e}, bound "
            f"{bound:.2e} ({'within' if worst <= bound else 'EXCEEDS'}); losses after "
            f"{args.check_steps} steps: largest relative difference {loss_rel:.2e}")
    for hot in [int(h) for h in args.hotness.split(",")]:
        for tag, _ in runs:
            rank0 = load(args, tag, 0)[f"{hot}hot"]
            traced = rank0.get("profile")
            if "profile_error" in rank0:
                lines.append(
                    f"- {hot}-hot {tag}: the traced steps failed: {rank0['profile_error']}")
            if traced:
                ops = "; ".join(f"{op} ({kind}) {ms:.2f}" for kind, op, ms in traced["top"])
                lines.append(
                    f"- where the time goes, {hot}-hot {tag}, rank 0 (step_profile.py, ms a "
                    f"step summed over nodes; traced step {traced['traced_ms']:.2f} ms): "
                    f"{ops}")
    text = "\n".join(lines) + "\n"
    publish(text, args.results, os.path.join(args.json_dir, "tf_weak_scaling_results.md"),
            "tf-weak-scaling")


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    os.makedirs(args.json_dir, exist_ok=True)
    started, longest, skipped = time.monotonic(), [0.0], []

    def run(tag, gpus, mode, optional=False, **kwargs):
        """launch(), timed; an optional launch is skipped (and listed in the
      report) when --budget-s could not fit the longest launch so far."""
        left = args.budget_s - (time.monotonic() - started) if args.budget_s else float("inf")
        if optional and left < longest[0] + 15:
            print(f"[{tag}] skipped: {left:.0f} s of --budget-s left", flush=True)
            skipped.append(tag)
            return False
        begin = time.monotonic()
        done = launch(args, gpus, mode, tag, **kwargs)
        longest[0] = max(longest[0], time.monotonic() - begin)
        return done

    ok = run("time1", 1, "time")
    runs = [("time1", "")]
    loopback = ("time1_loopback", "multi-worker pipeline, one rank")

    def run_loopback_variants(optional):
        for number, variant in enumerate(filter(None, args.loopback_variants.split(","))):
            tag = f"time1_loopback_variant{number}"
            env, options = variant_options(variant)
            if run(tag, 1, "time", optional=optional, env=env, loopback=True, **options):
                runs.append((tag, variant))

    def run_one_gpu_variants():
        for number, variant in enumerate(filter(None, args.one_gpu_variants.split(","))):
            tag = f"time1_variant{number}"
            env, options = variant_options(variant)
            if run(tag, 1, "time", env=env, **options):
                runs.append((tag, variant))

    if ok:
        run_one_gpu_variants()

    if args.gpus == 1:
        if ok and run(loopback[0], 1, "time", loopback=True):
            runs.append(loopback)
        if ok:
            run_loopback_variants(optional=False)
        if not ok:
            print("the timed launch failed: nothing to report", flush=True)
            return 1
        report(args, runs, {}, skipped=skipped)
        expected = 2 + sum(
            len(list(filter(None, v.split(","))))
            for v in (args.loopback_variants, args.one_gpu_variants))
        return 0 if len(runs) == expected else 1
    # What the target needs first (the scaled run and the 2-vs-1 check), then
    # what explains it, as far as the budget goes.
    ok = ok and run(f"time{args.gpus}", args.gpus, "time")
    runs.append((f"time{args.gpus}", ""))
    verdict, compressed = {}, {}
    if run("check1", 1, "check", streams=args.gpus) and run(f"check{args.gpus}", args.gpus,
                                                            "check"):
        verdict = compare_check(args, args.gpus)
    # The variants first: the native exchange leads them.
    for number, variant in enumerate(filter(None, args.variants.split(","))):
        env, options = variant_options(variant)
        tag = f"variant{number}"
        if ok and run(tag, args.gpus, "time", optional=True, env=env, **options):
            runs.append((tag, variant))
    horovod_verdict = {}
    if verdict and args.check_horovod and run(f"check{args.gpus}_horovod",
                                              args.gpus,
                                              "check",
                                              optional=True,
                                              env={"SOK_EV_ROW_TRANSPORT": "horovod"}):
        horovod_verdict = compare_check(args, args.gpus, "_horovod")
    if ok and run(loopback[0], 1, "time", optional=True, loopback=True):
        runs.append(loopback)
        run_loopback_variants(optional=True)
    dtype = args.check_compressed
    if verdict and dtype and run(
            f"check{args.gpus}_{dtype}", args.gpus, "check", optional=True, exchange_dtype=dtype):
        compressed = compare_compressed(args, args.gpus, dtype)
    if not ok:
        print("the timed launches failed: nothing to report", flush=True)
        return 1
    report(args, runs, verdict, compressed, skipped, horovod_verdict)
    within = all(worst <= bound for worst, bound, _ in compressed.values())
    agreed = all(agreed for _, agreed in list(verdict.values()) + list(horovod_verdict.values()))
    return 0 if verdict and within and agreed else 1


if __name__ == "__main__":
    sys.exit(main())
