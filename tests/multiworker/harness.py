"""Shared harness of the multi-worker tests: launch, time limit, results.

`launch(script, workers, ...)` runs `horovodrun --gloo -np W -H localhost:W
python script --out DIR ...` (Gloo oversubscribes a 2-core machine fine) in
its own process group, with a hard wall-clock limit: on expiry the whole
group -- horovodrun and every rank -- is killed, so a test ends in bounded
time even when a rank dies or hangs in a collective. Each rank writes its
results to `DIR/rank<r>.npz`; `launch` returns them with the exit status and
the output.

GPU mode, opt-in (tests/gpu/run_on_device.sh): SOK_EV_MULTIWORKER_GPUS=N
starts each rank through one_gpu_per_rank.sh, which shows it only the GPU of
its local rank (two ranks on one GPU fail in ncclCommInitRank), so Horovod's
collectives on the ranks' GPU tensors run over NCCL. NCCL_DEBUG=INFO makes
NCCL announce itself in each rank's output (Launch.nccl_ranks). A launch of
more ranks than N is skipped, naming both numbers; tests whose chain of
launches crosses worker counts size it by `max_workers()` instead.

No launch hangs silently: each rank gets a deadline (SOK_EV_RANK_DEADLINE_S,
the launch's limit less STACK_GRACE_S) and, on importing this module, arms
it. At the deadline every rank still running prints the Python stack of
each of its threads to stderr (faulthandler; no GIL needed, so a rank stuck
in a collective prints too) and dies RANK_EXIT_AFTER_STACK_S later, which
ends the job before the harness's own kill; `Launch.stuck_ranks()` names
the ranks that printed. The ranks' deadlines are armed within a second of
each other, so every stuck rank prints before horovodrun stops the others.

The data shared by worker scripts and the single-process references in the
tests (batches, initial rows, targets) is generated here from fixed seeds,
identically in every process. `owner_of` re-implements the documented
placement function of cc/partition.h in NumPy, so tests check that contract.
"""

import dataclasses
import faulthandler
import importlib.util
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))

# horovodrun is installed next to the Python that runs the tests (.venv/bin),
# or is on PATH (the GPU machines' kit).
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
if not os.path.exists(HOROVODRUN) and shutil.which("horovodrun"):
    HOROVODRUN = shutil.which("horovodrun")
# GPUs of GPU mode; 0: CPU ranks (Gloo).
GPUS = int(os.environ.get("SOK_EV_MULTIWORKER_GPUS", "0"))
ONE_GPU_PER_RANK = os.path.join(HERE, "one_gpu_per_rank.sh")
# The ranks' deadline: the launch's limit less the time to print every
# rank's stack and end the job.
RANK_DEADLINE_VARIABLE = "SOK_EV_RANK_DEADLINE_S"
STACK_GRACE_S = 30  # horovodrun's start (seconds on a busy machine) included
RANK_EXIT_AFTER_STACK_S = 3
# faulthandler's first line of a deadline's stack dump.
STACK_DUMP_HEADER = re.compile(r"^\[(\d+)\]<stderr>:Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!", re.M)


def max_workers(wanted=3):
    """The most ranks a launch can have here: `wanted` on CPU workers, at most
  one per GPU in GPU mode."""
    return min(wanted, GPUS) if GPUS else wanted


@dataclasses.dataclass
class Launch:
    returncode: int  # None when the time limit killed the job
    timed_out: bool
    seconds: float
    output: str  # stdout and stderr of horovodrun and all ranks
    results: dict  # rank -> dict of arrays from rank<r>.npz

    def tail(self, chars=6000):
        return self.output[-chars:]

    def stuck_ranks(self):
        """Ranks that reached their deadline and printed their stacks."""
        return {int(rank) for rank in STACK_DUMP_HEADER.findall(self.output)}

    def nccl_ranks(self):
        """Ranks whose output shows NCCL at work (GPU mode sets NCCL_DEBUG)."""
        return {
            int(line[1:line.index("]")])
            for line in self.output.splitlines()
            if line.startswith("[") and "]" in line and "NCCL INFO" in line and
            line[1:line.index("]")].isdigit()
        }

    def assert_completed(self, workers):
        """Asserts that the launch of `workers` ranks ended in time, exit 0,
    with every rank's results, and, in GPU mode with several ranks, with
    NCCL at work on each (one rank's exchange needs none)."""
        assert not self.timed_out, (f"{workers}-worker launch exceeded its time limit:\n"
                                    f"{self.tail()}")
        assert self.returncode == 0 and len(self.results) == workers, (
            f"{workers}-worker launch failed (exit {self.returncode}):\n{self.tail()}")
        if GPUS and workers > 1:
            assert self.nccl_ranks() == set(
                range(workers)), (f"GPU mode, but NCCL ran on ranks {sorted(self.nccl_ranks())} of "
                                  f"{workers}: the exchange did not use the GPUs:\n{self.tail()}")
        return self


