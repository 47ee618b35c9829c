"""Checkpoints lose nothing.

A model with many Embedding Variables (different dims, key dtypes and keys)
saves and restores every table -- keys, values, optimizer slots,
frequencies and versions -- through tf.compat.v1.train.Saver,
MonitoredTrainingSession and tf.train.Checkpoint; a restore needs no
initializer run first; training after a restore continues exactly as if it
had never stopped, and equals the same optimizer on dense tf.Variables saved
and restored by TensorFlow itself. A restore of many tables changes all of
them or none. Optimizer state with Embedding Variable slots is listed by
opt.variables() and checkpointed. A meta graph or SavedModel holding
Embedding Variables loads after `import sok_ev` and looks up the restored
rows. A corrupt checkpoint is rejected with a message naming what is wrong;
steps_to_live evicts stale keys at save, as in DeepRec. The Saver hook is
narrow: a Saver without Embedding Variables builds what TensorFlow builds,
and the private builder methods it overrides exist as it expects.
"""
import inspect
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training import saver as saver_module

import sok_ev_reference as ref
from sok_ev_reference import graph_session, matrix_ev, random_matrix

# The EV and the dense reference sum duplicate keys' gradients in different
# orders; everything else is the same float32 arithmetic.
RTOL = ATOL = 1e-5

# (embedding_dim, key dtype, rows of the default-value matrix) per table;
# each table draws its keys from its own range, so every table differs.
TABLES = [(2, np.int64, 5), (3, np.int32, 7), (4, np.int64, 11), (5, np.int32, 3),
          (8, np.int64, 13), (1, np.int64, 2)]
VOCABULARY = 40  # keys of table t: t * 1000 + [0, VOCABULARY)
BATCH, MAX_HOTNESS = 6, 3
SAVED_AFTER, STEPS = 3, 6


def _sparse_ids(keys, dtype=tf.int64):
    """One key per sample."""
    keys = np.asarray(keys)
    indices = np.stack([np.arange(len(keys)), np.zeros(len(keys), np.int64)], 1)
    return tf.SparseTensor(indices, tf.constant(keys, dtype), [len(keys), 1])


def _sparse_ids_placeholder(ids):
    """One key per sample, for a [n] placeholder of keys."""
    n = tf.shape(ids, out_type=tf.int64)[0]
    indices = tf.stack([tf.range(n), tf.zeros([n], tf.int64)], 1)
    return tf.SparseTensor(indices, ids, tf.stack([n, 1]))


def _sorted_export(full_export):
    """(keys, rows, frequencies, versions) ordered by key."""
    return ref.in_key_order(*full_export[:4])


def _assert_exports_equal(actual, expected, what):
    for field, a, e in zip(("keys", "rows", "frequencies", "versions"), actual, expected):
        np.testing.assert_array_equal(a, e, err_msg=f"{what}: {field}")


# --------------------------------------------------------------------------- a model of many tables


def _draw_steps(rng):
    """Per step, per table: a batch of that table's keys and an upstream gradient."""
    steps = []
    for _ in range(STEPS):
        step = []
        for t, (dim, key_dtype, _) in enumerate(TABLES):
            batch = ref.random_sparse_batch(
                rng,
                BATCH,
                MAX_HOTNESS,
                lambda n, t=t: t * 1000 + rng.integers(0, VOCABULARY, n),
                key_dtype)
            step.append((batch, rng.normal(size=(BATCH, dim)).astype(np.float32)))
        steps.append(step)
    return steps


