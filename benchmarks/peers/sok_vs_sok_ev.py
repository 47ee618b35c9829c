#!/usr/bin/env python3
"""sok-ev against NVIDIA SOK 2.1.0 (the peer users would pick) inside
TensorFlow, one implementation per process, on the same data (issue 14).

Workload: tf_sparse_step.py's (26 tables, batch 65536 a GPU, one-hot and
10-hot, dim 128, Zipf(1.1) ids from its generator and seeds, --rows keys in
all pre-filled, Adagrad lr 0.01 / accumulator 0.1 from tf.compat.v1.train,
sum combiner, loss = sum of every output), one tf.function step per call:
  sok_ev       sok_ev.lookup_sparse over Embedding Variables, raw 63-bit keys
  sok_dynamic  sok.lookup_sparse over sok.DynamicVariable (HKV, "hybrid"), the
               same raw keys; capacity 2^20 a table, all in HBM
  sok_dynamic_det  the same over sok.DynamicVariable on SOK's other hash
               table (DET, "hbm"), default capacity
  sok_static   sok.lookup_sparse over sok.Variable (rows x 128 a table,
               split over the GPUs), the ids themselves
SOK's DynamicVariables are updated through its sok.OptimizerWrapper around the
same Adagrad; its Variable, a ResourceVariable, by the Adagrad itself (the
wrapper calls DynamicVariable.to_static on every variable).

Under horovodrun (one GPU per rank, tests/multiworker/one_gpu_per_rank.sh)
each rank feeds its own batch of --batch samples (weak scaling): rank r uses
set (step + r) mod --sets. Each run writes $OUT/peers_<impl>_<N>gpu.json;
--report reads them all, prints ms per step, the ratios and the 1 -> 2 GPU
scaling, and appends the table to benchmarks/RESULTS.md.

  python3 benchmarks/peers/sok_vs_sok_ev.py --impl sok_ev
  horovodrun --gloo -np 2 -H localhost:2 tests/multiworker/one_gpu_per_rank.sh \\
      python3 benchmarks/peers/sok_vs_sok_ev.py --impl sok_dynamic
  python3 benchmarks/peers/sok_vs_sok_ev.py --report
  # the logic on a CPU, tiny: --impl sok_ev --dry-run-on-cpu
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from results import publish  # pylint: disable=wrong-import-position
# The data: tf_sparse_step.py's generator and key mapping, not a copy.
from tf_sparse_step import ACCUMULATOR, add_workload_arguments, DIM, LR, TABLES, batch_ids, raw_keys, rows_per_table  # pylint: disable=wrong-import-position

IMPLS = ("sok_ev", "sok_dynamic", "sok_dynamic_det", "sok_static")
NAMES = {
    "sok_ev": "sok-ev",
    "sok_dynamic": "SOK DynamicVariable (HKV)",
    "sok_dynamic_det": "SOK DynamicVariable (DET)",
    "sok_static": "SOK Variable"
}
# HKV's table per SOK table: a power of two at most half full with the keys of
# the default --rows (385K a table), values in HBM (GiB per table).
HKV_CAPACITY, HKV_HBM_GIB = 1 << 20, 1


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", choices=IMPLS)
    parser.add_argument("--report", action="store_true", help="merge the JSON files, append")
    add_workload_arguments(parser)
    parser.add_argument("--dry-run-on-cpu",
                        action="store_true",
                        help="sok_ev on a machine without GPU (checks the script only)")
    args = parser.parse_args(argv)
    if not args.report and not args.impl:
        parser.error("--impl or --report")
    return args


def init_workers(tf, impl):
    """hvd.init() (SOK needs Horovod even on one GPU), then the library's
    init; returns (module, rank, world size)."""
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    hvd = None
    if impl != "sok_ev" or "HOROVOD_RANK" in os.environ:
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
        hvd.init()
    if impl == "sok_ev":
        import sok_ev as lib  # pylint: disable=import-outside-toplevel
        lib.init()
    else:
        import sparse_operation_kit as lib  # pylint: disable=import-outside-toplevel
        # Keras 3 has no tf.keras.optimizers.legacy: leave tf.keras alone.
        lib.init(use_legacy_optimizer=False)
    return lib, (hvd.rank() if hvd else 0), (hvd.size() if hvd else 1)


def make_tables(tf, lib, impl, rows):
    uniform = tf.random_uniform_initializer(-0.05, 0.05)
    if impl == "sok_ev":
        return [
            lib.get_embedding_variable(f"peer_t{t}", embedding_dim=DIM, initializer=uniform)
            for t in range(TABLES)
        ]
    if impl.startswith("sok_dynamic"):
        # HKV ("hybrid") with its capacity, all in HBM; DET ("hbm") as it comes.
        if impl == "sok_dynamic_det":
            table_options = dict(var_type="hbm")
        else:
            table_options = dict(var_type="hybrid",
                                 init_capacity=HKV_CAPACITY,
                                 max_capacity=HKV_CAPACITY,
                                 max_hbm_for_vectors=HKV_HBM_GIB)
        return [
            lib.DynamicVariable(dimension=DIM,
                                initializer="random",
                                key_type=tf.int64,
                                name=f"peer_t{t}",
                                **table_options) for t in range(TABLES)
        ]
    return [
        lib.Variable(shape=[rows, DIM], initializer=uniform, dtype=tf.float32, name=f"peer_t{t}")
        for t in range(TABLES)
    ]


def sparse(tf, values, batch, hot):
    n = batch * hot
    j = tf.range(n, dtype=tf.int64)
    return tf.SparseTensor(tf.stack([j // hot, j % hot], axis=1), values, [batch, hot])


def run(args):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    lib, rank, size = init_workers(tf, args.impl)
    assert args.dry_run_on_cpu or tf.config.list_physical_devices("GPU"), "TensorFlow sees no GPU"
    assert args.impl == "sok_ev" or not args.dry_run_on_cpu, "SOK runs on GPUs only"
    rows = rows_per_table(args)
    hashed = args.impl != "sok_static"
    result = dict(impl=args.impl,
                  gpus=size,
                  tf_version=tf.__version__,
                  library=lib.__file__,
                  device=gpu_name(tf, args))
    tables = make_tables(tf, lib, args.impl, rows)
    opt = tf.compat.v1.train.AdagradOptimizer(LR, ACCUMULATOR)
    if args.impl.startswith("sok_dynamic"):  # SOK's wrapper updates DynamicVariables only
        opt = lib.OptimizerWrapper(opt)
    if hashed:  # every key present before timing, as tf_sparse_step.py does
        started = time.perf_counter()
        for t, table in enumerate(tables):
            keys = tf.constant(raw_keys(t, np.arange(rows)))
            lib.lookup_sparse([table], [sparse(tf, keys, rows, 1)], combiners=["sum"])
        result["prefill_s"] = time.perf_counter() - started
    for hot in [int(h) for h in args.hotness.split(",")]:
        ids = batch_ids(args, hot)
        if hashed:
            values = np.stack([[raw_keys(t, s[t]) for t in range(TABLES)] for s in ids])
        else:
            values = np.stack([np.stack(s) for s in ids]).astype(np.int64)
        batches = tf.Variable(values, trainable=False)

        @tf.function
        def step(i):
            batch = batches[i]
            sp_ids = [sparse(tf, batch[t], args.batch, hot) for t in range(TABLES)]
            with tf.GradientTape() as tape:
                outputs = lib.lookup_sparse(tables, sp_ids, combiners=["sum"] * TABLES)
                loss = tf.add_n([tf.reduce_sum(e) for e in outputs])
            grads = tape.gradient(loss, tables)
            opt.apply_gradients(zip(grads, tables))
            return loss

        times = []
        for s in range(args.steps + 3):
            started = time.perf_counter()
            step(tf.constant((s + rank) % args.sets)).numpy()
            times.append(time.perf_counter() - started)
        timed = np.array(times[3:]) * 1e3
        result[f"{hot}hot"] = dict(ms=float(np.median(timed)),
                                   ms_min=float(timed.min()),
                                   ms_max=float(timed.max()))
        print(f"[{args.impl} rank {rank}/{size}] {hot}-hot: {result[f'{hot}hot']}", flush=True)
        del batches
    if rank == 0:
        path = os.path.join(args.json_dir, f"peers_{args.impl}_{size}gpu.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {path}", flush=True)
    return 0


def gpu_name(tf, args):
    if args.dry_run_on_cpu:
        return "CPU (dry run)"
    details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
    return details.get("device_name", "GPU")


def report(args):
    """The table of every JSON found: ms per step, peer ÷ sok-ev, and the
    weak-scaling efficiency t(1 GPU) / t(2 GPUs) of each implementation."""
    found = {}
    for impl in IMPLS:
        for gpus in (1, 2):
            path = os.path.join(args.json_dir, f"peers_{impl}_{gpus}gpu.json")
            if os.path.exists(path):
                with open(path) as f:
                    found[impl, gpus] = json.load(f)
    if ("sok_ev", 1) not in found:
        print(f"no peers_sok_ev_1gpu.json in {args.json_dir}", file=sys.stderr)
        return 1
    ours = found["sok_ev", 1]
    ms = lambda impl, gpus, hot: found.get((impl, gpus), {}).get(f"{hot}hot", {}).get("ms")
    cell = lambda v, fmt="{:.2f}": fmt.format(v) if v is not None else "—"
    sok_library = next((found[impl, 1]["library"] for impl in IMPLS[1:] if (impl, 1) in found), "—")
    lines = [
        f"\n## sok-ev vs NVIDIA SOK 2.1.0 in TensorFlow, {datetime.date.today()}", "",
        f"Machine: {ours['device']} (device tool), TensorFlow {ours['tf_version']}; sok-ev "
        f"`{ours['library']}`, SOK `{sok_library}` "
        f"(benchmarks/peers/build_sok.sh). Command: `python3 benchmarks/peers/sok_vs_sok_ev.py "
        f"--impl IMPL` per implementation, 2 GPUs under `horovodrun --gloo -np 2` one GPU a rank "
        f"(tests/gpu/run_on_device.sh peers). {TABLES} tables, batch {args.batch} a GPU, dim {DIM}, "
        f"{args.rows} keys pre-filled, Zipf 1.1, Adagrad (tf.compat.v1.train; SOK's "
        f"DynamicVariable through sok.OptimizerWrapper), sum; tf.function, median ms per step of {args.steps}.",
        "", "| hotness | GPUs | sok-ev | SOK DynamicVariable (HKV) | SOK DynamicVariable (DET) | "
        "SOK Variable (static) | HKV ÷ sok-ev | DET ÷ sok-ev | static ÷ sok-ev |",
        "|---|---|---|---|---|---|---|---|---|"
    ]
    for hot in [int(h) for h in args.hotness.split(",")]:
        for gpus in (1, 2):
            a, d, e, s = (ms(i, gpus, hot) for i in IMPLS)
            if a is None:
                continue
            ratio = lambda t: cell(t / a if t else None, "{:.2f}×")
            lines.append(f"| {hot} | {gpus} | {cell(a)} | {cell(d)} | {cell(e)} | {cell(s)} | "
                         f"{ratio(d)} | {ratio(e)} | {ratio(s)} |")
    lines += ["", "Weak scaling 1 → 2 GPUs (t1 ÷ t2, 1.00 = perfect):", ""]
    for hot in [int(h) for h in args.hotness.split(",")]:
        parts = []
        for impl in IMPLS:
            t1, t2 = ms(impl, 1, hot), ms(impl, 2, hot)
            if t1 and t2:
                parts.append(f"{NAMES[impl]} {t1 / t2:.2f}")
        lines.append(f"- {hot}-hot: " + (", ".join(parts) or "no 2-GPU run"))
    text = "\n".join(lines) + "\n"
    publish(text, args.results, os.path.join(args.json_dir, "peers_results.md"), "peers")
    return 0


def main():
    args = parse_args()
    return report(args) if args.report else run(args)


if __name__ == "__main__":
    sys.exit(main())
