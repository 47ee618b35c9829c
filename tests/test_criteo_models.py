"""The Criteo towers (benchmarks/criteo/models.py) compute DLRM and DCNv2 as published.

Reference: the papers' formulas in NumPy, on the towers' own weights.
"""
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.criteo import models

N, DIM = 6, 4


@pytest.fixture(autouse=True)
def float32_matmuls():
    """The references multiply in float32; GPUs multiply in TF32 by default
  (a 10-bit mantissa: 4e-4 apart on an H200)."""
    was = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(was)


def relu(x):
    return np.maximum(x, 0)


def inputs(rng):
    dense = rng.random((N, 13)).astype(np.float32)
    embeddings = [rng.standard_normal((N, DIM)).astype(np.float32) for _ in range(26)]
    return dense, embeddings


def mlp(x, layers, relu_last):
    for i, layer in enumerate(layers):
        x = x @ layer.kernel.numpy() + layer.bias.numpy()
        if relu_last or i + 1 < len(layers):
            x = relu(x)
    return x


def test_dlrm_is_bottom_mlp_pairwise_dots_top_mlp(rng):
    tower = models.DLRM(DIM, [8, DIM], [16, 1], seed=1)
    dense, embeddings = inputs(rng)
    bottom = mlp(dense, tower.bottom.layers, relu_last=True)
    vectors = [bottom] + embeddings
    dots = [np.sum(vectors[i] * vectors[j], axis=1) for i in range(len(vectors)) for j in range(i)]
    expected = mlp(np.concatenate([bottom, np.stack(dots, 1)], 1), tower.top.layers, False)[:, 0]
    got = tower(tf.constant(dense), [tf.constant(e) for e in embeddings]).numpy()
    assert got.shape == (N,)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rank", [0, 3])
def test_dcnv2_is_cross_layers_then_deep_mlp(rng, rank):
    tower = models.DCNv2(DIM, cross_layers=2, cross_rank=rank, deep=[8, 8], seed=2)
    dense, embeddings = inputs(rng)
    x0 = np.concatenate([dense] + embeddings, axis=1)
    x = x0
    for layer in tower.cross:
        if rank:
            u, v = layer
            y = (x @ u.kernel.numpy()) @ v.kernel.numpy() + v.bias.numpy()
        else:
            y = x @ layer[0].kernel.numpy() + layer[0].bias.numpy()
        x = x0 * y + x
    deep = mlp(x, tower.deep.layers, relu_last=True)
    expected = (deep @ tower.out.kernel.numpy() + tower.out.bias.numpy())[:, 0]
    got = tower(tf.constant(dense), [tf.constant(e) for e in embeddings]).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = (models.DLRM(DIM, [DIM], [4, 1], seed=s) for s in (7, 7, 8))
    for x, y, z in zip(a.variables, b.variables, c.variables):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert not np.array_equal(a.top.layers[0].kernel.numpy(), c.top.layers[0].kernel.numpy())


def test_mlp_widths_are_checked():
    with pytest.raises(ValueError, match="bottom MLP must end at dim = 4"):
        models.DLRM(DIM, [8], [4, 1], seed=0)
    with pytest.raises(ValueError, match="top MLP must end at 1"):
        models.DLRM(DIM, [DIM], [4], seed=0)
