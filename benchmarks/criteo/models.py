"""The dense towers of the Criteo models: DLRM and DCNv2.

A tower maps the 13 transformed integer features ([n, 13]) and the 26
categorical embeddings (26 x [n, dim]) to one logit per sample ([n]).
Weights are tf.Variables drawn from stateless random ops of a fixed seed, so
every worker, and the Session and tf.function styles, start from the same
values without a broadcast.

  DLRM (Naumov et al. 2019): bottom MLP on the integer features (its last
    width is dim), the pairwise dot products of the 27 vectors (bottom output
    and embeddings), concatenated with the bottom output, then the top MLP.
  DCNv2 (Wang et al. 2020, stacked): x0 = [integers, embeddings]; cross
    layers x_{l+1} = x0 * (x_l W + b) + x_l, W full rank or low rank U V;
    then the deep MLP and a final linear unit. With a bottom MLP (MLPerf's
    DLRM-DCNv2: 512-256-128 on the integers, then 3 cross layers of rank 512
    and the deep MLP 1024-1024-512-256), x0 = [bottom(integers), embeddings].
    compute_dtype 'bfloat16' or 'float16' runs the cross and deep layers in
    that type (mixed precision: the weights stay float32, the logit is float32).
"""
from typing import List, Optional, Sequence

import tensorflow as tf

from benchmarks.criteo import reader


class _Dense:
    """y = act(x W + b), W glorot-uniform from a stateless seed, b = 0."""

    def __init__(self, fan_in, fan_out, seed, name, relu=True, bias=True):
        limit = (6.0 / (fan_in + fan_out))**0.5
        self.kernel = tf.Variable(lambda: tf.random.stateless_uniform(
            [fan_in, fan_out], seed=seed, minval=-limit, maxval=limit),
                                  name=f"{name}/kernel")
        self.bias = tf.Variable(lambda: tf.zeros([fan_out]), name=f"{name}/bias") if bias else None
        self.relu = relu
        self.variables = [self.kernel] + ([self.bias] if bias else [])

    def __call__(self, x):
        # Weights are float32; a bfloat16 or float16 x computes in its type.
        y = tf.matmul(x, tf.cast(self.kernel, x.dtype))
        if self.bias is not None:
            y += tf.cast(self.bias, x.dtype)
        return tf.nn.relu(y) if self.relu else y


class _MLP:
    """Dense layers of the given widths; ReLU after each but (optionally) the last."""

    def __init__(self, fan_in, widths, seed, name, relu_last=True):
        self.layers = []
        for i, width in enumerate(widths):
            relu = relu_last or i + 1 < len(widths)
            self.layers.append(_Dense(fan_in, width, [seed, i], f"{name}/layer_{i}", relu))
            fan_in = width
        self.variables = [v for layer in self.layers for v in layer.variables]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class DLRM:
    """DLRM's dense part. Args: dim (the embeddings' width), bottom MLP widths
  (the last must equal dim), top MLP widths (the last must be 1)."""

    def __init__(self, dim: int, bottom: Sequence[int], top: Sequence[int], seed: int):
        if bottom[-1] != dim:
            raise ValueError(f"DLRM: the bottom MLP must end at dim = {dim}, got {list(bottom)}")
        if top[-1] != 1:
            raise ValueError(f"DLRM: the top MLP must end at 1, got {list(top)}")
        vectors = reader.NUM_CATEGORICAL + 1
        self.bottom = _MLP(reader.NUM_DENSE, bottom, 2 * seed, "dlrm/bottom")
        self.top = _MLP(dim + vectors * (vectors - 1) // 2,
                        top,
                        2 * seed + 1,
                        "dlrm/top",
                        relu_last=False)
        rows, cols = zip(*[(i, j) for i in range(vectors) for j in range(i)])
        self._pairs = tf.constant([i * vectors + j for i, j in zip(rows, cols)], tf.int32)
        self._vectors = vectors
        self.variables = self.bottom.variables + self.top.variables

    def __call__(self, dense: tf.Tensor, embeddings: List[tf.Tensor]) -> tf.Tensor:
        bottom = self.bottom(dense)
        stacked = tf.stack([bottom] + list(embeddings), axis=1)  # [n, 27, dim]
        dots = tf.matmul(stacked, stacked, transpose_b=True)  # [n, 27, 27]
        flat = tf.reshape(dots, [-1, self._vectors * self._vectors])
        pairs = tf.gather(flat, self._pairs, axis=1)  # [n, 351], i > j
        return tf.squeeze(self.top(tf.concat([bottom, pairs], axis=1)), axis=1)


class DCNv2:
    """DCNv2's dense part. Args: dim, cross layers, cross rank (0 = full rank),
  deep MLP widths (a final linear unit follows)."""

    def __init__(self,
                 dim: int,
                 cross_layers: int,
                 cross_rank: int,
                 deep: Sequence[int],
                 seed: int,
                 bottom: Optional[Sequence[int]] = None,
                 compute_dtype: str = "float32"):
        if compute_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError("DCNv2: compute_dtype must be float32, bfloat16 or float16, got "
                             f"{compute_dtype!r}")
        self.compute_dtype = tf.as_dtype(compute_dtype)
        self.bottom = _MLP(reader.NUM_DENSE, bottom, 3 * seed + 3, "dcn/bottom") if bottom else None
        width = (bottom[-1] if bottom else reader.NUM_DENSE) + reader.NUM_CATEGORICAL * dim
        self.cross = []
        for i in range(cross_layers):
            if cross_rank:
                down = _Dense(width, cross_rank, [3 * seed, 2 * i], f"dcn/cross_{i}/u", False,
                              False)
                up = _Dense(cross_rank, width, [3 * seed, 2 * i + 1], f"dcn/cross_{i}/v", False)
                self.cross.append([down, up])
            else:
                self.cross.append(
                    [_Dense(width, width, [3 * seed, 2 * i], f"dcn/cross_{i}", False)])
        self.deep = _MLP(width, deep, 3 * seed + 1, "dcn/deep")
        self.out = _Dense(deep[-1] if deep else width, 1, [3 * seed + 2, 0], "dcn/out", False)
        self.variables = ([v for layer in self.cross for d in layer for v in d.variables] +
                          self.deep.variables + self.out.variables +
                          (self.bottom.variables if self.bottom else []))

    def __call__(self, dense: tf.Tensor, embeddings: List[tf.Tensor]) -> tf.Tensor:
        first = self.bottom(dense) if self.bottom else dense
        x0 = tf.cast(tf.concat([first] + list(embeddings), axis=1), self.compute_dtype)
        x = x0
        for layer in self.cross:
            y = x
            for d in layer:
                y = d(y)
            x = x0 * y + x
        return tf.squeeze(tf.cast(self.out(self.deep(x)), tf.float32), axis=1)
