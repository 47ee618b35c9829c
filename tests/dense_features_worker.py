"""Trains tf_keras models whose inputs go through `DenseFeatures` over sok-ev's
Embedding Variable columns, and the same models over TensorFlow's own
columns on dense tables holding the same initial rows; writes what
tests/test_dense_features_columns.py checks.

Usage: TF_USE_LEGACY_KERAS=1 python dense_features_worker.py OUT.npz SEED

For each case of CASES, "<case>/<model>/<field>" with model in {sok, tf} and
field in {batch, iterations, rows, kernel, loss} (the shared columns'
reference: one dense table looked up by tf.nn.safe_embedding_lookup_sparse
for each feature, as TensorFlow's shared columns are not built eagerly), one entry per step
(keras_twins.History; rows: every table's rows 0..N_ROWS-1, concatenated).
Also the json "facts": the layer's weights (names, kinds), the table
restored from a tf.train.Checkpoint, and the refusals' messages
(get_config, an indicator_column over an Embedding Variable column).
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import sok_ev
import keras_twins as twins

# TensorFlow's own column functions, before install_deeprec_api() puts
# sok-ev's in their place.
TF_EMBEDDING_COLUMN = tf.feature_column.embedding_column
sok_ev.install_deeprec_api()

N_ROWS, DIM, BATCH, HOTNESS, STEPS = 12, 4, 6, 3, 4
# Ids the batches never look up (their rows must not move).
LEFT_OUT = (9, 10, 11)
# case -> (optimizer, combiner, column kind).
CASES = {
    "sgd_mean": ("sgd", "mean", "plain"),
    "adagrad_sum": ("adagrad", "sum", "plain"),
    "sgd_weighted_sqrtn": ("sgd", "sqrtn", "weighted"),
    "adagrad_weighted_mean": ("adagrad", "mean", "weighted"),
    "adagrad_shared_mean": ("adagrad", "mean", "shared"),
    # DeepRec's partition_num=3: each column's table in 3 parts.
    "adagrad_partitioned_sum": ("adagrad", "sum", "partitioned"),
}
PARTS = 3
FEATURES = ("C1", "C2")


def _sparse(rng, dtype, values_fn):
    indices = []
    for row in range(BATCH):
        # Row 2 is empty; row 0 repeats an id.
        count = 0 if row == 2 else int(rng.integers(1, HOTNESS + 1))
        indices.extend([row, j] for j in range(count))
    values = values_fn(len(indices))
    if len(indices) > 1:
        values[1] = values[0]
    return tf.SparseTensor(
        np.array(indices, np.int64).reshape(-1, 2), values.astype(dtype), [BATCH, HOTNESS])


def _batches(rng):
    allowed = np.array([i for i in range(N_ROWS) if i not in LEFT_OUT], np.int64)
    data = []
    for _ in range(STEPS):
        features = {}
        for key in FEATURES:
            ids = _sparse(rng, np.int64, lambda n: rng.choice(allowed, size=n))
            features[key] = ids
            features[key + "_w"] = tf.SparseTensor(
                ids.indices,
                rng.uniform(0.5, 2.0, size=ids.values.shape[0]).astype(np.float32), ids.dense_shape)
        data.append((features, rng.normal(size=(BATCH, 1)).astype(np.float32)))
    return data


def _dataset(data):
    dataset = None
    for features, labels in data:
        one = tf.data.Dataset.from_tensors((features, labels))
        dataset = one if dataset is None else dataset.concatenate(one)
    return dataset


def _columns(kind, combiner, matrix, sok):
    init = tf.constant_initializer(matrix)
    if sok:
        option = sok_ev.EmbeddingVariableOption(init_option=sok_ev.InitializerOption(
            default_value_dim=N_ROWS))
        parts = PARTS if kind == "partitioned" else None
        cats = [
            tf.feature_column.categorical_column_with_embedding(k,
                                                                dtype=tf.int64,
                                                                partition_num=parts,
                                                                ev_option=option) for k in FEATURES
        ]
    else:
        cats = [tf.feature_column.categorical_column_with_identity(k, N_ROWS) for k in FEATURES]
    if kind == "weighted":
        cats = [tf.feature_column.weighted_categorical_column(c, c.key + "_w") for c in cats]
    if kind == "shared":
        return tf.feature_column.shared_embedding_columns(cats,
                                                          DIM,
                                                          combiner=combiner,
                                                          initializer=init)
    make = tf.feature_column.embedding_column if sok else TF_EMBEDDING_COLUMN
    # The second column's table starts at other rows.
    return [
        make(cats[0], DIM, combiner=combiner, initializer=init),
        make(cats[1], DIM, combiner=combiner, initializer=tf.constant_initializer(matrix[::-1]))
    ]


class SharedTwin(tf.keras.layers.Layer):
    """TensorFlow's lookup of every feature in one dense table, the columns'
  order: the reference for shared columns (TensorFlow's own shared
  embedding columns are not built under eager execution)."""

    def __init__(self, matrix, combiner, **kwargs):
        super().__init__(**kwargs)
        self.matrix, self.combiner = matrix, combiner

    def build(self, input_shape):
        self.table = self.add_weight(name="embedding_weights",
                                     shape=self.matrix.shape,
                                     initializer=tf.constant_initializer(self.matrix))
        super().build(input_shape)

    def call(self, features):
        return tf.concat([
            tf.nn.safe_embedding_lookup_sparse(self.table, features[k], None, self.combiner)
            for k in FEATURES
        ], 1)


def _model(kind, combiner, matrix, kernel, sok):
    inputs = {}
    for key in FEATURES:
        inputs[key] = tf.keras.Input(shape=(HOTNESS,), sparse=True, dtype=tf.int64, name=key)
        inputs[key + "_w"] = tf.keras.Input(shape=(HOTNESS,),
                                            sparse=True,
                                            dtype=tf.float32,
                                            name=key + "_w")
    if kind == "shared" and not sok:
        layer = SharedTwin(matrix, combiner, name="features")
    else:
        layer = tf.keras.layers.DenseFeatures(_columns(kind, combiner, matrix, sok),
                                              name="features")
    head = tf.keras.layers.Dense(1,
                                 use_bias=False,
                                 kernel_initializer=tf.constant_initializer(kernel),
                                 name="head")
    return tf.keras.Model(inputs, head(layer(inputs))), layer


def _tables(layer):
    return [w for w in layer.weights if "embedding_weights" in w.name]


def _rows(layer, sok):
    if not sok:
        return np.concatenate([t.numpy() for t in _tables(layer)])
    tables = _tables(layer)
    if len(tables) == len(FEATURES) * PARTS:  # partitioned: key k in part (k mod 1000) mod PARTS
        keys = tf.range(N_ROWS, dtype=tf.int64)
        return np.concatenate([
            np.stack([
                tables[c * PARTS + k % 1000 % PARTS].sparse_read(keys[k:k + 1]).numpy()[0]
                for k in range(N_ROWS)
            ])
            for c in range(len(FEATURES))
        ])
    return np.concatenate(
        [t.sparse_read(tf.range(N_ROWS, dtype=tf.int64)).numpy() for t in _tables(layer)])


def _fit(out, facts, case, rng):
    optimizer, combiner, kind = CASES[case]
    matrix = twins.random_matrix(rng, N_ROWS, DIM)
    tables = {"shared": 1, "partitioned": 2 * PARTS}.get(kind, 2)
    kernel = rng.normal(size=(len(FEATURES) * DIM, 1)).astype(np.float32)
    data = _batches(rng)
    kept = None
    for name, sok in (("sok", True), ("tf", False)):
        model, layer = _model(kind, combiner, matrix, kernel, sok)
        model.compile(optimizer=twins.OPTIMIZERS[optimizer](), loss="mse")
        history = twins.History(lambda layer=layer, sok=sok: _rows(layer, sok))
        model.fit(_dataset(data), epochs=1, verbose=0, callbacks=[history], shuffle=False)
        for field in ("batch", "iterations", "rows", "kernel", "loss"):
            out[f"{case}/{name}/{field}"] = np.array([s[field] for s in history.steps])
        facts[f"{case}/{name}/weights"] = [
            [w.name, type(w).__name__, bool(w.trainable)] for w in model.trainable_weights
        ]
        facts[f"{case}/{name}/tables"] = len(_tables(layer))
        kept = kept or (model, layer)
    facts[f"{case}/expected_tables"] = tables
    return kept


def _checkpoint(facts, model, layer, directory, kind="plain", fact="checkpoint"):
    """tf.train.Checkpoint(model=model) saves the tables (every part of a
  partitioned one); a fresh model of the same kind restores them."""
    tables = _tables(layer)
    exported = [[t.numpy() for t in table.export()[:2]] for table in tables]
    path = tf.train.Checkpoint(model=model).save(os.path.join(directory, fact))
    rng = np.random.default_rng(0)
    fresh, fresh_layer = _model(kind, "mean", twins.random_matrix(rng, N_ROWS, DIM),
                                np.zeros((len(FEATURES) * DIM, 1), np.float32), True)
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
    same_keys = same_rows = True
    for (keys, rows), table in zip(exported, _tables(fresh_layer)):
        got_keys, got_rows = [t.numpy() for t in table.export()[:2]]
        order, got_order = np.argsort(keys), np.argsort(got_keys)
        same_keys &= bool(np.array_equal(keys[order], got_keys[got_order]))
        same_rows &= bool(np.allclose(rows[order], got_rows[got_order]))
    facts[fact] = dict(keys=same_keys,
                       rows=same_rows,
                       count=int(sum(len(keys) for keys, _ in exported)),
                       tables=len(tables))


def _refusals(facts):
    cat = tf.feature_column.categorical_column_with_embedding("C1", dtype=tf.int64)
    column = tf.feature_column.embedding_column(cat, DIM)
    layer = tf.keras.layers.DenseFeatures([column])
    try:
        layer.get_config()
        facts["get_config"] = "no error"
    except NotImplementedError as error:
        facts["get_config"] = str(error)
    try:
        tf.keras.layers.DenseFeatures([tf.feature_column.indicator_column(cat)])({
            "C1": tf.sparse.from_dense(tf.constant([[1, 2]], tf.int64))
        })
        facts["indicator"] = "no error"
    except ValueError as error:
        facts["indicator"] = str(error)


def main():
    out_path, seed = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(seed)
    sok_ev.init()
    out, facts = {}, {}
    facts["keras"] = tf.keras.layers.Dense.__module__
    last = None
    for case in CASES:
        last = _fit(out, facts, case, rng)
        if case == "sgd_mean":
            _checkpoint(facts, *last, os.path.dirname(out_path))
        if case == "adagrad_partitioned_sum":
            _checkpoint(facts, *last, os.path.dirname(out_path), "partitioned",
                        "partitioned_checkpoint")
    _refusals(facts)
    out["facts"] = np.array(json.dumps(facts))
    np.savez(out_path, **out)


if __name__ == "__main__":
    main()
