#!/usr/bin/env python3
"""What sok-ev and NVIDIA SOK 2.1.0 accept, and what they answer to bad input
(issue 14): each case runs through one implementation's lookup_sparse, and an
accepted lookup is checked against the combiner formula of
tf.nn.embedding_lookup_sparse (sum w*v; mean /= sum w; sqrtn /= sqrt(sum w^2);
an empty row is zeros) over the rows the same table gives each key alone.

  python3 benchmarks/peers/feature_probe.py --impl sok_ev|sok_dynamic|sok_static
  python3 benchmarks/peers/feature_probe.py --report      # the markdown table

An implementation's run is a series of processes: a case that kills its
process (an abort in a native kernel) is recorded as such and the next
process starts after it. Results: $OUT/probe_<impl>.jsonl, $OUT/probe.md.
sok_ev runs on the CPU too (--allow-cpu); SOK needs a GPU.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

IMPLS = ("sok_ev", "sok_dynamic", "sok_static")
DIM, STATIC_ROWS = 4, 64


class Impl:
    """One implementation's tables and lookup, behind one interface."""

    def __init__(self, name):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        self.tf, self.name, self.count = tf, name, 0
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
        if name == "sok_ev":
            import sok_ev as lib  # pylint: disable=import-outside-toplevel
            lib.init()
        else:
            import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
            hvd.init()
            import sparse_operation_kit as lib  # pylint: disable=import-outside-toplevel
            lib.init(use_legacy_optimizer=False)
        self.lib = lib

    def table(self, key_dtype=None, target_gpu=None, name=None):
        """A fresh table; `name` defaults to a new one (SOK's load finds a
        table's files by its name, so a restore passes the saved one)."""
        tf, lib = self.tf, self.lib
        key_dtype = key_dtype or tf.int64
        self.count += 1
        name = name or f"probe_{self.count}"
        uniform = tf.random_uniform_initializer(-1.0, 1.0)
        mode = None if target_gpu is None else f"localized:{target_gpu}"
        if self.name == "sok_ev":
            return lib.get_embedding_variable(name,
                                              embedding_dim=DIM,
                                              key_dtype=key_dtype,
                                              initializer=uniform,
                                              target_gpu=-1 if target_gpu is None else target_gpu)
        if self.name == "sok_dynamic":
            return lib.DynamicVariable(dimension=DIM,
                                       var_type="hybrid",
                                       initializer="random",
                                       key_type=key_dtype,
                                       mode=mode,
                                       init_capacity=1024,
                                       max_capacity=1024,
                                       max_hbm_for_vectors=1,
                                       name=name)
        return lib.Variable(shape=[STATIC_ROWS, DIM],
                            initializer=uniform,
                            dtype=tf.float32,
                            name=name,
                            **({} if mode is None else dict(mode=mode)))

    def lookup(self, tables, ids, combiners, weights=None):
        return [
            np.asarray(e)
            for e in self.lib.lookup_sparse(tables, ids, combiners=combiners, sp_weights=weights)
        ]

    def optimizer(self):
        opt = self.tf.compat.v1.train.AdagradOptimizer(0.1, 0.1)
        # SOK's dump/load take its OptimizerWrapper (or a Keras optimizer).
        return opt if self.name == "sok_ev" else self.lib.OptimizerWrapper(opt)


def sparse(tf, rows, dtype=None, shape=None, values_dtype=None):
    """A [len(rows), max len] SparseTensor of the ragged list `rows`."""
    indices = [[r, j] for r, row in enumerate(rows) for j in range(len(row))]
    values = [v for row in rows for v in row]
    width = max([len(r) for r in rows] + [1])
    return tf.SparseTensor(
        tf.constant(indices, tf.int64, shape=[len(indices), 2]),
        tf.constant(values, values_dtype or dtype or tf.int64, shape=[len(values)]), shape or
        [len(rows), width])


def rows_of(impl, table, keys, dtype):
    """Each key's row as the table gives it alone (one key a sample, sum)."""
    out = impl.lookup([table], [sparse(impl.tf, [[k] for k in keys], dtype)], ["sum"])[0]
    return {k: out[i] for i, k in enumerate(keys)}