class _Model:
    """Every table of TABLES twice in the default graph: as an Embedding
    Variable and as the dense reference (a tf.Variable whose row k - t * 1000
    starts where key k of the EV starts), plus a dense bias; one Adagrad
    minimizes both halves' losses, counting the global step."""

    def __init__(self, sok, names, matrices):
        self.tables, self.dense, self.feeds = [], [], []
        losses = []
        for (dim, key_dtype, _), name, matrix in zip(TABLES, names, matrices):
            ev = matrix_ev(sok, name, matrix, key_dtype)
            offset = int(name.rsplit("_", 1)[1]) * 1000
            rows = ref.initial_rows(matrix, offset + np.arange(VOCABULARY))
            dense = tf.compat.v1.get_variable(f"{name}_dense", initializer=tf.constant(rows))
            ids = tf.compat.v1.sparse_placeholder(tf.as_dtype(key_dtype), shape=[None, None])
            upstream = tf.compat.v1.placeholder(tf.float32, shape=[None, dim])
            emb = sok.lookup_sparse([ev], [ids], combiners=["sum"])[0]
            dense_ids = tf.SparseTensor(ids.indices,
                                        tf.cast(ids.values, tf.int64) - offset, ids.dense_shape)
            dense_emb = tf.nn.embedding_lookup_sparse(dense, dense_ids, None, combiner="sum")
            dense_emb = tf.pad(dense_emb,
                               [[0, tf.shape(upstream)[0] - tf.shape(dense_emb)[0]], [0, 0]])
            losses += [tf.reduce_sum(emb * upstream), tf.reduce_sum(dense_emb * upstream)]
            self.tables.append(ev)
            self.dense.append(dense)
            self.feeds.append((ids, upstream))
        self.bias = tf.compat.v1.get_variable(f"{names[0]}_bias", initializer=tf.ones([3]))
        losses.append(tf.reduce_sum(self.bias * self.bias))
        self.step = tf.compat.v1.train.get_or_create_global_step()
        self.train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.add_n(losses),
                                                                       global_step=self.step)
        self.exports = [ev.export_full() for ev in self.tables]

    def feed(self, step):
        feed = {}
        for (ids, upstream), (batch, up) in zip(self.feeds, step):
            feed[ids] = batch.ids_value()
            feed[upstream] = up
        return feed

    def state(self, sess):
        """Every table's (keys, rows, frequencies, versions), the dense
        references and the bias."""
        exports, dense, bias = sess.run([self.exports, self.dense, self.bias])
        return [_sorted_export(e) for e in exports], dense, bias


def _names(unique_name):
    return [unique_name(f"table_{t}") for t in range(len(TABLES))]


def _matrices(rng):
    return [random_matrix(rng, n_rows, dim) for dim, _, n_rows in TABLES]


def _assert_tables_equal(actual, expected, what):
    for t, (a, e) in enumerate(zip(actual, expected)):
        _assert_exports_equal(a, e, f"{what}, table {t}")


def _assert_matches_dense_reference(state, what):
    """Each EV row equals the dense reference's row of the same key."""
    tables, dense, _ = state
    for t, ((keys, rows, _, _), table) in enumerate(zip(tables, dense)):
        dim = TABLES[t][0]
        expected = table[keys.astype(np.int64) - t * 1000]
        np.testing.assert_allclose(rows[:, :dim],
                                   expected,
                                   rtol=RTOL,
                                   atol=ATOL,
                                   err_msg=f"{what}, table {t}")


def _occurrences_and_last_steps(steps):
    """NumPy: per table, {key: occurrences} and {key: last step updated}."""
    counts = [dict() for _ in TABLES]
    last = [dict() for _ in TABLES]
    for index, step in enumerate(steps):
        for t, (batch, _) in enumerate(step):
            for key in batch.keys.tolist():
                counts[t][key] = counts[t].get(key, 0) + 1
                last[t][key] = index
    return counts, last


