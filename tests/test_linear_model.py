"""DeepRec's `tf.feature_column.linear_model` after install_deeprec_api()
(sok_ev.feature_column.linear_model).

DeepRec's WDL builds its wide part with
`linear_model(..., do_fusion=True)` over TensorFlow's hash-bucket columns.
Pinned down:
* with DeepRec's do_fusion it gives TensorFlow's v1 linear_model logits on
  the same weights (TensorFlow's own function is the reference);
* a column reading a categorical_column_with_embedding column, or an
  unknown argument, is refused with a ValueError naming it before any
  variable is made.
"""
import numpy as np
import pytest
import tensorflow as tf

from sok_ev import feature_column as sok_fc

WIDE_KEYS = ("C1", "C2")


@pytest.fixture(scope="module")
def deeprec(sok):
    sok.install_deeprec_api()
    return tf.compat.v1


def _features(rng, batch=6):
    ids = {key: [f"{key}-{rng.integers(0, 9)}" for _ in range(batch)] for key in WIDE_KEYS}
    ids["C2"][1] = ""  # an empty id is a bucket like any other
    return {key: tf.constant(np.array(values, dtype=object)) for key, values in ids.items()}


def _logits(build, rng, seed, **flags):
    """linear_model's logits after its weights are set to a seeded draw."""
    with tf.Graph().as_default():
        columns = [
            tf.compat.v1.feature_column.categorical_column_with_hash_bucket(key, 50)
            for key in WIDE_KEYS
        ]
        cols_to_vars = {}
        logits = build(_features(rng),
                       columns,
                       units=2,
                       sparse_combiner="sum",
                       cols_to_vars=cols_to_vars,
                       **flags)
        draws = np.random.default_rng(seed)
        variables = sorted(tf.compat.v1.trainable_variables(), key=lambda v: v.name)
        assigns = [
            v.assign(draws.normal(size=v.shape.as_list()).astype(np.float32)) for v in variables
        ]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(assigns)
            return sess.run(logits), sorted(v.name for v in variables)


def test_linear_model_with_do_fusion_gives_tensorflows_logits(deeprec, rng):
    seed = int(rng.integers(0, 2**31))
    state = rng.bit_generator.state
    ours, our_names = _logits(deeprec.feature_column.linear_model, rng, seed, do_fusion=True)
    rng.bit_generator.state = state  # the same ids for TensorFlow's
    theirs, their_names = _logits(sok_fc.STOCK["linear_model"], rng, seed)
    assert our_names == their_names
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    assert np.abs(ours).max() > 0  # the drawn weights were used


def test_linear_model_is_installed_on_both_feature_column_modules(deeprec):
    assert deeprec.feature_column.linear_model is sok_fc.linear_model
    assert tf.feature_column.linear_model is sok_fc.linear_model


def test_a_column_over_an_embedding_variable_is_refused_before_any_variable(deeprec):
    with tf.Graph().as_default():
        column = deeprec.feature_column.categorical_column_with_embedding("C9", dtype=tf.string)
        weighted = deeprec.feature_column.weighted_categorical_column(column, "C9_weight")
        for wide in (column, weighted):
            with pytest.raises(ValueError, match="linear_model: column 'C9"):
                deeprec.feature_column.linear_model({"C9": tf.constant(["a"])}, [wide])
        assert not tf.compat.v1.global_variables()


def test_an_unknown_argument_is_refused_naming_it(deeprec):
    with tf.Graph().as_default():
        column = deeprec.feature_column.categorical_column_with_hash_bucket("C1", 10)
        with pytest.raises(ValueError, match="fuse_everything=True"):
            deeprec.feature_column.linear_model({"C1": tf.constant(["a"])}, [column],
                                                fuse_everything=True)
        assert not tf.compat.v1.global_variables()