def reference(rows_by_key, rows, weights, combiner):
    out = np.zeros((len(rows), DIM), np.float32)
    for r, row in enumerate(rows):
        w = np.array(weights[r] if weights else [1.0] * len(row), np.float32)
        if not len(row):
            continue
        total = sum(wi * rows_by_key[k] for wi, k in zip(w, row))
        scale = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
        out[r] = total / scale
    return out


def checked(impl, rows, combiner="sum", dtype=None, weights=None):
    """Looks `rows` up, compares with the reference; returns the verdict."""
    tf = impl.tf
    dtype = dtype or tf.int64
    table = impl.table(dtype)
    sp_weights = None
    if weights is not None:
        sp_weights = [sparse(tf, weights, values_dtype=tf.float32)]
    got = impl.lookup([table], [sparse(tf, rows, dtype)], [combiner], sp_weights)[0]
    keys = sorted({k for row in rows for k in row})
    want = reference(rows_of(impl, table, keys, dtype), rows, weights, combiner)
    error = float(np.abs(got - want).max()) if got.shape == want.shape else None
    if error is None:
        return f"accepted, shape {got.shape} (expected {want.shape})"
    return "accepted, matches" if error < 1e-5 else f"accepted, WRONG (max error {error:.3g})"


ROWS = [[3, 17], [42], [17, 3, 42]]


def case_checkpoint(impl):
    """One Adagrad step, then the library's checkpoint: what is written, and
    whether a fresh table restores the rows."""
    tf = impl.tf
    table, opt = impl.table(), impl.optimizer()
    ids = sparse(tf, ROWS)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(impl.lib.lookup_sparse([table], [ids], combiners=["sum"])[0])
    opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
    keys = [3, 17, 42]
    before = rows_of(impl, table, keys, tf.int64)
    path = tempfile.mkdtemp(prefix="probe_ckpt_")
    if impl.name == "sok_ev":
        saved = tf.train.Checkpoint(table=table, optimizer=opt).save(os.path.join(path, "ckpt"))
        names = [f"{n} {s}" for n, s in tf.train.list_variables(saved) if "table" in n]
        fresh, fresh_opt = impl.table(), impl.optimizer()
        tf.train.Checkpoint(table=fresh, optimizer=fresh_opt).restore(saved)
        what = "tf.train.Checkpoint: " + "; ".join(names)
    else:
        impl.lib.dump(path, [table], opt)
        names = sorted(os.listdir(path))
        fresh, fresh_opt = impl.table(name=table.name.split(":")[0]), impl.optimizer()
        impl.lib.load(path, [fresh], fresh_opt)
        what = "sok.dump: " + ", ".join(names)
    after = rows_of(impl, fresh, keys, tf.int64)
    same = all(np.allclose(before[k], after[k]) for k in keys)
    return f"{what}; restored rows {'match' if same else 'DIFFER'}"


def cases(impl):
    tf = impl.tf
    big = 2**40 + 5
    return [
        ("int64 keys, sum", lambda: checked(impl, ROWS)),
        ("int32 keys, sum", lambda: checked(impl, ROWS, dtype=tf.int32)),
        ("key 2^40+5", lambda: checked(impl, [[big], [3, big]])),
        ("combiner mean", lambda: checked(impl, ROWS, "mean")),
        ("combiner sqrtn", lambda: checked(impl, ROWS, "sqrtn")),
        ("weights, sum",
         lambda: checked(impl, ROWS, weights=[[0.5, 2.0], [3.0], [1.0, -1.0, 0.25]])),
        ("weights, mean",
         lambda: checked(impl, ROWS, "mean", weights=[[0.5, 2.0], [3.0], [1.0, 1.0, 0.25]])),
        ("ragged rows with empty rows", lambda: checked(impl, [[3], [], [17, 42, 3], []])),
        ("duplicate key in a row", lambda: checked(impl, [[3, 3], [17, 17, 17]])),
        ("negative keys (-5, -1)", lambda: checked(impl, [[-5], [-1, 3]])),
        ("id ≥ static rows (64, 1000)", lambda: checked(impl, [[STATIC_ROWS], [1000]])),
        ("target_gpu 0", lambda: target_gpu_case(impl, 0)),
        ("target_gpu 5 (no such GPU)", lambda: target_gpu_case(impl, 5)),
        ("int32 ids into an int64 table",
         lambda: impl.lookup([impl.table()], [sparse(tf, ROWS, tf.int32)], ["sum"]) and "accepted"),
        ("float ids", lambda: impl.lookup([impl.table(
        )], [sparse(tf, ROWS, values_dtype=tf.float32)], ["sum"]) and "accepted"),
        ("2 tables, 1 SparseTensor", lambda: impl.lookup([impl.table(), impl.table(
        )], [sparse(tf, ROWS)], ["sum", "sum"]) and "accepted"),
        ("combiner 'max'",
         lambda: impl.lookup([impl.table()], [sparse(tf, ROWS)], ["max"]) and "accepted"),
        ("rows out of order", lambda: impl.lookup([impl.table()], [
            tf.SparseTensor([[1, 0], [0, 0]], tf.constant([3, 17], tf.int64), [2, 1])
        ], ["sum"]) and "accepted"),
        ("weights of another shape",
         lambda: impl.lookup([impl.table()], [sparse(tf, ROWS)], ["sum"],
                             [sparse(tf, [[1.0], [1.0]], values_dtype=tf.float32)]) and "accepted"),
        ("checkpoint after an Adagrad step", lambda: case_checkpoint(impl)),
    ]


