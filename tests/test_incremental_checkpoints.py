"""Incremental checkpoints: DeepRec's Saver(incremental_save_restore=True),
`saver.incremental_save(sess, path)` and `incremental_restore`.

A model of several tables (int32 and int64 keys, Adagrad and Adam slots, a
CounterFilter, steps_to_live eviction) and a dense variable trains with a
full save, then incremental saves between steps. Restoring the last
incremental checkpoint (its chain: full + incrementals) into a fresh session
gives bit for bit what a full save at the same moment gives: every key, row,
slot, frequency and version, the dense variable, the filter's counts (a
further training step on both restores matches too). An incremental
checkpoint holds only the changed keys. Run by tests/gpu/run_on_device.sh,
the same tests exercise the GPU tables.

After sok_ev.install_deeprec_api(), DeepRec's stock names:
tf.compat.v1.train.Saver(incremental_save_restore=True) is sok_ev's
incremental Saver (without the flag, TensorFlow's, an explicit builder=
included); MonitoredTrainingSession(save_incremental_checkpoint_secs=...)
writes increments and, after a stop that lost the last full save, resumes
from the full checkpoint before it plus the increments: bit for bit the
state at the last increment.
"""
import os
import time

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref
from sok_ev_reference import graph_session

# (name, embedding_dim, key dtype, optimizer, options)
VOCABULARY = 30
BATCH = 8


def _build(sok, names, optimizer):
    """The model: tables trained on one batch of keys fed per step."""
    tables = [
        sok.get_embedding_variable(names[0],
                                   embedding_dim=3,
                                   key_dtype=tf.int64,
                                   initializer=tf.compat.v1.ones_initializer()),
        sok.get_embedding_variable(names[1],
                                   embedding_dim=2,
                                   key_dtype=tf.int32,
                                   initializer=tf.compat.v1.random_uniform_initializer(-1.0,
                                                                                       1.0,
                                                                                       seed=3),
                                   steps_to_live=2),
        sok.get_embedding_variable(
            names[2],
            embedding_dim=4,
            key_dtype=tf.int64,
            initializer=tf.compat.v1.ones_initializer(),
            ev_option=sok.EmbeddingVariableOption(filter_option=sok.CounterFilter(2))),
    ]
    dense = tf.compat.v1.get_variable(names[3], initializer=np.ones([4], np.float32))
    ids = [
        tf.compat.v1.placeholder(t.key_dtype, [BATCH], name=f"ids_{i}")
        for i, t in enumerate(tables)
    ]
    loss = tf.reduce_sum(dense)
    for table, keys in zip(tables, ids):
        emb = tf.nn.embedding_lookup(table, keys)
        loss += tf.reduce_sum(emb * emb) * tf.reduce_sum(dense)
    step = tf.compat.v1.train.get_or_create_global_step()
    train = optimizer().minimize(loss, global_step=step)
    return tables, ids, train


def _feeds(rng, steps, ids_placeholders):
    """Feeds by placeholder name, for every graph _build makes."""
    return [{
        p.name: rng.integers(0, VOCABULARY, BATCH).astype(p.dtype.as_numpy_dtype)
        for p in ids_placeholders
    }
            for _ in range(steps)]


def _state(sess, tables):
    """Every table's keys, rows (value and slots), frequencies and versions,
  sorted by key, and every dense variable."""
    return _state_of(sess, tables, [table.export_full() for table in tables])


def _state_of(sess, tables, exports):
    """_state from the tables' `export_full()` ops built beforehand (a
  MonitoredSession's graph is finalized)."""
    state = {}
    for table, export in zip(tables, exports):
        keys, rows, frequencies, versions, slot_names, _ = sess.run(export)
        order = np.argsort(keys)
        state[table.name] = (keys[order], rows[order], frequencies[order], versions[order],
                             sorted(slot_names.tolist()))
    for variable in tf.compat.v1.global_variables():
        if not isinstance(variable, tf.compat.v1.Variable) or hasattr(variable, "key_dtype"):
            continue
        state[variable.name] = sess.run(variable)
    return state


def _assert_states_equal(actual, expected, what):
    assert actual.keys() == expected.keys(), what
    for name in expected:
        a, e = actual[name], expected[name]
        if isinstance(e, tuple):
            for field, x, y in zip(("keys", "rows", "frequencies", "versions", "slots"), a, e):
                np.testing.assert_array_equal(np.asarray(x),
                                              np.asarray(y),
                                              err_msg=f"{what}: {name} {field}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{what}: {name}")


