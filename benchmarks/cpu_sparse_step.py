"""CPU benchmark of one grouped sparse training step: sok_ev against what a CPU
user could run instead, every side measured in the same run.

The step is what a Criteo-like model does with its 26 categorical features:
look up every table (sum combiner), back-propagate, apply Adagrad. Sides:

  sok_ev         TF 2.21 (.venv): 26 Embedding Variables, ONE
                 sok_ev.lookup_sparse call, stock
                 tf.compat.v1.train.AdagradOptimizer (through the sok_ev hook).
  dense          TF 2.21 (.venv): 26 dense tf.Variables [vocab, dim], one
                 tf.nn.embedding_lookup_sparse each, the same optimizer.
  dense-tf2.16   the same dense step on TensorFlow 2.16.2.
  tfra-tf2.16    TFRA 0.8.1 (tensorflow-recommenders-addons) on TensorFlow
                 2.16.2: de.get_variable tables (new keys start at zeros, TFRA's
                 default), de.embedding_lookup_sparse, de.DynamicEmbeddingOptimizer
                 around the same AdagradOptimizer; in tf.function through TFRA's
                 ShadowVariable route (de.shadow_ops.ShadowVariable).

The TensorFlow 2.16.2 sides run in .venv-tf2.16, made by
benchmarks/make_baseline_venv.sh. Each side runs in its own worker process
(this script with --worker, under its venv's Python); all are fed the same
keys, written once by the driver. Keys follow a Zipf law over each table's
vocabulary (hot ids scattered by a random permutation, as after hashing);
hotness 1 is one-hot, hotness h > 1 ragged (hotness uniform in [1, 2h - 1]).
Inputs are read from variables, so Grappler cannot constant-fold the dense
path's unique / segment-id work, and a few distinct batches are cycled.

Modes: graph (a tf.compat.v1.Session), tf.function (the step takes one
SparseTensor per table: 3 tensors each, which TensorFlow handles one by one
at every call), and tf.function-packed (the step takes every table's ids as
ONE RaggedTensor [tables, batch, None], 3 tensors in all). With packed ids
sok_ev passes the RaggedTensor to lookup_sparse as it is; the dense and TFRA
sides slice out each table's RaggedTensor (ids[t]) and look it up as their
APIs take it (tf.nn.embedding_lookup_sparse takes a RaggedTensor; TFRA's
lookup a SparseTensor, via .to_sparse()).

The driver alternates the workers: each turn one worker runs --block steps
while the others wait on a pipe, and the order rotates every round, so
background load hits all sides alike. Each step is timed inside its worker
(sess.run in graph mode, the tf.function call otherwise). Before each cell the
driver waits (up to --max-wait seconds) for the machine's 1-minute load to fall
below --max-load, and records the load next to the cell.

A dense side holds 2 * tables * vocab * dim floats (values + Adagrad
accumulators): 13 GB at batch 16384, dim 64, 1M keys. Dense sides that do not
fit in memory together are measured in separate groups, each group alongside
every sparse side; a baseline's ratio is taken against sok_ev's median of its
own group.

Prints one markdown table per run (median, p10, p90 ms per step, baseline /
sok_ev ratios) and appends it to benchmarks/RESULTS.md (--no-append to skip).

  python benchmarks/cpu_sparse_step.py                  # 2 hotness x 3 modes, ~15 min
  python benchmarks/cpu_sparse_step.py --batch 16384 --dim 64 --vocab 1000000 --hotness 1
  python benchmarks/cpu_sparse_step.py --sides sok_ev dense --modes graph --no-append
  python benchmarks/cpu_sparse_step.py --python-time --hotness 1   # 26 tables vs 1
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

import results  # benchmarks/results.py, next to this script
import step_profile  # benchmarks/step_profile.py

REPO_ROOT = results.REPO_ROOT
VENV_TF216 = os.path.join(REPO_ROOT, ".venv-tf2.16")

# side -> (implementation, venv); the first side is the one measured against.
SIDES = {
    "sok_ev": ("sok_ev", os.path.join(REPO_ROOT, ".venv")),
    "dense": ("dense", os.path.join(REPO_ROOT, ".venv")),
    "dense-tf2.16": ("dense", VENV_TF216),
    "tfra-tf2.16": ("tfra", VENV_TF216),
}
MODES = ("graph", "tf.function", "tf.function-packed")


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
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--sides", nargs="+", choices=list(SIDES), default=list(SIDES))
    p.add_argument("--batches", type=int, default=4, help="distinct batches cycled")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=30, help="timed steps per side")
    p.add_argument("--block", type=int, default=3, help="steps per turn of a side")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--max-load", type=float, default=1.0, help="wait for a lower 1-minute load")
    p.add_argument("--max-wait", type=float, default=1200, help="seconds to wait for it")
    p.add_argument("--no-append", action="store_true", help="do not write RESULTS.md")
    p.add_argument("--profile",
                   action="store_true",
                   help="instead of timing: each op type's CPU time in the graph-mode step "
                   "of sok_ev and dense TF (TensorFlow's step stats), per hotness")
    p.add_argument("--python-time",
                   action="store_true",
                   help="instead of timing against baselines: sok_ev's Python time per step "
                   "(the step's wall time outside TensorFlow's runtime call) with all --tables "
                   "tables and with one, per mode, at the first --hotness")
    p.add_argument("--seed", type=int, default=0)
    # Worker side (internal): one implementation in one mode.
    p.add_argument("--worker", choices=["sok_ev", "dense", "tfra"], help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--inputs", help=argparse.SUPPRESS)
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
    """(indices [nnz, 2], keys [nnz]) of one ragged batch."""
    if hotness == 1:
        counts = np.ones(batch, np.int64)
    else:
        counts = rng.integers(1, 2 * hotness, size=batch)
    rows = np.repeat(np.arange(batch), counts)
    cols = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.stack([rows, cols], 1).astype(np.int64), draw(len(rows)).astype(np.int64)


def write_inputs(args, hotness, path):
    """Writes args.batches batches of every table to `path` (.npz); returns
  the mean number of keys per step."""
    rng = np.random.default_rng(args.seed + hotness)
    draws = [zipf_sampler(rng, args.vocab, args.zipf) for _ in range(args.tables)]
    arrays = {}
    for b in range(args.batches):
        for t in range(args.tables):
            arrays[f"indices_{b}_{t}"], arrays[f"keys_{b}_{t}"] = make_batch(
                rng, draws[t], args.batch, hotness)
    np.savez(path, **arrays)
    return np.mean([
        sum(len(arrays[f"keys_{b}_{t}"]) for t in range(args.tables)) for b in range(args.batches)
    ])


def read_inputs(args):
    """[batch][table] -> (indices, keys, dense_shape)."""
    data = np.load(args.inputs)
    inputs = []
    for b in range(args.batches):
        tables = []
        for t in range(args.tables):
            indices, keys = data[f"indices_{b}_{t}"], data[f"keys_{b}_{t}"]
            tables.append((indices, keys, [args.batch, int(indices[:, 1].max()) + 1]))
        inputs.append(tables)
    return inputs


# --------------------------------------------------------------------------- worker


def worker(args):
    """Builds one side's step, warms it up, then runs steps on request: reads
  'run N' lines from stdin, answers each with a JSON list of N step times
  (ms); 'quit' ends it."""
    # Answers go to the original stdout; anything the libraries print, to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    inputs = read_inputs(args)
    start = time.perf_counter()
    step = build_step(tf, args, inputs, args.mode)
    for i in range(args.warmup):
        step(i)
    print(json.dumps({
        "tf_version": tf.__version__,
        "build_s": time.perf_counter() - start
    }),
          file=answers,
          flush=True)
    i = 0
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        times = []
        for _ in range(int(command[1])):
            begin = time.perf_counter()
            step(i)
            times.append((time.perf_counter() - begin) * 1e3)
            i += 1
        print(json.dumps(times), file=answers, flush=True)


def step_loss(tf, outputs):
    return tf.add_n([tf.reduce_sum(o) for o in outputs])


def lookups(tf, args, tables, sps, tag=""):
    """The side's embeddings of one batch (a list of [batch, dim] tensors),
  and what the optimizer trains (None: the tables). sps: one SparseTensor
  per table, or every table's ids packed in one RaggedTensor."""
    packed = isinstance(sps, tf.RaggedTensor)
    if args.worker == "sok_ev":
        import sok_ev  # pylint: disable=import-outside-toplevel
        return sok_ev.lookup_sparse(tables, sps, combiners=["sum"] * len(tables)), None
    if packed:
        sps = [sps[t] for t in range(len(tables))]  # each table's [batch, None]
    if args.worker == "dense":
        return [
            tf.nn.embedding_lookup_sparse(v, sp, None, combiner="sum")
            for v, sp in zip(tables, sps)
        ], None
    from tensorflow_recommenders_addons import dynamic_embedding as de  # pylint: disable=import-outside-toplevel
    if packed:
        sps = [sp.to_sparse() for sp in sps]
    outputs, trainables = [], []
    for t, (v, sp) in enumerate(zip(tables, sps)):
        # In graph mode each lookup makes the TrainableWrapper the optimizer
        # trains; a ShadowVariable (tf.function) is its own.
        emb, trainable = de.embedding_lookup_sparse(v,
                                                    sp,
                                                    None,
                                                    combiner="sum",
                                                    name=f"lookup{tag}_{t}",
                                                    return_trainable=True)
        outputs.append(emb)
        trainables.append(trainable)
    return outputs, trainables