def target_gpu_case(impl, gpu):
    table = impl.table(target_gpu=gpu)
    got = impl.lookup([table], [sparse(impl.tf, ROWS)], ["sum"])[0]
    return f"accepted, output {got.shape}"


def worker(args):
    """Runs the cases from --start on, one JSON line each (started, then
    done), so a parent can tell which case killed the process."""
    impl = Impl(args.impl)
    todo = cases(impl)
    with open(args.jsonl, "a") as f:
        for i, (name, run) in enumerate(todo[args.start:], args.start):
            f.write(json.dumps(dict(case=i, name=name, started=True)) + "\n")
            f.flush()
            try:
                answer = run()
            except Exception as e:  # pylint: disable=broad-except
                # TensorFlow's "{{function_node ...}}" prefix names no argument.
                text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", str(e)).strip()
                first = (text.splitlines() or [""])[0][:160]
                answer = f"error {type(e).__name__}: {first}"
            f.write(json.dumps(dict(case=i, name=name, answer=answer)) + "\n")
            f.flush()
            print(f"[{args.impl}] {name}: {answer}", flush=True)


def run_all(args):
    """Workers in turn until every case has an answer."""
    if os.path.exists(args.jsonl):
        os.remove(args.jsonl)
    start, total = 0, None
    while True:
        command = [sys.executable, __file__, "--impl", args.impl, "--worker", "--start", str(start)]
        if args.allow_cpu:
            command.append("--allow-cpu")
        code = subprocess.run(command, check=False).returncode
        lines = [json.loads(l) for l in open(args.jsonl)] if os.path.exists(args.jsonl) else []
        answered = {l["case"] for l in lines if "answer" in l}
        started = [l for l in lines if l.get("started") and l["case"] not in answered]
        if code == 0 or not started:
            return 0 if code == 0 else code
        crashed = started[-1]
        with open(args.jsonl, "a") as f:
            f.write(
                json.dumps(
                    dict(case=crashed["case"],
                         name=crashed["name"],
                         answer=f"process died (exit {code})")) + "\n")
        start = crashed["case"] + 1


def report(args):
    answers, names = {}, {}
    for impl in IMPLS:
        path = os.path.join(args.json_dir, f"probe_{impl}.jsonl")
        if not os.path.exists(path):
            continue
        for line in open(path):
            entry = json.loads(line)
            if "answer" in entry:
                answers[impl, entry["case"]] = entry["answer"]
                names[entry["case"]] = entry["name"]
    present = [i for i in IMPLS if any(k[0] == i for k in answers)]
    lines = ["| case | " + " | ".join(present) + " |", "|---" * (len(present) + 1) + "|"]
    for case in sorted(names):
        cells = [answers.get((i, case), "—").replace("|", "/") for i in present]
        lines.append(f"| {names[case]} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.json_dir, "probe.md"), "w") as f:
        f.write(text)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", choices=IMPLS)
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--allow-cpu", action="store_true", help="sok_ev without a GPU")
    parser.add_argument("--json-dir", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()
    if args.report:
        return report(args)
    if not args.impl:
        parser.error("--impl or --report")
    args.jsonl = os.path.join(args.json_dir, f"probe_{args.impl}.jsonl")
    if args.worker:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        assert args.allow_cpu or tf.config.list_physical_devices("GPU"), "no GPU"
        return worker(args)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
