"""CPU benchmark: DeepRec-style tf.nn lookups on Embedding Variables against
sok-ev's own lookup, in one training step.

DeepRec code reads each table with its own tf.nn.embedding_lookup_sparse
call; sok-ev dispatches each to sok_ev.lookup_sparse (sok_ev/dispatch.py).
Three implementations run in the same process on the same keys (the inputs
and the timing loop of benchmarks/cpu_sparse_step.py), graph mode
(tf.compat.v1.Session), lookup + backward + Adagrad:

  grouped    one sok_ev.lookup_sparse call over all tables (SOK's way);
  per_table  one sok_ev.lookup_sparse call per table;
  tf_nn      one tf.nn.embedding_lookup_sparse call per table (DeepRec's way).

tf_nn / per_table is the cost of the dispatch itself (it rebuilds each
SparseTensor's positions); tf_nn / grouped what a DeepRec script gives up
by not grouping its lookups. Appends a dated section to benchmarks/RESULTS.md
(--no-append to skip).

  python benchmarks/cpu_tf_nn_dispatch.py
"""
import datetime
import os
import platform
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu_sparse_step as common  # noqa: E402  pylint: disable=wrong-import-position

tf = common.tf
IMPLEMENTATIONS = ("grouped", "per_table", "tf_nn")


def step_loss(sok, impl, evs, sps):
    if impl == "grouped":
        outs = sok.lookup_sparse(evs, sps, combiners=["sum"] * len(evs))
    elif impl == "per_table":
        outs = [sok.lookup_sparse([ev], [sp], combiners=["sum"])[0] for ev, sp in zip(evs, sps)]
    else:
        outs = [
            tf.nn.embedding_lookup_sparse(ev, sp, None, combiner="sum") for ev, sp in zip(evs, sps)
        ]
    return tf.add_n([tf.reduce_sum(o) for o in outs])


def build_graph(args, impl, inputs, sok):
    """One implementation in its own graph and Session; returns step(i)."""
    graph = tf.Graph()
    with graph.as_default():
        sess = tf.compat.v1.Session(graph=graph)
        batches = common.input_tensors(inputs)
        opt = tf.compat.v1.train.AdagradOptimizer(args.lr)
        evs = [
            sok.get_embedding_variable(f"ev_{t}", embedding_dim=args.dim)
            for t in range(args.tables)
        ]
        train_ops = [opt.minimize(step_loss(sok, impl, evs, sps)) for sps in batches]
        sess.run(tf.compat.v1.global_variables_initializer())
    graph.finalize()
    return lambda i: sess.run(train_ops[i % len(train_ops)])


def main(argv=None):
    args = common.parse_args(argv)
    sys.path.insert(0, common.REPO_ROOT)  # this tree's package, not an installed one
    import sok_ev as sok  # pylint: disable=import-outside-toplevel
    sok.init()
    rows, ratios = [], []
    for hotness in args.hotness:
        inputs = common.make_inputs(args, hotness)
        steps = {impl: build_graph(args, impl, inputs, sok) for impl in IMPLEMENTATIONS}
        times = common.time_interleaved(steps, args.warmup, args.reps)
        medians = {}
        for impl, ms in times.items():
            med, p10, p90 = common.summary(ms)
            medians[impl] = med
            rows.append(f"| {hotness} | {impl} | {med:.2f} | {p10:.2f} | {p90:.2f} |")
            print(rows[-1], flush=True)
        ratios.append(f"- hotness {hotness}: tf_nn / per_table = "
                      f"**{medians['tf_nn'] / medians['per_table']:.2f}x**, tf_nn / grouped = "
                      f"**{medians['tf_nn'] / medians['grouped']:.2f}x**")
        print(ratios[-1], flush=True)
        del steps

    command = "python " + " ".join(
        [os.path.relpath(os.path.abspath(sys.argv[0]), common.REPO_ROOT)] +
        (sys.argv[1:] if argv is None else argv))
    machine = (f"{platform.machine()}, {os.cpu_count()} cores ({common.cpu_model()}), "
               f"TensorFlow {tf.__version__}, Python {platform.python_version()}; "
               f"load average at end {os.getloadavg()[0]:.1f}")
    config = (f"{args.tables} tables, batch {args.batch}, dim {args.dim}, Zipf {args.zipf} over "
              f"{args.vocab} keys/table, sum combiner, Adagrad lr {args.lr}, graph mode; "
              f"{args.batches} distinct batches cycled, {args.warmup} warm-up + {args.reps} "
              "timed steps per implementation, interleaved step by step")
    table = "\n".join(
        ["| hotness | impl | median ms | p10 ms | p90 ms |", "|---|---|---|---|---|"] + rows)
    section = "\n".join([
        f"\n## CPU tf.nn lookups on Embedding Variables (benchmarks/cpu_tf_nn_dispatch.py), "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}", "", f"- machine: {machine}",
        f"- command: `{command}`", f"- setup: {config}", "",
        "Milliseconds per training step (lookup + backward + Adagrad, all tables).", "", table, ""
    ] + ratios + [""])
    print(section)
    if not args.no_append:
        common.results.append(section, "cpu-tf-nn")


if __name__ == "__main__":
    main()
