"""Stock `tf.compat.v1.train` optimizers updating Embedding Variables.

An Embedding Variable's gradient is IndexedSlices keyed by raw keys; it is
applied by one fused native op (`SokEv>SparseApplyOptimizer`) whose slots live
beside each row in the variable's table. Two ways in:

* `install_optimizer_hook()` (run by `sok_ev.init()`): the user's script stays
  unchanged. It wraps five methods of `tf.compat.v1.train.Optimizer`, each
  delegating to TensorFlow's original for anything that is not an Embedding
  Variable:
    - `optimizer._get_processor`: an Embedding Variable gets a processor
      whose update is the fused op;
    - `Optimizer.apply_gradients`: with several Embedding Variables, their
      processors hand their updates to the last one, which applies all of
      them in one op (one TF op a step instead of one per table; the GPU
      runs the tables side by side);
    - `Optimizer._zeros_slot`, `_get_or_make_slot`,
      `_get_or_make_slot_with_initializer`: a slot of an Embedding Variable
      is a descriptor of a slot in its table, not a dense variable.
  Checked against TensorFlow 2.21 by tests/test_optimizers.py.
* `OptimizerWrapper(optimizer)`: patches nothing.

`SUPPORTED_OPTIMIZERS` lists the optimizers with a fused update; any other
raises TypeError naming them. Adam is lazy, as in DeepRec.
"""

import dataclasses
import threading
from typing import Callable, List, Optional, Tuple

import tensorflow as tf
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training import optimizer as optimizer_module

from sok_ev import embedding_gradients
from sok_ev._ops import host_memory_input, ops
from sok_ev.embedding_variable import EmbeddingVariable

_train = tf.compat.v1.train


@dataclasses.dataclass(frozen=True)
class _Rule:
    """How one optimizer class maps onto the fused op."""
    op_name: str
    # (slot name, initial value) in the op's slot order (cc/optimizers.h).
    slots: Callable[[object], List[Tuple[str, float]]]
    # Scalars in the op's hyperparameter order (sok_ev/cc/ops/optimizer_ops.cc);
    # read after the optimizer's _prepare().
    hyperparameters: Callable[[object], list]
    # apply(optimizer, pairs) -> update ops, for an optimizer whose update
    # needs more than one fused op with shared hyperparameters (e.g. state
    # kept per variable); None: fused_update of every pair at once.
    apply: Optional[Callable[[object, list], list]] = None


def _adam_hyperparameters(optimizer):
    beta1_power, beta2_power = optimizer._get_beta_accumulators()
    return [
        optimizer._lr_t, optimizer._beta1_t, optimizer._beta2_t, optimizer._epsilon_t, beta1_power,
        beta2_power
    ]


_RULES = {
    _train.GradientDescentOptimizer:
        _Rule("sgd", lambda o: [], lambda o: [o._learning_rate_tensor]),
    _train.AdagradOptimizer:
        _Rule("adagrad", lambda o: [("accumulator", o._initial_accumulator_value)],
              lambda o: [o._learning_rate_tensor]),
    _train.AdamOptimizer:
        _Rule("adam", lambda o: [("m", 0.0), ("v", 0.0)], _adam_hyperparameters),
    _train.FtrlOptimizer:
        _Rule(
            "ftrl", lambda o: [("accum", o._initial_accumulator_value), ("linear", 0.0)],
            lambda o: [
                o._learning_rate_tensor, o._learning_rate_power_tensor, o.
                _l1_regularization_strength_tensor, o._adjusted_l2_regularization_strength_tensor, o
                ._l2_shrinkage_regularization_strength_tensor
            ]),
    _train.MomentumOptimizer:
        _Rule("momentum", lambda o: [("momentum", 0.0)],
              lambda o: [o._learning_rate_tensor, o._momentum_tensor]),
    _train.RMSPropOptimizer:
        _Rule(
            "rmsprop", lambda o: [("rms", 1.0),
                                  ("momentum", 0.0)] + ([("mg", 0.0)]
                                                        if o._centered else []), lambda o:
            [o._learning_rate_tensor, o._decay_tensor, o._momentum_tensor, o._epsilon_tensor]),
}

SUPPORTED_OPTIMIZERS = tuple(f"tf.compat.v1.train.{cls.__name__}" for cls in _RULES)


