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
Run on a GPU machine with sok-ev installed, from the repository root:
  python3 benchmarks/gpu/criteo_step_split.py
"""
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.append(os.getcwd())
import sok_ev  # pylint: disable=wrong-import-position
from benchmarks.criteo import models  # pylint: disable=wrong-import-position

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


def main():
    sok_ev.init()
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
    for name, ms in results.items():
        print(f"{name}: {ms:.2f} ms ({BATCH / ms * 1e3:,.0f} samples/s)", flush=True)


if __name__ == "__main__":
    main()
