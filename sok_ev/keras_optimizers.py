"""Keras optimizers (`tf.keras.optimizers.*`) updating Embedding Variables.

Both Keras flavours TensorFlow 2.21 can put under `tf.keras` are hooked:
* Keras 3 (the default): `install_keras_optimizer_hook()` (run by
  `sok_ev.init()`) wraps the public `tf.keras.optimizers.Optimizer.apply`
  (which `apply_gradients` calls);
* legacy Keras 2 (`TF_USE_LEGACY_KERAS=1` with the `tf_keras` package),
  whose optimizers have no `apply`: it wraps
  `tf.keras.optimizers.Optimizer.apply_gradients` instead. (tf_keras's
  `tf.keras.optimizers.legacy.*` optimizers are not hooked. In a TF1
  graph, tf_keras's own apply_gradients leaves dense variables unchanged,
  hooked or not; TF1 scripts use tf.compat.v1.train optimizers, which
  `sok_ev.optimizers` hooks.)
Either way the Embedding Variables among the variables are updated by the
fused native op (`SokEv>SparseApplyOptimizer`, through
`sok_ev.optimizers.fused_update`), then the other variables go through
Keras unchanged, and Keras counts the step once (`optimizer.iterations`).
Without the hook, `apply_gradients(optimizer, grads_and_vars)` does the
same for one call.

Supported, with the arithmetic of the same Keras optimizer applied to each
looked-up row (duplicate keys summed first):
  SGD (momentum and nesterov too), Adagrad, Adam and AdamW (amsgrad False),
  Ftrl, RMSprop.
Keras updates a dense variable from a dense view of its gradient, so rows
outside the batch still move under Adam (their moments decay) and can move
under Ftrl and RMSprop (its velocity decays, and with momentum the row
keeps its last step). sok-ev is lazy, as DeepRec: only the rows of the
batch's keys change, with Keras's formulas, and Adam's bias correction uses
the optimizer's step count (`iterations + 1`) for every row. SGD and Adagrad
equal Keras on a dense variable row for row; RMSprop does while every row is
in every batch.

Keras's Adagrad divides by sqrt(accumulator + epsilon); the fused kernel
divides by sqrt(accumulator), so the table's `accumulator` slot holds
Keras's accumulator plus epsilon (it starts at initial_accumulator_value +
epsilon), which gives Keras's update exactly. tf_keras's SGD, Adagrad,
Adam, Ftrl and RMSprop have the same formulas; its Adam's `adaptive_epsilon`
must stay False.

Slots live in the Embedding Variable's table, in columns named
`<prefix>/<slot>` (`adagrad/accumulator`, `adam/m`, ...), and are saved
with the table. The prefix must be the same when a checkpoint is restored
into freshly built objects, but Keras 3 names unnamed optimizers uniquely per
process (`adagrad`, `adagrad_1`, ...), by creation order. So the prefix is
the optimizer's name with Keras's `_<n>` suffix dropped when the rest is the
name Keras gives the class (`sgd`, `adagrad`, `adam`, `adam_w`, `ftrl`,
`rm_sprop`); any other name is kept as is. Two live optimizers that would
use the same column of one Embedding Variable (two unnamed Adagrads on one
table, say) raise a ValueError at the update: give one an explicit `name=`.

Keras's decoupled weight decay (`weight_decay` of any of them; AdamW, Adam
with a decay of 4e-3 by default) is applied as Keras applies it, `row -= row
* weight_decay * lr` before the update, to the rows of the batch's keys only
(a dense variable decays every row), and not to variables the optimizer
excludes (`exclude_from_weight_decay`).

Keras's `clipnorm` and `clipvalue` clip a table's gradient as they clip a
dense variable's: on its rows summed by key, by the optimizer's own clipping.
With several workers each clips the shard it owns, so clipnorm takes the
norm of a shard's gradient, not of the whole table's. `global_clipnorm`
scales every gradient of the step, the tables' and the dense ones, by
Keras's factor for their joint norm (the tables' rows summed by key; with
several workers the tables' part summed over all of them, so every worker
scales by the same factor).

Keras 3's loss-scale optimizer (`tf.keras.optimizers.LossScaleOptimizer`,
which `model.compile` puts around the optimizer under a `mixed_float16`
policy) takes Embedding Variables too, with Keras's own steps: when every
gradient is finite, the gradients are divided by its `dynamic_scale` and
applied by the inner optimizer (the fused update for the tables), and the
scale doubles after `dynamic_growth_steps` such steps; otherwise nothing is
applied, `iterations` stays and the scale halves. A table's gradient holds
only its looked-up rows, so those are what is checked and unscaled. With
several workers the finite check is agreed over all of them (the minimum),
so that every worker skips the same steps: a table's gradient is split
between its owners. tf_keras's (`tf.keras.mixed_precision.
LossScaleOptimizer` under TF_USE_LEGACY_KERAS=1) takes them with its own
rules: gradients arrive unscaled, and a skipped step counts in `iterations`.

Refused with a ValueError naming the setting (they have no fused form yet):
use_ema, gradient_accumulation_steps and loss_scale_factor when an Embedding
Variable is among the variables. Any other Keras optimizer (subclasses
included: they may change the arithmetic) raises a TypeError listing the
supported ones.
"""

