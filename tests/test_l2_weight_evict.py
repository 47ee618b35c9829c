"""DeepRec's L2WeightEvict: at save, keys whose value v has
0.5 * sum(v * v) < l2_weight_threshold leave the table.

DeepRec's testEmbeddingVariableForL2FeatureEviction*: ones rows, ids
[0,0,0,1,1,2], one FTRL step, threshold 0.9: the checkpoint holds keys 0 and
1 only, and after a restore key 2 reads its initial value again. DeepRec's
own FTRL leaves rows 0.8283 and 0.7927 for keys 0 and 1 (L2 weights 1.03
and 0.94); TensorFlow's FtrlOptimizer, which sok-ev equals, leaves 0.8142
and 0.7717 (0.99 and 0.89), so the test takes threshold 0.85, which splits
TensorFlow's rows as 0.9 splits DeepRec's. The rows that stay are those of
the same FTRL step on a dense tf.Variable, and which keys stay is computed
from them by NumPy. Run by tests/gpu/run_on_device.sh, the same tests
exercise the GPU tables.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref
from sok_ev_reference import graph_session

DIM = 3
IDS = [0, 0, 0, 1, 1, 2]
THRESHOLD = 0.85


def _ftrl():
    return tf.compat.v1.train.FtrlOptimizer(0.1,
                                            l1_regularization_strength=2.0,
                                            l2_regularization_strength=0.00001)


def _dense_reference_rows():
    """The same step on a dense variable of ones: rows of keys 0, 1, 2."""
    with graph_session() as sess:
        with tf.device("/cpu:0"):
            dense = tf.Variable(np.ones((3, DIM), np.float32))
            loss = tf.reduce_sum(tf.nn.embedding_lookup(dense, tf.constant(IDS)) * 2.0)
            train = _ftrl().minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        return sess.run(dense)


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
def test_l2_weight_evict_drops_light_keys_at_save_as_deeprec_does(sok, unique_name, tmp_path,
                                                                  key_dtype):
    expected = _dense_reference_rows()
    l2_weight = 0.5 * np.sum(expected * expected, axis=1)
    kept = [k for k in range(3) if l2_weight[k] >= THRESHOLD]
    assert kept == [0, 1]  # DeepRec's expected keys
    name = unique_name()
    path = str(tmp_path / "model.ckpt")
    with graph_session() as sess:
        option = sok.EmbeddingVariableOption(evict_option=sok.L2WeightEvict(THRESHOLD))
        ev = sok.get_embedding_variable(name,
                                        embedding_dim=DIM,
                                        key_dtype=key_dtype,
                                        initializer=tf.compat.v1.ones_initializer(),
                                        ev_option=option)
        emb = tf.nn.embedding_lookup(ev, tf.constant(IDS, key_dtype))
        train = _ftrl().minimize(tf.reduce_sum(emb * 2.0))
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        saver.save(sess, path)
        keys, rows = sess.run(ev.export())  # the eviction ran on the table itself
        assert sorted(keys.tolist()) == kept
        for key, row in ref.export_to_dict(keys, rows).items():
            np.testing.assert_allclose(row, expected[key], rtol=1e-6)
    saved = tf.train.load_variable(path, f"{name}/sok_ev/shard_0_of_1/keys")
    assert sorted(saved.tolist()) == kept
    with graph_session() as sess:
        ev = sok.get_embedding_variable(name,
                                        embedding_dim=DIM,
                                        key_dtype=key_dtype,
                                        initializer=tf.compat.v1.ones_initializer(),
                                        ev_option=option)
        emb = tf.nn.embedding_lookup(ev, tf.constant(IDS, key_dtype))
        tf.compat.v1.train.Saver().restore(sess, path)
        read = sess.run(emb)
    np.testing.assert_allclose(read,
                               np.concatenate([expected[IDS[:5]],
                                               np.ones((1, DIM))]),
                               rtol=1e-6)


@pytest.mark.parametrize("threshold", [-1.0, 0.0, -0.5])
def test_l2_weight_evict_with_a_non_positive_threshold_evicts_nothing(sok, unique_name, tmp_path,
                                                                      threshold):
    """DeepRec: a threshold <= 0 disables the eviction (no row has a negative
  weight; a zero row is kept)."""
    with graph_session() as sess:
        option = sok.EmbeddingVariableOption(evict_option=sok.L2WeightEvict(threshold))
        ev = sok.get_embedding_variable(unique_name(),
                                        embedding_dim=DIM,
                                        initializer=tf.compat.v1.zeros_initializer(),
                                        ev_option=option)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(tf.nn.embedding_lookup(ev, tf.constant([4, 5], tf.int64)))
        tf.compat.v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
        assert sess.run(ev.total_count()) == 2


def test_l2_weight_evict_runs_at_a_tf_train_checkpoint_save(sok, unique_name, tmp_path):
    option = sok.EmbeddingVariableOption(evict_option=sok.L2WeightEvict(0.1))
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=2,
                                    initializer=tf.compat.v1.zeros_initializer(),
                                    ev_option=option)
    rows = np.array([[0.3, 0.3], [0.5, 0.0], [1.0, 1.0]], np.float32)  # weights .09, .125, 1
    ev.import_full(tf.constant([1, 2, 3], tf.int64), rows, tf.constant([1, 1, 1], tf.int64),
                   tf.constant([0, 0, 0], tf.int64), tf.constant([], tf.string),
                   tf.constant([], tf.float32))
    tf.train.Checkpoint(ev=ev).write(str(tmp_path / "ckpt"))
    keys, _ = ev.export()
    assert sorted(keys.numpy().tolist()) == [2, 3]


def test_an_imported_meta_graph_keeps_the_l2_weight_threshold(sok, unique_name, tmp_path):
    name = unique_name()
    with graph_session():
        option = sok.EmbeddingVariableOption(evict_option=sok.L2WeightEvict(0.7))
        sok.get_embedding_variable(name, embedding_dim=DIM, ev_option=option)
        tf.compat.v1.train.export_meta_graph(str(tmp_path / "model.meta"))
    with graph_session():
        tf.compat.v1.train.import_meta_graph(str(tmp_path / "model.meta"))
        (ev,) = [v for v in tf.compat.v1.global_variables() if v.name.startswith(name)]
        assert ev.l2_weight_threshold == pytest.approx(0.7)
