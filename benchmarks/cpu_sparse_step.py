"""CPU micro-benchmark of one grouped sparse training step, sok_ev vs stock TF.

The step is what a Criteo-like model does with its 26 categorical features:
look up every table (sum combiner), back-propagate, apply Adagrad. Two
implementations run in the same process on the same keys:

  sok_ev   26 Embedding Variables, ONE sok_ev.lookup_sparse call, stock
           tf.compat.v1.train.AdagradOptimizer (through the sok_ev hook);
  dense    26 dense tf.Variables [vocab, dim], 26 tf.nn.embedding_lookup_sparse
           calls, the same stock AdagradOptimizer (what users have today).

Keys follow a Zipf law over each table's vocabulary (hot ids scattered by a
random permutation, as after hashing). Two variants: one-hot and multi-hot
(ragged samples, hotness uniform in [1, 2h - 1], mean h). Inputs live in
tf.Variables, so Grappler cannot constant-fold the dense path's unique /
segment-id work, and a few distinct batches are cycled. The two
implementations are timed interleaved, step by step, so a busy machine
slows both alike. Graph mode
(tf.compat.v1.Session) is timed, DeepRec users' path; --tf-function also
times the eager tf.function path.

Prints a markdown table (median, p10, p90 milliseconds per step) and the
dense/sok_ev ratio, and appends a dated section to benchmarks/RESULTS.md
(--no-append to skip).

  python benchmarks/cpu_sparse_step.py                     # default, < ~1 min
  python benchmarks/cpu_sparse_step.py --batch 8192 --dim 32 --reps 100
"""
import argparse
import datetime
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import results  # noqa: E402  (benchmarks/results.py, next to this script)

REPO_ROOT = results.REPO_ROOT


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--vocab", type=int, default=100_000, help="keys per table")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of key frequency")
    p.add_argument("--hotness",
                   type=int,
                   nargs="+",
                   default=[1, 10],
                   help="mean keys per sample; 1 = one-hot, >1 = ragged multi-hot")
    p.add_argument("--batches", type=int, default=4, help="distinct batches cycled")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--tf-function", action="store_true", help="also time the tf.function path")
    p.add_argument("--disable-v2-behavior",
                   action="store_true",
                   help="tf.compat.v1.disable_v2_behavior() first, as DeepRec-era scripts do "
                   "(dense tables become legacy ref variables); graph mode only")
    p.add_argument("--only", choices=["sok_ev", "dense"], help="time one implementation")
    p.add_argument("--no-append", action="store_true", help="do not write RESULTS.md")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


# --------------------------------------------------------------------------- data


def zipf_sampler(rng, vocab, exponent):
    weights = 1.0 / np.arange(1, vocab + 1)**exponent
    cdf = np.cumsum(weights / weights.sum())
    scatter = rng.permutation(vocab)  # hot ids spread over the id space

    def draw(n):
        return scatter[np.minimum(np.searchsorted(cdf, rng.random(n)), vocab - 1)]

    return draw


def make_batch(rng, draw, batch, hotness):
    """(indices [nnz, 2], keys [nnz], max_hotness) of one ragged batch."""
    if hotness == 1:
        counts = np.ones(batch, np.int64)
    else:
        counts = rng.integers(1, 2 * hotness, size=batch)
    rows = np.repeat(np.arange(batch), counts)
    cols = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.stack([rows, cols], 1).astype(np.int64), draw(len(rows)).astype(np.int64), \
        int(counts.max())


def make_inputs(args, hotness):
    rng = np.random.default_rng(args.seed + hotness)
    draws = [zipf_sampler(rng, args.vocab, args.zipf) for _ in range(args.tables)]
    return [[make_batch(rng, draws[t], args.batch, hotness)
             for t in range(args.tables)]
            for _ in range(args.batches)]


def input_tensors(inputs):
    """SparseTensors read from non-trainable Variables (not constant-foldable)."""
    out = []
    for b, tables in enumerate(inputs):
        sps = []
        for t, (indices, keys, max_hot) in enumerate(tables):
            iv = tf.Variable(indices, trainable=False, name=f"in_idx_{b}_{t}")
            kv = tf.Variable(keys, trainable=False, name=f"in_key_{b}_{t}")
            sps.append(
                tf.SparseTensor(iv.read_value(), kv.read_value(), [indices[-1, 0] + 1, max_hot]))
        out.append(sps)
    return out


# --------------------------------------------------------------------------- models


def sok_ev_step_loss(sok, evs, sps):
    outs = sok.lookup_sparse(evs, sps, combiners=["sum"] * len(evs))
    return tf.add_n([tf.reduce_sum(o) for o in outs])


def dense_step_loss(tables, sps):
    outs = [
        tf.nn.embedding_lookup_sparse(v, sp, None, combiner="sum") for v, sp in zip(tables, sps)
    ]
    return tf.add_n([tf.reduce_sum(o) for o in outs])


