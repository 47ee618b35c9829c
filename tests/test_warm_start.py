"""tf.compat.v1.train.init_from_checkpoint warm-starts Embedding Variables.

As DeepRec does, and as TensorFlow does for a dense variable (the reference,
warm-started in the same call): the mapped variable's initializer loads it
from the checkpoint. An Embedding Variable gets its whole table back (keys,
rows with their optimizer slots, frequencies, versions), in each of
TensorFlow's assignment-map forms, and DeepRec's EV_INIT_VAR_OPS collection
runs the new initializer too.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref
from sok_ev_reference import graph_session

DIM = 3


def _sorted(export):
    return ref.in_key_order(*export[:4])


@pytest.fixture(scope="module")
def trained(sok, tmp_path_factory):
    """A Saver checkpoint of a trained Embedding Variable `a` and a dense `d`,
  with what each held."""
    path = str(tmp_path_factory.mktemp("warm") / "model")
    with graph_session() as sess:
        ev = sok.get_embedding_variable("a", embedding_dim=DIM)
        dense = tf.compat.v1.get_variable("d", initializer=tf.ones([4, DIM]))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(ev, ids)**2) + tf.reduce_sum(dense**2)
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=step)
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in ([1, 2, 2], [2, 7], [-5]):
            sess.run(train, {ids: batch})
        tf.compat.v1.train.Saver().save(sess, path)
        return path, _sorted(sess.run(ev.export_full())), sess.run(dense)


MAPS = {
    "names": lambda ev, dense: {
        "a": "scope/a",
        "d": "scope/d"
    },
    "objects": lambda ev, dense: {
        "a": ev,
        "d": dense
    },
    "scope_to_scope": lambda ev, dense: {
        "/": "scope/"
    },
}


@pytest.mark.parametrize("form", sorted(MAPS))
def test_init_from_checkpoint_warm_starts_a_table_as_a_dense_variable(sok, trained, form):
    path, table, dense_value = trained
    with graph_session() as sess:
        with tf.compat.v1.variable_scope("scope"):
            ev = sok.get_embedding_variable("a", embedding_dim=DIM)
            dense = tf.compat.v1.get_variable("d", initializer=tf.zeros([4, DIM]))
        tf.compat.v1.train.init_from_checkpoint(path, MAPS[form](ev, dense))
        sess.run(tf.compat.v1.global_variables_initializer())

        np.testing.assert_array_equal(sess.run(dense), dense_value)  # the reference
        for restored, saved in zip(_sorted(sess.run(ev.export_full())), table):
            np.testing.assert_array_equal(restored, saved)


def test_deeprec_ev_init_var_ops_collection_runs_the_warm_start(sok, trained):
    path, table, _ = trained
    with graph_session() as sess:
        ev = sok.get_embedding_variable("b", embedding_dim=DIM)
        tf.compat.v1.train.init_from_checkpoint(path, {"a": "b"})
        sess.run(tf.compat.v1.get_collection(sok.embedding_variable.EV_INIT_VAR_OPS))
        np.testing.assert_array_equal(_sorted(sess.run(ev.export_full()))[1], table[1])


def test_a_table_the_checkpoint_lacks_is_refused_naming_it(sok, trained):
    path, _, _ = trained
    with graph_session():
        ev = sok.get_embedding_variable("c", embedding_dim=DIM)
        initializer = ev.initializer
        with pytest.raises(ValueError) as error:
            tf.compat.v1.train.init_from_checkpoint(path, {"missing": "c"})
        assert ev.initializer is initializer  # nothing changed
    assert ref.error_names(error.value, "missing", "c:0")