def test_saver_keeps_every_table_of_a_model_with_many_tables(sok, rng, unique_name, tmp_path):
    names, matrices, steps = _names(unique_name), _matrices(rng), _draw_steps(rng)
    with graph_session() as sess:
        model = _Model(sok, names, matrices)
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in steps[:SAVED_AFTER]:
            sess.run(model.train, model.feed(step))
        saved = model.state(sess)
        path = saver.save(sess, str(tmp_path / "model"))
        for step in steps[SAVED_AFTER:]:
            sess.run(model.train, model.feed(step))
        uninterrupted = model.state(sess)

    # Every table holds its own keys (an overwrite would show here)...
    key_sets = [frozenset(keys.tolist()) for keys, _, _, _ in saved[0]]
    assert len(set(key_sets)) == len(TABLES)
    # ... counted and stamped as NumPy says.
    counts, last = _occurrences_and_last_steps(steps[:SAVED_AFTER])
    for t, (keys, _, frequencies, versions) in enumerate(saved[0]):
        assert dict(zip(keys.tolist(), frequencies.tolist())) == counts[t]
        assert dict(zip(keys.tolist(), versions.tolist())) == last[t]

    # A new program: the same model, restored without running any initializer.
    with graph_session() as sess:
        model = _Model(sok, names, matrices)
        saver = tf.compat.v1.train.Saver()
        saver.restore(sess, path)
        restored = model.state(sess)
        _assert_tables_equal(restored[0], saved[0], "restored")
        for step in steps[SAVED_AFTER:]:
            sess.run(model.train, model.feed(step))
        resumed = model.state(sess)
    _assert_tables_equal(resumed[0], uninterrupted[0], "trained after the restore")
    np.testing.assert_array_equal(resumed[2], uninterrupted[2])
    _assert_matches_dense_reference(resumed, "trained after the restore")


def _train_monitored(sok, names, matrices, checkpoint_dir, steps):
    """Trains `steps` in a new graph under MonitoredTrainingSession, which
    resumes from checkpoint_dir and saves there every step."""
    with tf.Graph().as_default():
        model = _Model(sok, names, matrices)
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir,
                                                         save_checkpoint_steps=1,
                                                         save_summaries_steps=None,
                                                         save_summaries_secs=None,
                                                         log_step_count_steps=None) as sess:
            for step in steps:
                sess.run(model.train, model.feed(step))
            return model.state(sess), sess.run(model.step)


def test_monitored_training_session_resumes_every_table_from_its_checkpoint_dir(
        sok, rng, unique_name, tmp_path):
    names, matrices, steps = _names(unique_name), _matrices(rng), _draw_steps(rng)
    _, global_step = _train_monitored(sok, names, matrices, str(tmp_path / "interrupted"),
                                      steps[:SAVED_AFTER])
    assert global_step == SAVED_AFTER
    resumed, global_step = _train_monitored(sok, names, matrices, str(tmp_path / "interrupted"),
                                            steps[SAVED_AFTER:])
    assert global_step == STEPS
    uninterrupted, _ = _train_monitored(sok, names, matrices, str(tmp_path / "uninterrupted"),
                                        steps)
    _assert_tables_equal(resumed[0], uninterrupted[0], "resumed")
    _assert_matches_dense_reference(resumed, "resumed")


def test_saver_restores_into_a_fresh_session_without_running_the_initializer(
        sok, rng, unique_name, tmp_path):
    matrix = random_matrix(rng, 16, 4)
    with graph_session() as sess:
        ev = matrix_ev(sok, unique_name(), matrix)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb, = sok.lookup_sparse([ev], [_sparse_ids_placeholder(ids)])
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(emb * emb))
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: [3, 5, 5, 100]})
        path = saver.save(sess, str(tmp_path / "model"))
        saved_rows = sess.run(ev.sparse_read(tf.constant([3, 5, 100], tf.int64)))
        # The same graph, a new session: nothing initialized.
        with tf.compat.v1.Session(graph=sess.graph) as fresh:
            assert not fresh.run(ev.is_initialized())
            saver.restore(fresh, path)
            assert fresh.run(ev.is_initialized())
            np.testing.assert_array_equal(fresh.run(emb, {ids: [3, 5, 100]}), saved_rows)


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
def test_checkpoint_object_round_trip_keeps_keys_rows_frequencies(sok, rng, unique_name, tmp_path,
                                                                  key_dtype):
    keys = rng.integers(-1000, 1000, size=50)
    source = sok.get_embedding_variable(unique_name(), 3, key_dtype=key_dtype)
    sok.lookup_sparse([source], [_sparse_ids(keys, key_dtype)])
    path = tf.train.Checkpoint(table=source).save(str(tmp_path / "ckpt"))
    target = sok.get_embedding_variable(unique_name(), 3, key_dtype=key_dtype)
    tf.train.Checkpoint(table=target).restore(path).assert_consumed()
    expected = _sorted_export(source.export_full())
    actual = _sorted_export(target.export_full())
    _assert_exports_equal(actual, expected, "restored")
    # Frequencies count every occurrence in the batch.
    unique, counts = np.unique(keys, return_counts=True)
    np.testing.assert_array_equal(actual[0], unique)
    np.testing.assert_array_equal(actual[2], counts)


