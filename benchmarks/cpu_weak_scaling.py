"""Weak scaling of the model-parallel grouped sparse step on CPU workers.

The step: 26 Embedding Variables sharded over W Horovod/Gloo workers
(target_gpu=-1), ONE sok_ev.lookup_sparse call (sum combiner), backward,
stock tf.compat.v1.train.AdagradOptimizer applied by each owner to its shard.
Every worker feeds its own batch of a fixed size (weak scaling: the global
batch grows with W). Baseline: the same step on one worker with 26 dense
tf.Variables and tf.nn.embedding_lookup_sparse (what users have today).

Keys: Zipf(1.1) over each table's vocabulary, hot ids scattered by a random
permutation (as after hashing); several distinct batches are cycled.

Bytes exchanged per step (all workers together, only what crosses between
workers) are computed from the actual batches with the documented placement
(owner_of, cc/partition.h), for this design and for an allgather design:

  this design (alltoall of unique keys to their owners):
    keys   16 B per (worker, unique key owned elsewhere) -- key + count
           + 16 B * tables header per pair of workers
    rows    4 B * dim per (worker, unique key owned elsewhere), forward
    grads   the same again, backward
  allgather design (SOK/HugeCTR distributed-slot: every worker gets every
  worker's keys, combines the rows it owns per sample, reduce-scatters):
    keys    8 B per key to each of the W - 1 other workers
    rows    4 B * dim per sample and table, reduce-scatter of the global
            batch's partial sums: (W - 1) / W of it leaves each worker
    grads   the same again (allgather of the samples' gradients)

  python benchmarks/cpu_weak_scaling.py                 # W = 1, 2, 4; ~3 min
  python benchmarks/cpu_weak_scaling.py --workers 1 2 --steps 10 --no-append

The driver launches `horovodrun --gloo -np W` per W (horovodrun next to this
Python), prints a markdown table and appends it to benchmarks/RESULTS.md.
On a 2-core machine 4 workers share 2 cores: the scaling is only indicative.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
TABLES = 26
BATCHES = 4  # distinct batches cycled
MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def owner_of(keys, workers):
    """cc/partition.h: splitmix64_finalizer(int64(key) ^ salt) mod W."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.int64).view(np.uint64) ^ np.uint64(0x5bd1e9955bd1e995)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(workers)).astype(np.int64)


def make_batches(args, rank):
    """BATCHES batches of this rank: per table [batch] one-hot int64 keys."""
    rng = np.random.default_rng(1234)
    permutations = [rng.permutation(args.vocab) for _ in range(TABLES)]
    weights = 1.0 / np.arange(1, args.vocab + 1)**1.1
    weights /= weights.sum()
    rng = np.random.default_rng(1000 + rank)
    return [[
        permutations[t][rng.choice(args.vocab, size=args.batch, p=weights)] for t in range(TABLES)
    ] for _ in range(BATCHES)]


def exchanged_bytes(all_batches, dim, workers):
    """Mean bytes per step crossing between workers, both designs.

    all_batches[w][b][t]: worker w's keys of table t in batch b."""
    ours = allgather = 0.0
    for b in range(BATCHES):
        for w in range(workers):
            keys = sum(len(k) for k in all_batches[w][b])
            remote_unique = 0
            for t in range(TABLES):
                unique = np.unique(all_batches[w][b][t])
                remote_unique += int(np.sum(owner_of(unique, workers) != w))
            ours += (16 * remote_unique + 16 * TABLES * (workers - 1) + 2 * 4 * dim * remote_unique)
            samples = len(all_batches[w][b][0]) * TABLES
            allgather += (8 * keys * (workers - 1) + 2 * 4 * dim * samples * (workers - 1))
    return ours / BATCHES, allgather / BATCHES


def build_step(tf, args, tables, dense):
    """Placeholders, train op and loss of one grouped step."""
    ids = [tf.compat.v1.placeholder(tf.int64, [args.batch]) for _ in range(TABLES)]
    indices = tf.stack([tf.range(args.batch, dtype=tf.int64),
                        tf.zeros([args.batch], tf.int64)],
                       axis=1)
    sparse = [tf.SparseTensor(indices, k, [args.batch, 1]) for k in ids]
    if dense:
        embeddings = [
            tf.nn.embedding_lookup_sparse(v, s, None, combiner="sum")
            for v, s in zip(tables, sparse)
        ]
    else:
        import sok_ev  # pylint: disable=import-outside-toplevel
        embeddings = sok_ev.lookup_sparse(tables, sparse, combiners="sum")
    loss = tf.add_n([tf.reduce_sum(tf.square(e)) for e in embeddings])
    train = tf.compat.v1.train.AdagradOptimizer(0.01).minimize(loss)
    return ids, train, loss


def time_steps(tf, session, ids, train, batches, args, barrier=None):

    def run(step):
        batch = batches[step % BATCHES]
        session.run(train, {p: k for p, k in zip(ids, batch)})

    for step in range(args.warmup):
        run(step)
    if barrier is not None:
        session.run(barrier)
    start = time.perf_counter()
    for step in range(args.steps):
        run(step)
    if barrier is not None:
        session.run(barrier)  # the slowest worker sets the pace
    return time.perf_counter() - start


