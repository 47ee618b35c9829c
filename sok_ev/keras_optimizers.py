"""Keras 3 optimizers (`tf.keras.optimizers.*`) updating Embedding Variables.

`install_keras_optimizer_hook()` (run by `sok_ev.init()`) wraps the public
`tf.keras.optimizers.Optimizer.apply` (which `apply_gradients` calls): the
Embedding Variables among the variables are updated by the fused native op
(`SokEv>SparseApplyOptimizer`, through `sok_ev.optimizers.fused_update`),
then the other variables go through Keras unchanged, and Keras counts the
step once (`optimizer.iterations`). Without the hook,
`apply_gradients(optimizer, grads_and_vars)` does the same for one call.

Supported, with the arithmetic of the same Keras optimizer applied to each
looked-up row (duplicate keys summed first):
  SGD (momentum 0), Adagrad, Adam (amsgrad False), Ftrl.
Keras updates a dense variable from a dense view of its gradient, so rows
outside the batch still move under Adam (their moments decay) and can move
under Ftrl. sok-ev is lazy, as DeepRec: only the rows of the batch's keys
change, with Keras's formulas, and Adam's bias correction uses the
optimizer's step count (`iterations + 1`) for every row. SGD and Adagrad
equal Keras on a dense variable row for row.

Keras's Adagrad divides by sqrt(accumulator + epsilon); the fused kernel
divides by sqrt(accumulator), so the table's `accumulator` slot holds
Keras's accumulator plus epsilon (it starts at initial_accumulator_value +
epsilon), which gives Keras's update exactly.

Refused with a ValueError naming the setting (they have no fused form yet):
clipnorm, clipvalue, global_clipnorm, weight_decay, use_ema,
gradient_accumulation_steps and loss_scale_factor when an Embedding Variable
is among the variables. Any other Keras optimizer (including subclasses such
as AdamW) raises a TypeError listing the supported ones.
"""

import dataclasses
from typing import Callable, List, Sequence, Tuple

import tensorflow as tf

from sok_ev import optimizers
from sok_ev.embedding_variable import EmbeddingVariable


@dataclasses.dataclass(frozen=True)
class _KerasRule:
    """How one Keras optimizer class maps onto the fused op."""
    op_name: str
    # (slot name, initial value) in the op's slot order (cc/optimizers.h).
    slots: Callable[[object], List[Tuple[str, float]]]
    # Scalars in the op's hyperparameter order (sok_ev/cc/ops/optimizer_ops.cc)
    # for this step: (optimizer, learning rate tensor, step t = iterations + 1).
    hyperparameters: Callable[[object, tf.Tensor, tf.Tensor], list]
    # Settings of this class without a fused form: name -> value it must have.
    required: Tuple[Tuple[str, object], ...] = ()


def _adam_hyperparameters(o, lr, t):
    beta_1 = tf.cast(o.beta_1, tf.float32)
    beta_2 = tf.cast(o.beta_2, tf.float32)
    return [lr, beta_1, beta_2, o.epsilon, tf.pow(beta_1, t), tf.pow(beta_2, t)]


def _ftrl_hyperparameters(o, lr, t):
    del t
    # Keras adds beta / (2 lr) to the l2 strength.
    l2 = o.l2_regularization_strength + o.beta / (2.0 * lr)
    return [
        lr, o.learning_rate_power, o.l1_regularization_strength, l2,
        o.l2_shrinkage_regularization_strength
    ]


def _rules():
    keras = tf.keras.optimizers
    return {
        keras.SGD:
            _KerasRule("sgd", lambda o: [], lambda o, lr, t: [lr], (("momentum", 0.0),)),
        keras.Adagrad:
            _KerasRule("adagrad",
                       lambda o: [("accumulator", o.initial_accumulator_value + o.epsilon)],
                       lambda o, lr, t: [lr]),
        keras.Adam:
            _KerasRule("adam", lambda o: [("m", 0.0), ("v", 0.0)], _adam_hyperparameters,
                       (("amsgrad", False),)),
        keras.Ftrl:
            _KerasRule("ftrl", lambda o: [("accum", o.initial_accumulator_value), ("linear", 0.0)],
                       _ftrl_hyperparameters),
    }


def supported_optimizers() -> Tuple[str, ...]:
    """Names of the Keras optimizers that update Embedding Variables."""
    return tuple(f"tf.keras.optimizers.{cls.__name__}" for cls in _rules())


# Base optimizer settings without a fused form: name -> values that mean "off".
_UNSUPPORTED_SETTINGS = {
    "clipnorm": (None, 0),
    "clipvalue": (None, 0),
    "global_clipnorm": (None, 0),
    "weight_decay": (None, 0),
    "use_ema": (False,),
    "gradient_accumulation_steps": (None, 1),
    "loss_scale_factor": (None, 1),
}