# --------------------------------------------------------------------------- all or nothing


def _two_tables(sok, unique_name, dims, keys):
    tables = [sok.get_embedding_variable(unique_name(), dim) for dim in dims]
    for table, table_keys in zip(tables, keys):
        sok.lookup_sparse([table], [_sparse_ids(table_keys)])
    return tables


def test_checkpoint_restore_of_many_tables_changes_none_when_one_is_rejected(
        sok, rng, unique_name, tmp_path):
    saved = _two_tables(sok, unique_name, [4, 3], [rng.integers(0, 50, 20), [1, 2, 3]])
    path = tf.train.Checkpoint(first=saved[0], second=saved[1]).write(str(tmp_path / "ckpt"))
    # The first table matches the checkpoint, the second has another dim.
    targets = _two_tables(sok, unique_name, [4, 5], [rng.integers(100, 150, 20), [7, 8]])
    before = [_sorted_export(t.export_full()) for t in targets]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"embedding_dim 3 .*the variable has embedding_dim 5"):
        tf.train.Checkpoint(first=targets[0], second=targets[1]).read(path)
    for t, (table, expected) in enumerate(zip(targets, before)):
        _assert_exports_equal(_sorted_export(table.export_full()), expected, f"table {t}")


def test_saver_restore_of_many_tables_changes_none_when_one_is_missing(
        sok, rng, unique_name, tmp_path):
    with graph_session() as sess:
        first = sok.get_embedding_variable(unique_name(), 4)
        lookup = sok.lookup_sparse([first], [_sparse_ids(rng.integers(0, 50, 20))])
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(lookup)
        path = tf.compat.v1.train.Saver({"first": first}).save(sess, str(tmp_path / "model"))
        # Restoring "first" and a "second" the checkpoint does not hold.
        second = sok.get_embedding_variable(unique_name(), 4)
        lookup = sok.lookup_sparse([first, second], [_sparse_ids([500, 501])] * 2)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(lookup)
        before = [_sorted_export(sess.run(t.export_full())) for t in (first, second)]
        saver = tf.compat.v1.train.Saver({"first": first, "second": second})
        with pytest.raises(tf.errors.NotFoundError, match="'second' is not in checkpoint"):
            saver.restore(sess, path)
        for t, (table, expected) in enumerate(zip((first, second), before)):
            _assert_exports_equal(_sorted_export(sess.run(table.export_full())), expected,
                                  f"table {t}")


# --------------------------------------------------------------------------- optimizer state


def _tape_step(sok, opt, ev, bias, keys, upstream):
    with tf.GradientTape() as tape:
        emb, = sok.lookup_sparse([ev], [_sparse_ids(keys)])
        loss = tf.reduce_sum(emb * upstream) + tf.reduce_sum(bias * bias)
    grads = tape.gradient(loss, [ev, bias])
    opt.apply_gradients(zip(grads, [ev, bias]))


