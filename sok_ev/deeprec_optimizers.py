"""DeepRec's AdamAsyncOptimizer and AdagradDecayOptimizer on stock TensorFlow.

Both are tf.compat.v1.train optimizers with DeepRec's update rules (its
python/training/adam_async.py and adagrad_decay.py, kernels ApplyAdamAsync,
SparseApplyAdamAsync, KvResourceSparseApplyAdamAsync, ApplyAdagradDecay,
SparseApplyAdagradDecay, KvResourceSparseApplyAdagradDecay), slot names and
defaults; `install_deeprec_api()` adds them to `tf.train` and
`tf.compat.v1.train`.

Dense variables are updated by TF ops (the rule written out; duplicate
indices of a sparse gradient summed first, as DeepRec's optimizer does).
Embedding Variables are updated by the fused native op
(`SokEv>SparseApplyOptimizer`, sok_ev.optimizers.fused_update), whose CPU and
GPU twins share one rule header (cc/optimizers.h):

* AdamAsync: DeepRec's Embedding Variable rule is sok-ev's lazy Adam with
  beta powers kept per variable ('adam'), or, with
  `apply_sparse_rmsprop=True`, TensorFlow's RMSProp with decay beta2 and
  momentum beta1 ('rmsprop'); so no new native rule. The beta powers are a
  dense `[1]` variable per Embedding Variable (as DeepRec's), which is why
  each Embedding Variable gets a fused op of its own.
* AdagradDecay: its own native rule ('adagrad_decay'): the per-row decay
  count needs the global step inside the row update.
"""

import numbers

import tensorflow as tf
from tensorflow.python.training import optimizer as optimizer_module

