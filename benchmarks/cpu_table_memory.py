"""CPU memory of an Embedding Variable: at rest, while a slot is added, during a save.

Measures process memory (RSS from /proc, the peak through VmHWM, reset before
each phase by writing 5 to /proc/self/clear_refs) of one Embedding Variable
of `--keys` distinct int64 keys, dim `--dim`, trained by Adagrad:

  values at rest   after inserting every key (lookups; no slot yet)
  slot peak        peak while Adagrad's first step adds its accumulator slot
                   (one step on a small batch: the slot widens every row)
  at rest          value + slot of every key
  save peak        peak while tf.train.Checkpoint(table=ev).write() runs
  small table      what a table of 64 keys (dim 16, Adagrad) costs, and 26 of them

Each figure is divided by the raw bytes the table holds, the baseline, which
needs no measurement: per key the key (8 B), the value and the slot (4 * dim
B each); with dim 16 that is 136 B, the issue's figure. The frequency and
version each key also keeps (8 B each) are not in it, so they count as
overhead. A dense tf.Variable [keys, dim] with an Adagrad slot is measured
in the same run for comparison. Every measurement runs in a fresh child
process, so earlier phases do not hide in the allocator's free lists; each
child warms TensorFlow up (one small table through every phase) before its
first reading.

  python benchmarks/cpu_table_memory.py                 # 5M keys, dim 16
  python benchmarks/cpu_table_memory.py --keys 200000   # quick look

Appends a dated section to benchmarks/RESULTS.md (--no-append to skip).
"""
import argparse
import datetime
import gc
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import results  # noqa: E402  (benchmarks/results.py, next to this script)

REPO_ROOT = results.REPO_ROOT
MIB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, default=5_000_000)
    p.add_argument("--dim", type=int, default=16)
    # A large training batch; lookups of far more keys at once leave their
    # temporaries in the allocator's free lists, which RSS would count.
    p.add_argument("--batch", type=int, default=65_536, help="keys per inserting lookup")
    p.add_argument("--label", default="", help="tag of this run in RESULTS.md (e.g. before)")
    p.add_argument("--no-append", action="store_true", help="do not write RESULTS.md")
    p.add_argument("--child", choices=["table", "small", "dense"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --------------------------------------------------------------------------- memory


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss():
    """Resident bytes now, after a garbage collection."""
    gc.collect()
    return _status("VmRSS")


def reset_peak():
    """Makes VmHWM restart from the current RSS."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak():
    return _status("VmHWM")


# --------------------------------------------------------------------------- children


def _distinct_keys(n, seed):
    """n distinct int64 keys spread over the id space (as hashed ids are)."""
    rng = np.random.default_rng(seed)
    # An odd multiplier is a bijection of uint64, so the keys stay distinct.
    spread = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return (spread + np.uint64(rng.integers(1 << 62))).view(np.int64)


def _one_hot(tf, keys):
    n = len(keys)
    indices = np.stack([np.arange(n, dtype=np.int64), np.zeros(n, np.int64)], 1)
    return tf.SparseTensor(indices, tf.constant(keys), [n, 1])


def _table_phases(args, keys, record):
    """Runs every phase on a table of `keys`; record(name, bytes) is called
    with RSS readings relative to the start."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import sok_ev  # pylint: disable=import-outside-toplevel

    base = rss()
    ev = sok_ev.get_embedding_variable(f"table_{len(keys)}", args.dim)
    for start in range(0, len(keys), args.batch):
        sok_ev.lookup_sparse([ev], [_one_hot(tf, keys[start:start + args.batch])])
    record("values at rest", rss() - base)

    opt = tf.compat.v1.train.AdagradOptimizer(0.1)
    small = _one_hot(tf, keys[:1024])
    reset_peak()
    with tf.GradientTape() as tape:
        emb, = sok_ev.lookup_sparse([ev], [small])
        loss = tf.reduce_sum(emb)
    grads = tape.gradient(loss, [ev])
    opt.apply_gradients(zip(grads, [ev]))
    del tape, emb, loss, grads
    record("slot peak", peak() - base)
    record("at rest", rss() - base)

    directory = tempfile.mkdtemp(prefix="sok_ev_memory_")
    reset_peak()
    tf.train.Checkpoint(table=ev).write(os.path.join(directory, "ckpt"))
    record("save peak", peak() - base)
    record("after save", rss() - base)
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    os.rmdir(directory)
    return ev


def child_table(args):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import sok_ev  # pylint: disable=import-outside-toplevel
    sok_ev.init()
    results = {}
    # Warm-up: every lazily allocated runtime structure (thread pools, kernels,
    # checkpoint machinery) is created by a small table first.
    _table_phases(args, _distinct_keys(20_000, 1), lambda name, value: None)
    _table_phases(args, _distinct_keys(args.keys, 2), results.__setitem__)
    del tf
    return results


def child_small(args):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import sok_ev  # pylint: disable=import-outside-toplevel
    sok_ev.init()
    opt = tf.compat.v1.train.AdagradOptimizer(0.1)

    def small_tables(count, tag):
        tables = []
        for t in range(count):
            ev = sok_ev.get_embedding_variable(f"{tag}_{t}", args.dim)
            with tf.GradientTape() as tape:
                emb, = sok_ev.lookup_sparse([ev], [_one_hot(tf, _distinct_keys(64, 10 + t))])
                loss = tf.reduce_sum(emb)
            opt.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))
            tables.append(ev)
        return tables

    warm = small_tables(2, "warm")
    base = rss()
    one = small_tables(1, "one")
    one_cost = rss() - base
    base = rss()
    many = small_tables(26, "many")
    many_cost = rss() - base
    del warm, one, many
    return {"one 64-key table": one_cost, "26 64-key tables": many_cost}


