"""Where the Criteo GPU step's time goes: the DLRM step of
benchmarks/criteo/run.py --device gpu, taken apart on one GPU.

Times, each a median of 10 tf.function calls after 2 warm-up calls
(batch 65536, 26 one-hot features, dim 128, DLRM bottom [512, 256, 128],
top [1024, 512, 256, 1], tf.compat.v1 Adagrad, as run.py's GPU preset):
  hash    tf.strings.to_hash_bucket_fast of a [65536, 26] string batch (a
          CPU-only op), which run.py's input pipeline does per batch, in
          parallel with the steps;
  dense   the DLRM tower's forward, backward and Adagrad update, with the 26
          embeddings given as constants;
  keyed   sok_ev.lookup_sparse + the tower + Adagrad on every variable, fed
          the hashed keys from host memory (run.py's sok-ev step) and from
          GPU memory;
  step hashing inside   hashing + the keyed step in one tf.function, as
          run.py's step was until 2026-11-25: serial, ~ hash + keyed.
With --mlperf, MLPerf DLRM-DCNv2's step of run.py --model dcnv2 --hotness
mlperf instead (214 keys a sample from InMemoryData, dim 128, DCNv2 with 3
cross layers of rank 512, bottom [512, 256], deep [1024, 1024, 512, 256]):
  dense f32 / bf16   the DCNv2 tower's step with the embeddings given;
  lookup             sok_ev.lookup_sparse of the 26 multi-hot features alone;
  sparse             lookup, its gradient and Adagrad's update of the 26
                     tables, with a loss that costs nothing (no tower);
  step f32 / bf16    the whole step;
each lookup also with the ids as ragged rows of fixed length instead of
SparseTensors with [nnz, 2] indices (what run.py builds), and the bf16 tower
also compiled by XLA (a jit_compile function inside the step);
and the sparse part's bandwidth floor: the bytes it must move (each unique
row read for the forward, read and written with its Adagrad slot for the
update; each output written and each gradient read once; the keys read
twice) over the device's copy rate measured here (x + 1 over 2 GiB).
With --trace, one call each of the lookup, the sparse part and the XLA step
is traced by TensorFlow's profiler: the ops by GPU kernel time and the
longest idle gaps.
Run on a GPU machine with sok-ev installed:
  python3 benchmarks/gpu/criteo_step_split.py [--mlperf [--trace]]
"""
import argparse
import os
import sys
import time

import numpy as np
import tensorflow as tf

# Appended: the installed sok_ev, not the checkout's, is the one timed.
sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import sok_ev  # pylint: disable=wrong-import-position
from benchmarks.criteo import embeddings  # pylint: disable=wrong-import-position
from benchmarks.criteo import formats  # pylint: disable=wrong-import-position
from benchmarks.criteo import in_memory  # pylint: disable=wrong-import-position
from benchmarks.criteo import models  # pylint: disable=wrong-import-position
from benchmarks.criteo import reader  # pylint: disable=wrong-import-position
from benchmarks import step_profile  # pylint: disable=wrong-import-position

BATCH, TABLES, DIM = 65536, 26, 128


def median_ms(function, calls=10):
    function()
    function()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        np.asarray(function())  # waits for the result
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def print_trace(name, function):
    """One call of `function` (already warm) under TensorFlow's profiler,
  printed by step_profile.print_top."""
    traced = step_profile.trace_function(tf, lambda _: np.asarray(function()), 1)
    if traced is None:
        print(f"[trace {name}] the profiler wrote no record", flush=True)
        return
    step_profile.print_top(step_profile.gpu_timeline(traced[0]), name)
    sys.stdout.flush()


def report(results):
    for name, ms in results.items():
        print(f"{name}: {ms:.2f} ms ({BATCH / ms * 1e3:,.0f} samples/s)", flush=True)