def register_rule(optimizer_class, rule: _Rule) -> None:
    """Makes `optimizer_class` (a tf.compat.v1.train.Optimizer subclass)
  update Embedding Variables by `rule` (used by sok_ev.deeprec_optimizers)."""
    global SUPPORTED_OPTIMIZERS
    _RULES[optimizer_class] = rule
    SUPPORTED_OPTIMIZERS = tuple(f"tf.compat.v1.train.{cls.__name__}" for cls in _RULES)


def _rule_for(optimizer, variable):
    for cls in type(optimizer).__mro__:
        if cls in _RULES:
            return _RULES[cls]
    raise TypeError(f"{type(optimizer).__name__} cannot update Embedding Variable "
                    f"'{variable.name}': sok-ev has fused updates for "
                    f"{', '.join(SUPPORTED_OPTIMIZERS)}.")


class EmbeddingVariableSlot(trackable.Trackable):
    """What `optimizer.get_slot(embedding_variable, name)` returns: the slot
  lives in the variable's table, beside each row, under `table_slot_name`.

  It is optimizer state like a dense slot variable: `opt.variables()` lists
  it and `tf.train.Checkpoint(optimizer=opt)` tracks it. Its values are
  saved and restored with the table (Saver, tf.train.Checkpoint); the
  optimizer's checkpoint records only which table column it is, and a
  restore fails if the optimizer now names that column differently (the
  restored column would otherwise be silently ignored). Model-parallel like
  its table, so `hvd.broadcast_variables` does not copy it (see
  sok_ev/broadcast.py).
  """

    def __init__(self, primary, table_slot_name):
        self.primary = primary
        self.table_slot_name = table_slot_name

    # --- What TensorFlow and Horovod expect of optimizer state --------------

    @property
    def name(self):
        """`<variable>/<optimizer>/<slot>:0`, e.g. `var_0/Adagrad/accumulator:0`."""
        return f"{self.primary.name[:-2]}/{self.table_slot_name}:0"

    @property
    def dtype(self):
        return tf.float32

    @property
    def shape(self):
        """`[embedding_dim]`, as its Embedding Variable."""
        return self.primary.shape

    @property
    def device(self):
        return self.primary.device

    @property
    def op(self):
        """Its Embedding Variable's handle op."""
        return self.primary.op

    @property
    def graph(self):
        return self.primary.graph

    @property
    def trainable(self):
        return False

    @property
    def _in_graph_mode(self):
        return self.primary._in_graph_mode  # pylint: disable=protected-access

    @property
    def _graph_key(self):
        return self.primary._graph_key  # pylint: disable=protected-access

    def _serialize_to_tensors(self):
        with tf.device("/cpu:0"):
            return {trackable.VARIABLE_VALUE_KEY: tf.constant(self.table_slot_name)}

    def _restore_from_tensors(self, restored_tensors):
        saved_as = restored_tensors[trackable.VARIABLE_VALUE_KEY]
        return tf.debugging.Assert(tf.equal(saved_as, self.table_slot_name), [
            f"slot '{self.table_slot_name}' of Embedding Variable '{self.primary.name}' was "
            "saved as column", saved_as, "of its table: give the optimizer the name it had "
            "when the checkpoint was saved"
        ])

    # --- Reading it ----------------------------------------------------------

    def export(self):
        """Every key of the primary and its slot row: `(keys [n], values [n, dim])`.

    Raises:
      tf.errors.InvalidArgumentError: the slot does not exist yet (it is
        created by the optimizer's first update).
    """
        keys, rows, _, _, names, _ = self.primary.export_full()
        matches = tf.equal(names, self.table_slot_name)
        check = tf.debugging.assert_equal(
            tf.reduce_any(matches),
            True,
            message=f"slot {self.table_slot_name} of {self.primary.name} does not "
            "exist yet: the optimizer creates it at its first update")
        with tf.control_dependencies([check]):
            dim = self.primary.embedding_dim
            start = (1 + tf.argmax(tf.cast(matches, tf.int32), output_type=tf.int32)) * dim
            return tf.identity(keys), rows[:, start:start + dim]

    def __repr__(self):
        return (f"<sok_ev.EmbeddingVariableSlot '{self.table_slot_name}' of "
                f"'{self.primary.name}'>")