from sok_ev import optimizers
from sok_ev.embedding_variable import EmbeddingVariable


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check(name, value, ok, expected):
    """Raises ValueError naming `name` and `value` unless `ok` (Python numbers
  only: tensors are not checked)."""
    if _is_number(value) and not ok(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")


class AdamAsyncOptimizer(tf.compat.v1.train.Optimizer):
    """DeepRec's AdamAsync: Adam whose beta powers are slots of each variable
  (no shared state between variables, for asynchronous training).

  Slots: `m`, `v` (zeros, the variable's shape; for an Embedding Variable
  columns of its table, float32 `[embedding_dim]` a key), `beta1_power`,
  `beta2_power` (initialised to beta1 and beta2; a scalar for a dense
  variable, a `[1]` float32 variable for an Embedding Variable).

  A dense gradient g (every step):
    alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
    m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
    var -= alpha * m / (sqrt(v) + epsilon)
    beta1_power *= beta1;  beta2_power *= beta2
  A sparse gradient (tf.IndexedSlices, or any Embedding Variable's) does the
  same on the rows it holds only (lazy), and multiplies the beta powers once
  per apply with at least one index. With `apply_sparse_rmsprop=True` a
  sparse gradient is applied instead as
    v = beta2 * v + (1 - beta2) * g * g
    m = beta1 * m + lr * g / sqrt(v + epsilon);  var -= m
  leaving the beta powers unchanged.
  """

    def __init__(self,
                 learning_rate=0.001,
                 beta1=0.9,
                 beta2=0.999,
                 epsilon=1e-8,
                 use_locking=False,
                 apply_sparse_rmsprop=False,
                 name="AdamAsync"):
        """
    Args:
      learning_rate: float or float scalar tensor, >= 0.
      beta1, beta2: floats in [0, 1): the moments' decay rates.
      epsilon: float >= 0, added to sqrt(v).
      use_locking: accepted (the fused update is already atomic per row).
      apply_sparse_rmsprop: sparse gradients apply the RMSProp rule above.
      name: the optimizer's name; slots of a variable `N` are saved as
        `N/<name>`, `N/<name>_1`, ... (DeepRec's names).

    Raises:
      ValueError: learning_rate < 0, beta1 or beta2 outside [0, 1), or
        epsilon < 0 (named, with the value), before anything is created.
    """
        _check("learning_rate", learning_rate, lambda x: x >= 0, ">= 0")
        _check("beta1", beta1, lambda x: 0 <= x < 1, "in [0, 1)")
        _check("beta2", beta2, lambda x: 0 <= x < 1, "in [0, 1)")
        _check("epsilon", epsilon, lambda x: x >= 0, ">= 0")
        super().__init__(use_locking, name)
        self._lr = learning_rate
        self._beta1 = beta1
        self._beta2 = beta2
        self._epsilon = epsilon
        self._apply_sparse_rmsprop = bool(apply_sparse_rmsprop)
        self._lr_t = self._beta1_t = self._beta2_t = self._epsilon_t = None

    def _create_slots(self, var_list):
        for v in var_list:
            self._zeros_slot(v, "m", self._name)
            self._zeros_slot(v, "v", self._name)
            if isinstance(v, EmbeddingVariable):
                _embedding_beta_powers(self, v)
            else:
                with tf.compat.v1.colocate_with(v):
                    for slot_name, beta in (("beta1_power", self._beta1), ("beta2_power",
                                                                           self._beta2)):
                        self._get_or_make_slot(v, tf.convert_to_tensor(beta, v.dtype.base_dtype),
                                               slot_name, self._name)

    def _prepare(self):
        self._lr_t = tf.convert_to_tensor(self._lr, name="learning_rate")
        self._beta1_t = tf.convert_to_tensor(self._beta1, name="beta1")
        self._beta2_t = tf.convert_to_tensor(self._beta2, name="beta2")
        self._epsilon_t = tf.convert_to_tensor(self._epsilon, name="epsilon")

    def _hyper(self, dtype):
        return [
            tf.cast(t, dtype) for t in (self._lr_t, self._beta1_t, self._beta2_t, self._epsilon_t)
        ]

    def _resource_apply_dense(self, grad, var):
        lr, beta1, beta2, epsilon = self._hyper(grad.dtype.base_dtype)
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        beta1_power, beta2_power = self.get_slot(var,
                                                 "beta1_power"), self.get_slot(var, "beta2_power")
        alpha = lr * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
        m_t = m.assign(beta1 * m + (1 - beta1) * grad, use_locking=self._use_locking)
        v_t = v.assign(beta2 * v + (1 - beta2) * grad * grad, use_locking=self._use_locking)
        var_update = var.assign_sub(alpha * m_t / (tf.sqrt(v_t) + epsilon),
                                    use_locking=self._use_locking)
        with tf.control_dependencies([var_update]):
            return tf.group(beta1_power.assign(beta1_power * beta1),
                            beta2_power.assign(beta2_power * beta2))

    def _resource_apply_sparse(self, grad, var, indices):
        # indices are unique here: _resource_apply_sparse_duplicate_indices
        # summed the duplicates, as DeepRec's optimizer does.
        lr, beta1, beta2, epsilon = self._hyper(grad.dtype.base_dtype)
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        g = grad
        m_rows = tf.gather(m, indices)
        v_rows = tf.gather(v, indices) * beta2 + g * g * (1 - beta2)
        if self._apply_sparse_rmsprop:
            m_rows = m_rows * beta1 + tf.math.rsqrt(v_rows + epsilon) * lr * g
            return tf.group(m.scatter_update(tf.IndexedSlices(m_rows, indices)),
                            v.scatter_update(tf.IndexedSlices(v_rows, indices)),
                            var.scatter_sub(tf.IndexedSlices(m_rows, indices)))
        beta1_power, beta2_power = self.get_slot(var,
                                                 "beta1_power"), self.get_slot(var, "beta2_power")
        alpha = lr * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
        m_rows = m_rows * beta1 + g * (1 - beta1)
        updates = [
            m.scatter_update(tf.IndexedSlices(m_rows, indices)),
            v.scatter_update(tf.IndexedSlices(v_rows, indices)),
            var.scatter_sub(tf.IndexedSlices(m_rows * alpha / (tf.sqrt(v_rows) + epsilon), indices))
        ]
        with tf.control_dependencies(updates):
            return _advance_beta_powers(beta1_power, beta2_power, beta1, beta2, tf.size(indices))

    # Ref variables (what tf.disable_v2_behavior() makes, as DeepRec's
    # scripts do) take the same rule: the updates above are Variable methods.
    def _apply_dense(self, grad, var):
        return self._resource_apply_dense(grad, var)

    def _apply_sparse(self, grad, var):
        return self._resource_apply_sparse(grad.values, var, grad.indices)


def _advance_beta_powers(beta1_power, beta2_power, beta1, beta2, num_indices):
    """beta powers *= beta, when the apply had an index (DeepRec's N > 0)."""
    touched = num_indices > 0
    return tf.group(beta1_power.assign(tf.where(touched, beta1_power * beta1, beta1_power)),
                    beta2_power.assign(tf.where(touched, beta2_power * beta2, beta2_power)))


def _embedding_beta_powers(optimizer, variable):
    """The `[1]` float32 beta1_power and beta2_power variables of Embedding
  Variable `variable`, made on first use and kept as its slots (so get_slot,
  variables(), Saver and tf.train.Checkpoint see them). Named
  `<variable>/<optimizer>_2` and `_3` in a graph, DeepRec's names: its m and v
  are `<variable>/<optimizer>` and `_1`."""
    key = optimizer_module._var_key(variable)  # pylint: disable=protected-access
    powers = []
    for index, (slot_name, beta) in enumerate(
        (("beta1_power", optimizer._beta1), ("beta2_power", optimizer._beta2))):  # pylint: disable=protected-access
        slots = optimizer._slot_dict(slot_name)  # pylint: disable=protected-access
        if key not in slots:
            name = f"{variable.name[:-2]}/{optimizer.get_name()}_{index + 2}"
            with tf.init_scope(), tf.device(variable.device):
                initial = tf.constant([beta], tf.float32) if _is_number(beta) else tf.reshape(
                    tf.cast(beta, tf.float32), [1])
                if tf.executing_eagerly():
                    slots[key] = tf.Variable(initial, trainable=False, name=name)
                else:
                    # Absolute, as TensorFlow's own slots: not under the
                    # apply_gradients name scope.
                    with tf.compat.v1.get_default_graph().name_scope(None):
                        slots[key] = tf.Variable(initial, trainable=False, name=name)
        powers.append(slots[key])
    return powers


def _apply_adam_async_to_embedding_variables(optimizer, pairs):
    lr, beta1, beta2, epsilon = (
        optimizer._lr_t,
        optimizer._beta1_t,
        optimizer._beta2_t,  # pylint: disable=protected-access
        optimizer._epsilon_t)  # pylint: disable=protected-access
    name = optimizer.get_name()
    updates = []
    for grad, variable in pairs:
        if optimizer._apply_sparse_rmsprop:  # pylint: disable=protected-access
            # TensorFlow's RMSProp with rms = v (decay beta2), momentum = m.
            updates += optimizers.fused_update([(grad, variable)], "rmsprop",
                                               [lr, beta2, beta1, epsilon], [(f"{name}/v", 0.0),
                                                                             (f"{name}/m", 0.0)],
                                               optimizers.global_step)
            continue
        beta1_power, beta2_power = _embedding_beta_powers(optimizer, variable)
        # One op a variable: each has its own beta powers.
        applied = optimizers.fused_update(
            [(grad, variable)], "adam", [lr, beta1, beta2, epsilon, beta1_power[0], beta2_power[0]],
            [(f"{name}/m", 0.0), (f"{name}/v", 0.0)], optimizers.global_step)
        with tf.control_dependencies(applied):
            updates.append(
                _advance_beta_powers(beta1_power, beta2_power, tf.cast(beta1, tf.float32),
                                     tf.cast(beta2, tf.float32), tf.size(grad.indices)))
    return updates


class AdagradDecayOptimizer(tf.compat.v1.train.Optimizer):
    """DeepRec's AdagradDecay: Adagrad whose accumulator decays once every
  `accumulator_decay_step` global steps, so it does not grow without bound.

  Slots: `accumulator` (initial_accumulator_value, the variable's shape) and
  `accumulator_decay_power` (how many decays a row had: for a dense
  variable of the global step's dtype and the variable's shape, as
  DeepRec's; for an Embedding Variable a float32 table column, every column
  of a row holding the row's count).

  With s = (global_step + 1) // accumulator_decay_step, the global step read
  as the update is built (before apply_gradients increments it), each row
  the gradient g holds (a dense gradient: the whole variable, one count):
    if s > decay_power:
      accumulator = max(accumulator * accumulator_decay_rate,
                        initial_accumulator_value)
      decay_power += 1
    accumulator += g * g;  var -= lr * g / sqrt(accumulator)
  As in DeepRec, a dense variable's sparse update keeps row r's count in
  element r of the flattened `accumulator_decay_power`, its dense update in
  element 0.
  """

    def __init__(self,
                 learning_rate,
                 global_step,
                 initial_accumulator_value=0.1,
                 accumulator_decay_step=100000,
                 accumulator_decay_rate=0.9,
                 use_locking=False,
                 name="AdagradDecay"):
        """
    Args:
      learning_rate: float or float scalar tensor, >= 0.
      global_step: the global step variable (int32 or int64).
      initial_accumulator_value: float > 0: the accumulator's start and the
        floor a decay keeps.
      accumulator_decay_step: int > 0.
      accumulator_decay_rate: float in (0, 1].
      use_locking: accepted (the fused update is already atomic per row).
      name: the optimizer's name; slots of `N` are saved as `N/<name>` and
        `N/<name>_1` (DeepRec's names).

    Raises:
      ValueError: a value outside the ranges above, or global_step None
        (named, with the value), before anything is created.
    """
        _check("learning_rate", learning_rate, lambda x: x >= 0, ">= 0")
        _check("initial_accumulator_value", initial_accumulator_value, lambda x: x > 0, "> 0")
        _check("accumulator_decay_step", accumulator_decay_step, lambda x: x > 0, "> 0")
        _check("accumulator_decay_rate", accumulator_decay_rate, lambda x: 0 < x <= 1, "in (0, 1]")
        if global_step is None:
            raise ValueError("global_step must be the global step variable, got None")
        super().__init__(use_locking, name)
        self._learning_rate = learning_rate
        self._global_step = global_step
        self._initial_accumulator_value = initial_accumulator_value
        self._accumulator_decay_step = accumulator_decay_step
        self._accumulator_decay_rate = accumulator_decay_rate
        self._learning_rate_tensor = None

    def _create_slots(self, var_list):
        step_dtype = self._global_step.dtype.base_dtype
        for v in var_list:
            dtype = v.dtype.base_dtype
            with tf.compat.v1.colocate_with(v):
                self._get_or_make_slot_with_initializer(
                    v,
                    tf.compat.v1.constant_initializer(self._initial_accumulator_value, dtype=dtype),
                    v.get_shape(), dtype, "accumulator", self._name)
                self._get_or_make_slot_with_initializer(v,
                                                        tf.compat.v1.zeros_initializer(step_dtype),
                                                        v.get_shape(), step_dtype,
                                                        "accumulator_decay_power", self._name)

    def _prepare(self):
        self._learning_rate_tensor = tf.convert_to_tensor(self._learning_rate, name="learning_rate")

    def decay_count(self, dtype=tf.int64):
        """(global_step + 1) // accumulator_decay_step: the number of decays a
    row should have had by this update. Scalar of `dtype`."""
        step = tf.cast(tf.convert_to_tensor(self._global_step), tf.int64) + 1
        return tf.cast(step // tf.cast(self._accumulator_decay_step, tf.int64), dtype)

    def _hyper(self, dtype):
        return (tf.cast(self._learning_rate_tensor,
                        dtype), tf.cast(self._accumulator_decay_rate,
                                        dtype), tf.cast(self._initial_accumulator_value, dtype))

    def _resource_apply_dense(self, grad, var):
        lr, rate, baseline = self._hyper(grad.dtype.base_dtype)
        accumulator = self.get_slot(var, "accumulator")
        power = self.get_slot(var, "accumulator_decay_power")
        flat_power = tf.reshape(power, [-1])
        decay = self.decay_count(power.dtype) > flat_power[0]
        decayed = tf.where(decay, tf.maximum(accumulator * rate, baseline), accumulator)
        accumulated = accumulator.assign(decayed + grad * grad, use_locking=self._use_locking)
        counted = power.assign(
            tf.reshape(
                tf.tensor_scatter_nd_add(flat_power, [[0]],
                                         tf.reshape(tf.cast(decay, power.dtype), [1])),
                tf.shape(power)))
        return tf.group(
            var.assign_sub(lr * grad / tf.sqrt(accumulated), use_locking=self._use_locking),
            counted)

    def _resource_apply_sparse(self, grad, var, indices):
        # Unique indices (duplicates summed by the base class, as in DeepRec).
        lr, rate, baseline = self._hyper(grad.dtype.base_dtype)
        accumulator = self.get_slot(var, "accumulator")
        power = self.get_slot(var, "accumulator_decay_power")
        flat_power = tf.reshape(power, [-1])
        row_power = tf.gather(flat_power, indices)
        decay = self.decay_count(power.dtype) > row_power
        rows = tf.gather(accumulator, indices)
        decay_rows = tf.reshape(
            decay, tf.concat([tf.shape(decay), tf.ones_like(tf.shape(rows)[1:])], 0))
        rows = tf.where(decay_rows, tf.maximum(rows * rate, baseline), rows) + grad * grad
        counted = power.assign(
            tf.reshape(
                tf.tensor_scatter_nd_update(flat_power, tf.expand_dims(indices, 1),
                                            row_power + tf.cast(decay, power.dtype)),
                tf.shape(power)))
        return tf.group(accumulator.scatter_update(tf.IndexedSlices(rows, indices)),
                        var.scatter_sub(tf.IndexedSlices(lr * grad / tf.sqrt(rows), indices)),
                        counted)

    # Ref variables (what tf.disable_v2_behavior() makes, as DeepRec's
    # scripts do) take the same rule: the updates above are Variable methods.
    def _apply_dense(self, grad, var):
        return self._resource_apply_dense(grad, var)

    def _apply_sparse(self, grad, var):
        return self._resource_apply_sparse(grad.values, var, grad.indices)


optimizers.register_rule(
    AdamAsyncOptimizer,
    optimizers._Rule(  # pylint: disable=protected-access
        "adam",
        lambda o: [("m", 0.0), ("v", 0.0)],
        lambda o: [],
        apply=_apply_adam_async_to_embedding_variables))

optimizers.register_rule(
    AdagradDecayOptimizer,
    optimizers._Rule(  # pylint: disable=protected-access
        "adagrad_decay",
        lambda o: [
            ("accumulator", o._initial_accumulator_value),  # pylint: disable=protected-access
            ("accumulator_decay_power", 0.0)
        ],
        lambda o: [
            o._learning_rate_tensor,  # pylint: disable=protected-access
            o.decay_count(tf.float32),
            o._accumulator_decay_rate,  # pylint: disable=protected-access
            o._initial_accumulator_value  # pylint: disable=protected-access
        ]))