def test_optimizer_variables_include_embedding_variable_slots_after_an_update(sok, unique_name):
    with graph_session() as sess:
        ev = sok.get_embedding_variable(unique_name(), 2)
        bias = tf.compat.v1.get_variable(unique_name("bias"), initializer=tf.ones([2]))
        emb, = sok.lookup_sparse([ev], [_sparse_ids([1, 2])])
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        train = opt.minimize(tf.reduce_sum(emb) + tf.reduce_sum(bias))
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        names = [v.name for v in opt.variables()]
    slot_names = [f"{ev.name[:-2]}/Adam/m:0", f"{ev.name[:-2]}/Adam/v:0"]
    assert set(slot_names) <= set(names), names
    assert any(name.startswith(bias.name[:-2] + "/Adam") for name in names), names

    ev = sok.get_embedding_variable(unique_name(), 2)
    bias = tf.Variable(tf.ones([2]))
    opt = tf.compat.v1.train.AdagradOptimizer(0.1)
    _tape_step(sok, opt, ev, bias, [1, 2], np.ones([2, 2], np.float32))
    slots = [v for v in opt.variables() if isinstance(v, sok.EmbeddingVariableSlot)]
    assert [s.name for s in slots] == [f"{ev.name[:-2]}/Adagrad/accumulator:0"]


def test_checkpoint_with_the_optimizer_restores_slots_so_training_continues_identically(
        sok, rng, unique_name, tmp_path):
    batches = [
        (rng.integers(0, 30, 8), rng.normal(size=(8, 3)).astype(np.float32)) for _ in range(4)
    ]

    def model():
        return (sok.get_embedding_variable(unique_name(),
                                           3,
                                           initializer=tf.constant_initializer(0.5)),
                tf.Variable(tf.ones([3])), tf.compat.v1.train.AdagradOptimizer(0.1))

    ev, bias, opt = model()
    for keys, upstream in batches[:2]:
        _tape_step(sok, opt, ev, bias, keys, upstream)
    path = tf.train.Checkpoint(table=ev, bias=bias, optimizer=opt).write(str(tmp_path / "ckpt"))
    for keys, upstream in batches[2:]:
        _tape_step(sok, opt, ev, bias, keys, upstream)

    restored_ev, restored_bias, restored_opt = model()
    tf.train.Checkpoint(table=restored_ev, bias=restored_bias,
                        optimizer=restored_opt).read(path).assert_consumed()
    for keys, upstream in batches[2:]:
        _tape_step(sok, restored_opt, restored_ev, restored_bias, keys, upstream)
    _assert_exports_equal(_sorted_export(restored_ev.export_full()),
                          _sorted_export(ev.export_full()), "trained after the restore")
    np.testing.assert_array_equal(restored_bias.numpy(), bias.numpy())


# --------------------------------------------------------------------------- meta graphs


def _two_table_graph(sok, names, matrices):
    tables = [matrix_ev(sok, name, matrix) for name, matrix in zip(names, matrices)]
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    embs = sok.lookup_sparse(tables, [_sparse_ids_placeholder(ids)] * 2)
    emb = tf.concat(embs, axis=1, name="emb")
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(emb * emb))
    return tables, ids, emb, train


def test_import_meta_graph_rebuilds_embedding_variables_that_look_up_the_restored_rows(
        sok, rng, unique_name, tmp_path):
    names = [unique_name("first"), unique_name("second")]
    matrices = [random_matrix(rng, 8, 3), random_matrix(rng, 5, 2)]
    batch = [1, 7, 7, 40]
    with graph_session() as sess:
        _, ids, emb, train = _two_table_graph(sok, names, matrices)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: batch})
        path = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "model"))
        expected = sess.run(emb, {ids: batch})

    with graph_session() as sess:
        saver = tf.compat.v1.train.import_meta_graph(path + ".meta")
        saver.restore(sess, path)
        graph = sess.graph
        np.testing.assert_array_equal(
            sess.run(graph.get_tensor_by_name("emb:0"), {graph.get_tensor_by_name("ids:0"): batch}),
            expected)
        # The variables come back as Embedding Variables a new lookup can use.
        tables = {v.name: v for v in tf.compat.v1.global_variables()}
        rebuilt = [tables[f"{name}:0"] for name in names]
        assert all(isinstance(v, sok.EmbeddingVariable) for v in rebuilt)
        again = sok.lookup_sparse(rebuilt, [_sparse_ids(batch)] * 2)
        np.testing.assert_array_equal(np.concatenate(sess.run(again), axis=1), expected)