# Set on a graph tensor that holds one table's unique keys of a lookup
# although no Unique op produced it (mark_distinct_keys).
_DISTINCT_KEYS = "_sok_ev_distinct_keys"


def mark_distinct_keys(tensor):
    """Records that graph tensor `tensor` holds one table's unique keys of a
  lookup, passed on unchanged (sok_ev.LookupPipeline's unstaged copy of
  UniqueKeys' or UniqueOwnedKeys' output), so that an apply keyed by it skips
  deduplicating. Returns `tensor`."""
    setattr(tensor, _DISTINCT_KEYS, True)
    return tensor


def _keys_are_distinct(indices):
    """Whether `indices` are, provably, one table's unique keys straight from
  a lookup (an output of SokEv>UniqueKeys or SokEv>UniquePackedKeys, or of
  SokEv>UniqueOwnedKeys on an owner, or a tensor mark_distinct_keys marked,
  through Identity ops): the fused apply then skips deduplicating them. Only
  graphs (Session, tf.function) show a tensor's producer; eagerly the apply
  deduplicates."""
    tensor = indices
    while getattr(tensor, "op", None) is not None and tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    if getattr(tensor, _DISTINCT_KEYS, False):
        return True
    op = getattr(tensor, "op", None)
    return (op is not None and
            op.type in ("SokEv>UniqueKeys", "SokEv>UniquePackedKeys", "SokEv>UniqueOwnedKeys") and
            tensor.value_index < op.get_attr("N"))


def global_step():
    """The global step as int64 (0 without one): what tf.compat.v1
  optimizers version updated keys with."""
    step = _train.get_global_step()
    return tf.constant(0, tf.int64) if step is None else tf.cast(step, tf.int64)


def apply_to_embedding_variables(optimizer, grads_and_variables):
    """The fused update of Embedding Variables by `optimizer` (after its
  `_prepare()`): one op per device the variables live on.

  Args:
    optimizer: a supported tf.compat.v1.train optimizer.
    grads_and_variables: `(grad, variable)` pairs; each grad is
      tf.IndexedSlices whose indices are raw keys (duplicates are summed)
      and values `[n, embedding_dim]`.

  Returns:
    The update ops (one per device).

  Raises:
    TypeError: unsupported optimizer, or a dense gradient.
    ValueError: see check_gradient.
  """
    pairs = list(grads_and_variables)
    if not pairs:
        return []
    first = pairs[0][1]
    rule = _rule_for(optimizer, first)
    if rule.apply is not None:
        for _, variable in pairs:
            for slot_name, _ in rule.slots(optimizer):
                _slot_of(optimizer, variable, slot_name)  # so get_slot() finds it
        return rule.apply(optimizer, pairs)
    if rule.op_name == "adam" and optimizer._get_beta_accumulators()[0] is None:
        # Only the patch-free path gets here with no dense variable to carry
        # Adam's beta powers; the hook path creates them in _create_slots.
        for name, value in (("beta1_power", optimizer._beta1), ("beta2_power", optimizer._beta2)):
            optimizer._create_non_slot_variable(initial_value=value, name=name, colocate_with=first)
    slots = rule.slots(optimizer)
    for _, variable in pairs:
        for slot_name, _ in slots:
            _slot_of(optimizer, variable, slot_name)  # so get_slot() finds it
    return fused_update(pairs,
                        rule.op_name,
                        rule.hyperparameters(optimizer),
                        [(f"{optimizer.get_name()}/{name}", value) for name, value in slots],
                        global_step,
                        use_nesterov=bool(getattr(optimizer, "_use_nesterov", False)),
                        centered=bool(getattr(optimizer, "_centered", False)))


