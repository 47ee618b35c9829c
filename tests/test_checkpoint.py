"""Checkpoints lose nothing: values, optimizer slots, frequencies and
versions survive tf.compat.v1.train.Saver and tf.train.Checkpoint; a corrupt
checkpoint is rejected with a message naming what is wrong, and the table
keeps its contents; steps_to_live evicts stale keys at save, as in DeepRec.
"""
import re

import numpy as np
import pytest
import tensorflow as tf

from sok_ev_reference import graph_session, matrix_ev, random_matrix


def _sparse_ids(keys, dtype=tf.int64):
    """One key per sample."""
    keys = np.asarray(keys)
    indices = np.stack([np.arange(len(keys)), np.zeros(len(keys), np.int64)], 1)
    return tf.SparseTensor(indices, tf.constant(keys, dtype), [len(keys), 1])


def _sorted_export(full_export):
    """(keys, rows, frequencies, versions) ordered by key."""
    keys, rows, frequencies, versions = (np.asarray(a) for a in full_export[:4])
    order = np.argsort(keys)
    return keys[order], rows[order], frequencies[order], versions[order]


def test_saver_restores_values_and_slots_so_training_continues_identically(
        sok, rng, unique_name, tmp_path):
    matrix = random_matrix(rng, 16, 4)
    batches = [rng.integers(0, 40, size=12) for _ in range(4)]
    with graph_session() as sess:
        ev = matrix_ev(sok, unique_name(), matrix)
        ids = tf.compat.v1.placeholder(tf.int64, [12])
        emb, = sok.lookup_sparse([ev], [_sparse_ids_placeholder(ids)])
        loss = tf.reduce_sum(emb * emb)
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: batches[0]})
        path = saver.save(sess, str(tmp_path / "model"))
        for batch in batches[1:]:
            sess.run(train, {ids: batch})
        trained_on = _sorted_export(sess.run(ev.export_full()))
        # Start over from the checkpoint: the same batches must give the
        # same bits, which needs the accumulator slot back as well.
        sess.run(tf.compat.v1.global_variables_initializer())
        assert sess.run(ev.total_count()) == 0
        saver.restore(sess, path)
        for batch in batches[1:]:
            sess.run(train, {ids: batch})
        restored_then_trained = _sorted_export(sess.run(ev.export_full()))
    for expected, actual in zip(trained_on, restored_then_trained):
        np.testing.assert_array_equal(actual, expected)


def _sparse_ids_placeholder(ids):
    n = ids.shape[0]
    indices = tf.stack([tf.range(n, dtype=tf.int64), tf.zeros([n], tf.int64)], 1)
    return tf.SparseTensor(indices, ids, [n, 1])


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
    for e, a in zip(expected, actual):
        np.testing.assert_array_equal(a, e)
    # Frequencies count every occurrence in the batch.
    unique, counts = np.unique(keys, return_counts=True)
    np.testing.assert_array_equal(actual[0], unique)
    np.testing.assert_array_equal(actual[2], counts)


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
        after = _sorted_export(ev.export_full())
        for b, a in zip(before, after):
            np.testing.assert_array_equal(a, b, err_msg=f"table changed by {what}")


def test_restoring_a_checkpoint_of_another_dim_fails_naming_the_shapes(sok, unique_name, tmp_path):
    source = sok.get_embedding_variable(unique_name(), 4)
    sok.lookup_sparse([source], [_sparse_ids([1, 2, 3])])
    path = tf.train.Checkpoint(table=source).save(str(tmp_path / "ckpt"))
    target = sok.get_embedding_variable(unique_name(), 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows must have shape \[3, 3\]"):
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
