"""One rank of tests/multiworker/test_keras_fit.py (launched by harness.launch).

  python keras_fit_worker.py --out DIR

Keras is `tf.keras`: Keras 3, or tf_keras when the launch sets
TF_USE_LEGACY_KERAS=1. Every rank builds the same functional model (dense
ids and weights -> sok_ev.keras.Embedding(combiner='mean') -> Dense(1)),
compiles it with sok_ev.keras.DistributedOptimizer(Adagrad) and fits STEPS
steps of its share of each global batch (rows [rank*b, (rank+1)*b) of
GLOBAL_BATCH), with sok_ev.keras.BroadcastGlobalVariablesCallback(0). Rank 1
starts its head from another kernel and bias: the broadcast must replace
them with rank 0's before the first step.

Each rank also fits, alone, the reference: the same model on
keras.layers.Embedding holding the same rows, on the whole global batches
(what one worker does).

Every rank then does both again with the Adagrad's global_clipnorm set
(small enough to clip every step: the tables' and the head's gradients by
their joint norm), prefixes sok_global_clipnorm/ and twin_global_clipnorm/;
and with the LossScaleOptimizer around the Adagrad (Keras 3's, or tf_keras's
mixed_precision one: what compile uses under a mixed_float16 policy):
sok_loss_scaled/ and twin_loss_scaled/.

Results (rank<r>.npz), per callback step t:
  sok/<t>/keys, sok/<t>/rows   this rank's shard of the table;
  sok/<t>/kernel, sok/<t>/bias the head;
  sok/<t>/batch, sok/<t>/iterations what the callback saw;
  twin/<t>/rows, twin/<t>/kernel, twin/<t>/bias the reference's;
and "keras" (the Keras layer module), "initial_kernel" (this rank's).
"""
import argparse
import os
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

import harness  # noqa: F401  (arms the rank's deadline)

hvd.init()
# keras_twins lives in tests/, beside this folder.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import sok_ev  # pylint: disable=wrong-import-position
import keras_twins as twins  # pylint: disable=wrong-import-position

sok_ev.init()
RANK, WORKERS = hvd.rank(), hvd.size()
N_ROWS, DIM, HOTNESS, GLOBAL_BATCH, STEPS = 40, 4, 3, 8, 4


def global_batches():
    """The same STEPS global batches on every rank: int64 ids with
  duplicates within and across rows, weights, targets."""
    rng = np.random.default_rng(52)
    out = []
    for _ in range(STEPS):
        ids = rng.integers(0, N_ROWS, size=(GLOBAL_BATCH, HOTNESS)).astype(np.int64)
        ids[0, 1] = ids[0, 0]
        ids[-1, 0] = ids[0, 0]
        weights = rng.uniform(0.25, 2.0, size=ids.shape).astype(np.float32)
        y = rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)
        out.append(((ids, weights), y))
    return out


def model_of(embedding, kernel, bias):
    ids = tf.keras.Input((HOTNESS,), dtype="int64")
    weights = tf.keras.Input((HOTNESS,), dtype="float32")
    head = tf.keras.layers.Dense(1,
                                 kernel_initializer=tf.keras.initializers.Constant(kernel),
                                 bias_initializer=tf.keras.initializers.Constant(bias),
                                 name="head")
    model = tf.keras.Model([ids, weights], head(embedding(ids, weights)))
    model.head = head
    return model


def dataset(batches):
    return tf.data.Dataset.from_generator(
        lambda: iter([((tf.constant(i), tf.constant(w)), tf.constant(y)) for (i, w), y in batches]),
        output_signature=((tf.TensorSpec([None, HOTNESS],
                                         tf.int64), tf.TensorSpec([None, HOTNESS], tf.float32)),
                          tf.TensorSpec([None, 1], tf.float32)))


class Record(tf.keras.callbacks.Callback):

    def __init__(self, prefix, read_rows, results):
        super().__init__()
        self.prefix, self.read_rows, self.results = prefix, read_rows, results
        self.step = 0

    def on_train_batch_end(self, batch, logs=None):
        p = f"{self.prefix}/{self.step}"
        for name, value in self.read_rows().items():
            self.results[f"{p}/{name}"] = value
        self.results[f"{p}/kernel"] = self.model.head.kernel.numpy().copy()
        self.results[f"{p}/bias"] = self.model.head.bias.numpy().copy()
        self.results[f"{p}/batch"] = np.int64(batch)
        self.results[f"{p}/iterations"] = np.int64(self.model.optimizer.iterations.numpy())
        self.step += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = parser.parse_args().out
    rng = np.random.default_rng(7)
    matrix = rng.normal(size=(N_ROWS, DIM)).astype(np.float32)
    kernel = rng.normal(size=(DIM, 1)).astype(np.float32)
    results = {"keras": np.array(tf.keras.layers.Layer.__module__)}
    batches = global_batches()
    share = GLOBAL_BATCH // WORKERS
    mine = [((i[RANK * share:(RANK + 1) * share], w[RANK * share:(RANK + 1) * share]),
             y[RANK * share:(RANK + 1) * share]) for (i, w), y in batches]

    # Rank 1 starts elsewhere: the broadcast must undo it.
    start_kernel, start_bias = kernel + RANK, np.full([1], 0.5 * RANK, np.float32)
    results["initial_kernel"] = start_kernel

    def run(suffix, make):
        fit_both(matrix, kernel, start_kernel, start_bias, batches, mine, suffix, make, results)

    run("", twins.OPTIMIZERS["adagrad"])
    run(
        "_global_clipnorm", lambda: tf.keras.optimizers.Adagrad(
            0.3, initial_accumulator_value=0.2, global_clipnorm=0.05))
    if hasattr(tf.keras.optimizers, "LossScaleOptimizer"):  # Keras 3
        run(
            "_loss_scaled", lambda: tf.keras.optimizers.LossScaleOptimizer(
                twins.OPTIMIZERS["adagrad"](), initial_scale=2.0**12, dynamic_growth_steps=2))
    else:  # tf_keras
        run(
            "_loss_scaled", lambda: tf.keras.mixed_precision.LossScaleOptimizer(
                twins.OPTIMIZERS["adagrad"](), initial_scale=2.0**12, dynamic_growth_steps=2))
    np.savez(f"{out}/rank{RANK}.npz", **results)


def fit_both(matrix, kernel, start_kernel, start_bias, batches, mine, suffix, make, results):
    """This rank's data-parallel fit of its share and the one-worker
  reference's fit of the global batches, each with make(), recorded under
  sok<suffix>/ and twin<suffix>/."""
    layer = twins.sok_layer(sok_ev, matrix, "mean", name="item" + suffix)
    model = model_of(layer, start_kernel, start_bias)
    model.compile(optimizer=sok_ev.keras.DistributedOptimizer(make()), loss="mse")

    def shard():
        keys, rows = (t.numpy() for t in layer.embedding_variable.export())
        order = np.argsort(keys)
        return {"keys": keys[order].astype(np.int64), "rows": rows[order]}

    model.fit(dataset(mine),
              verbose=0,
              callbacks=[
                  sok_ev.keras.BroadcastGlobalVariablesCallback(0),
                  Record("sok" + suffix, shard, results)
              ])

    twin = twins.DenseTwin(matrix, "mean")
    reference = model_of(twin, kernel, np.zeros([1], np.float32))
    reference.compile(optimizer=make(), loss="mse")
    reference.fit(dataset(batches),
                  verbose=0,
                  callbacks=[Record("twin" + suffix, lambda: {"rows": twin.rows()}, results)])


if __name__ == "__main__":
    main()