def check_gradient(grad, variable):
    """Refuses what the fused update cannot apply.

  Raises:
    TypeError: `grad` is not float32 tf.IndexedSlices keyed by raw keys: its indices
      must have the variable's key_dtype (int32 into an int64 table is
      widened; int64 into an int32 table would be cut, so it is refused).
    ValueError: its values are not [n, embedding_dim] (where known when the
      update is built), or, with several workers, `grad` went through a
      Horovod reduction (sok_ev.embedding_gradients.check_before_apply).
  """
    if not isinstance(grad, tf.IndexedSlices):
        raise TypeError(f"The gradient of Embedding Variable '{variable.name}' must be "
                        "tf.IndexedSlices keyed by raw keys (as sok_ev.lookup_sparse produces), "
                        f"got {type(grad).__name__}")
    key_dtype = grad.indices.dtype
    if key_dtype != variable.key_dtype and not (key_dtype == tf.int32 and
                                                variable.key_dtype == tf.int64):
        raise TypeError(f"The gradient of Embedding Variable '{variable.name}' has "
                        f"{key_dtype.name} indices, but its keys are "
                        f"{variable.key_dtype.name}: index it by the keys the lookup used")
    if grad.values.dtype != tf.float32:
        raise TypeError(f"The gradient of Embedding Variable '{variable.name}' must be float32 "
                        f"(as its rows), got {grad.values.dtype.name}")
    values = grad.values.shape  # checked by the kernel too, when it runs
    if values.rank is not None and (values.rank != 2 or
                                    values[1] not in (None, variable.embedding_dim)):
        raise ValueError(f"The gradient of Embedding Variable '{variable.name}' must have values "
                         f"of shape [n, {variable.embedding_dim}], got {values}")
    # With several workers the gradient must come from the lookup's own
    # exchange, never from a Horovod reduction (which would mix shards).
    embedding_gradients.check_before_apply(grad, variable)


def fused_update(grads_and_variables,
                 op_name,
                 hyperparameters,
                 slots,
                 clock,
                 use_nesterov=False,
                 centered=False):
    """`SokEv>SparseApplyOptimizer` updates of Embedding Variables, one op
  for all the variables on one device: the one place sok-ev calls the fused
  op (tf.compat.v1 and Keras optimizers alike). Every gradient is checked
  before any op is built.

  Args:
    grads_and_variables: `(grad, variable)` pairs; grad is tf.IndexedSlices
      keyed by raw keys (duplicates are summed). A variable listed twice is
      updated twice, in order.
    op_name: 'sgd', 'adagrad', 'adam', 'ftrl', 'momentum', 'rmsprop' or
      'adagrad_decay'.
    hyperparameters: scalars in the op's order (sok_ev/cc/ops/optimizer_ops.cc).
    slots: `(table slot name, initial value)` pairs in the op's slot order.
    clock: callable returning the int64 scalar step written as each updated
      key's version (the global step, or a Keras optimizer's iterations);
      each variable keeps it as its version_clock, which steps_to_live
      evicts by.

  Returns:
    The update ops, one per device, in order of first appearance.

  Raises:
    TypeError, ValueError: see check_gradient.
  """
    pairs = list(grads_and_variables)
    for grad, variable in pairs:
        check_gradient(grad, variable)
    if not pairs:
        return []
    for _, variable in pairs:
        variable.version_clock = clock
    step = clock()
    hyperparameters = host_memory_input(tf.stack([tf.cast(h, tf.float32) for h in hyperparameters]),
                                        tf.float32)
    step = host_memory_input(step, tf.int64)
    by_device = {}
    for grad, variable in pairs:
        by_device.setdefault(variable.handle.device, []).append((grad, variable))
    updates = []
    for device, group in by_device.items():
        with tf.device(device):
            updates.append(ops().sok_ev_sparse_apply_optimizer(
                [variable.handle for _, variable in group],
                [tf.cast(grad.indices, variable.key_dtype) for grad, variable in group],
                [grad.values for grad, _ in group],
                hyperparameters,
                step,
                optimizer=op_name,
                slot_names=[name for name, _ in slots],
                slot_initial_values=[float(value) for _, value in slots],
                use_nesterov=use_nesterov,
                centered=centered,
                keys_are_unique=[_keys_are_distinct(grad.indices) for grad, _ in group]))
    return updates


class _PendingUpdates:
    """The Embedding Variable updates of one `Optimizer.apply_gradients`
  call, held until the last one arrives, then applied by one fused op (per
  device) instead of one op per variable."""

    def __init__(self, expected):
        self.expected = expected  # how many update_op calls will come
        self.pairs = []


# id(optimizer) -> _PendingUpdates, for the apply_gradients calls under way
# on this thread.
_pending = threading.local()


def _pending_updates(optimizer):
    return getattr(_pending, "by_optimizer", {}).get(id(optimizer))