import dataclasses
import re
import sys
import weakref
from typing import Callable, Dict, List, Sequence, Tuple

import tensorflow as tf

from sok_ev import communication
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
    # The op's boolean attributes for this optimizer (use_nesterov, centered).
    flags: Callable[[object], Dict[str, bool]] = lambda o: {}
    # Whether the op is given the gradient times this step's learning rate.
    gradient_times_lr: bool = False


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


# Keras's SGD with momentum keeps m = momentum * m - lr * g and adds m (plus,
# with nesterov, momentum * m - lr * g instead). TensorFlow 1's fused
# Momentum keeps a = momentum * a + g' and subtracts lr' * a (nesterov: lr' *
# g' + lr' * momentum * a): given g' = lr * g and lr' = 1 its slot is -m, bit
# for bit, and it takes Keras's steps, learning rate schedules included.
_SGD_MOMENTUM = _KerasRule("momentum",
                           lambda o: [("momentum", 0.0)],
                           lambda o, lr, t: [1.0, o.momentum],
                           flags=lambda o: {"use_nesterov": bool(o.nesterov)},
                           gradient_times_lr=True)


def _rules():
    keras = tf.keras.optimizers
    return {
        keras.SGD:
            _KerasRule("sgd", lambda o: [], lambda o, lr, t: [lr]),
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
        # AdamW is Adam with a weight_decay (4e-3) by default: see _weight_decay.
        keras.AdamW:
            _KerasRule("adam", lambda o: [("m", 0.0), ("v", 0.0)], _adam_hyperparameters,
                       (("amsgrad", False),)),
        # The fused RMSProp is TensorFlow 1's, whose arithmetic is Keras's:
        # the momentum slot holds the last step (the increment when momentum
        # is 0) and epsilon is added under the square root.
        keras.RMSprop:
            _KerasRule("rmsprop",
                       lambda o: [("velocity", 0.0), ("momentum", 0.0)] +
                       ([("average_gradient", 0.0)] if o.centered else []),
                       lambda o, lr, t: [lr, o.rho, o.momentum, o.epsilon],
                       flags=lambda o: {"centered": bool(o.centered)}),
    }


def supported_optimizers() -> Tuple[str, ...]:
    """Names of the Keras optimizers that update Embedding Variables."""
    return tuple(f"tf.keras.optimizers.{cls.__name__}" for cls in _rules())


# Base optimizer settings without a fused form: name -> values that mean "off".
_UNSUPPORTED_SETTINGS = {
    "use_ema": (False,),
    "gradient_accumulation_steps": (None, 1),
    "loss_scale_factor": (None, 1),
    # tf_keras's Adam only (Keras 3 has no such attribute: None).
    "adaptive_epsilon": (False, None),
}