def worker(args):
    """One rank: times the sharded step; rank 0 writes the JSON result."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    hvd.init()
    import sok_ev  # pylint: disable=import-outside-toplevel
    sok_ev.init()
    rank, workers = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        tables = [
            sok_ev.get_embedding_variable(f"table_{t}", embedding_dim=args.dim, target_gpu=-1)
            for t in range(TABLES)
        ]
        ids, train, _ = build_step(tf, args, tables, dense=False)
        barrier = sok_ev.communication.allreduce(tf.constant(1.0))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            seconds = time_steps(tf, session, ids, train, make_batches(args, rank), args, barrier)
    if rank == 0:
        all_batches = [make_batches(args, w) for w in range(workers)]
        ours, allgather = exchanged_bytes(all_batches, args.dim, workers)
        with open(args.out, "w") as f:
            json.dump(
                {
                    "workers": workers,
                    "seconds": seconds,
                    "steps_per_s": args.steps / seconds,
                    "bytes": ours,
                    "allgather_bytes": allgather
                }, f)


def dense_baseline(args):
    """One process, 26 dense tf.Variables: seconds for args.steps steps."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    with tf.Graph().as_default():
        rng = np.random.default_rng(0)
        tables = [
            tf.Variable(rng.normal(0, 0.25, (args.vocab, args.dim)).astype(np.float32))
            for _ in range(TABLES)
        ]
        ids, train, _ = build_step(tf, args, tables, dense=True)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return time_steps(tf, session, ids, train, make_batches(args, 0), args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch", type=int, default=4096, help="per worker")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=100000)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO_ROOT, env.get("PYTHONPATH")] if p)
    passed = [
        "--batch", args.batch, "--dim", args.dim, "--vocab", args.vocab, "--warmup", args.warmup,
        "--steps", args.steps
    ]
    rows = []
    for workers in args.workers:
        out = tempfile.mktemp(suffix=".json")
        command = [
            horovodrun, "--gloo", "-np",
            str(workers), "-H", f"localhost:{workers}", sys.executable,
            os.path.abspath(__file__), "--worker", "--out", out, *map(str, passed)
        ]
        subprocess.run(command, env=env, check=True, timeout=900, stdout=subprocess.DEVNULL)
        with open(out) as f:
            rows.append(json.load(f))
        os.remove(out)
        print(f"{workers} workers: {rows[-1]['steps_per_s']:.2f} steps/s", flush=True)
    dense_seconds = dense_baseline(args)
    dense_rate = args.steps / dense_seconds

    one = next((r for r in rows if r["workers"] == 1), None)
    lines = [
        "| workers | global batch | steps/s | samples/s | efficiency vs 1 worker"
        " | bytes exchanged/step (this design) | allgather design | ratio |",
        "|---|---|---|---|---|---|---|---|"
    ]
    for r in rows:
        w = r["workers"]
        efficiency = (f"{r['steps_per_s'] / one['steps_per_s']:.0%}" if one else "n/a")
        ratio = (f"{r['allgather_bytes'] / r['bytes']:.1f}x less" if r["bytes"] else "-")
        lines.append(f"| {w} | {w * args.batch} | {r['steps_per_s']:.2f} | "
                     f"{r['steps_per_s'] * w * args.batch:,.0f} | {efficiency} | "
                     f"{r['bytes'] / 1e6:.2f} MB | {r['allgather_bytes'] / 1e6:.2f} MB"
                     f" | {ratio} |")
    lines.append(f"| 1 (dense tf.Variable baseline) | {args.batch} | "
                 f"{dense_rate:.2f} | {dense_rate * args.batch:,.0f} | - | 0 | "
                 "- | - |")
    table = "\n".join(lines)
    print(table)

    if args.no_append:
        return
    load = os.getloadavg()[0]
    command = "python benchmarks/cpu_weak_scaling.py" + (" " + " ".join(sys.argv[1:])
                                                         if sys.argv[1:] else "")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    section = f"""
## CPU weak scaling, model parallel over Horovod/Gloo (benchmarks/cpu_weak_scaling.py), {datetime.datetime.now():%Y-%m-%d %H:%M}

- machine: {platform.machine()}, {os.cpu_count()} cores, TensorFlow {tf.__version__}, Python {platform.python_version()}; load average at end {load:.1f}
- command: `{command}`
- setup: 26 Embedding Variables sharded over the workers (target_gpu=-1), one lookup_sparse call, batch {args.batch} per worker (weak scaling), one-hot, dim {args.dim}, vocab {args.vocab}/table, Zipf 1.1, sum combiner, Adagrad lr 0.01, graph mode; {BATCHES} distinct batches cycled, {args.warmup} warm-up + {args.steps} timed steps, timed between two barriers (the slowest worker sets the pace). Baseline: the same step in one process on 26 dense tf.Variables with tf.nn.embedding_lookup_sparse.
- bytes: computed from the batches and owner_of, crossing between workers, forward + backward (see the script's docstring for both formulas).
- **Only indicative on this machine: {os.cpu_count()} cores are shared by all workers** (4 workers oversubscribe them), so steps/s cannot scale here; the bytes column is what scales with W.

{table}
"""
    sys.path.insert(0, HERE)
    import results  # pylint: disable=import-outside-toplevel  (benchmarks/results.py)
    results.append(section, "cpu-weak-scaling", os.path.join(HERE, "RESULTS.md"))


if __name__ == "__main__":
    main()