def _rule_for(optimizer, variable):
    """The rule of `optimizer`'s exact class (subclasses may change the math).

  Raises:
    TypeError: no fused update for this optimizer (lists the supported ones).
    ValueError: a setting without a fused form (names it and its value).
  """
    rule = _rules().get(type(optimizer))
    if rule is None:
        raise TypeError(f"{type(optimizer).__name__} cannot update Embedding Variable "
                        f"'{variable.name}': sok-ev has fused updates for the Keras optimizers "
                        f"{', '.join(supported_optimizers())} (and the tf.compat.v1.train "
                        f"optimizers {', '.join(optimizers.SUPPORTED_OPTIMIZERS)}).")
    settings = dict(_UNSUPPORTED_SETTINGS)
    settings.update({name: (value,) for name, value in rule.required})
    for name, allowed in settings.items():
        value = getattr(optimizer, name, None)
        if value not in allowed:
            raise ValueError(f"{type(optimizer).__name__}({name}={value!r}) cannot update "
                             f"Embedding Variable '{variable.name}': sok-ev's fused update "
                             f"has no {name}; use {name}={allowed[0]!r} (or keep Embedding "
                             "Variables out of this optimizer).")
    return rule


def _update(optimizer, rule, tables):
    """The fused update of every `(grad, variable)` pair in `tables`."""
    lr = tf.cast(tf.convert_to_tensor(optimizer.learning_rate), tf.float32)
    iterations = tf.convert_to_tensor(optimizer.iterations)
    step = tf.cast(iterations + 1, tf.float32)
    global_step = tf.compat.v1.train.get_global_step()
    version = iterations if global_step is None else global_step
    return optimizers.fused_update(
        tables, rule.op_name, rule.hyperparameters(optimizer, lr, step),
        [(f"{optimizer.name}/{name}", value) for name, value in rule.slots(optimizer)], version)


@tf.autograph.experimental.do_not_convert
def apply_gradients(optimizer, grads_and_vars: Sequence, apply_dense=None):
    """`optimizer.apply_gradients(grads_and_vars)` for a Keras optimizer,
  with Embedding Variables among the variables.

  Args:
    optimizer: a supported tf.keras optimizer.
    grads_and_vars: (gradient, variable) pairs; an Embedding Variable's
      gradient is tf.IndexedSlices keyed by raw keys (None skips it).
    apply_dense: how the other pairs are applied: `apply_dense(optimizer,
      grads, variables)` (default: Keras's own `apply`, unhooked).

  Returns:
    `optimizer.iterations`, as Keras's apply_gradients.

  Raises:
    TypeError: an unsupported optimizer, or a dense gradient for an
      Embedding Variable.
    ValueError: an unsupported setting, or no gradient at all.
  """
    apply_dense = apply_dense or _originals.get("apply", type(optimizer).apply)
    pairs = list(grads_and_vars)
    tables = [(g, v) for g, v in pairs if isinstance(v, EmbeddingVariable)]
    dense = [(g, v) for g, v in pairs if not isinstance(v, EmbeddingVariable)]
    if not tables:
        apply_dense(optimizer, [g for g, _ in dense], [v for _, v in dense])
        return optimizer.iterations
    rule = _rule_for(optimizer, tables[0][1])
    tables = [(g, v) for g, v in tables if g is not None]
    if not tables and all(g is None for g, _ in dense):
        raise ValueError("No gradients provided for any variable.")
    with tf.name_scope(optimizer.name):
        updates = _update(optimizer, rule, tables)
    # The updates read `iterations` before Keras increments it once per step.
    with tf.control_dependencies(updates):
        if any(g is not None for g, _ in dense):
            apply_dense(optimizer, [g for g, _ in dense], [v for _, v in dense])
        else:
            optimizer.iterations.assign_add(1)
    return optimizer.iterations


_originals = {}


def install_keras_optimizer_hook() -> None:
    """Lets `tf.keras.optimizers` update Embedding Variables (see the module
  docstring). Wraps the public `tf.keras.optimizers.Optimizer.apply`;
  variables that are not Embedding Variables go through Keras's original
  code. Idempotent."""
    if _originals:
        return
    base = tf.keras.optimizers.Optimizer
    original = base.apply
    _originals["apply"] = original
    _originals["own"] = "apply" in vars(base)

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            return original(self, grads, trainable_variables)
        trainable_variables = list(trainable_variables)
        if not any(isinstance(v, EmbeddingVariable) for v in trainable_variables):
            return original(self, grads, trainable_variables)
        apply_gradients(self, zip(grads, trainable_variables), original)
        return None

    apply.__doc__ = original.__doc__
    base.apply = apply


def uninstall_keras_optimizer_hook() -> None:
    """Restores Keras's original `Optimizer.apply`."""
    if not _originals:
        return
    base = tf.keras.optimizers.Optimizer
    if _originals["own"]:
        base.apply = _originals["apply"]
    else:
        del base.apply  # back to the inherited one
    _originals.clear()


def keras_optimizer_hook_installed() -> bool:
    """Whether install_keras_optimizer_hook() is in effect."""
    return bool(_originals)
