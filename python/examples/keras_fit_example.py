"""A small DLRM on synthetic Criteo-shaped data, trained the Keras way:
sok_ev.keras layers, compile, fit, evaluate, predict, save and export.

One worker:   python python/examples/keras_fit_example.py [--steps 200]
Two workers:  horovodrun -np 2 -H localhost:2 --gloo \
                  python python/examples/keras_fit_example.py
(each worker fits its own share of every global batch; tables are sharded
over the workers, dense gradients averaged.)

Each sample has 13 dense features and 26 categorical ones, each one raw
int64 id (hashed, unbounded: no vocabulary), as Criteo's; the label is drawn
from a planted logistic model over the ids and dense features. The 26
tables are sok_ev.keras.Embedding layers looked up together by
sok_ev.keras.GroupedEmbedding (one lookup_sparse call); a bottom MLP, the
pairwise dot products and a top MLP make the DLRM. Prints the held-out
logloss and AUC, then writes weights (and, with --export DIR, a SavedModel
for serving).
"""
import argparse
import os

import numpy as np
import tensorflow as tf
import keras

import sok_ev

try:  # horovodrun: several workers; one worker needs no Horovod.
    import horovod.tensorflow as hvd
except ImportError:
    hvd = None

DENSE, CATEGORICAL, VOCABULARY = 13, 26, 2000


def synthetic_criteo(seed, samples):
    """(dense [n, 13] float32, ids [n, 26] int64, labels [n, 1]): ids drawn
  Zipf-like from each feature's vocabulary, then hashed to raw int64 ids;
  labels from a logistic model planted with the fixed seed 0."""
    planted = np.random.default_rng(0)
    id_weights = planted.normal(0, 0.6, size=(CATEGORICAL, VOCABULARY))
    dense_weights = planted.normal(0, 0.5, size=DENSE)
    rng = np.random.default_rng(seed)
    dense = rng.lognormal(0, 1, size=(samples, DENSE)).astype(np.float32)
    dense = np.log1p(dense)
    ranks = np.minimum(rng.zipf(1.2, size=(samples, CATEGORICAL)), VOCABULARY) - 1
    logits = id_weights[np.arange(CATEGORICAL), ranks].sum(axis=1) + (dense - 0.7) @ dense_weights
    labels = (rng.uniform(size=samples) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    # Raw ids: (feature, rank) hashed into the int64 range.
    ids = (np.arange(CATEGORICAL)[None, :] * 1_000_003 + ranks) * 0x9E3779B1 % (2**62)
    return dense, ids.astype(np.int64), labels[:, None]


def mlp(widths, name):
    return keras.Sequential([keras.layers.Dense(w, activation="relu") for w in widths], name=name)


class DLRM(keras.Model):

    def __init__(self, dim):
        super().__init__()
        self.tables = [
            sok_ev.keras.Embedding(dim,
                                   combiner="sum",
                                   initializer=tf.random_normal_initializer(stddev=0.05),
                                   name=f"C{i + 1}") for i in range(CATEGORICAL)
        ]
        self.lookup = sok_ev.keras.GroupedEmbedding(self.tables, name="categorical")
        self.bottom = mlp([64, dim], "bottom")
        self.top = keras.Sequential(
            [mlp([64, 32], "top_hidden"), keras.layers.Dense(1)], name="top")

    def call(self, inputs):
        dense, ids = inputs
        # One id per feature: each table looks up a [batch, 1] column.
        columns = tf.split(ids, CATEGORICAL, axis=1)
        vectors = [self.bottom(dense)] + self.lookup(columns)
        stacked = tf.stack(vectors, axis=1)  # [batch, 27, dim]
        n = len(vectors)
        dots = tf.reshape(tf.matmul(stacked, stacked, transpose_b=True), [-1, n * n])
        # Each pair of distinct features once: the strict upper triangle.
        pairs = tf.gather(dots, [i * n + j for i in range(n) for j in range(i + 1, n)], axis=1)
        return self.top(tf.concat([vectors[0], pairs], axis=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps")
    parser.add_argument("--batch", type=int, default=512, help="global batch size")
    parser.add_argument("--dim", type=int, default=16, help="embedding dim")
    parser.add_argument("--out", default="keras_fit_example_out", help="where weights go")
    parser.add_argument("--export", default=None, help="a SavedModel for serving goes here")
    args = parser.parse_args()

    workers, rank = 1, 0
    if hvd is not None:
        hvd.init()
        workers, rank = hvd.size(), hvd.rank()
    sok_ev.init()
    if args.batch % workers:
        raise ValueError(f"--batch {args.batch} must be a multiple of the {workers} workers")
    share = args.batch // workers

    dense, ids, labels = synthetic_criteo(1, args.steps * args.batch)
    # Each worker takes its own share of every global batch.
    mine = np.concatenate([
        np.arange(s * args.batch + rank * share, s * args.batch + (rank + 1) * share)
        for s in range(args.steps)
    ])
    train = tf.data.Dataset.from_tensor_slices(
        ((dense[mine], ids[mine]), labels[mine])).batch(share).prefetch(2)

    model = DLRM(args.dim)
    optimizer = sok_ev.keras.DistributedOptimizer(keras.optimizers.Adagrad(0.1))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.AUC(from_logits=True, name="auc")],
                  steps_per_execution=10)
    history = model.fit(train,
                        epochs=1,
                        verbose=2 if rank == 0 else 0,
                        callbacks=[sok_ev.keras.BroadcastGlobalVariablesCallback(0)])

    test_dense, test_ids, test_labels = synthetic_criteo(2, 20_000)
    # tf.data keeps the ids int64 (Keras converts NumPy inputs to floats).
    test = tf.data.Dataset.from_tensor_slices(((test_dense, test_ids), test_labels)).batch(1000)
    loss, auc = model.evaluate(test, verbose=0)
    scores = model.predict(test.take(1), verbose=0)[:5]
    keys = sum(int(t.embedding_variable.total_count()) for t in model.tables)
    if rank == 0:
        print(f"train logloss {history.history['loss'][-1]:.4f}")
        print(f"eval logloss {loss:.4f} auc {auc:.4f} ({keys} keys in worker 0's tables)")
        print("first predictions (logits):", np.round(scores.ravel(), 4).tolist())
    # Each worker saves its shards (tf.train.Checkpoint; on one worker
    # model.save_weights("*.weights.h5") works too).
    os.makedirs(args.out, exist_ok=True)
    tf.train.Checkpoint(model=model).write(os.path.join(args.out, f"worker-{rank}", "ckpt"))
    if args.export and workers == 1:
        with sok_ev.serving_export():
            # A subclassed model's input dtypes are not known to Keras: given.
            signature = [(tf.TensorSpec([None, DENSE],
                                        tf.float32), tf.TensorSpec([None, CATEGORICAL], tf.int64))]
            model.export(args.export, input_signature=signature, verbose=False)
        print(f"exported for serving to {args.export}")


if __name__ == "__main__":
    main()