def _sok_ev_import_root():
    """Where this process imports sok_ev from, without importing it: the ranks
    get it first on their path, so they run the sok_ev under test (the
    checkout in CI, the installed artifact on the device)."""
    spec = importlib.util.find_spec("sok_ev")
    if spec is None:
        return REPO_ROOT
    return os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))


def launch(script, workers, args=(), timeout=240, out_dir=None, pass_out=True, env=None):
    """Runs `script` on `workers` Horovod/Gloo processes with a hard limit.

    Args:
      script: path of the worker script; it gets `--out DIR` then `args`.
      workers: number of ranks.
      timeout: seconds before the whole process group is killed.
      out_dir: where ranks write rank<r>.npz (a fresh temp dir by default).
      pass_out: False runs `script args` alone (a user script).
      env: extra environment variables of the ranks.

    Returns:
      A Launch. Ranks that wrote no file are absent from `results`.
    """
    if GPUS and workers > GPUS:
        import pytest  # pylint: disable=import-outside-toplevel
        pytest.skip(f"GPU mode: {workers} ranks need {workers} GPUs, one each; "
                    f"SOK_EV_MULTIWORKER_GPUS={GPUS}")
    out_dir = out_dir or tempfile.mkdtemp(prefix="sok_ev_mw_")
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join([_sok_ev_import_root(), HERE] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault(RANK_DEADLINE_VARIABLE, str(max(timeout - STACK_GRACE_S, timeout / 2)))
    env["PYTHONUNBUFFERED"] = "1"
    rank = [sys.executable]
    if GPUS:
        rank = [ONE_GPU_PER_RANK, sys.executable]
        env["NCCL_DEBUG"] = "INFO"
        env["NCCL_DEBUG_SUBSYS"] = "INIT"
    command = [
        HOROVODRUN, "--gloo", "-np",
        str(workers), "-H", f"localhost:{workers}", *rank, script,
        *(["--out", out_dir] if pass_out else []), *map(str, args)
    ]
    start = time.monotonic()
    process = subprocess.Popen(command,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT,
                               env=env,
                               cwd=REPO_ROOT,
                               start_new_session=True)
    timed_out = False
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        # The ranks are horovodrun's children in the same new session/group.
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    seconds = time.monotonic() - start
    results = {}
    for rank in range(workers):
        path = os.path.join(out_dir, f"rank{rank}.npz")
        if os.path.exists(path):
            with np.load(path, allow_pickle=False) as data:
                results[rank] = dict(data)
    return Launch(None if timed_out else process.returncode, timed_out, seconds,
                  output.decode(errors="replace"), results)


# NCCL's own log lines (its debug.cc): "host:pid:tid [device] NCCL INFO ...";
# a WARN also names its source ("... [device] file.cc:123 NCCL WARN ..."),
# a TRACE its time and function too.
NCCL_LOG_LINE = re.compile(r"^\S+:\d+:\d+ \[\d+\] (?:\S+ ){0,2}NCCL (?:INFO|WARN|TRACE)\b")


def rank_stdout(output, rank):
    """Rank `rank`'s stdout lines from horovodrun's prefixed output, without
  NCCL's own log lines (GPU mode sets NCCL_DEBUG, and they hold numbers).
  A line of the worker's own that names NCCL stays."""
    prefix = f"[{rank}]<stdout>:"
    lines = (line[len(prefix):] for line in output.splitlines() if line.startswith(prefix))
    return "\n".join(line for line in lines if not NCCL_LOG_LINE.match(line))


def horovod_available():
    return os.path.exists(HOROVODRUN)


# SCENARIO:PLACEMENT:MODE. Every placement runs in both modes on 2 workers;
# 3 workers run each placement once, alternating the mode, to bound CI time.
# Mode "packed" is "eager" with the ids packed in RaggedTensors; "pipelined"
# and "pipelined_fn" are "graph" and "eager" through sok_ev.LookupPipeline
# (each step routing the next step's batch). One worker
# runs the multi-worker pipeline over a one-rank exchange
# (sok_ev.lookup.exchange_on_one_worker, what tf_weak_scaling.py times on
# one GPU) in each mode; the idle-worker scenario needs a second worker.
CASES = {
    1: [
        "random:sharded:graph", "random:mixed:eager", "duplicates:target:graph",
        "random:sharded:packed", "random:sharded:pipelined"
    ],
    2: [
        "random:sharded:graph", "random:sharded:eager", "random:target:graph",
        "random:target:eager", "random:mixed:graph", "random:mixed:eager", "empty:sharded:eager",
        "one_owner:sharded:graph", "duplicates:mixed:eager", "random:mixed:packed",
        "empty:sharded:packed", "random:mixed:pipelined", "duplicates:sharded:pipelined_fn",
        "empty:sharded:pipelined"
    ],
    3: [
        "random:sharded:eager", "random:target:graph", "random:mixed:eager", "empty:mixed:graph",
        "one_owner:sharded:eager", "duplicates:sharded:graph", "random:sharded:packed",
        "random:sharded:pipelined"
    ],
}
LAUNCH_TIMEOUT = 240  # seconds; a healthy launch takes well under half


def require_horovodrun():
    """Fails (never skips) the calling test when horovodrun is missing."""
    import pytest  # pylint: disable=import-outside-toplevel
    if not horovod_available():
        pytest.fail(f"{HOROVODRUN} not found: the multi-worker tests "
                    "need Horovod in the test interpreter's environment "
                    "(bash request.sh installs it)")


# --- Worker side -------------------------------------------------------------


def arm_rank_deadline():
    """In a rank of `launch` (HOROVOD_RANK set): at SOK_EV_RANK_DEADLINE_S
  seconds, prints every thread's Python stack to stderr, then ends the
  process RANK_EXIT_AFTER_STACK_S later (SIGALRM's default action, which
  needs no Python code to run). Elsewhere it does nothing."""
    seconds = os.environ.get(RANK_DEADLINE_VARIABLE)
    if "HOROVOD_RANK" not in os.environ or not seconds:
        return
    seconds = float(seconds)
    faulthandler.dump_traceback_later(seconds, exit=False)
    signal.alarm(math.ceil(seconds) + RANK_EXIT_AFTER_STACK_S)


arm_rank_deadline()


def save_rank_results(out_dir, rank, results):
    """Writes one rank's results (name -> array or str) atomically."""
    path = os.path.join(out_dir, f"rank{rank}.npz")
    np.savez(path + ".tmp.npz", **results)
    os.replace(path + ".tmp.npz", path)


# --- Placement contract (cc/partition.h) -------------------------------------

_MASK = (1 << 64) - 1
OWNER_SALT = 0x5bd1e9955bd1e995


def owner_of(key, num_workers):
    """owner_of(key, W) = splitmix64_finalizer(int64(key) XOR salt) mod W."""
    z = (int(key) & _MASK) ^ OWNER_SALT
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & _MASK
    z ^= z >> 31
    return z % num_workers


# --- The model of the equivalence tests --------------------------------------

# Two tables, as the issue specifies: dims 128 and 4, hotness 10 and 3.
# Table 1 uses int32 keys so both key dtypes cross the exchange.
TABLES = (
    dict(name="t0", dim=128, hotness=10, key_dtype="int64", default_rows=7),
    dict(name="t1", dim=4, hotness=3, key_dtype="int32", default_rows=5),
)
VOCABULARY = 300  # keys in [0, VOCABULARY): duplicates within and
# across workers' batches
PER_WORKER_BATCH = 6
STEPS = 10
LEARNING_RATE = 0.1  # tf.compat.v1.train.AdagradOptimizer, default
# initial_accumulator_value 0.1


def default_rows(table):
    """The `[default_rows, dim]` matrix given to
    `InitializerOption(default_value_dim=default_rows)` through
    `tf.constant_initializer`: key k starts as row k mod default_rows."""
    rng = np.random.default_rng(1000 + table["dim"])
    return rng.normal(size=(table["default_rows"], table["dim"])).astype(np.float32)


def make_tables(targets, prefix=""):
    """The Embedding Variables of TABLES (named `prefix` + name), table t
  placed by targets[t], each starting as `default_rows` (in a worker, after
  sok_ev.init())."""
    import sok_ev  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tables = []
    for table, target in zip(TABLES, targets):
        option = sok_ev.EmbeddingVariableOption(init_option=sok_ev.InitializerOption(
            default_value_dim=table["default_rows"]))
        tables.append(
            sok_ev.get_embedding_variable(prefix + table["name"],
                                          embedding_dim=table["dim"],
                                          key_dtype=table["key_dtype"],
                                          initializer=tf.constant_initializer(default_rows(table)),
                                          ev_option=option,
                                          target_gpu=target))
    return tables


def initial_dense_table(table):
    """The reference's dense table: row k = default_rows[k mod default_rows]."""
    rows = default_rows(table)
    return rows[np.arange(VOCABULARY) % len(rows)]


@dataclasses.dataclass
class Batch:
    """One worker's (or the global) batch of one table, as SparseTensor parts."""
    indices: np.ndarray  # [nnz, 2] int64, rows in order
    values: np.ndarray  # [nnz] keys
    batch_size: int


def _random_batch(rng, table, batch_size, keys=None):
    rows = []
    for b in range(batch_size):
        hotness = rng.integers(1, table["hotness"] + 1)
        pool = keys if keys is not None else np.arange(VOCABULARY)
        rows.append(rng.choice(pool, size=hotness))
    return rows


def _to_batch(rows, table):
    indices = np.array([[b, j] for b, row in enumerate(rows) for j in range(len(row))],
                       np.int64).reshape(-1, 2)
    values = np.array([k for row in rows for k in row], dtype=table["key_dtype"]).reshape(-1)
    return Batch(indices, values, len(rows))


def make_step_data(scenario, workers, step):
    """Per-worker batches and targets of one step of `scenario`.

    Scenarios (every worker computes the same data from the seed):
      "random": independent random batches per worker.
      "empty": the last worker's batch has no samples.
      "one_owner": every key is owned by worker 0 under owner_of.
      "duplicates": every worker feeds the same batch (same keys everywhere).

    Returns:
      (batches, targets): batches[w][t] is a Batch; targets[w][t] is the
      `[batch_size, dim]` float32 target of worker w's samples.
    """
    rng = np.random.default_rng([sum(map(ord, scenario)), workers, step])
    keys = None
    if scenario == "one_owner":
        keys = np.array([k for k in range(VOCABULARY) if owner_of(k, workers) == 0])
    # "duplicates": one set of rows per table, fed by every worker.
    shared_rows = [_random_batch(rng, table, PER_WORKER_BATCH) for table in TABLES]
    batches, targets = [], []
    for w in range(workers):
        size = 0 if scenario == "empty" and w == workers - 1 else PER_WORKER_BATCH
        worker_batches, worker_targets = [], []
        for t, table in enumerate(TABLES):
            rows = (shared_rows[t] if scenario == "duplicates" else _random_batch(
                rng, table, size, keys))
            worker_batches.append(_to_batch(rows, table))
            worker_targets.append(rng.normal(size=(size, table["dim"])).astype(np.float32))
        batches.append(worker_batches)
        targets.append(worker_targets)
    return batches, targets


def global_batch(batches, t):
    """Concatenates every worker's batch of table t (the reference's input)."""
    indices, values, offset = [], [], 0
    for worker_batches in batches:
        batch = worker_batches[t]
        shifted = batch.indices.copy()
        shifted[:, 0] += offset
        indices.append(shifted)
        values.append(batch.values)
        offset += batch.batch_size
    return Batch(np.concatenate(indices), np.concatenate(values), offset)


def loss_of(embeddings, targets):
    """The model's loss: sum over tables and samples of 0.5 * |emb - y|^2.
    A sum (not a mean), so the global loss is the sum of the workers'."""
    return sum(0.5 * np.sum((e - y)**2) for e, y in zip(embeddings, targets))


def assert_shards_equal_twin_rows(results, step, workers, sok="sok", twin="twin"):
    """Step `step`'s shards ("<sok>/<step>/keys", ".../rows" of each rank)
  hold each key once, with the one-worker twin's row of it
  ("<twin>/<step>/rows" of rank 0, indexed by key). Returns the keys,
  concatenated over the ranks."""
    twin_rows = results[0][f"{twin}/{step}/rows"]
    keys = np.concatenate([results[r][f"{sok}/{step}/keys"] for r in range(workers)])
    rows = np.concatenate([results[r][f"{sok}/{step}/rows"] for r in range(workers)])
    assert len(set(keys.tolist())) == len(keys), f"step {step}: a key on several workers"
    np.testing.assert_allclose(rows, twin_rows[keys], rtol=2e-5, atol=2e-6, err_msg=f"step {step}")
    return keys