def _rule_for(optimizer, variable):
    """The rule of `optimizer`'s exact class (subclasses may change the math).

  Raises:
    TypeError: no fused update for this optimizer (lists the supported ones).
    ValueError: a setting without a fused form (names it and its value).
  """
    rule = _rules().get(type(optimizer))
    if rule is not None and type(optimizer) is tf.keras.optimizers.SGD and optimizer.momentum:
        rule = _SGD_MOMENTUM
    if rule is None:
        raise TypeError(f"{type(optimizer).__name__} cannot update Embedding Variable "
                        f"'{variable.name}': sok-ev has fused updates for the Keras optimizers "
                        f"{', '.join(supported_optimizers())} (and the tf.compat.v1.train "
                        f"optimizers {', '.join(optimizers.SUPPORTED_OPTIMIZERS)}).")
    settings = dict(_UNSUPPORTED_SETTINGS)
    settings.update({name: (value,) for name, value in rule.required})
    if not hasattr(optimizer, "_use_weight_decay"):
        # An optimizer whose decay sok-ev cannot ask about a variable.
        settings["weight_decay"] = (None, 0)
    if not hasattr(optimizer, "_clip_gradients"):
        settings.update(clipnorm=(None, 0), clipvalue=(None, 0))
    for name, allowed in settings.items():
        value = getattr(optimizer, name, None)
        if value not in allowed:
            raise ValueError(f"{type(optimizer).__name__}({name}={value!r}) cannot update "
                             f"Embedding Variable '{variable.name}': sok-ev's fused update "
                             f"has no {name}; use {name}={allowed[0]!r} (or keep Embedding "
                             "Variables out of this optimizer).")
    return rule


def _keras_default_name(cls) -> str:
    """The name Keras 3 gives an unnamed optimizer of `cls` before making it
  unique: the class name in snake case, as Keras writes it (`SGD` -> `sgd`,
  `Adagrad` -> `adagrad`, `RMSprop` -> `rm_sprop`)."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", cls.__name__)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def slot_prefix(optimizer) -> str:
    """The prefix of `optimizer`'s slot columns in an Embedding Variable's
  table (`<prefix>/<slot>`): its name, without the `_<n>` suffix Keras adds
  to the default name of its class (so `adagrad_3` -> `adagrad`, while
  `item_adagrad` stays as it is)."""
    default = _keras_default_name(type(optimizer))
    if re.fullmatch(re.escape(default) + r"_\d+", optimizer.name):
        return default
    return optimizer.name


# id(Embedding Variable) -> (weakref to it, {slot column: weakref to the
# optimizer using it}): whose state each column holds. Weak both ways, so
# neither tables nor optimizers are kept alive.
_column_owners: Dict[int, Tuple[weakref.ref, Dict[str, weakref.ref]]] = {}


def _owners_of(variable, create=False):
    entry = _column_owners.get(id(variable))
    if entry is not None and entry[0]() is variable:
        return entry[1]
    if not create:
        return {}
    owners = {}
    _column_owners[id(variable)] = (weakref.ref(variable), owners)
    weakref.finalize(variable, _column_owners.pop, id(variable), None)
    return owners


def _check_column_owners(optimizer, variables, columns):
    """Raises ValueError if another live optimizer keeps its state in one of
  `columns` of one of `variables`: they would silently share it."""
    for variable in variables:
        owners = _owners_of(variable)
        for column in columns:
            owner = owners[column]() if column in owners else None
            if owner is not None and owner is not optimizer:
                cls, prefix = type(optimizer).__name__, slot_prefix(optimizer)
                why, taken = "", repr(prefix)
                if prefix == _keras_default_name(type(optimizer)):
                    why = (" (sok-ev drops the '_<n>' suffix of Keras's default optimizer "
                           "names, so that checkpoints restore into freshly built optimizers)")
                    taken += f" or '{prefix}_<n>'"
                example = f"{variable.name.split(':')[0].replace('/', '_')}_{prefix}"
                raise ValueError(
                    f"{cls}(name={optimizer.name!r}) and {type(owner).__name__}"
                    f"(name={owner.name!r}) would both keep state in column '{column}' of "
                    f"Embedding Variable '{variable.name}'{why}. Give one of them an explicit "
                    f"name=... other than {taken}, e.g. tf.keras.optimizers.{cls}(..., "
                    f"name='{example}').")


def _claim_columns(optimizer, variables, columns):
    for variable in variables:
        owners = _owners_of(variable, create=True)
        for column in columns:
            owners[column] = weakref.ref(optimizer)


def _iterations_clock(optimizer):
    """The step a Keras optimizer's updates are versioned in: its
  `iterations` (Keras advances no global step), read when called; the
  global step once the optimizer is gone."""
    optimizer = weakref.ref(optimizer)

    def clock():
        live = optimizer()
        if live is None:
            return optimizers.global_step()
        return tf.cast(tf.convert_to_tensor(live.iterations), tf.int64)

    return clock


def _current_learning_rate(optimizer) -> tf.Tensor:
    """This step's learning rate. tf_keras's `learning_rate` of a schedule is
  the value its own apply_gradients last computed, which has not run yet
  for this step: the schedule is evaluated at `iterations` here, as Keras 3
  and tf_keras's dense path do."""
    schedule = getattr(optimizer, "_learning_rate", None)
    if isinstance(schedule, tf.keras.optimizers.schedules.LearningRateSchedule):
        return tf.convert_to_tensor(schedule(optimizer.iterations))
    return tf.convert_to_tensor(optimizer.learning_rate)