class _EmbeddingVariableProcessor(optimizer_module._OptimizableVariable):  # pylint: disable=protected-access
    """Differentiates with respect to the handle; updates with the fused op."""

    def __init__(self, variable):
        self._v = variable

    def target(self):
        return self._v.handle

    def update_op(self, optimizer, g):
        pending = _pending_updates(optimizer)
        if pending is None:  # an apply_gradients that does not group
            return tf.group(apply_to_embedding_variables(optimizer, [(g, self._v)]))
        pending.pairs.append((g, self._v))  # checked by the apply_gradients wrapper
        if len(pending.pairs) < pending.expected:
            return tf.no_op()  # this variable's update is the last one's op
        return tf.group(apply_to_embedding_variables(optimizer, pending.pairs))


def _grouping_apply_gradients(original):

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, **kwargs):
        grads_and_vars = tuple(grads_and_vars)
        # Before anything applies (eagerly, dense variables update as their
        # ops are made): a bad Embedding Variable gradient changes nothing.
        for g, v in grads_and_vars:
            if g is not None and isinstance(v, EmbeddingVariable):
                _rule_for(self, v)
                check_gradient(g, v)
        expected = sum(
            1 for g, v in grads_and_vars if g is not None and isinstance(v, EmbeddingVariable))
        # Strategies call the processors per replica, maybe on other threads:
        # those keep one op per variable.
        if expected < 2 or tf.distribute.has_strategy() or id(self) in getattr(
                _pending, "by_optimizer", {}):
            return original(self, grads_and_vars, global_step=global_step, name=name, **kwargs)
        by_optimizer = _pending.__dict__.setdefault("by_optimizer", {})
        pending = by_optimizer[id(self)] = _PendingUpdates(expected)
        try:
            result = original(self, grads_and_vars, global_step=global_step, name=name, **kwargs)
        finally:
            del by_optimizer[id(self)]
        if len(pending.pairs) != expected:
            raise RuntimeError(f"sok-ev grouped {len(pending.pairs)} of {expected} Embedding "
                               f"Variable updates of {type(self).__name__}.apply_gradients: a "
                               "subclass skipped some; uninstall the optimizer hook "
                               "(sok_ev.uninstall_optimizer_hook) and use "
                               "sok_ev.OptimizerWrapper")
        return result

    apply_gradients.__name__ = original.__name__
    apply_gradients.__doc__ = original.__doc__
    return apply_gradients


def _slot_of(optimizer, variable, slot_name):
    rule = _rule_for(optimizer, variable)  # an unsupported optimizer fails here first
    named_slots = optimizer._slot_dict(slot_name)
    key = optimizer_module._var_key(variable)
    if key not in named_slots:
        table_slot_name = f"{optimizer.get_name()}/{slot_name}"
        named_slots[key] = EmbeddingVariableSlot(variable, table_slot_name)
        # A checkpoint in DeepRec's layout holds no initial values: a restore
        # before the first update adds the slot with this one.
        initial = dict(rule.slots(optimizer)).get(slot_name)
        if initial is not None:
            variable.optimizer_slots[table_slot_name] = float(initial)
    return named_slots[key]


_originals = {}


def _dispatching_slot_method(original):

    def slot_method(self, var, *args, **kwargs):
        if isinstance(var, EmbeddingVariable):
            slot_name = kwargs.get("slot_name", args[-2] if len(args) >= 2 else None)
            return _slot_of(self, var, slot_name)
        return original(self, var, *args, **kwargs)

    slot_method.__name__ = original.__name__
    slot_method.__doc__ = original.__doc__
    return slot_method


def _dispatching_get_processor(original):

    def get_processor(v):
        if isinstance(v, EmbeddingVariable):
            return _EmbeddingVariableProcessor(v)
        return original(v)

    return get_processor


def install_optimizer_hook() -> None:
    """Lets stock tf.compat.v1.train optimizers update Embedding Variables.

  Idempotent. Only Embedding Variables take the new path; every other
  variable goes through TensorFlow's original code.
  """
    if _originals:
        return
    _originals["_get_processor"] = optimizer_module._get_processor
    optimizer_module._get_processor = _dispatching_get_processor(optimizer_module._get_processor)
    original = optimizer_module.Optimizer.apply_gradients
    _originals["apply_gradients"] = original
    optimizer_module.Optimizer.apply_gradients = _grouping_apply_gradients(original)
    for method in ("_zeros_slot", "_get_or_make_slot", "_get_or_make_slot_with_initializer"):
        original = getattr(optimizer_module.Optimizer, method)
        _originals[method] = original
        setattr(optimizer_module.Optimizer, method, _dispatching_slot_method(original))


