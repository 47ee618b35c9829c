"""SavedModel exports for serving.

A model that looks up Embedding Variables is exported with
`tf.saved_model.save` (TF2) or `tf.compat.v1.saved_model.Builder` (TF1)
inside `sok_ev.serving_export(unseen_keys=...)`, then loaded in a fresh
process that only imports sok_ev (as a serving binary would load the op
library): it serves the trained rows bit for bit, a key never trained reads
its initializer's value (what var.sparse_read gave in training) or zeros,
serving inserts no key, and the export holds no optimizer slot. An export
outside the context keeps the slots and loads for training. Run by
tests/gpu/run_on_device.sh, the same tests exercise the GPU tables.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref
from sok_ev_reference import graph_session

DIM = 4
TRAINED = np.array([3, 17, 17, 42, 5], np.int64)
UNSEEN = np.array([1000, 7, 123456789], np.int64)


def _run_fresh(tmp_path, code):
    """Runs `code` in a new Python process that imports sok_ev (nothing
  else of this test process), with `out` = tmp_path for its results."""
    script = tmp_path / "fresh.py"
    script.write_text("import sys\nimport numpy as np\nimport tensorflow as tf\nimport sok_ev\n"
                      f"out = {str(tmp_path)!r}\n" + textwrap.dedent(code))
    env = ref.child_env()
    result = subprocess.run([sys.executable, str(script)],
                            capture_output=True,
                            text=True,
                            timeout=300,
                            env=env,
                            check=False)
    assert result.returncode == 0, result.stderr[-6000:]
    return result.stdout


def _checkpoint_tensors(export_dir):
    return [name for name, _ in tf.train.list_variables(f"{export_dir}/variables/variables")]


class _Model(tf.Module):

    def __init__(self, ev):
        super().__init__()
        self.ev = ev

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def serve(self, ids):
        return tf.nn.embedding_lookup(self.ev, ids)


def _trained_eager_model(sok, unique_name):
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=DIM,
                                    initializer=tf.random_uniform_initializer(-1.0, 1.0, seed=7))
    model = _Model(ev)
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.3)
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model.serve(tf.constant(TRAINED))))
        optimizer.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))
    return ev, model


@pytest.mark.parametrize("unseen_keys", ["initializer", "zeros"])
def test_tf2_serving_export_serves_trained_rows_in_a_fresh_process(sok, unique_name, tmp_path,
                                                                   unseen_keys):
    ev, model = _trained_eager_model(sok, unique_name)
    trained = model.serve(tf.constant(TRAINED)).numpy()
    initial = ev.sparse_read(tf.constant(UNSEEN)).numpy()  # inserts nothing
    count = int(ev.total_count())
    export_dir = str(tmp_path / "export")
    with sok.serving_export(unseen_keys=unseen_keys):
        tf.saved_model.save(model, export_dir)
    assert not [n for n in _checkpoint_tensors(export_dir) if "slot_0" in n]  # no optimizer slots
    _run_fresh(
        tmp_path, f"""
        model = tf.saved_model.load({export_dir!r})
        ids = tf.constant({TRAINED.tolist() + UNSEEN.tolist()}, tf.int64)
        np.save(out + "/served.npy", model.serve(ids).numpy())
        np.save(out + "/signature.npy",
                model.signatures["serving_default"](ids)["output_0"].numpy())
        np.save(out + "/count.npy", model.ev.total_count().numpy())
        """)
    expected_unseen = initial if unseen_keys == "initializer" else np.zeros_like(initial)
    expected = np.concatenate([trained, expected_unseen])
    np.testing.assert_array_equal(np.load(tmp_path / "served.npy"), expected)
    np.testing.assert_array_equal(np.load(tmp_path / "signature.npy"), expected)
    assert int(np.load(tmp_path / "count.npy")) == count  # serving inserted nothing


def test_a_served_table_refuses_training_naming_the_export(sok, unique_name, tmp_path):
    _, model = _trained_eager_model(sok, unique_name)
    export_dir = str(tmp_path / "export")
    with sok.serving_export():
        tf.saved_model.save(model, export_dir)
    loaded = tf.saved_model.load(export_dir)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(loaded.serve(tf.constant(TRAINED)))
    with pytest.raises(tf.errors.FailedPreconditionError) as error:
        tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
            zip(tape.gradient(loss, [loaded.ev]), [loaded.ev]))
    assert ref.error_names(error.value, "serving", "cannot be trained")


def test_tf2_export_outside_serving_export_keeps_slots_and_trains_on(sok, unique_name, tmp_path):
    ev, model = _trained_eager_model(sok, unique_name)
    expected = ev.export_full()
    export_dir = str(tmp_path / "export")
    tf.saved_model.save(model, export_dir)
    assert [n for n in _checkpoint_tensors(export_dir) if "slot_0" in n]
    loaded = tf.saved_model.load(export_dir)
    restored = loaded.ev.export_full()
    # Exports come in no order (a GPU table's differs from call to call):
    # each is sorted by its own keys.
    order_a, order_e = np.argsort(restored[0].numpy()), np.argsort(expected[0].numpy())
    for a, e in zip(restored[:4], expected[:4]):
        np.testing.assert_array_equal(a.numpy()[order_a], e.numpy()[order_e])
    loaded.serve(tf.constant(UNSEEN))  # a training table inserts what it looks up
    assert int(loaded.ev.total_count()) == int(ev.total_count()) + len(UNSEEN)


@pytest.mark.parametrize("unseen_keys", ["initializer", "zeros"])
def test_tf1_saved_model_builder_serving_export_serves_in_a_fresh_process(
        sok, unique_name, tmp_path, unseen_keys):
    export_dir = str(tmp_path / "export")
    with graph_session() as sess:
        ev = sok.get_embedding_variable(unique_name(),
                                        embedding_dim=DIM,
                                        initializer=tf.compat.v1.random_normal_initializer(seed=3))
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        emb = tf.nn.embedding_lookup(ev, ids)
        train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(emb * emb))
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: TRAINED})
        trained = sess.run(emb, {ids: TRAINED})
        initial = sess.run(ev.sparse_read(tf.constant(UNSEEN)))
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        signature = tf.compat.v1.saved_model.predict_signature_def(inputs={"ids": ids},
                                                                   outputs={"emb": emb})
        with sok.serving_export(unseen_keys=unseen_keys):
            builder.add_meta_graph_and_variables(sess, ["serve"],
                                                 signature_def_map={"predict": signature})
        builder.save()
    assert not [
        n for n in _checkpoint_tensors(export_dir)
        if "slot_" in n and "names" not in n and "initial" not in n
    ]
    _run_fresh(
        tmp_path, f"""
        tf.compat.v1.disable_eager_execution()
        with tf.compat.v1.Session() as sess:
            meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], {export_dir!r})
            signature = meta.signature_def["predict"]
            emb = sess.graph.get_tensor_by_name(signature.outputs["emb"].name)
            ids = sess.graph.get_tensor_by_name(signature.inputs["ids"].name)
            keys = {TRAINED.tolist() + UNSEEN.tolist()}
            np.save(out + "/served.npy", sess.run(emb, {{ids: keys}}))
            np.save(out + "/again.npy", sess.run(emb, {{ids: keys}}))
        """)
    expected_unseen = initial if unseen_keys == "initializer" else np.zeros_like(initial)
    expected = np.concatenate([trained, expected_unseen])
    np.testing.assert_array_equal(np.load(tmp_path / "served.npy"), expected)
    np.testing.assert_array_equal(np.load(tmp_path / "again.npy"), expected)


def test_serving_export_refuses_an_unknown_unseen_keys_option(sok):
    with pytest.raises(ValueError) as error:
        with sok.serving_export(unseen_keys="random"):
            pass
    assert ref.error_names(error.value, "unseen_keys", "random")


@pytest.mark.parametrize("filter_name", ["CounterFilter", "CBFFilter"])
def test_a_filtered_table_serves_what_training_read_for_keys_it_never_admitted(
        sok, unique_name, tmp_path, filter_name):
    # DeepRec: a key not admitted reads default_value_no_permission; served
    # with unseen_keys="initializer" ("what training would have given it"),
    # a key the export lacks was never admitted, so it reads that too.
    filter_option = (sok.CounterFilter(
        filter_freq=3) if filter_name == "CounterFilter" else sok.CBFFilter(
            filter_freq=3, max_element_size=1000, false_positive_probability=0.01))
    ev = sok.get_embedding_variable(
        unique_name(),
        embedding_dim=DIM,
        ev_option=sok.EmbeddingVariableOption(
            filter_option=filter_option,
            init_option=sok.InitializerOption(default_value_no_permission=-0.5)))
    model = _Model(ev)
    model.serve(tf.constant([3, 3, 3, 42], tf.int64))  # 42 seen once
    model.serve(tf.constant([3], tf.int64))  # 3 admitted (seen 3 times before)
    ids = tf.constant([3, 42, 1000], tf.int64)
    in_training = ev.sparse_read(ids).numpy()  # the reference; inserts nothing
    assert (in_training[1:] == -0.5).all() and (in_training[0] != -0.5).any()
    export_dir = str(tmp_path / "export")
    with sok.serving_export(unseen_keys="initializer"):
        tf.saved_model.save(model, export_dir)

    loaded = tf.saved_model.load(export_dir)
    np.testing.assert_array_equal(loaded.serve(ids).numpy(), in_training)


def test_an_export_restored_into_a_table_built_to_train_warm_starts_it(sok, unique_name, tmp_path):
    # Warm start from a deployed model: its values, and the table trains on.
    ev, model = _trained_eager_model(sok, unique_name)
    trained = model.serve(tf.constant(TRAINED)).numpy()
    export_dir = str(tmp_path / "export")
    with sok.serving_export():
        tf.saved_model.save(model, export_dir)
    fresh = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)

    tf.train.Checkpoint(ev=fresh).restore(f"{export_dir}/variables/variables")

    np.testing.assert_array_equal(
        tf.nn.embedding_lookup(fresh, tf.constant(TRAINED)).numpy(), trained)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(fresh, tf.constant(UNSEEN)))
    tf.compat.v1.train.GradientDescentOptimizer(0.5).apply_gradients(
        zip(tape.gradient(loss, [fresh]), [fresh]))
    assert int(fresh.total_count()) == len(np.unique(TRAINED)) + len(UNSEEN)
