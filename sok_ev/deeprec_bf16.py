"""DeepRec's `tf.variable_scope(...).keep_weights(dtype=tf.float32)`.

DeepRec's BF16 recipe (its modelzoo's `--bf16`): inside
`with tf.variable_scope(...).keep_weights(dtype=tf.float32):` the inputs are
cast to bfloat16, the layers compute in bfloat16, and the outputs are cast
back; the variables the layers ask for in bfloat16 are kept, saved and
updated in float32, each read through a cast to bfloat16 (so the small
updates of training are not rounded away).

`install()` adds `keep_weights(dtype=tf.float32)` to TensorFlow's
`tf.compat.v1.variable_scope`: it returns the same scope, which, entered,
gives its variables (and those of the scopes inside it) a custom getter: a
floating-point variable asked for in another floating-point dtype is created
in `dtype` (its initializer run in `dtype`) and handed out as
`tf.cast(variable, asked dtype)`. The gradient reaches the `dtype` variable
through the cast, so an optimizer updates it in `dtype`; the Saver saves it
in `dtype`. A getter given to the scope itself (`custom_getter=`) still runs,
inside this one. Variables asked for in `dtype`, or of a non-floating dtype,
are unchanged.
"""

import functools

import tensorflow as tf
from tensorflow.python.ops import variable_scope as variable_scope_module

_METHOD = "keep_weights"


def keep_weights_getter(dtype):
    """A variable_scope custom getter keeping floating variables in `dtype`.

  Raises:
    ValueError: dtype is not a floating-point dtype.
  """
    keep = tf.as_dtype(dtype)
    if not keep.is_floating:
        raise ValueError(f"variable_scope.keep_weights: dtype must be a floating-point dtype, "
                         f"got {keep.name}")

    # TensorFlow calls a custom getter with keywords only: getter=, name=, ...
    def keep_getter(getter, *args, **kwargs):
        asked = kwargs.get("dtype")
        asked = tf.as_dtype(asked).base_dtype if asked is not None else None
        if asked is None or asked == keep or not asked.is_floating:
            return getter(*args, **kwargs)
        kwargs["dtype"] = keep
        initializer = kwargs.get("initializer")
        if isinstance(initializer, (tf.Tensor, tf.Variable)):
            kwargs["initializer"] = tf.cast(initializer, keep)
        variable = getter(*args, **kwargs)
        return tf.cast(variable, asked)

    return keep_getter


def keep_weights(self, dtype=tf.float32):
    """`variable_scope.keep_weights`: this scope, keeping its variables in
  `dtype` (see the module docstring)."""
    getter = keep_weights_getter(dtype)
    own = self._custom_getter  # pylint: disable=protected-access
    if own is not None:
        getter = functools.partial(_outer_getter, getter, own)
    self._custom_getter = getter  # pylint: disable=protected-access
    return self


def _outer_getter(outer, inner, getter, *args, **kwargs):
    return outer(functools.partial(inner, getter), *args, **kwargs)


def install():
    """Adds keep_weights to tf.compat.v1.variable_scope. Idempotent.

  Raises:
    RuntimeError: variable_scope already has another keep_weights (e.g. on
      DeepRec itself); nothing is replaced.
  """
    existing = getattr(variable_scope_module.variable_scope, _METHOD, None)
    if existing is None:
        setattr(variable_scope_module.variable_scope, _METHOD, keep_weights)
    elif existing is not keep_weights:
        raise RuntimeError("install_deeprec_api: tf.compat.v1.variable_scope.keep_weights "
                           f"already exists ({existing!r}); sok-ev will not replace it.")