def dlrm():
    rng = np.random.default_rng(0)
    strings = tf.constant(
        np.char.mod("%08x",
                    rng.zipf(1.1, size=(BATCH, TABLES)) % 100000).astype(object))
    dense_features = tf.constant(rng.random((BATCH, 13), np.float32))
    labels = tf.constant(rng.integers(0, 2, BATCH).astype(np.float32))
    tower = models.DLRM(DIM, [512, 256, DIM], [1024, 512, 256, 1], seed=0)
    tables = [sok_ev.get_embedding_variable(f"t{t}", embedding_dim=DIM) for t in range(TABLES)]
    given = [tf.constant(rng.normal(size=(BATCH, DIM)).astype(np.float32)) for _ in range(TABLES)]
    sample = tf.stack([tf.range(BATCH, dtype=tf.int64), tf.zeros([BATCH], tf.int64)], 1)
    dense_optimizer = tf.compat.v1.train.AdagradOptimizer(0.01)
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.01)

    def loss_of(embeddings):
        logits = tower(dense_features, embeddings)
        return tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                     logits=logits)) / BATCH

    hash_keys = tf.function(lambda s: tf.strings.to_hash_bucket_fast(s, 2**63 - 1))

    @tf.function
    def dense_step():
        with tf.GradientTape() as tape:
            tape.watch(given)
            loss = loss_of(given)
        grads = tape.gradient(loss, tower.variables + given)
        dense_optimizer.apply_gradients(zip(grads[:len(tower.variables)], tower.variables))
        return loss

    @tf.function
    def keyed_step(keys):
        ids = [tf.SparseTensor(sample, keys[:, t], [BATCH, 1]) for t in range(TABLES)]
        with tf.GradientTape() as tape:
            loss = loss_of(sok_ev.lookup_sparse(tables, ids, "sum"))
        variables = tables + tower.variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    step = tf.function(lambda s: keyed_step(tf.strings.to_hash_bucket_fast(s, 2**63 - 1)))
    keys = hash_keys(strings)
    with tf.device("/GPU:0"):
        keys_on_gpu = tf.identity(keys)
    results = {
        "hash": median_ms(lambda: hash_keys(strings)),
        "dense": median_ms(dense_step),
        "step hashing inside": median_ms(lambda: step(strings)),
        "keyed (keys in host memory)": median_ms(lambda: keyed_step(keys)),
        "keyed (keys in GPU memory)": median_ms(lambda: keyed_step(keys_on_gpu)),
    }
    report(results)


def copy_rate():
    """Bytes read + written per second by x + 1 over 2 GiB of float32."""
    with tf.device("/GPU:0"):
        x = tf.zeros([1 << 29])
    plus_one = tf.function(lambda: tf.reduce_max((x + 1.0)[:1]))
    return 2 * 4 * (1 << 29) / (median_ms(plus_one) * 1e-3)