def _summed_by_key(grad, variable):
    """An Embedding Variable's gradient with each key once, its rows summed:
  the nonzero rows of the same variable's dense gradient."""
    keys, index = tf.unique(tf.cast(grad.indices, variable.key_dtype))
    return tf.IndexedSlices(tf.math.unsorted_segment_sum(grad.values, index, tf.size(keys)), keys)


def _clipped(optimizer, grad, variable):
    """Keras's clipnorm or clipvalue (the optimizer's own `_clip_gradients`)
  of an Embedding Variable's gradient, on its rows summed by key: what Keras
  clips of a dense variable's gradient, whose other rows are zeros."""
    summed = _summed_by_key(grad, variable)
    return tf.IndexedSlices(optimizer._clip_gradients([summed.values])[0], summed.indices)  # pylint: disable=protected-access


def _map_values(grad, fn):
    """`grad` with `fn` applied to its values: an IndexedSlices' rows (its
  keys kept), a dense gradient whole; None stays None."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(fn(grad.values), grad.indices, grad.dense_shape)
    return fn(grad)


def _scaled(grad, scale):
    return _map_values(grad, lambda values: values * tf.cast(scale, values.dtype))


def _clipped_by_global_norm(optimizer, tables, dense):
    """Keras's `global_clipnorm` over the whole step: every gradient scaled
  by clip / max(norm, clip) (NaN when the norm is not finite), the norm that
  of the dense gradients and of each table's rows summed by key (what its
  dense gradient holds), the tables' part summed over the workers (each
  holds the shard it owns). Returns (tables, dense), clipped."""
    clip = tf.cast(optimizer.global_clipnorm, tf.float32)
    tables = [(_summed_by_key(g, v), v) for g, v in tables]
    table_squares = [tf.reduce_sum(tf.square(g.values)) for g, _ in tables]
    squares = [tf.reduce_sum(tf.square(tf.convert_to_tensor(g))) for g, _ in dense if g is not None]
    # Every worker joins the reduction, with or without table gradients.
    tables_total = tf.add_n(table_squares) if table_squares else tf.constant(0.0)
    if communication.world_size() > 1:
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
        tables_total = hvd.allreduce(tables_total, op=hvd.Sum, name="sok_ev_keras_global_norm")
    squares.append(tables_total)
    norm = tf.sqrt(tf.reduce_sum(tf.stack(squares)))
    # Keras's formula (keras.optimizers clip_by_global_norm).
    scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
    return ([(_scaled(g, scale), v) for g, v in tables], [(_scaled(g, scale), v) for g, v in dense])


def _weight_decay(optimizer, tables, lr):
    """Keras's decoupled weight decay (`weight_decay`, AdamW's 4e-3 by
  default), before the optimizer's own update and lazily, as every update of
  a table is: each row of the batch's keys becomes `row - row * weight_decay
  * lr` (Keras's formula, which a dense variable applies to every row), by
  the fused SGD update of the gradient `row * weight_decay`. Variables the
  optimizer excludes (`exclude_from_weight_decay`) are left. Returns the
  update ops."""
    decay = getattr(optimizer, "weight_decay", None)
    if not decay:
        return []
    pairs = []
    for grad, variable in tables:
        if not optimizer._use_weight_decay(variable):  # pylint: disable=protected-access
            continue
        keys, _ = tf.unique(tf.cast(grad.indices, variable.key_dtype))
        rows = variable.sparse_read(keys)
        pairs.append((tf.IndexedSlices(rows * tf.cast(decay, tf.float32), keys), variable))
    return optimizers.fused_update(pairs, "sgd", [lr], [], _iterations_clock(optimizer))


def _update(optimizer, rule, tables):
    """The fused update of every `(grad, variable)` pair in `tables`, after
  their weight decay.

  Raises:
    ValueError: another live optimizer uses the same slot columns of one of
      the variables (before anything changes).
  """
    slots = [(f"{slot_prefix(optimizer)}/{name}", value) for name, value in rule.slots(optimizer)]
    columns = [column for column, _ in slots]
    variables = [v for _, v in tables]
    _check_column_owners(optimizer, variables, columns)
    lr = tf.cast(_current_learning_rate(optimizer), tf.float32)
    step = tf.cast(tf.convert_to_tensor(optimizer.iterations) + 1, tf.float32)
    if getattr(optimizer, "clipnorm", None) or getattr(optimizer, "clipvalue", None):
        tables = [(_clipped(optimizer, g, v), v) for g, v in tables]
    decays = _weight_decay(optimizer, tables, lr)
    if rule.gradient_times_lr:
        tables = [(_scaled(g, lr), v) for g, v in tables]
    with tf.control_dependencies(decays):
        updates = optimizers.fused_update(tables, rule.op_name,
                                          rule.hyperparameters(optimizer, lr, step), slots,
                                          _iterations_clock(optimizer), **rule.flags(optimizer))
    _claim_columns(optimizer, variables, columns)
    return updates


def _all_finite(grads):
    """A bool tensor: whether every gradient is finite, each Embedding
  Variable's (and any IndexedSlices') by its rows, agreed over the workers."""
    checks = [
        tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
        for g in grads
        if g is not None
    ]
    finite = tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
    if communication.world_size() > 1:
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
        finite = hvd.allreduce(tf.cast(finite, tf.int32),
                               op=hvd.Min,
                               name="sok_ev_keras_loss_scale_finite") > 0
    return finite


def _unscaled(grad, scale):
    # Divided, as Keras divides (not times the reciprocal).
    return _map_values(grad, lambda values: values / tf.cast(scale, values.dtype))


def _loss_scaled_apply(optimizer, pairs):
    """Keras 3 LossScaleOptimizer's step (its `_common_apply`) on `pairs`,
  Embedding Variables among them: built on the dense variables only (a
  table's slots live in it), the inner optimizer's step through `_apply`."""
    dense = [v for _, v in pairs if not isinstance(v, EmbeddingVariable)]
    if not optimizer.built:
        with tf.name_scope(optimizer.name):
            optimizer.build(dense)
        optimizer.built = True
    inner = optimizer.inner_optimizer
    grads = [g for g, _ in pairs]

    def finite_step():
        scale = optimizer.dynamic_scale

        def unscale(g, v):
            # Keras leaves a gradient that overwrites its variable as it is.
            overwrite = optimizer._overwrite_variable_with_gradient(v)  # pylint: disable=protected-access
            return g if overwrite else _unscaled(g, scale)

        unscaled = [(unscale(g, v), v) for g, v in pairs]
        with tf.control_dependencies([
                op for op in _apply(inner, unscaled, _default_apply_dense(type(inner)))
                if op is not None
        ]):
            grow = tf.equal(optimizer.step_counter, optimizer.dynamic_growth_steps - 1)

        def upscale():
            optimizer.step_counter.assign(0)
            optimizer.dynamic_scale.assign(optimizer.dynamic_scale * 2.0)

        def count():
            optimizer.step_counter.assign_add(1)

        tf.cond(grow, upscale, count)

    def skipped_step():
        optimizer.step_counter.assign(0)
        optimizer.dynamic_scale.assign(optimizer.dynamic_scale * 0.5)

    tf.cond(_all_finite(grads), finite_step, skipped_step)
    return [optimizer.iterations]


def _legacy_loss_scaled_apply(optimizer, pairs):
    """tf_keras LossScaleOptimizerV3's `apply_gradients` on `pairs`,
  Embedding Variables among them. Its gradients arrive unscaled
  (`get_unscaled_gradients`, as its `minimize` and `fit` do); its dynamic
  loss scale is updated from one scalar, finite when every gradient is
  (the tables' by their rows; agreed over the workers), and the inner
  optimizer's step runs through `_apply` when it says so; a skipped step
  still counts in `iterations`, tf_keras's rule. Built on the dense
  variables only."""
    with tf.init_scope():
        optimizer.build([v for _, v in pairs if not isinstance(v, EmbeddingVariable)])
    inner = optimizer.inner_optimizer
    should_apply = True
    if optimizer.dynamic:
        finite = _all_finite([g for g, _ in pairs])
        signal = tf.where(finite, tf.constant(0.0), tf.constant(float("inf")))
        _, should_apply = optimizer._loss_scale.update([signal])  # pylint: disable=protected-access

    def apply():
        ops = [
            op for op in _apply(inner, pairs, _default_apply_dense(type(inner))) if op is not None
        ]
        with tf.control_dependencies(ops):
            return tf.no_op()

    def skip():
        inner.iterations.assign_add(1, read_value=False)
        return tf.no_op()

    tf.__internal__.smart_cond.smart_cond(should_apply, apply, skip)
    return [optimizer.iterations]


def legacy_keras() -> bool:
    """Whether `tf.keras` is legacy Keras 2 (tf_keras, under
  TF_USE_LEGACY_KERAS=1), whose optimizers have `apply_gradients` but no
  Keras 3 `apply`."""
    return not hasattr(tf.keras.optimizers.Optimizer, "apply")


def _loss_scale_optimizer_classes() -> Tuple[type, ...]:
    """The loss-scale optimizer classes of this `tf.keras` whose update
  method overrides the base optimizer's (Keras 3: LossScaleOptimizer.apply;
  tf_keras: LossScaleOptimizerV3.apply_gradients, behind the public
  tf.keras.mixed_precision.LossScaleOptimizer)."""
    if not legacy_keras():
        return (tf.keras.optimizers.LossScaleOptimizer,)
    public = tf.keras.mixed_precision.LossScaleOptimizer
    # tf_keras makes the public class a factory; the class wrapping the
    # optimizers sok-ev hooks sits beside it.
    wrapping = getattr(sys.modules.get(public.__module__), "LossScaleOptimizerV3", None)
    return (wrapping,) if isinstance(wrapping, type) else ()


def _is_loss_scale_optimizer(optimizer) -> bool:
    if legacy_keras():
        return isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
    return isinstance(optimizer, tf.keras.optimizers.LossScaleOptimizer)


def _default_apply_dense(optimizer_class):
    """Keras's own (unhooked) update of dense variables, as
  `apply_dense(optimizer, grads, variables)`."""
    if legacy_keras():
        original = _original(optimizer_class, "apply_gradients")
        return lambda optimizer, grads, variables: original(optimizer, list(zip(grads, variables)))
    return _original(optimizer_class, "apply")


# Optimizers made data parallel by sok_ev.keras.DistributedOptimizer.
_data_parallel = weakref.WeakSet()


def make_data_parallel(optimizer) -> None:
    """Makes `optimizer`'s steps average gradients over the Horovod workers
  (see `_average_over_workers`)."""
    _data_parallel.add(optimizer)


def is_data_parallel(optimizer) -> bool:
    return optimizer in _data_parallel


def _average_over_workers(pairs):
    """`pairs` with each gradient averaged over the workers, as the
  gradient of the mean of the workers' losses: dense ones by Horovod's
  allreduce (average); an Embedding Variable's by dividing it by the worker
  count, since its lookup's backward exchange already summed every worker's
  contribution at the key's owner (an allreduce would be wrong: sok-ev
  refuses it)."""
    workers = communication.world_size()
    if workers == 1:
        return pairs
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    dense = [
        i for i, (g, v) in enumerate(pairs)
        if g is not None and not isinstance(v, EmbeddingVariable)
    ]
    # Sparse gradients of dense variables (keras.layers.Embedding) go dense.
    reduced = hvd.grouped_allreduce([tf.convert_to_tensor(pairs[i][0]) for i in dense],
                                    op=hvd.Average,
                                    name="sok_ev_keras_dense_gradients") if dense else []
    out = list(pairs)
    for i, grad in zip(dense, reduced):
        out[i] = (grad, pairs[i][1])
    for i, (g, v) in enumerate(pairs):
        if g is not None and isinstance(v, EmbeddingVariable):
            out[i] = (_unscaled(g, workers), v)
    return out


def _apply(optimizer, pairs, apply_dense):
    """The step of `apply_gradients` below: the ops it ran or built, the
  fused updates first, then Keras's own step (dense update or count)."""
    if is_data_parallel(optimizer):
        pairs = _average_over_workers(pairs)
    tables = [(g, v) for g, v in pairs if isinstance(v, EmbeddingVariable)]
    dense = [(g, v) for g, v in pairs if not isinstance(v, EmbeddingVariable)]
    if not tables:
        return [apply_dense(optimizer, [g for g, _ in dense], [v for _, v in dense])]
    if _is_loss_scale_optimizer(optimizer):
        _rule_for(optimizer.inner_optimizer, tables[0][1])  # refuses before anything changes
        if legacy_keras():
            return _legacy_loss_scaled_apply(optimizer, pairs)
        return _loss_scaled_apply(optimizer, pairs)
    rule = _rule_for(optimizer, tables[0][1])
    tables = [(g, v) for g, v in tables if g is not None]
    if not tables and all(g is None for g, _ in dense):
        raise ValueError("No gradients provided for any variable.")
    global_clip = getattr(optimizer, "global_clipnorm", None)
    if global_clip:
        tables, dense = _clipped_by_global_norm(optimizer, tables, dense)
    with tf.name_scope(optimizer.name):
        updates = _update(optimizer, rule, tables)
    # The updates read `iterations` before Keras increments it once per step.
    with tf.control_dependencies(updates):
        if any(g is not None for g, _ in dense):
            try:
                # The dense gradients are clipped already, by the joint norm.
                optimizer.global_clipnorm = None
                step = apply_dense(optimizer, [g for g, _ in dense], [v for _, v in dense])
            finally:
                optimizer.global_clipnorm = global_clip
        else:
            step = optimizer.iterations.assign_add(1)
    return list(updates) + [step]


@tf.autograph.experimental.do_not_convert
def apply_gradients(optimizer, grads_and_vars: Sequence, apply_dense=None):
    """`optimizer.apply_gradients(grads_and_vars)` for a Keras optimizer,
  with Embedding Variables among the variables.

  Args:
    optimizer: a supported tf.keras optimizer (Keras 3 or tf_keras).
    grads_and_vars: (gradient, variable) pairs; an Embedding Variable's
      gradient is tf.IndexedSlices keyed by raw keys (None skips it).
    apply_dense: how the other pairs are applied: `apply_dense(optimizer,
      grads, variables)` (default: Keras's own `apply`, or tf_keras's own
      `apply_gradients`, unhooked).

  Returns:
    `optimizer.iterations`, as Keras's apply_gradients.

  Raises:
    TypeError: an unsupported optimizer, or a dense gradient for an
      Embedding Variable.
    ValueError: an unsupported setting, another live optimizer using the
      same slot columns, or no gradient at all.
  """
    _apply(optimizer, list(grads_and_vars), apply_dense or _default_apply_dense(type(optimizer)))
    return optimizer.iterations


# (class, attribute) -> (original function, whether the class defined it).
_originals = {}


def _original(cls, attribute):
    """`cls.<attribute>` as Keras defines it, unhooked."""
    for klass in cls.__mro__:
        if (klass, attribute) in _originals:
            return _originals[(klass, attribute)][0]
        if attribute in vars(klass):
            return vars(klass)[attribute]
    raise AttributeError(f"{cls.__name__} has no {attribute}")


def _patch(cls, attribute, wrapper):
    original = getattr(cls, attribute)
    _originals[(cls, attribute)] = (original, attribute in vars(cls))
    wrapped = wrapper(original)
    wrapped.__doc__ = original.__doc__
    setattr(cls, attribute, wrapped)


def _has_embedding_variable(variables):
    return variables is not None and any(isinstance(v, EmbeddingVariable) for v in variables)


def _hooked_apply(original):
    """Keras 3's `Optimizer.apply(grads, trainable_variables)`, hooked."""

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            return original(self, grads, trainable_variables)
        trainable_variables = list(trainable_variables)
        if not _has_embedding_variable(trainable_variables) and not is_data_parallel(self):
            return original(self, grads, trainable_variables)
        apply_gradients(self, zip(grads, trainable_variables), original)
        return None

    return apply


def _hooked_apply_gradients(original):
    """tf_keras's `Optimizer.apply_gradients(grads_and_vars, ...)`, hooked.
  Returns what tf_keras returns eagerly (`iterations`); in a graph, a
  tensor (`iterations` after the step) that runs the Embedding Variables'
  updates and tf_keras's own step when fetched."""

    @tf.autograph.experimental.do_not_convert
    def apply_gradients_(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)  # may be an iterator
        if not _has_embedding_variable([v for _, v in pairs]) and not is_data_parallel(self):
            return original(self, pairs, *args, **kwargs)

        def apply_dense(optimizer, grads, variables):
            return original(optimizer, list(zip(grads, variables)), *args, **kwargs)

        ops = _apply(self, pairs, apply_dense)
        if tf.executing_eagerly():
            return self.iterations
        with tf.control_dependencies([op for op in ops if op is not None]):
            return tf.identity(self.iterations)

    return apply_gradients_


def install_keras_optimizer_hook() -> None:
    """Lets `tf.keras.optimizers` update Embedding Variables (see the module
  docstring): wraps Keras 3's `Optimizer.apply`, or tf_keras's
  `Optimizer.apply_gradients` under TF_USE_LEGACY_KERAS=1, and the
  loss-scale optimizer's override of it; variables that are not Embedding
  Variables go through Keras's original code. Idempotent."""
    if _originals:
        return
    if legacy_keras():
        _patch(tf.keras.optimizers.Optimizer, "apply_gradients", _hooked_apply_gradients)
        # tf_keras's LossScaleOptimizerV3 overrides apply_gradients: hooked too.
        for cls in _loss_scale_optimizer_classes():
            _patch(cls, "apply_gradients", _hooked_apply_gradients)
        return
    _patch(tf.keras.optimizers.Optimizer, "apply", _hooked_apply)
    # LossScaleOptimizer overrides apply: its own hook, taking tables.
    for cls in _loss_scale_optimizer_classes():
        _patch(cls, "apply", _hooked_apply)


def uninstall_keras_optimizer_hook() -> None:
    """Restores every method install_keras_optimizer_hook() wrapped."""
    for (cls, attribute), (original, own) in _originals.items():
        if own:
            setattr(cls, attribute, original)
        else:
            delattr(cls, attribute)  # back to the inherited one
    _originals.clear()


def keras_optimizer_hook_installed() -> bool:
    """Whether install_keras_optimizer_hook() is in effect."""
    return bool(_originals)