def child_dense(args):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    opt = tf.compat.v1.train.AdagradOptimizer(0.1)

    def train(rows):
        var = tf.Variable(tf.zeros([rows, args.dim]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(var, tf.range(min(rows, 1024))))
        opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
        return var

    warm = train(20_000)
    base = rss()
    var = train(args.keys)
    cost = rss() - base
    del warm, var
    return {"dense at rest": cost}


def run_child(kind, args):
    command = [
        sys.executable,
        os.path.abspath(__file__), "--child", kind, "--keys",
        str(args.keys), "--dim",
        str(args.dim), "--batch",
        str(args.batch)
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# --------------------------------------------------------------------------- report


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        result = {
            "table": child_table,
            "small": child_small,
            "dense": child_dense
        }[args.child](args)
        print(json.dumps(result))
        return
    raw = 8 + 2 * 4 * args.dim  # key + value + Adagrad slot
    raw_values = 8 + 4 * args.dim  # before the slot exists
    table = run_child("table", args)
    small = run_child("small", args)
    dense = run_child("dense", args)
    n = args.keys
    rows = []
    for name, value in table.items():
        per_key = value / n
        reference = raw_values if name == "values at rest" else raw
        rows.append(f"| {name} | {value / MIB:.1f} MiB | {per_key:.1f} B | "
                    f"{reference} B | **{per_key / reference:.2f}x** |")
    rows.append(
        f"| dense tf.Variable + slot at rest (comparison) | {dense['dense at rest'] / MIB:.1f}"
        f" MiB | {dense['dense at rest'] / n:.1f} B | {raw - 8} B | "
        f"{dense['dense at rest'] / n / (raw - 8):.2f}x |")
    for name, value in small.items():
        count = 26 if name.startswith("26") else 1
        held = count * 64 * raw
        rows.append(f"| {name} | {value / 1024:.0f} KiB | — | {held / 1024:.1f} KiB held | "
                    f"{value / held:.1f}x |")
    table_md = "\n".join([
        "| phase | RSS growth | per key | raw per key | ratio |",
        "|---|---|---|---|---|",
    ] + rows)
    try:
        commit = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True,
                                text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    label = f" — {args.label}" if args.label else ""
    section = "\n".join([
        f"\n## CPU table memory (benchmarks/cpu_table_memory.py){label}, "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}", "",
        f"- machine: {results.machine()}",
        f"- command: `{results.command(argv)}` (tree at {commit})",
        f"- setup: {n} distinct int64 keys, dim {args.dim}, Adagrad; inserted by lookups of "
        f"{args.batch} keys; save = tf.train.Checkpoint(table=ev).write()",
        f"- raw per key: key 8 B + value {4 * args.dim} B + slot {4 * args.dim} B = {raw} B "
        f"(before the slot: {raw_values} B)", "", table_md, ""
    ])
    print(section)
    if not args.no_append:
        results.append(section, "cpu-table-memory")


if __name__ == "__main__":
    main()
