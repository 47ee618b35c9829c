"""DeepRec's variable_scope(...).keep_weights(dtype=tf.float32) (sok_ev.deeprec_bf16).

The reference is the same layer written with stock TensorFlow ops: a float32
tf.Variable read through tf.cast to bfloat16, multiplied in bfloat16.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev
from sok_ev import deeprec_bf16

sok_ev.install_deeprec_api()


def _train(kept):
    """Two SGD steps of x @ w in bfloat16, w float32; returns (dtypes, w0, w2, y0)."""
    x = np.random.RandomState(3).normal(size=(4, 5)).astype(np.float32)
    w0 = np.random.RandomState(4).normal(size=(5, 3)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        if kept:
            with tf.compat.v1.variable_scope("dnn").keep_weights(dtype=tf.float32):
                w_read = tf.compat.v1.get_variable("w",
                                                   shape=[5, 3],
                                                   dtype=tf.bfloat16,
                                                   initializer=tf.constant_initializer(w0))
            variable = tf.compat.v1.trainable_variables()[0]
        else:
            variable = tf.compat.v1.Variable(w0, name="w")
            w_read = tf.cast(variable, tf.bfloat16)
        y = tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), w_read), tf.float32)
        loss = tf.reduce_sum(tf.square(y))
        step = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            y0 = session.run(y)
            session.run(step)
            session.run(step)
            return variable.dtype.base_dtype, variable.name, session.run(variable), y0


def test_keep_weights_variable_is_float32_and_trains_as_cast_read():
    kept = _train(True)
    stock = _train(False)
    assert kept[0] == tf.float32
    assert kept[1] == "dnn/w:0"
    np.testing.assert_array_equal(kept[3], stock[3])
    np.testing.assert_allclose(kept[2], stock[2], rtol=1e-6, atol=1e-6)


def test_keep_weights_dense_layers_keep_float32_variables():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.ones([2, 4], tf.bfloat16)
        with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE).keep_weights():
            with tf.compat.v1.variable_scope("inner"):
                w = tf.compat.v1.get_variable("k", shape=[4, 2], dtype=tf.bfloat16)
            y = tf.matmul(x, w)
            z = tf.compat.v1.get_variable("same", shape=[2], dtype=tf.float32)
            n = tf.compat.v1.get_variable("count", shape=[], dtype=tf.int64)
        assert y.dtype == tf.bfloat16
        assert isinstance(z, tf.Variable) and isinstance(n, tf.Variable)
        kinds = {v.op.name: v.dtype.base_dtype for v in tf.compat.v1.global_variables()}
    assert kinds == {"mlp/inner/k": tf.float32, "mlp/same": tf.float32, "mlp/count": tf.int64}


def test_keep_weights_runs_the_scopes_own_custom_getter():
    seen = []

    def getter(getter, *args, **kwargs):
        seen.append(kwargs["dtype"])
        return getter(*args, **kwargs)

    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.variable_scope("s", custom_getter=getter).keep_weights(tf.float32):
            tf.compat.v1.get_variable("v", shape=[1], dtype=tf.bfloat16)
    assert seen == [tf.float32]


def test_keep_weights_refuses_a_non_floating_dtype():
    with pytest.raises(ValueError, match="keep_weights"):
        deeprec_bf16.keep_weights_getter(tf.int32)