def test_saved_model_loader_loads_a_graph_with_embedding_variables(sok, rng, unique_name, tmp_path):
    names = [unique_name("first"), unique_name("second")]
    matrices = [random_matrix(rng, 8, 3), random_matrix(rng, 5, 2)]
    batch = [2, 9, 9, 33]
    export_dir = str(tmp_path / "saved_model")
    with graph_session() as sess:
        _, ids, emb, train = _two_table_graph(sok, names, matrices)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: batch})
        expected = sess.run(emb, {ids: batch})
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        signature = tf.compat.v1.saved_model.predict_signature_def(inputs={"ids": ids},
                                                                   outputs={"emb": emb})
        builder.add_meta_graph_and_variables(sess, ["serve"],
                                             signature_def_map={"predict": signature})
        builder.save()

    with graph_session() as sess:
        meta_graph = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        signature = meta_graph.signature_def["predict"]
        outputs = sess.run(sess.graph.get_tensor_by_name(signature.outputs["emb"].name),
                           {sess.graph.get_tensor_by_name(signature.inputs["ids"].name): batch})
    np.testing.assert_array_equal(outputs, expected)


# --------------------------------------------------------------------------- bad checkpoints


def test_corrupt_checkpoint_is_rejected_and_table_keeps_its_contents(sok, rng, unique_name):
    ev = sok.get_embedding_variable(unique_name(), 4)
    sok.lookup_sparse([ev], [_sparse_ids(rng.integers(0, 100, size=20))])
    before = _sorted_export(ev.export_full())
    names = tf.constant([], tf.string)
    no_slots = tf.constant([], tf.float32)
    two = tf.constant([7, 8], tf.int64)
    zeros2 = tf.zeros([2], tf.int64)
    corrupt = {
        "rows of the wrong width":
            (two, tf.zeros([2, 5]), zeros2, zeros2, names, no_slots, "rows must have shape [2, 4]"),
        "frequencies of another length": (two, tf.zeros([2, 4]), tf.zeros([3], tf.int64), zeros2,
                                          names, no_slots, "frequencies"),
        "a duplicated key": (tf.constant([7, 7], tf.int64), tf.zeros([2, 4]), zeros2, zeros2, names,
                             no_slots, "key 7 appears more than once"),
        "slot names without values": (two, tf.zeros([2, 8]), zeros2, zeros2,
                                      tf.constant(["Adagrad/accumulator"]), no_slots, "slot_names"),
    }
    for what, (*tensors, fragment) in corrupt.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(fragment)):
            ev.import_full(*tensors)
        _assert_exports_equal(_sorted_export(ev.export_full()), before, f"table changed by {what}")


def test_restoring_a_checkpoint_of_another_dim_fails_naming_both_dims(sok, unique_name, tmp_path):
    source = sok.get_embedding_variable(unique_name(), 4)
    sok.lookup_sparse([source], [_sparse_ids([1, 2, 3])])
    path = tf.train.Checkpoint(table=source).save(str(tmp_path / "ckpt"))
    target = sok.get_embedding_variable(unique_name(), 3)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"has embedding_dim 4 .*the variable has embedding_dim 3"):
        tf.train.Checkpoint(table=target).restore(path)