def uninstall_optimizer_hook() -> None:
    """Restores TensorFlow's original optimizer code."""
    if not _originals:
        return
    optimizer_module._get_processor = _originals.pop("_get_processor")
    for method, original in list(_originals.items()):
        setattr(optimizer_module.Optimizer, method, original)
    _originals.clear()


def optimizer_hook_installed() -> bool:
    """Whether install_optimizer_hook() is in effect."""
    return bool(_originals)


class OptimizerWrapper:
    """A stock optimizer that also updates Embedding Variables, patching nothing.

  Same methods as the wrapped `tf.compat.v1.train` optimizer; attributes not
  defined here are the wrapped optimizer's. Its methods are not converted by
  AutoGraph inside a tf.function (there is no data-dependent Python control
  flow in them to convert).

  Example:
    >>> opt = sok_ev.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
    >>> train_op = opt.minimize(loss)
  """

    def __init__(self, optimizer: optimizer_module.Optimizer):
        if not isinstance(optimizer, optimizer_module.Optimizer):
            raise TypeError("OptimizerWrapper wraps a tf.compat.v1.train.Optimizer, "
                            f"got {type(optimizer).__name__}")
        self._optimizer = optimizer

    def __getattr__(self, name):
        return getattr(self._optimizer, name)

    @tf.autograph.experimental.do_not_convert
    def compute_gradients(self, loss, var_list=None, **kwargs):
        """As Optimizer.compute_gradients; Embedding Variables get IndexedSlices."""
        if tf.executing_eagerly():
            if not callable(loss):
                raise ValueError("In eager mode, compute_gradients needs a callable "
                                 "loss, as tf.compat.v1.train optimizers do.")
            with tf.GradientTape() as tape:
                loss_value = loss()
            if var_list is None:
                var_list = [v for v in tape.watched_variables() if v.trainable]
            var_list = list(var_list)
            return list(zip(tape.gradient(loss_value, var_list), var_list))
        if var_list is None:
            var_list = (
                tf.compat.v1.trainable_variables() +
                tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES))
        var_list = list(var_list)
        tables = [v for v in var_list if isinstance(v, EmbeddingVariable)]
        dense = [v for v in var_list if not isinstance(v, EmbeddingVariable)]
        grads = {}
        if dense:
            for g, v in self._optimizer.compute_gradients(loss, var_list=dense, **kwargs):
                grads[id(v)] = g
        if tables:
            for g, v in zip(tf.gradients(loss, [v.handle for v in tables]), tables):
                grads[id(v)] = g
        return [(grads[id(v)], v) for v in var_list]

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """As Optimizer.apply_gradients. Embedding Variables are updated first;
    dense variables then go through the wrapped optimizer unchanged."""
        grads_and_vars = list(grads_and_vars)
        tables = [
            (g, v) for g, v in grads_and_vars if isinstance(v, EmbeddingVariable) and g is not None
        ]
        dense = [(g, v) for g, v in grads_and_vars if not isinstance(v, EmbeddingVariable)]
        optimizer = self._optimizer
        name = name or optimizer.get_name()
        with tf.name_scope(name):
            optimizer._prepare()
            updates = apply_to_embedding_variables(optimizer, tables)
        if dense:
            with tf.control_dependencies(updates):
                return optimizer.apply_gradients(dense, global_step=global_step, name=name)
        finish = optimizer._finish(updates, name)
        if global_step is None:
            return finish
        with tf.control_dependencies([finish]):
            return tf.compat.v1.assign_add(global_step, 1, name=name).op

    @tf.autograph.experimental.do_not_convert
    def minimize(self, loss, global_step=None, var_list=None, name=None, **kwargs):
        """compute_gradients then apply_gradients."""
        grads_and_vars = self.compute_gradients(loss, var_list=var_list, **kwargs)
        return self.apply_gradients(grads_and_vars, global_step=global_step, name=name)