OPTIMIZERS = {
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_full_plus_incrementals_restore_bit_for_bit_what_a_full_save_holds(
        sok, rng, unique_name, tmp_path, optimizer):
    names = [unique_name(tag) for tag in ("a", "b", "c", "dense")]
    full_dir, incremental_dir, reference_dir = (tmp_path / d for d in ("full", "incr", "ref"))
    for directory in (full_dir, reference_dir):
        directory.mkdir()
    feeds = None
    with graph_session() as sess:
        tables, ids, train = _build(sok, names, OPTIMIZERS[optimizer])
        feeds = _feeds(rng, 7, ids)
        saver = sok.Saver(incremental_save_restore=True)
        reference_saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        for feed in feeds[:2]:
            sess.run(train, feed)
        saver.save(sess, str(full_dir / "model"), global_step=2)
        paths = []
        for step, feed in enumerate(feeds[2:5], start=3):
            sess.run(train, feed)
            paths.append(saver.incremental_save(sess, str(incremental_dir / "model"), step))
        reference = reference_saver.save(sess, str(reference_dir / "model"))
        expected = _state(sess, tables)
        sess.run(train, feeds[5])
        expected_after_a_step = _state(sess, tables)
    assert tf.train.latest_checkpoint(str(incremental_dir)) == paths[-1]
    assert sok.incremental_saver.checkpoint_chain(
        paths[-1]) == paths[::-1] + [str(full_dir / "model-2")]
    # Only changed keys: the last increment holds at most one batch's keys.
    for table in (names[0], names[2]):
        keys = tf.train.load_variable(paths[-1], f"{table}/sok_ev/shard_0_of_1/keys")
        assert len(keys) <= BATCH
    for path in (paths[-1], reference):
        with graph_session() as sess:
            tables, ids, train = _build(sok, names, OPTIMIZERS[optimizer])
            sok.Saver(incremental_save_restore=True).restore(sess, path)
            _assert_states_equal(_state(sess, tables), expected, f"restored from {path}")
            sess.run(train, feeds[5])
            _assert_states_equal(_state(sess, tables), expected_after_a_step,
                                 f"a step after restoring {path}")


def test_incremental_restore_takes_deeprecs_arguments(sok, rng, unique_name, tmp_path):
    names = [unique_name(tag) for tag in ("a", "b", "c", "dense")]
    with graph_session() as sess:
        tables, ids, train = _build(sok, names, OPTIMIZERS["adagrad"])
        feeds = _feeds(rng, 3, ids)
        saver = sok.Saver(incremental_save_restore=True)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, feeds[0])
        full = saver.save(sess, str(tmp_path / "model"))
        sess.run(train, feeds[1])
        incremental = saver.incremental_save(sess, str(tmp_path / "incr" / "model"))
        expected = _state(sess, tables)
    with graph_session() as sess:
        tables, ids, train = _build(sok, names, OPTIMIZERS["adagrad"])
        saver = sok.Saver(incremental_save_restore=True)
        with pytest.raises(ValueError) as error:
            saver.incremental_restore(sess, str(tmp_path / "other"), incremental)
        assert ref.error_names(error.value, "builds on", full)
        saver.incremental_restore(sess, full, incremental)
        _assert_states_equal(_state(sess, tables), expected, "incremental_restore")
        # The restore is the base of the next increment.
        sess.run(train, feeds[2])
        again = saver.incremental_save(sess, str(tmp_path / "incr" / "model-again"))
        expected = _state(sess, tables)  # after the save's steps_to_live eviction
    with graph_session() as sess:
        tables, ids, train = _build(sok, names, OPTIMIZERS["adagrad"])
        tf.compat.v1.train.Saver().restore(sess, again)
        _assert_states_equal(_state(sess, tables), expected, "increment of a restore")


def test_incremental_save_without_a_full_save_first_fails_naming_the_fix(
        sok, unique_name, tmp_path):
    with graph_session() as sess:
        sok.get_embedding_variable(unique_name(), embedding_dim=2)
        saver = sok.Saver(incremental_save_restore=True)
        sess.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(tf.errors.FailedPreconditionError) as error:
            saver.incremental_save(sess, str(tmp_path / "model"))
        assert ref.error_names(error.value, "incremental", "full checkpoint first")
        assert not os.path.exists(str(tmp_path / "model.index"))


def test_incremental_save_needs_incremental_save_restore(sok, unique_name, tmp_path):
    with graph_session() as sess:
        sok.get_embedding_variable(unique_name(), embedding_dim=2)
        saver = sok.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(ValueError) as error:
            saver.incremental_save(sess, str(tmp_path / "model"))
        assert ref.error_names(error.value, "incremental_save_restore=True")