def make_tables(tf, args, prefix):
    if args.worker == "sok_ev":
        sys.path.insert(0, REPO_ROOT)  # the checkout's package and op library
        import sok_ev  # pylint: disable=import-outside-toplevel
        sok_ev.init()
        return [
            sok_ev.get_embedding_variable(f"{prefix}ev_{t}", embedding_dim=args.dim)
            for t in range(args.tables)
        ]
    if args.worker == "dense":
        initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05)
        return [
            tf.Variable(initializer([args.vocab, args.dim]), name=f"{prefix}table_{t}")
            for t in range(args.tables)
        ]
    from tensorflow_recommenders_addons import dynamic_embedding as de  # pylint: disable=import-outside-toplevel
    return [
        de.get_variable(f"{prefix}de_{t}", key_dtype=tf.int64, value_dtype=tf.float32, dim=args.dim)
        for t in range(args.tables)
    ]


def make_optimizer(tf, args):
    optimizer = tf.compat.v1.train.AdagradOptimizer(args.lr)
    if args.worker == "tfra":
        from tensorflow_recommenders_addons import dynamic_embedding as de  # pylint: disable=import-outside-toplevel
        optimizer = de.DynamicEmbeddingOptimizer(optimizer)
    return optimizer


def build_graph(tf, args, inputs):
    """The step in a tf.compat.v1.Session; returns step(i)."""
    graph = tf.Graph()
    with graph.as_default():
        sess = tf.compat.v1.Session(graph=graph)
        tables = make_tables(tf, args, "")
        optimizer = make_optimizer(tf, args)
        train_ops = []
        for b, batch in enumerate(inputs):
            # Inputs read from variables: not constant-foldable.
            sps = [
                tf.SparseTensor(
                    tf.Variable(indices, trainable=False, name=f"in_idx_{b}_{t}").read_value(),
                    tf.Variable(keys, trainable=False, name=f"in_key_{b}_{t}").read_value(), shape)
                for t, (indices, keys, shape) in enumerate(batch)
            ]
            outputs, var_list = lookups(tf, args, tables, sps, tag=f"_{b}")
            train_ops.append(optimizer.minimize(step_loss(tf, outputs), var_list=var_list))
        sess.run(tf.compat.v1.global_variables_initializer())
    graph.finalize()
    return lambda i, **run: sess.run(train_ops[i % len(train_ops)], **run)


