"""Turns a TensorFlow initializer into the core's per-key initializer.

Kinds mirror `sok_ev::InitializerSpec::Kind` in cc/initializer.h. Constant,
uniform, normal and truncated-normal initializers are drawn natively, per key,
when a key is first seen. Any other initializer, or an explicit
`InitializerOption(default_value_dim=N)`, uses DeepRec's rule: an `[N, dim]`
matrix drawn once from the initializer, row `key mod N` for each new key.
"""

import dataclasses
import inspect
import random

import numpy as np
import tensorflow as tf

CONSTANT = 0
RANDOM_UNIFORM = 1
RANDOM_NORMAL = 2
TRUNCATED_NORMAL = 3
DEFAULT_VALUE_MATRIX = 4

# DeepRec's default_value_dim, used when an initializer can only be drawn as
# a matrix.
DEEPREC_DEFAULT_VALUE_DIM = 4096


@dataclasses.dataclass
class InitializerSpec:
    """Arguments of the InitializeEmbeddingVariable op."""
    kind: int
    param_a: float = 0.0
    param_b: float = 0.0
    seed: int = 0
    default_value_dim: int = 0  # rows of the matrix; 0 unless the matrix kind


@dataclasses.dataclass
class Drawn:
    """An initializer already turned into its spec (and, for the matrix kind,
  its `[N, dim]` matrix, as a NumPy array): how a loaded SavedModel
  recreates an Embedding Variable exactly as it was made."""
    spec: InitializerSpec
    matrix: np.ndarray


def as_instance(initializer, where):
    """The initializer object to draw from: DeepRec (like tf.compat.v1's
  get_variable) accepts an initializer class and instantiates it with its
  default arguments, e.g. `initializer=init_ops.ones_initializer`.

  Args:
    initializer: an initializer instance or class (tf.compat.v1 or Keras).
    where: names the caller and table in error messages.

  Raises:
    TypeError: `initializer` is neither callable nor a class that can be
      created without arguments.
  """
    if inspect.isclass(initializer):
        try:
            initializer = initializer()
        except TypeError as error:
            raise TypeError(f"{where}: initializer={initializer!r} is a class that cannot be "
                            f"created without arguments: {error}. Pass an instance.") from error
    if not callable(initializer):
        raise TypeError(f"{where}: initializer must be an initializer (a callable taking "
                        f"a shape and a dtype) or its class, got {initializer!r}")
    return initializer


def _seed(initializer):
    """A 63-bit seed: the initializer's, combined with the graph seed if set."""
    op_seed = getattr(initializer, "seed", None)
    graph_seed, op_seed = tf.compat.v1.get_seed(op_seed)
    if graph_seed is None and op_seed is None:
        return random.getrandbits(63)
    return ((graph_seed or 0) * 1000003 + (op_seed or 0)) & ((1 << 63) - 1)


def _scalar_constant(initializer):
    """The constant's value if it is one number, else None."""
    value = np.asarray(getattr(initializer, "value", None), dtype=np.float64)
    if value.size != 1:
        return None
    return float(value.reshape(()))


def spec_for(initializer, default_value_dim):
    """Chooses the native kind for `initializer`.

  Args:
    initializer: a tf.compat.v1 or tf.keras/TF2 initializer object.
    default_value_dim: None, or DeepRec's explicit matrix size.

  Returns:
    An InitializerSpec; for DEFAULT_VALUE_MATRIX the caller draws the matrix
    with `initializer([default_value_dim, dim])`.
  """
    if isinstance(initializer, Drawn):
        return initializer.spec
    if default_value_dim is not None:
        return InitializerSpec(DEFAULT_VALUE_MATRIX, default_value_dim=default_value_dim)
    name = type(initializer).__name__
    if name in ("Zeros", "ZerosInitializer", "zeros_initializer"):
        return InitializerSpec(CONSTANT, 0.0)
    if name in ("Ones", "OnesInitializer", "ones_initializer"):
        return InitializerSpec(CONSTANT, 1.0)
    if name in ("Constant", "ConstantInitializer"):
        value = _scalar_constant(initializer)
        if value is not None:
            return InitializerSpec(CONSTANT, value)
    elif name in ("RandomUniform",):
        # tf.compat.v1's maxval=None means 1 for floats, as TensorFlow draws it.
        maxval = 1.0 if initializer.maxval is None else float(initializer.maxval)
        return InitializerSpec(RANDOM_UNIFORM, float(initializer.minval), maxval,
                               _seed(initializer))
    elif name in ("RandomNormal",):
        return InitializerSpec(RANDOM_NORMAL, float(initializer.mean), float(initializer.stddev),
                               _seed(initializer))
    elif name in ("TruncatedNormal",):
        return InitializerSpec(TRUNCATED_NORMAL, float(initializer.mean), float(initializer.stddev),
                               _seed(initializer))
    return InitializerSpec(DEFAULT_VALUE_MATRIX, default_value_dim=DEEPREC_DEFAULT_VALUE_DIM)


def default_values(initializer, spec, embedding_dim):
    """The `[N, dim]` float32 matrix input of the initialize op ([0, dim] when
  the kind draws per key).

  Raises:
    ValueError: the initializer cannot draw an `[N, dim]` float32 matrix;
      the message names the initializer and the matrix's shape.
  """
    if spec.kind != DEFAULT_VALUE_MATRIX:
        return tf.zeros([0, embedding_dim], tf.float32)
    if isinstance(initializer, Drawn):
        return tf.constant(initializer.matrix, tf.float32)
    try:
        matrix = initializer([spec.default_value_dim, embedding_dim], dtype=tf.float32)
    except (TypeError, ValueError) as error:
        raise ValueError(f"initializer={initializer!r} could not draw the "
                         f"[{spec.default_value_dim}, {embedding_dim}] float32 matrix new keys "
                         f"take their rows from (DeepRec's default_value_dim rule): "
                         f"{error}") from error
    return tf.convert_to_tensor(matrix, tf.float32)