def test_stock_saver_name_takes_incremental_save_restore_after_install_deeprec_api(
        sok, rng, unique_name, tmp_path):
    """DeepRec scripts call tf.train.Saver(incremental_save_restore=True)."""
    from tensorflow.python.training import saver as saver_module  # pylint: disable=import-outside-toplevel
    sok.install_deeprec_api()
    names = [unique_name(tag) for tag in ("a", "b", "c", "dense")]
    with graph_session() as sess:
        tables, ids, train = _build(sok, names, OPTIMIZERS["adagrad"])
        feeds = _feeds(rng, 4, ids)
        saver = tf.compat.v1.train.Saver(incremental_save_restore=True)
        assert isinstance(saver, sok.Saver) and isinstance(saver, saver_module.Saver)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, feeds[0])
        (tmp_path / "full").mkdir()
        saver.save(sess, str(tmp_path / "full" / "model"), global_step=1)
        for step, feed in enumerate(feeds[1:3], start=2):
            sess.run(train, feed)
            path = saver.incremental_save(sess, str(tmp_path / "incr" / "model"), step)
        expected = _state(sess, tables)
    with graph_session() as sess:
        tables, ids, train = _build(sok, names, OPTIMIZERS["adagrad"])
        tf.compat.v1.train.Saver(incremental_save_restore=True).restore(sess, path)
        _assert_states_equal(_state(sess, tables), expected, f"restored from {path}")


def test_stock_saver_name_without_the_flag_is_tensorflows_saver(sok, unique_name, tmp_path):
    from tensorflow.python.training import saver as saver_module  # pylint: disable=import-outside-toplevel
    sok.install_deeprec_api()
    with graph_session() as sess:
        ev = sok.get_embedding_variable(unique_name("ev"), embedding_dim=2)
        dense = tf.compat.v1.get_variable(unique_name("dense"), initializer=[1.0, 2.0])
        sess.run(tf.compat.v1.global_variables_initializer())
        saver = tf.compat.v1.train.Saver()
        assert not saver.incremental_save_restore
        with pytest.raises(ValueError) as error:
            saver.incremental_save(sess, str(tmp_path / "model"))
        assert ref.error_names(error.value, "incremental_save_restore=True")
        # An explicit builder is TensorFlow's to use, as without sok-ev.
        plain = tf.compat.v1.train.Saver([dense], builder=saver_module.BaseSaverBuilder())
        path = plain.save(sess, str(tmp_path / "plain"))
        np.testing.assert_array_equal(tf.train.load_variable(path, dense.name[:-2]), [1.0, 2.0])
        assert ev.name  # the Embedding Variable is left to the hooked Savers


def test_monitored_training_session_writes_increments_and_resumes_from_them(
        sok, rng, unique_name, tmp_path):
    """DeepRec's MonitoredTrainingSession(save_incremental_checkpoint_secs=...):
    incremental checkpoints between full saves; after a stop that lost the
    last full save, the session restores the full checkpoint before it plus
    the increments after it: the state at the last increment, bit for bit."""
    sok.install_deeprec_api()
    names = [unique_name(tag) for tag in ("a", "b", "c", "dense")]
    checkpoint_dir = str(tmp_path / "ckpt")
    secs = 0.05
    with tf.Graph().as_default():
        tables, ids, train = _build(sok, names, OPTIMIZERS["adagrad"])
        feeds = _feeds(rng, 4, ids)
        exports = [t.export_full() for t in tables]  # built before the graph is finalized
        with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=checkpoint_dir,
                save_checkpoint_steps=1000,
                save_summaries_steps=None,
                save_incremental_checkpoint_secs=secs) as sess:
            for feed in feeds:
                time.sleep(2 * secs)  # so every step's increment is due
                sess.run(train, feed)
            expected = _state_of(sess, tables, exports)
    increments = os.path.join(checkpoint_dir, ".incremental_checkpoint")
    last = tf.train.latest_checkpoint(increments)
    assert last == os.path.join(increments, "model.ckpt-4")
    assert sok.incremental_saver.checkpoint_chain(last)[-1] == os.path.join(
        checkpoint_dir, "model.ckpt-0")
    # The stop lost the full save at the end: back to model.ckpt-0.
    for path in tf.io.gfile.glob(os.path.join(checkpoint_dir, "model.ckpt-4*")):
        tf.io.gfile.remove(path)
    tf.compat.v1.train.update_checkpoint_state(checkpoint_dir,
                                               os.path.join(checkpoint_dir, "model.ckpt-0"))
    with tf.Graph().as_default():
        tables, ids, train = _build(sok, names, OPTIMIZERS["adagrad"])
        exports = [t.export_full() for t in tables]
        with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=checkpoint_dir,
                save_checkpoint_steps=1000,
                save_summaries_steps=None,
                save_incremental_checkpoint_secs=secs) as sess:
            _assert_states_equal(_state_of(sess, tables, exports), expected,
                                 "resumed from the increments")


def test_monitored_training_session_increments_need_a_checkpoint_dir(sok):
    sok.install_deeprec_api()
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        with pytest.raises(ValueError) as error:
            tf.compat.v1.train.MonitoredTrainingSession(save_incremental_checkpoint_secs=10)
        assert ref.error_names(error.value, "save_incremental_checkpoint_secs=10", "checkpoint_dir")