def build_step(tf, args, inputs, mode):
    """The step of `mode` (MODES); returns step(i)."""
    if mode == "graph":
        return build_graph(tf, args, inputs)
    return build_tf_function(tf, args, inputs, packed=mode == "tf.function-packed")


def packed_batch(tf, batch):
    """One batch's tables as one RaggedTensor [tables, batch, None]."""
    return tf.ragged.stack([
        tf.RaggedTensor.from_value_rowids(keys, indices[:, 0], nrows=shape[0])
        for indices, keys, shape in batch
    ])


def build_tf_function(tf, args, inputs, packed=False):
    """The step as a tf.function on eager variables; returns step(i).
  packed: the step takes one RaggedTensor, not a SparseTensor per table."""
    batches = [
        packed_batch(tf, batch) if packed else [tf.SparseTensor(i, k, s)
                                                for i, k, s in batch]
        for batch in inputs
    ]
    tables = make_tables(tf, args, "fn_")
    optimizer = make_optimizer(tf, args)
    if args.worker == "tfra":
        from tensorflow_recommenders_addons import dynamic_embedding as de  # pylint: disable=import-outside-toplevel
        tables = [
            de.shadow_ops.ShadowVariable(v, name=f"shadow_{t}", trainable=True)
            for t, v in enumerate(tables)
        ]

    @tf.function(reduce_retracing=True)
    def step(sps):
        with tf.GradientTape() as tape:
            outputs, _ = lookups(tf, args, tables, sps)
            loss = step_loss(tf, outputs)
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))

    return lambda i: step(batches[i % len(batches)])