def test_restoring_a_checkpoint_of_another_key_dtype_fails_naming_both(sok, unique_name, tmp_path):
    source = sok.get_embedding_variable(unique_name(), 2, key_dtype=tf.int32)
    sok.lookup_sparse([source], [_sparse_ids([1, 2], tf.int32)])
    path = tf.train.Checkpoint(table=source).save(str(tmp_path / "ckpt"))
    target = sok.get_embedding_variable(unique_name(), 2, key_dtype=tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"int32 keys.*has int64 keys"):
        tf.train.Checkpoint(table=target).restore(path)


def test_steps_to_live_evicts_keys_not_updated_recently_when_saving(sok, unique_name, tmp_path):
    with graph_session() as sess:
        ev = sok.get_embedding_variable(unique_name(), 2, steps_to_live=3)
        ids = tf.compat.v1.placeholder(tf.int64, [2])
        emb, = sok.lookup_sparse([ev], [_sparse_ids_placeholder(ids)])
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(emb),
                                                                          global_step=step)
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: [100, 200]})  # version 0
        for _ in range(6):
            sess.run(train, {ids: [1, 2]})  # versions 1..6, global step ends at 7
        assert sess.run(ev.total_count()) == 4
        saver.save(sess, str(tmp_path / "model"))
        keys = sorted(sess.run(ev.export()[0]).tolist())
    # Keys 100 and 200 were last updated at step 0 < 7 - 3: gone.
    assert keys == [1, 2]


@pytest.mark.parametrize("global_step", [None, 1000], ids=["no_global_step", "idle_global_step"])
def test_steps_to_live_counts_a_keras_optimizers_iterations(sok, unique_name, tmp_path, request,
                                                            global_step):
    # Keras advances no global step: its updates are versioned by, and age
    # in, its own iterations, whatever a v1 global step says.
    if global_step is not None:
        tf.compat.v1.train.get_or_create_global_step().assign(global_step)
        # The eager global step lives in a process-wide collection.
        request.addfinalizer(lambda: tf.compat.v1.get_default_graph().clear_collection(
            tf.compat.v1.GraphKeys.GLOBAL_STEP))
    ev = sok.get_embedding_variable(unique_name(), 2, steps_to_live=2)
    optimizer = tf.keras.optimizers.SGD(0.1)
    for key in range(5):  # key k updated at iteration k
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(ev, tf.constant([key], tf.int64)))
        optimizer.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))
    assert int(optimizer.iterations) == 5

    tf.train.Checkpoint(table=ev).write(str(tmp_path / "ckpt"))

    # DeepRec's rule: evicted when step - version > steps_to_live (5 - k > 2).
    assert sorted(ev.export()[0].numpy().tolist()) == [3, 4]


def test_saved_checkpoint_names_each_tables_tensors_after_the_table(sok, unique_name, tmp_path):
    with graph_session() as sess:
        tables = [sok.get_embedding_variable(unique_name(), 2) for _ in range(2)]
        lookup = sok.lookup_sparse(tables, [_sparse_ids([1])] * 2)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(lookup)
        path = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "model"))
    saved = dict(tf.train.list_variables(path))
    for table in tables:
        name = table.name[:-2]
        assert saved[f"{name}/sok_ev/shard_0_of_1/keys"] == [1]
        assert saved[f"{name}/sok_ev/shard_0_of_1/values"] == [1, 2]
    assert not os.path.exists(str(tmp_path / "model_temp"))


# --------------------------------------------------------------------------- the Saver hook

# What sok_ev/checkpoint.py overrides in TensorFlow's Saver builder, and the
# parameters it relies on.
OVERRIDDEN = {
    "_build_internal": [
        "self", "names_to_saveables", "reshape", "sharded", "max_to_keep",
        "keep_checkpoint_every_n_hours", "name", "restore_sequentially", "filename", "build_save",
        "build_restore"
    ],
    "_AddSaveOps": ["self", "filename_tensor", "saveables"],
    "_AddShardedSaveOps": ["self", "filename_tensor", "per_device"],
    "_AddRestoreOps": [
        "self", "filename_tensor", "saveables", "restore_sequentially", "reshape",
        "preferred_shard", "name"
    ],
    "_AddShardedRestoreOps": [
        "self", "filename_tensor", "per_device", "restore_sequentially", "reshape"
    ],
}