def build_graph(args, impl, inputs, sok):
    """Builds one implementation in its own graph and Session; returns step(i)."""
    graph = tf.Graph()
    with graph.as_default():
        sess = tf.compat.v1.Session(graph=graph)
        batches = input_tensors(inputs)
        opt = tf.compat.v1.train.AdagradOptimizer(args.lr)
        if impl == "sok_ev":
            evs = [
                sok.get_embedding_variable(f"ev_{t}", embedding_dim=args.dim)
                for t in range(args.tables)
            ]
            train_ops = [opt.minimize(sok_ev_step_loss(sok, evs, sps)) for sps in batches]
        else:
            tables = [
                tf.compat.v1.get_variable(
                    f"table_{t}", [args.vocab, args.dim],
                    initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.05))
                for t in range(args.tables)
            ]
            train_ops = [opt.minimize(dense_step_loss(tables, sps)) for sps in batches]
        sess.run(tf.compat.v1.global_variables_initializer())
    graph.finalize()
    return lambda i: sess.run(train_ops[i % len(train_ops)])


def build_tf_function(args, impl, inputs, sok):
    """The same step as a tf.function on eager variables; returns step(i)."""
    batches = [[tf.SparseTensor(i, k, [i[-1, 0] + 1, m]) for i, k, m in tables] for tables in inputs
              ]
    opt = tf.compat.v1.train.AdagradOptimizer(args.lr)
    if impl == "sok_ev":
        params = [
            sok.get_embedding_variable(f"fn_ev_{t}_{id(inputs)}", embedding_dim=args.dim)
            for t in range(args.tables)
        ]
        loss_of = lambda sps: sok_ev_step_loss(sok, params, sps)  # noqa: E731
    else:
        params = [
            tf.Variable(tf.random.truncated_normal([args.vocab, args.dim], stddev=0.05))
            for _ in range(args.tables)
        ]
        loss_of = lambda sps: dense_step_loss(params, sps)  # noqa: E731

    @tf.function(reduce_retracing=True)
    def step(sps):
        with tf.GradientTape() as tape:
            loss = loss_of(sps)
        opt.apply_gradients(zip(tape.gradient(loss, params), params))

    return lambda i: step(batches[i % len(batches)])


def time_interleaved(steps, warmup, reps):
    """{impl: ms per step}. Implementations alternate step by step (and which
    goes first alternates too), so background load hits them alike."""
    for i in range(warmup):
        for step in steps.values():
            step(i)
    times = {impl: [] for impl in steps}
    order = list(steps)
    for i in range(reps):
        for impl in (order if i % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            steps[impl](i)
            times[impl].append(time.perf_counter() - start)
    return {impl: np.array(t) * 1e3 for impl, t in times.items()}


# --------------------------------------------------------------------------- report


def summary(ms):
    return np.median(ms), np.percentile(ms, 10), np.percentile(ms, 90)


def main(argv=None):
    args = parse_args(argv)
    if args.disable_v2_behavior:
        if args.tf_function:
            sys.exit("--disable-v2-behavior times graph mode only; drop --tf-function")
        tf.compat.v1.disable_v2_behavior()
    impls = [args.only] if args.only else ["sok_ev", "dense"]
    sok = None
    if "sok_ev" in impls:
        sys.path.append(REPO_ROOT)  # in-tree package if not installed
        import sok_ev as sok
        sok.init()

    modes = [("graph", build_graph)
            ] + ([("tf.function", build_tf_function)] if args.tf_function else [])
    rows, ratios = [], []
    for hotness in args.hotness:
        inputs = make_inputs(args, hotness)
        nnz = np.mean([sum(len(k) for _, k, _ in tables) for tables in inputs])
        for mode, build in modes:
            steps = {impl: build(args, impl, inputs, sok) for impl in impls}
            times = time_interleaved(steps, args.warmup, args.reps)
            medians = {}
            for impl, ms in times.items():
                med, p10, p90 = summary(ms)
                medians[impl] = med
                rows.append(f"| {hotness} | {mode} | {impl} | {med:.2f} | {p10:.2f} | {p90:.2f} "
                            f"| {nnz * 1e-3 / med:.2f} |")
                print(rows[-1], flush=True)
            if len(medians) == 2:
                ratio = medians["dense"] / medians["sok_ev"]
                ratios.append(f"- hotness {hotness}, {mode}: dense / sok_ev = **{ratio:.2f}x** "
                              f"({'sok_ev faster' if ratio > 1 else 'dense faster'})")
                print(ratios[-1], flush=True)
            del steps

    command = results.command(argv)
    machine = results.machine()
    config = (
        f"{args.tables} tables, batch {args.batch}, dim {args.dim}, vocab {args.vocab}/table, "
        f"Zipf {args.zipf}, sum combiner, Adagrad lr {args.lr}; {args.batches} distinct "
        f"batches cycled, {args.warmup} warm-up + {args.reps} timed steps per implementation, "
        f"the implementations interleaved step by step" +
        ("; v2 behavior disabled" if args.disable_v2_behavior else ""))
    table = "\n".join([
        "| hotness | mode | impl | median ms | p10 ms | p90 ms | M keys/s |",
        "|---|---|---|---|---|---|---|"
    ] + rows)
    section = "\n".join([
        f"\n## CPU grouped sparse step (benchmarks/cpu_sparse_step.py), "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}", "", f"- machine: {machine}",
        f"- command: `{command}`", f"- setup: {config}", "",
        "Milliseconds per training step (lookup + backward + Adagrad, all tables).", "", table, ""
    ] + ratios + [""])
    print(section)
    if not args.no_append:
        results.append(section)


if __name__ == "__main__":
    main()
