"""A Keras 3 model of sok_ev.keras layers, exported for serving
(`model.export` inside `sok_ev.serving_export()`), serves in a fresh process that never imports sok_ev: TensorFlow Serving's
way, the TF1 SavedModel loader in a Session, with sok-ev's op library
loaded by `tf.load_op_library` (what a serving binary links).

The reference is the same model on keras.layers.Embedding holding the
trained tables' rows (rows 0..N_ROWS-1: trained, or the initial value a key
training never saw reads), with the trained head: the served predictions
must equal it and the in-process `predict`. Test ids have duplicates, ids
training never saw, int32 ids into an int64 table and int64 ids.
"""
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import tensorflow as tf

N_ROWS, DIM, HOTNESS, BATCH = 30, 4, 3, 8
# Training looks up ids below TRAINED only: the others serve their initial rows.
TRAINED = 20

SERVE = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf

    library, export_dir, out = sys.argv[1:4]
    tf.load_op_library(library)
    inputs = np.load(out + "/inputs.npz")
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        signature = meta.signature_def["serving_default"]
        feed = {signature.inputs[name].name: inputs[name] for name in signature.inputs}
        (output,) = signature.outputs.values()
        served = session.run(output.name, feed)
    assert "sok_ev" not in sys.modules
    np.save(out + "/served.npy", served)
""")


def _sok_layer(sok, matrix, combiner, name):
    option = sok.EmbeddingVariableOption(init_option=sok.InitializerOption(
        default_value_dim=matrix.shape[0]))
    return sok.keras.Embedding(DIM,
                               combiner=combiner,
                               initializer=tf.constant_initializer(matrix),
                               ev_option=option,
                               name=name)


def _model(user_layer, item_layer):
    """user ids (int32) pooled by 'sum', item ids (int64) pooled by 'mean',
  concatenated, Dense(1)."""
    user = keras.Input((HOTNESS,), dtype="int32", name="user")
    item = keras.Input((HOTNESS,), dtype="int64", name="item")
    both = keras.layers.Concatenate()([user_layer(user), item_layer(item)])
    return keras.Model({"user": user, "item": item}, keras.layers.Dense(1, name="head")(both))


class PooledRows(keras.layers.Layer):
    """The reference lookup: keras.layers.Embedding over `rows`, pooled."""

    def __init__(self, rows, combiner):
        super().__init__()
        self.combiner = combiner
        self.embedding = keras.layers.Embedding(
            rows.shape[0], rows.shape[1], embeddings_initializer=keras.initializers.Constant(rows))

    def call(self, ids):
        pooled = tf.reduce_sum(self.embedding(ids), axis=1)
        return pooled / HOTNESS if self.combiner == "mean" else pooled


def _ids(rng, high, batch=BATCH):
    ids = rng.integers(0, high, size=(batch, HOTNESS))
    ids[0, 1] = ids[0, 0]  # a duplicate within a row
    ids[1, 0] = ids[0, 0]  # and across rows
    return {"user": ids.astype(np.int32), "item": rng.permutation(ids).astype(np.int64)}


def _trained(sok, rng, name):
    layers = [
        _sok_layer(sok,
                   rng.normal(size=(N_ROWS, DIM)).astype(np.float32), combiner, f"{name}_{feature}")
        for feature, combiner in (("user", "sum"), ("item", "mean"))
    ]
    model = _model(*layers)
    model.compile(optimizer=keras.optimizers.Adagrad(0.2), loss="mse")
    for _ in range(3):
        x = _ids(rng, TRAINED)
        model.fit(x, rng.normal(size=(BATCH, 1)).astype(np.float32), verbose=0)
    return model, layers


def _reference(model, layers):
    """The model on keras.layers.Embedding over the trained tables' rows."""
    rows = [
        layer.embedding_variable.sparse_read(tf.range(N_ROWS, dtype=tf.int64)).numpy()
        for layer in layers
    ]
    twin = _model(PooledRows(rows[0], "sum"), PooledRows(rows[1], "mean"))
    twin.get_layer("head").set_weights(model.get_layer("head").get_weights())
    return twin


def _serve_in_a_fresh_process(export_dir, inputs, tmp_path, sok):
    np.savez(tmp_path / "inputs.npz", **inputs)
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    library = os.path.join(os.path.dirname(sok.__file__), "_sok_ev_ops.so")
    result = subprocess.run(
        [sys.executable, str(script), library, export_dir,
         str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        check=False)
    assert result.returncode == 0, result.stderr[-6000:]
    return np.load(tmp_path / "served.npy")


def test_an_exported_keras_model_serves_its_predictions_in_a_process_without_sok_ev(
        sok, rng, tmp_path):
    model, layers = _trained(sok, rng, "exported")
    test = _ids(rng, N_ROWS)  # ids training saw and ids it never saw
    assert (test["item"] >= TRAINED).any()
    expected = _reference(model, layers).predict(test, verbose=0)
    np.testing.assert_allclose(model.predict(test, verbose=0), expected, rtol=1e-5, atol=1e-6)
    export_dir = str(tmp_path / "export")
    with sok.serving_export():
        model.export(export_dir, verbose=False)
    served = _serve_in_a_fresh_process(export_dir, test, tmp_path, sok)
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