def test_saver_builder_methods_the_hook_overrides_exist_with_the_expected_parameters(sok):
    assert sok.checkpoint.saver_hook_installed()
    for name, parameters in OVERRIDDEN.items():
        original = getattr(saver_module.BaseSaverBuilder, name)
        assert list(inspect.signature(original).parameters) == parameters, (
            f"TensorFlow {tf.__version__} changed BaseSaverBuilder.{name}; sok_ev/checkpoint.py "
            "must be updated")


@pytest.mark.parametrize("sharded", [False, True])
def test_a_saver_without_embedding_variables_builds_what_tensorflow_builds(sok, sharded):

    def saver_graph():
        with tf.Graph().as_default() as graph:
            tf.compat.v1.get_variable("dense", initializer=tf.ones([3]))
            tf.compat.v1.train.Saver(sharded=sharded)
        return graph.as_graph_def()

    hooked = saver_graph()
    sok.checkpoint.uninstall_saver_hook()
    try:
        original = saver_graph()
    finally:
        sok.init()
    assert hooked == original


def test_a_table_on_a_worker_this_run_lacks_is_refused_at_restore_and_nothing_changes(
        sok, unique_name, tmp_path):
    # A lookup refuses target_gpu >= the worker count; a restore must too,
    # or the table would come back empty on every worker.
    tables = [sok.get_embedding_variable(unique_name(), 2) for _ in range(2)]
    sok.lookup_sparse(tables, [_sparse_ids([1, 2])] * 2)
    path = tf.train.Checkpoint(tables=tables).save(str(tmp_path / "ckpt"))
    fresh = sok.get_embedding_variable(unique_name(), 2)
    sok.lookup_sparse([fresh], [_sparse_ids([7])])
    moved = sok.get_embedding_variable(unique_name(), 2, target_gpu=2)  # from a 3-worker job

    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        tf.train.Checkpoint(tables=[fresh, moved]).restore(path)

    assert ref.error_names(error.value, "target_gpu is 2", "1 worker")
    assert sorted(fresh.export()[0].numpy().tolist()) == [7]  # unchanged


def test_two_eager_savers_over_embedding_variables_of_one_name_each_save_and_restore(sok, tmp_path):
    # Eager Embedding Variables of one name are distinct tables; an eager
    # Saver over each saves and restores its own (it crashed on the graph of
    # an eager tensor).
    ones = sok.get_embedding_variable("twin", embedding_dim=2, initializer=tf.ones_initializer())
    zeros = sok.get_embedding_variable("twin", embedding_dim=2, initializer=tf.zeros_initializer())

    def look_up(keys):
        ids = tf.SparseTensor([[i, 0] for i in range(len(keys))], tf.constant(keys, tf.int64),
                              [len(keys), 1])
        sok.lookup_sparse([ones, zeros], [ids, ids], combiners=["sum", "sum"])

    look_up([1, 2])
    savers = [tf.compat.v1.train.Saver([ones]), tf.compat.v1.train.Saver([zeros])]
    paths = [s.save(None, str(tmp_path / name)) for s, name in zip(savers, ["ones", "zeros"])]
    look_up([3])  # a key neither checkpoint holds
    for saver, path in zip(savers, paths):
        saver.restore(None, path)
    for table, value in ((ones, 1.0), (zeros, 0.0)):
        got = ref.export_to_dict(*[t.numpy() for t in table.export()])
        assert sorted(got) == [1, 2]
        for row in got.values():
            np.testing.assert_array_equal(row, np.full(2, value, np.float32))