def mlperf(trace=False):
    hotness = formats.MLPERF_HOTNESS
    data = in_memory.InMemoryData(2 * BATCH,
                                  BATCH,
                                  cardinality_scale=0.1,
                                  processes=os.cpu_count() or 1,
                                  hotness=hotness)
    batch = next(iter(data.dataset("train", BATCH)))
    with tf.device("/GPU:0"):
        keys = tf.identity(batch["keys"])
        dense_features = tf.identity(batch["dense"])
        labels = tf.identity(batch["label"])
    dim = 128
    tables = [
        sok_ev.get_embedding_variable(f"C{f + 1}", embedding_dim=dim, key_dtype=tf.int64)
        for f in range(reader.NUM_CATEGORICAL)
    ]
    rng = np.random.default_rng(0)
    given = [tf.constant(rng.normal(size=(BATCH, dim)).astype(np.float32)) for _ in tables]
    weights = [tf.constant(rng.normal(size=(1, dim)).astype(np.float32)) for _ in tables]
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.01)

    def ids(ragged):
        """The 26 features as lookup_sparse takes them: run.py's SparseTensors
    with [nnz, 2] indices (embeddings.multi_hot_ids), or ragged rows of fixed
    length."""
        if not ragged:
            return embeddings.multi_hot_ids(keys, hotness, batch_on_gpu=True)
        return [
            tf.RaggedTensor.from_uniform_row_length(tf.reshape(column, [-1]),
                                                    column.shape[1],
                                                    validate=False)
            for column in embeddings.feature_columns(keys, list(hotness), batch_on_gpu=True)
        ]

    def steps(compute_dtype, ragged=False, xla=False):
        """(the tower's step with the embeddings given, the whole step); xla:
    the tower compiled by XLA inside the step (sok-ev's ops stay outside)."""
        tower = models.DCNv2(dim,
                             3,
                             512, [1024, 1024, 512, 256],
                             seed=0,
                             bottom=[512, 256],
                             compute_dtype=compute_dtype)
        dense_optimizer = tf.compat.v1.train.AdagradOptimizer(0.01)

        def tower_loss(dense, embeddings):
            logits = tower(dense, embeddings)
            return tf.reduce_sum(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)) / BATCH

        if xla:
            tower_loss = tf.function(tower_loss, jit_compile=True)

        @tf.function
        def dense_step():
            with tf.GradientTape() as tape:
                tape.watch(given)
                loss = tower_loss(dense_features, given)
            grads = tape.gradient(loss, tower.variables)
            dense_optimizer.apply_gradients(zip(grads, tower.variables))
            return loss

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tower_loss(dense_features, sok_ev.lookup_sparse(tables, ids(ragged), "sum"))
            variables = tables + tower.variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        return dense_step, step

    def lookup(ragged):
        return tf.function(lambda: tf.add_n(
            [tf.reduce_sum(e[:1]) for e in sok_ev.lookup_sparse(tables, ids(ragged), "sum")]))

    def sparse(ragged):

        @tf.function
        def sparse_step():
            with tf.GradientTape() as tape:
                embeddings = sok_ev.lookup_sparse(tables, ids(ragged), "sum")
                loss = tf.add_n([tf.reduce_sum(e * w) for e, w in zip(embeddings, weights)])
            optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
            return loss

        return sparse_step

    dense32, step32 = steps("float32")
    dense16, step16 = steps("bfloat16")
    dense_xla, step_xla = steps("bfloat16", xla=True)
    timed = {
        "dense f32": dense32,
        "dense bf16": dense16,
        "dense bf16, XLA tower": dense_xla,
        "lookup": lookup(False),
        "lookup, ragged ids": lookup(True),
        "sparse": sparse(False),
        "sparse, ragged ids": sparse(True),
        "step f32": step32,
        "step bf16": step16,
        "step bf16, XLA tower": step_xla,
    }
    results = {name: median_ms(function) for name, function in timed.items()}
    report(results)
    if trace:
        for name in ("lookup", "sparse", "step bf16, XLA tower"):
            print_trace(name, timed[name])
    columns = np.split(keys.numpy(), np.cumsum(hotness)[:-1], axis=1)
    unique = sum(len(np.unique(c)) for c in columns)
    nnz = BATCH * formats.MULTIHOT_KEYS
    bags = BATCH * reader.NUM_CATEGORICAL
    floor_bytes = unique * (4 * dim + 2 * 8 * dim) + 2 * bags * 4 * dim + 2 * nnz * 8
    rate = copy_rate()
    floor_ms = floor_bytes / rate * 1e3
    print(
        f"sparse floor: {unique:,} unique keys of {nnz:,}, {floor_bytes / 1e9:.2f} GB at "
        f"{rate / 1e12:.2f} TB/s copy rate = {floor_ms:.2f} ms; sparse at "
        f"{100 * floor_ms / results['sparse']:.0f}% of it ("
        f"{100 * floor_ms / results['sparse, ragged ids']:.0f}% with ragged ids)",
        flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mlperf", action="store_true", help="MLPerf DLRM-DCNv2's step")
    parser.add_argument("--trace",
                        action="store_true",
                        help="with --mlperf: one traced call of the lookup, the sparse part and "
                        "the XLA step, their ops by GPU kernel time")
    args = parser.parse_args(argv)
    sok_ev.init()
    if args.mlperf:
        mlperf(args.trace)
    else:
        dlrm()


if __name__ == "__main__":
    main()