def build_empty_tf_function(tf, args, inputs):
    """A tf.function taking the step's SparseTensors that does nothing (one
  counter add): what TensorFlow's argument handling alone costs a call."""
    del args  # the same arguments as build_tf_function's
    batches = [[tf.SparseTensor(i, k, s) for i, k, s in batch] for batch in inputs]
    counter = tf.Variable(0, dtype=tf.int64)

    @tf.function(reduce_retracing=True)
    def step(sps):
        del sps
        counter.assign_add(1)

    return lambda i: step(batches[i % len(batches)])


# --------------------------------------------------------------------------- driver


def load_1min():
    return os.getloadavg()[0]


def wait_for_quiet(args):
    """Waits until the 1-minute load is below --max-load (or --max-wait has
  passed); returns the load seen."""
    deadline = time.time() + args.max_wait
    while load_1min() >= args.max_load and time.time() < deadline:
        time.sleep(10)
    return load_1min()


def memory_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 40


def side_groups(args):
    """Lists of sides measured together: every sparse side in each group, the
  dense sides spread so that each group's dense tables fit in memory."""
    dense_bytes = 2 * args.tables * args.vocab * args.dim * 4 * 1.5  # + init temporaries
    sparse = [s for s in args.sides if SIDES[s][0] != "dense"]
    dense = [s for s in args.sides if SIDES[s][0] == "dense"]
    per_group = max(1, int(0.8 * memory_available() // dense_bytes))
    if not dense:
        return [sparse]
    return [sparse + dense[g:g + per_group] for g in range(0, len(dense), per_group)]


class Worker:
    """One side's worker process."""

    def __init__(self, side, args, mode, inputs_path):
        impl, venv = SIDES[side]
        python = os.path.join(venv, "bin", "python")
        if not os.path.exists(python):
            sys.exit(f"{side}: {python} not found; run benchmarks/make_baseline_venv.sh")
        shape = [
            "--tables", args.tables, "--batch", args.batch, "--dim", args.dim, "--vocab",
            args.vocab, "--batches", args.batches, "--warmup", args.warmup, "--lr", args.lr
        ]
        command = [
            python,
            os.path.abspath(__file__), "--worker", impl, "--mode", mode, "--inputs", inputs_path
        ] + [str(a) for a in shape]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        if impl == "tfra":
            # TFRA 0.8.1 is built on Keras 2 (tf_keras in its venv); the
            # project venv has no tf_keras, and Horovod, which sok_ev.init()
            # imports, fails under this setting without it.
            env["TF_USE_LEGACY_KERAS"] = "1"
        self.side = side
        self.process = subprocess.Popen(command,
                                        stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE,
                                        text=True,
                                        env=env,
                                        cwd=REPO_ROOT)
        self.info = self._answer()

    def _answer(self):
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            sys.exit(f"{self.side}: worker ended with exit code {self.process.returncode}")
        return json.loads(line)

    def run(self, steps):
        self.process.stdin.write(f"run {steps}\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self):
        self.process.stdin.write("quit\n")
        self.process.stdin.close()
        self.process.wait()


def time_sides(args, sides, mode, inputs_path):
    """{side: ms per step array}, {side: TF version}, load before timing."""
    workers = [Worker(side, args, mode, inputs_path) for side in sides]
    try:
        load = wait_for_quiet(args)
        times = {w.side: [] for w in workers}
        rounds = -(-args.reps // args.block)
        for r in range(rounds):
            for k in range(len(workers)):
                w = workers[(r + k) % len(workers)]
                times[w.side] += w.run(args.block)
        return ({
            s: np.array(t) for s, t in times.items()
        }, {
            w.side: w.info["tf_version"] for w in workers
        }, load)
    finally:
        for w in workers:
            w.close()


def summary(ms):
    return np.median(ms), np.percentile(ms, 10), np.percentile(ms, 90)


def profile_ops(args, steps=10, count=12):
    """Prints, per hotness and side (sok_ev, dense TF in this venv), the op
  types that take the graph-mode step's time: the sum over their nodes of
  TensorFlow's step stats (start to end, on every thread), in ms a step."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory() as tmp:
        for hotness in args.hotness:
            args.inputs = os.path.join(tmp, f"hotness_{hotness}.npz")
            write_inputs(args, hotness, args.inputs)
            for side in ("sok_ev", "dense"):
                args.worker = side
                step = build_graph(tf, args, read_inputs(args))
                for i in range(args.warmup):
                    step(i)
                index = iter(range(steps))
                wall, times = step_profile.profile(
                    lambda options, metadata: step(
                        next(index), options=options, run_metadata=metadata), steps)
                total = sum(times.values())
                print(
                    f"[profile] hotness {hotness}, {side}, graph: {wall:.2f} ms a "
                    f"traced step (tracing adds time); op time {total:.2f} ms summed over "
                    f"threads",
                    flush=True)
                for _, op, ms in step_profile.top(times, count):
                    print(f"    {ms:8.2f} ms  {ms / total:6.1%}  {op}", flush=True)


def last_level_cache_bytes():
    """The largest CPU cache's size as sysfs gives it; 32 MiB where it does not."""
    sizes = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    for entry in os.listdir(base) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, entry, "size"), encoding="utf-8") as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 << 20)


def python_calls_per_step(step, steps):
    """Python function calls a step makes (sys.setprofile's "call" events),
  averaged over `steps` steps: the Python work, free of timing noise."""
    calls = [0]

    def count(_frame, event, _arg):
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    try:
        for i in range(steps):
            step(i)
    finally:
        sys.setprofile(None)
    return calls[0] / steps


def python_time(args):
    """sok_ev's Python time per step, with args.tables tables and with one
  (the same batch shape per table), per mode, three ways:
    - Python ms: each step's wall time minus the time inside TensorFlow's
      runtime call (the tf.function's execute, the Session's run), median
      over --reps steps after --warmup;
    - the same with caches evicted: every runtime call ends by reading a
      buffer twice the last-level cache (counted inside it), so both table
      counts' Python runs on cold caches. A 26-table step itself evicts the
      interpreter's lines, which one table's does not: this separates that
      from Python work;
    - Python function calls a step (python_calls_per_step).
  Prints a table and appends it to RESULTS.md (unless --no-append)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorflow.python.client import session  # pylint: disable=import-outside-toplevel
    from tensorflow.python.eager import execute  # pylint: disable=import-outside-toplevel
    inside = [0.0]
    evict = [False]
    cache_bytes = last_level_cache_bytes()
    sweep = np.ones(2 * cache_bytes // 8)

    def timed(call):

        def wrapper(*a, **k):
            begin = time.perf_counter()
            try:
                return call(*a, **k)
            finally:
                if evict[0]:
                    sweep.sum()
                inside[0] += time.perf_counter() - begin

        return wrapper

    def python_ms(step):
        """Median, p10, p90 of the Python ms a step, and the median wall ms."""
        python, wall_ms = [], []
        for i in range(args.reps):
            inside[0] = 0.0
            begin = time.perf_counter()
            step(i)
            wall = time.perf_counter() - begin
            wall_ms.append(wall * 1e3)
            python.append((wall - inside[0]) * 1e3)
        return (np.median(python), np.percentile(python, 10), np.percentile(python,
                                                                            90), np.median(wall_ms))

    # The tf.function's call (context.call_function -> execute.execute) and
    # the Session's (BaseSession._call_tf_sessionrun).
    execute.execute = timed(execute.execute)
    session.BaseSession._call_tf_sessionrun = timed(session.BaseSession._call_tf_sessionrun)
    args.worker = "sok_ev"
    hotness = args.hotness[0]
    counts = [args.tables, 1]
    rows, results_by_mode = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for tables in counts:
            args.tables = tables
            args.inputs = os.path.join(tmp, f"tables_{tables}.npz")
            write_inputs(args, hotness, args.inputs)
            inputs = read_inputs(args)
            modes = list(
                args.modes) + (["tf.function, empty body"] if "tf.function" in args.modes else [])
            for mode in modes:
                if mode == "tf.function, empty body":
                    step = build_empty_tf_function(tf, args, inputs)
                else:
                    step = build_step(tf, args, inputs, mode)
                for i in range(args.warmup):
                    step(i)
                median, p10, p90, wall = python_ms(step)
                evict[0] = True
                cold = python_ms(step)[0]
                evict[0] = False
                calls = python_calls_per_step(step, 20)
                results_by_mode.setdefault(mode, {})[tables] = (median, cold, calls)
                rows.append(f"| {mode} | {tables} | {median:.3f} | {p10:.3f} | {p90:.3f} "
                            f"| {cold:.3f} | {calls:.0f} | {wall:.2f} |")
                print(rows[-1], flush=True)
    args.tables = counts[0]
    verdicts = []
    empty = results_by_mode.pop("tf.function, empty body", None)
    for mode, by_count in results_by_mode.items():
        ratios = [many / one for many, one in zip(by_count[counts[0]], by_count[1])]
        verdicts.append(
            f"- {mode}: {counts[0]} tables' Python time is **{ratios[0]:.2f}x** one table's "
            f"(target <= 1x: {'met' if ratios[0] <= 1 else 'missed'}); with caches evicted "
            f"{ratios[1]:.2f}x; Python calls {ratios[2]:.2f}x")
        print(verdicts[-1], flush=True)
    if empty:
        verdicts.append(f"- a tf.function with an empty body and the same arguments costs "
                        f"{empty[counts[0]][0]:.3f} ms of Python a call with {counts[0]} "
                        f"tables, {empty[1][0]:.3f} with one: TensorFlow's handling of the "
                        f"arguments")
        print(verdicts[-1], flush=True)
    section = "\n".join([
        f"\n## Python time per step of the grouped lookup, {counts[0]} tables vs 1 "
        f"(benchmarks/cpu_sparse_step.py --python-time), "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}", "",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores ({results.cpu_model()}), "
        f"TensorFlow {tf.__version__}, Python {platform.python_version()}; 1-minute load "
        f"{load_1min():.2f} at the end", f"- command: `{results.command()}`",
        f"- setup: sok_ev step (one lookup_sparse call, Adagrad), batch {args.batch}, dim "
        f"{args.dim}, vocab {args.vocab}/table, hotness {hotness}; Python time = the step's "
        f"wall time minus the time inside TensorFlow's runtime call (tf.function: its "
        f"execute; graph: Session's run); {args.warmup} warm-up + {args.reps} steps; "
        f"'caches evicted': each runtime call ends by reading {2 * cache_bytes >> 20} MiB "
        f"(twice the last-level cache), counted inside it, so that every step's Python runs "
        f"on cold caches whatever the step's own footprint; 'calls': Python function calls "
        f"a step (sys.setprofile, 20 steps); 'tf.function, empty body': a tf.function taking "
        f"the same SparseTensors that does nothing (TensorFlow's own cost of the arguments, "
        f"which every side pays)", "",
        "| mode | tables | Python ms a step (median) | p10 | p90 | Python ms, caches evicted "
        "| Python calls a step | step wall ms |", "|---|---|---|---|---|---|---|---|"
    ] + rows + [""] + verdicts + [""])
    print(section)
    if not args.no_append:
        results.append(section, "cpu-sparse-step")


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    if args.profile:
        return profile_ops(args)
    if args.python_time:
        return python_time(args)
    if "sok_ev" not in args.sides:
        sys.exit("--sides must include sok_ev: every ratio is taken against it")
    groups = side_groups(args)
    rows, verdicts, loads = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for hotness in args.hotness:
            inputs_path = os.path.join(tmp, f"hotness_{hotness}.npz")
            keys_per_step = write_inputs(args, hotness, inputs_path)
            for mode in args.modes:
                load_before = wait_for_quiet(args)
                fastest = None  # (median, side) of the fastest baseline
                sok_ev_medians = []
                for g, group in enumerate(groups):
                    times, versions, load = time_sides(args, group, mode, inputs_path)
                    loads.append(f"hotness {hotness} ({keys_per_step:,.0f} keys per step), {mode}, "
                                 f"group {g + 1}: 1-minute load "
                                 f"{load_before:.2f} before building, {load:.2f} before timing, "
                                 f"{load_1min():.2f} after")
                    print(loads[-1], flush=True)
                    reference = np.median(times["sok_ev"])
                    sok_ev_medians.append(reference)
                    for side in group:
                        med, p10, p90 = summary(times[side])
                        ratio = "1" if side == "sok_ev" else f"{med / reference:.2f}x"
                        label = side if len(groups) == 1 or side != "sok_ev" else \
                            f"sok_ev (group {g + 1})"
                        rows.append(f"| {hotness} | {mode} | {label} | {versions[side]} "
                                    f"| {med:.2f} | {p10:.2f} | {p90:.2f} | {ratio} |")
                        print(rows[-1], flush=True)
                        if side != "sok_ev" and (fastest is None or med / reference < fastest[0]):
                            fastest = (med / reference, side)
                if fastest:
                    met = "met" if fastest[0] >= 2 else f"missed by {(1 - fastest[0] / 2):.0%}"
                    verdicts.append(f"- hotness {hotness}, {mode}: fastest baseline {fastest[1]}; "
                                    f"it takes **{fastest[0]:.2f}x** sok_ev's time "
                                    f"(target >= 2x: {met})")
                    print(verdicts[-1], flush=True)
        write_report(args, rows, verdicts, loads, groups)


def write_report(args, rows, verdicts, loads, groups):
    command = results.command()
    # Each side's TensorFlow is in the table: this process imports none.
    machine = (f"{platform.machine()}, {os.cpu_count()} cores ({results.cpu_model()}), "
               f"Python {platform.python_version()}")
    config = (
        f"{args.tables} tables, batch {args.batch}, dim {args.dim}, vocab {args.vocab}/table, "
        f"Zipf {args.zipf}, sum combiner, Adagrad lr {args.lr}; {args.batches} distinct "
        f"batches cycled; {args.warmup} warm-up + {args.reps} timed steps per side, sides "
        f"alternating every {args.block} steps (order rotating); groups measured "
        f"together: {'; '.join(', '.join(g) for g in groups)}")
    table = "\n".join([
        "| hotness | mode | side | TensorFlow | median ms | p10 ms | p90 ms | side / sok_ev |",
        "|---|---|---|---|---|---|---|---|"
    ] + rows)
    section = "\n".join([
        f"\n## CPU grouped sparse step against every baseline (benchmarks/cpu_sparse_step.py), "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}", "", f"- machine: {machine}",
        f"- command: `{command}`", f"- setup: {config}"
    ] + [f"- {line}" for line in loads] + [
        "", "Milliseconds per training step (lookup + backward + Adagrad, all tables).", "", table,
        ""
    ] + verdicts + [""])
    print(section)
    if not args.no_append:
        results.append(section, "cpu-sparse-step")


if __name__ == "__main__":
    main()
