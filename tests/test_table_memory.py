"""An Embedding Variable costs about what it holds, and never kills the process.

* embedding_dim is bounded at creation (65536 floats, a 256 KiB row), in
  get_embedding_variable and in the op, with an error naming the argument,
  the value and the bound.
* When the system refuses memory for rows, the lookup fails with
  ResourceExhaustedError naming the table, its embedding_dim and the bytes
  asked for; the table keeps the keys it had and the process lives on.
* Memory, measured as process RSS in a fresh child process by
  benchmarks/cpu_table_memory.py (the benchmark that records the figures in
  benchmarks/RESULTS.md): a table of 2M keys, dim 16, Adagrad stays within
  1.3x the raw bytes it holds (key, value and slot: 136 B a key) at rest and
  while its slot is added, and within 1.5x while a checkpoint is written;
  26 tables of 64 keys cost a few hundred KiB, not a page per shard.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import sok_ev_reference as ref

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK = os.path.join(REPO_ROOT, "benchmarks", "cpu_table_memory.py")
MAX_EMBEDDING_DIM = 1 << 16


def _cpu_child_env():
    """The environment of a child measuring the CPU table: the sok_ev these
  tests import (the checkout in CI, the installed wheel on the device), and no
  GPU, so its tables are host tables wherever the suite runs."""
    return ref.child_env(CUDA_VISIBLE_DEVICES="")


def _run_python(code, timeout=300):
    return subprocess.run([sys.executable, "-c", code],
                          env=_cpu_child_env(),
                          capture_output=True,
                          text=True,
                          timeout=timeout,
                          check=False)


@pytest.mark.parametrize("dim", [MAX_EMBEDDING_DIM + 1, 2**26, 2**40])
def test_embedding_dim_beyond_the_bound_is_rejected_at_creation(sok, unique_name, dim):
    with pytest.raises(ValueError) as error:
        sok.get_embedding_variable(unique_name(), embedding_dim=dim)
    assert ref.error_names(error.value, "embedding_dim", dim, MAX_EMBEDDING_DIM)


def test_the_initializer_op_rejects_an_embedding_dim_beyond_the_bound(sok, unique_name):
    # What a graph built elsewhere (an imported meta graph) would run.
    ops = sok._ops.ops()  # pylint: disable=protected-access
    dim = 2**26
    handle = ops.sok_ev_embedding_variable_handle(shared_name=unique_name(),
                                                  key_dtype=tf.int64,
                                                  embedding_dim=dim)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        ops.sok_ev_initialize_embedding_variable(handle,
                                                 tf.zeros([0, dim]),
                                                 key_dtype=tf.int64,
                                                 embedding_dim=dim,
                                                 initializer_kind=0)
    assert ref.error_names(error.value, "embedding_dim", dim, MAX_EMBEDDING_DIM)


def test_running_out_of_memory_is_an_error_naming_the_table_and_the_size():
    # A child process whose address space is capped 512 MiB above what it
    # uses: keys of 256 KiB rows arrive one lookup at a time until the table
    # cannot grow.
    result = _run_python(
        textwrap.dedent("""
        import resource
        import tensorflow as tf
        import sok_ev
        sok_ev.init()
        table = sok_ev.get_embedding_variable("huge_rows", embedding_dim=65536)
        one = lambda key: tf.SparseTensor([[0, 0]], tf.constant([key], tf.int64), [1, 1])
        sok_ev.lookup_sparse([table], [one(0)])
        with open("/proc/self/status") as status:
            used = [int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize:")][0]
        resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 29), resource.RLIM_INFINITY))
        try:
            for key in range(1, 100000):
                sok_ev.lookup_sparse([table], [one(key)])
        except tf.errors.ResourceExhaustedError as error:
            print("ERROR:", error.message.splitlines()[0])
        size = int(table.total_count())
        row = table.sparse_read(tf.constant([0], tf.int64)).numpy()
        print("KEPT:", size, row.shape)
        """))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    message = lines.get("ERROR", "")
    # (An eager variable's resource is named after it, with a unique suffix.)
    for fragment in ("Embedding Variable 'huge_rows", "embedding_dim 65536", "out of memory",
                     "bytes"):
        assert fragment in message, (message, result.stderr[-2000:])
    size = int(lines["KEPT"].split()[0])
    assert 0 < size < 100000


def _table_memory(keys):
    env = _cpu_child_env()
    out = {}
    for child in ("table", "small"):
        run = subprocess.run([sys.executable, BENCHMARK, "--child", child, "--keys",
                              str(keys)],
                             env=env,
                             capture_output=True,
                             text=True,
                             timeout=600,
                             check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        out.update(json.loads(run.stdout.strip().splitlines()[-1]))
    return out


@pytest.fixture(scope="module")
def memory():
    keys = 2_000_000
    return keys, _table_memory(keys)


@pytest.mark.parametrize("phase", ["at rest", "slot peak"])
def test_a_table_stays_within_1_3x_the_raw_bytes_it_holds(memory, phase):
    keys, measured = memory
    raw = keys * (8 + 2 * 4 * 16)  # key, value and Adagrad slot, dim 16
    assert measured[phase] <= 1.3 * raw, f"{phase}: {measured[phase] / keys:.1f} B per key"


def test_saving_a_table_stays_within_1_5x_the_raw_bytes_it_holds(memory):
    keys, measured = memory
    raw = keys * (8 + 2 * 4 * 16)
    assert measured["save peak"] <= 1.5 * raw, f"{measured['save peak'] / keys:.1f} B per key"


def test_small_tables_cost_about_what_they_hold(memory):
    _, measured = memory
    # 26 tables of 64 keys hold 26 * 64 * 136 B = 221 KiB.
    assert measured["26 64-key tables"] < 4 << 20, measured["26 64-key tables"]
