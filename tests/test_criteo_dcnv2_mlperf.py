"""MLPerf's DLRM-DCNv2 tower (benchmarks/criteo/models.DCNv2 with a bottom MLP), and its mixed precision.

Reference: the DCNv2 formula in NumPy on the tower's own weights, with the
bottom MLP's output in place of the integer features (MLPerf's arrangement:
bottom 512-256-128, 3 cross layers of rank 512, deep 1024-1024-512-256, here
at a tiny width); and the float32 tower for its bfloat16 and float16 runs.
"""
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.criteo import models

N, DIM = 6, 4


@pytest.fixture(autouse=True)
def float32_matmuls():
    """GPUs multiply float32 in TF32 by default; the reference does not."""
    was = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(was)


def mlp(x, layers):
    for layer in layers:
        x = np.maximum(x @ layer.kernel.numpy() + layer.bias.numpy(), 0)
    return x


def inputs():
    rng = np.random.default_rng(3)
    dense = rng.random((N, 13)).astype(np.float32)
    return dense, [rng.standard_normal((N, DIM)).astype(np.float32) * 0.1 for _ in range(26)]


def tower(compute_dtype="float32"):
    # MLPerf's shape, 64 times narrower: bottom [8, 4, DIM], rank 8, deep [16, 16, 8, 4].
    return models.DCNv2(DIM,
                        cross_layers=3,
                        cross_rank=8,
                        deep=[16, 16, 8, 4],
                        seed=5,
                        bottom=[8, 4, DIM],
                        compute_dtype=compute_dtype)


def test_bottom_mlp_output_replaces_the_integers_in_x0():
    t = tower()
    dense, embeddings = inputs()
    x0 = np.concatenate([mlp(dense, t.bottom.layers)] + embeddings, axis=1)
    assert x0.shape == (N, DIM + 26 * DIM)
    x = x0
    for u, v in t.cross:
        x = x0 * ((x @ u.kernel.numpy()) @ v.kernel.numpy() + v.bias.numpy()) + x
    expected = (mlp(x, t.deep.layers) @ t.out.kernel.numpy() + t.out.bias.numpy())[:, 0]
    got = t(tf.constant(dense), [tf.constant(e) for e in embeddings]).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # Every weight is trained: the bottom MLP's too.
    assert all(any(v is w for w in t.variables) for v in t.bottom.variables)


@pytest.mark.parametrize("dtype, tolerance", [("bfloat16", 0.05), ("float16", 0.01)])
def test_mixed_precision_keeps_float32_weights_and_logits_near_float32s(dtype, tolerance):
    full, mixed = tower(), tower(dtype)
    dense, embeddings = inputs()
    args = (tf.constant(dense), [tf.constant(e) for e in embeddings])
    got, expected = mixed(*args), full(*args)
    assert got.dtype == tf.float32
    assert all(v.dtype == tf.float32 for v in mixed.variables)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=tolerance)
    # ... and the gradients reach the float32 weights.
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(mixed(*args))
    assert all(g is not None for g in tape.gradient(loss, mixed.variables))


def test_unknown_compute_dtype_is_named():
    with pytest.raises(ValueError, match="compute_dtype must be .* got 'int8'"):
        tower("int8")
