"""Keras 3 optimizers (tf.keras.optimizers) update Embedding Variables.

After sok_ev.init(), `opt.apply_gradients(zip(grads, vars))` of a Keras
SGD, Adagrad, Adam, AdamW, Ftrl or RMSprop updates Embedding Variables with the fused kernel
(sok_ev/keras_optimizers.py), eagerly and in tf.function.

References (each step looks up a random ragged batch with duplicate keys and
empty samples; rows start at M[k]):
* SGD, Adagrad: the same Keras optimizer on a dense tf.Variable(M), given
  the dense gradient (duplicates summed, as the Embedding Variable's are):
  row for row equal, over several steps.
* Ftrl: the same, from zero rows (Keras recomputes every row of a dense
  variable from its `linear` slot, which only coincides with sok-ev's lazy
  update for rows consistent with it; zero rows are).
* Adam: DeepRec's lazy Adam in NumPy (Keras's dense Adam also moves rows
  outside the batch); and on the first step, Keras's dense Adam itself.
* RMSprop (plain, with momentum, centered): Keras's formulas applied lazily
  in NumPy; and Keras's dense RMSprop itself on batches holding every row.
* SGD with momentum (nesterov, a schedule): Keras on a dense variable on
  batches holding every row; lazily in NumPy.
* clipvalue, clipnorm: Keras on a dense variable on batches holding every row.
* Weight decay (AdamW; weight_decay of SGD, Adagrad, Adam, RMSprop): Keras on
  a dense variable on batches holding every row; lazily in NumPy for SGD;
  a variable excluded from it trains as with plain Adam.
* Checkpoints: the same dense tf.Variable and Keras optimizer, written with
  tf.train.Checkpoint and read into freshly built objects (whose Keras
  auto-names differ from the writers'), then trained on.

Slots live in table columns `<prefix>/<slot>`, the prefix being the
optimizer's name without Keras's auto-name suffix (`adagrad_3` -> `adagrad`),
so they restore whatever order optimizers are created in; two live
optimizers that would share a column raise. LossScaleOptimizer: Keras's own
on a dense tf.Variable, step for step, non-finite steps skipped; dense-only
use is Keras's, bit for bit.
"""
import gc
import re

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

N_ROWS, DIM, STEPS = 20, 4, 4
KERAS = tf.keras.optimizers

DENSE_EQUIVALENT = {
    "sgd":
        lambda: KERAS.SGD(0.3),
    "adagrad":
        lambda: KERAS.Adagrad(0.2),
    "adagrad_initial_accumulator_epsilon":
        lambda: KERAS.Adagrad(0.2, initial_accumulator_value=0.5, epsilon=1e-3),
}
FTRL = {
    "ftrl":
        lambda: KERAS.Ftrl(0.2),
    "ftrl_l1_l2_beta_power":
        lambda: KERAS.Ftrl(0.2,
                           learning_rate_power=-0.7,
                           initial_accumulator_value=0.2,
                           l1_regularization_strength=0.01,
                           l2_regularization_strength=0.02,
                           beta=0.3),
}
ADAM = dict(learning_rate=0.05, beta_1=0.8, beta_2=0.9, epsilon=1e-6)


def _lazy_adam(matrix, batches, upstreams):
    """DeepRec's lazy Adam with ADAM's settings, in NumPy: the rows after each step."""
    return ref.numpy_lazy_adam_trajectory(matrix,
                                          batches,
                                          upstreams,
                                          learning_rate=ADAM["learning_rate"],
                                          beta1=ADAM["beta_1"],
                                          beta2=ADAM["beta_2"],
                                          epsilon=ADAM["epsilon"])


def _batches(rng, steps=STEPS, keys=N_ROWS):
    return [
        ref.random_sparse_batch(rng, 6, 3, lambda n: rng.integers(0, keys, size=n), np.int64)
        for _ in range(steps)
    ]


def _upstreams(rng, batches):
    return [rng.normal(size=(b.batch_size, DIM)).astype(np.float32) for b in batches]


def _ev_step(sok, ev, opt, mode):
    """`step(batch, upstream)`: one training step of Embedding Variable `ev`."""

    def step(indices, keys, shape, upstream):
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([ev], [tf.SparseTensor(indices, keys, shape)], "sum")[0]
            loss = tf.reduce_sum(out * upstream)
        opt.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))

    step = tf.function(step) if mode == "tf_function" else step
    return lambda b, u: step(b.indices, b.keys, np.array(b.dense_shape, np.int64), u)


def _dense_step(table, opt, batch, upstream):
    """The reference step: Keras on dense tf.Variable `table`, fed the dense
    gradient (duplicates summed, as the Embedding Variable's are)."""
    with tf.GradientTape() as tape:
        out = ref.dense_lookup_sparse(table, batch, "sum", False)
        loss = tf.reduce_sum(out * upstream)
    opt.apply_gradients([(tf.convert_to_tensor(tape.gradient(loss, table)), table)])


def _train_ev(sok, name, matrix, make_optimizer, batches, upstreams, mode):
    """Trains an Embedding Variable (key k starts at matrix[k]) with a Keras
    optimizer through apply_gradients; returns {key: row} after every step."""
    ev = ref.matrix_ev(sok, name, matrix)
    opt = make_optimizer()

    def step(indices, keys, shape, upstream):
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([ev], [tf.SparseTensor(indices, keys, shape)], "sum")[0]
            loss = tf.reduce_sum(out * upstream)
        grads = tape.gradient(loss, [ev])
        opt.apply_gradients(zip(grads, [ev]))

    if mode == "tf_function":
        step = tf.function(step)
    history = []
    for batch, upstream in zip(batches, upstreams):
        step(batch.indices, batch.keys, np.array(batch.dense_shape, np.int64), upstream)
        history.append(ref.export_to_dict(*[t.numpy() for t in ev.export()]))
    assert int(opt.iterations) == len(batches)
    return history


def _train_dense(matrix, make_optimizer, batches, upstreams):
    """The same with Keras on a dense tf.Variable, fed the dense gradient."""
    table = tf.Variable(matrix)
    opt = make_optimizer()
    history = []
    for batch, upstream in zip(batches, upstreams):
        _dense_step(table, opt, batch, upstream)
        history.append(table.numpy().copy())
    return history


def _assert_trajectories_equal(ev_history, dense_history, batches, rtol, atol):
    seen = set()
    for t, (stored, dense, batch) in enumerate(zip(ev_history, dense_history, batches)):
        seen |= set(int(k) for k in batch.keys)
        ref.assert_rows_close(stored, {k: dense[k] for k in seen},
                              rtol=rtol,
                              atol=atol,
                              what=f"step {t + 1}")


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("optimizer", sorted(DENSE_EQUIVALENT))
def test_keras_optimizer_updates_an_ev_like_a_dense_variable(sok, rng, unique_name, mode,
                                                             optimizer):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng)
    upstreams = _upstreams(rng, batches)
    make = DENSE_EQUIVALENT[optimizer]
    got = _train_ev(sok, unique_name(), matrix, make, batches, upstreams, mode)
    expected = _train_dense(matrix, make, batches, upstreams)
    _assert_trajectories_equal(got, expected, batches, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("optimizer", sorted(FTRL))
def test_keras_ftrl_updates_an_ev_like_a_dense_variable_from_zero_rows(
        sok, rng, unique_name, mode, optimizer):
    matrix = np.zeros((N_ROWS, DIM), np.float32)
    batches = _batches(rng)
    upstreams = _upstreams(rng, batches)
    got = _train_ev(sok, unique_name(), matrix, FTRL[optimizer], batches, upstreams, mode)
    expected = _train_dense(matrix, FTRL[optimizer], batches, upstreams)
    _assert_trajectories_equal(got, expected, batches, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_keras_adam_on_an_ev_is_deeprecs_lazy_adam(sok, rng, unique_name, mode):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=5)
    upstreams = _upstreams(rng, batches)
    got = _train_ev(sok, unique_name(), matrix, lambda: KERAS.Adam(**ADAM), batches, upstreams,
                    mode)
    expected = _lazy_adam(matrix, batches, upstreams)
    _assert_trajectories_equal(got, expected, batches, rtol=1e-5, atol=1e-6)


def test_keras_adam_first_step_equals_keras_on_a_dense_variable(sok, rng, unique_name):
    # At step 1 every moment is zero, so lazy and dense Adam agree.
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=1)
    upstreams = _upstreams(rng, batches)
    make = lambda: KERAS.Adam(**ADAM)
    got = _train_ev(sok, unique_name(), matrix, make, batches, upstreams, "eager")
    expected = _train_dense(matrix, make, batches, upstreams)
    _assert_trajectories_equal(got, expected, batches, rtol=1e-5, atol=1e-6)


RMSPROP = {
    "rmsprop":
        dict(learning_rate=0.05, rho=0.8, epsilon=1e-6),
    "rmsprop_momentum":
        dict(learning_rate=0.05, rho=0.8, momentum=0.7, epsilon=1e-6),
    "rmsprop_centered_momentum":
        dict(learning_rate=0.05, rho=0.8, momentum=0.7, epsilon=1e-6, centered=True),
}


def _lazy_rmsprop(matrix,
                  batches,
                  upstreams,
                  learning_rate,
                  rho,
                  epsilon,
                  momentum=0.0,
                  centered=False):
    """Keras's RMSprop applied lazily, in float64 NumPy: only the rows of the
  batch's keys change (velocity, average gradient and momentum included)."""
    value = matrix.astype(np.float64).copy()
    velocity, average, step = (np.zeros_like(value) for _ in range(3))
    history = []
    for batch, upstream in zip(batches, upstreams):
        for key, g in ref.numpy_batch_gradient(matrix.shape, batch, upstream).items():
            velocity[key] = rho * velocity[key] + (1 - rho) * g * g
            denominator = velocity[key] + epsilon
            if centered:
                average[key] = rho * average[key] + (1 - rho) * g
                denominator = denominator - average[key]**2
            step[key] = momentum * step[key] + learning_rate * g / np.sqrt(denominator)
            value[key] -= step[key]
        history.append(value.copy())
    return history


def _covering_batches(rng, steps=STEPS):
    """Batches in which every key of [0, N_ROWS) appears (with duplicates and
  empty samples): on them Keras's dense updates are lazy ones."""
    batches = []
    while len(batches) < steps:
        batch = ref.random_sparse_batch(rng, 16, 4, lambda n: np.resize(rng.permutation(N_ROWS), n),
                                        np.int64)
        if len(np.unique(batch.keys)) == N_ROWS:
            batches.append(batch)
    return batches


def _assert_like_dense_on_covering_batches(sok,
                                           rng,
                                           name,
                                           make_optimizer,
                                           mode,
                                           upstream_scale=1.0):
    """Trains an Embedding Variable and a dense tf.Variable with the same
  Keras optimizer on batches holding every row (where Keras's dense update
  is a lazy one) and asserts the same rows after every step; returns the
  matrix, batches, upstreams and the dense trajectory."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _covering_batches(rng)
    upstreams = [upstream_scale * u for u in _upstreams(rng, batches)]
    got = _train_ev(sok, name, matrix, make_optimizer, batches, upstreams, mode)
    expected = _train_dense(matrix, make_optimizer, batches, upstreams)
    _assert_trajectories_equal(got, expected, batches, rtol=1e-5, atol=1e-6)
    return matrix, batches, upstreams, expected


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("optimizer", sorted(RMSPROP))
def test_keras_rmsprop_updates_an_ev_like_a_dense_variable_when_every_row_is_in_the_batch(
        sok, rng, unique_name, mode, optimizer):
    _assert_like_dense_on_covering_batches(sok, rng, unique_name(),
                                           lambda: KERAS.RMSprop(**RMSPROP[optimizer]), mode)


@pytest.mark.parametrize("optimizer", sorted(RMSPROP))
def test_keras_rmsprop_on_an_ev_updates_only_the_rows_of_the_batch(sok, rng, unique_name,
                                                                   optimizer):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=5)
    upstreams = _upstreams(rng, batches)
    got = _train_ev(sok, unique_name(), matrix, lambda: KERAS.RMSprop(**RMSPROP[optimizer]),
                    batches, upstreams, "eager")
    expected = _lazy_rmsprop(matrix, batches, upstreams, **RMSPROP[optimizer])
    _assert_trajectories_equal(got, expected, batches, rtol=1e-5, atol=1e-6)


SGD_MOMENTUM = {
    "sgd_momentum":
        lambda: KERAS.SGD(0.2, momentum=0.8),
    "sgd_nesterov":
        lambda: KERAS.SGD(0.2, momentum=0.8, nesterov=True),
    "sgd_momentum_schedule":
        lambda: KERAS.SGD(KERAS.schedules.ExponentialDecay(0.3, decay_steps=1, decay_rate=0.5),
                          momentum=0.9),
}


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("optimizer", sorted(SGD_MOMENTUM))
def test_keras_sgd_momentum_updates_an_ev_like_a_dense_variable_when_every_row_is_in_the_batch(
        sok, rng, unique_name, mode, optimizer):
    """Keras's m = momentum * m - lr * g, row += m (nesterov: row +=
  momentum * m - lr * g), a learning rate schedule included."""
    _assert_like_dense_on_covering_batches(sok, rng, unique_name(), SGD_MOMENTUM[optimizer], mode)


@pytest.mark.parametrize("nesterov", [False, True])
def test_keras_sgd_momentum_on_an_ev_moves_only_the_rows_of_the_batch(sok, rng, unique_name,
                                                                      nesterov):
    lr, momentum = 0.2, 0.8
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=5)
    upstreams = _upstreams(rng, batches)
    got = _train_ev(sok, unique_name(), matrix,
                    lambda: KERAS.SGD(lr, momentum=momentum, nesterov=nesterov), batches, upstreams,
                    "eager")
    value, m = matrix.astype(np.float64).copy(), np.zeros(matrix.shape)
    expected = []
    for batch, upstream in zip(batches, upstreams):
        for key, g in ref.numpy_batch_gradient(matrix.shape, batch, upstream).items():
            m[key] = momentum * m[key] - lr * g
            value[key] += momentum * m[key] - lr * g if nesterov else m[key]
        expected.append(value.copy())
    _assert_trajectories_equal(got, expected, batches, rtol=1e-5, atol=1e-6)


CLIPPED = {  # (clipped, the same unclipped)
    "sgd_clipvalue": (lambda: KERAS.SGD(0.3, clipvalue=0.4), lambda: KERAS.SGD(0.3)),
    "adagrad_clipnorm": (lambda: KERAS.Adagrad(0.2, clipnorm=0.5), lambda: KERAS.Adagrad(0.2)),
    "adam_clipnorm": (lambda: KERAS.Adam(clipnorm=0.3, **ADAM), lambda: KERAS.Adam(**ADAM)),
}


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("optimizer", sorted(CLIPPED))
def test_keras_clipping_clips_an_ev_gradient_as_a_dense_one(sok, rng, unique_name, mode, optimizer):
    """clipvalue and clipnorm act on the gradient with duplicate keys summed,
  which is a dense variable's gradient without its zero rows."""
    clipped, unclipped = CLIPPED[optimizer]
    # Upstream gradients large enough to clip.
    matrix, batches, upstreams, expected = _assert_like_dense_on_covering_batches(
        sok, rng, unique_name(), clipped, mode, upstream_scale=3.0)
    # The clipping bit: without it the dense rows end elsewhere.
    assert not np.allclose(_train_dense(matrix, unclipped, batches, upstreams)[-1], expected[-1])


WEIGHT_DECAY = {
    "adamw": lambda: KERAS.AdamW(weight_decay=0.05, **ADAM),
    "adam_weight_decay": lambda: KERAS.Adam(weight_decay=0.05, **ADAM),
    "sgd_weight_decay": lambda: KERAS.SGD(0.3, weight_decay=0.1),
    "adagrad_weight_decay": lambda: KERAS.Adagrad(0.2, weight_decay=0.1),
    "rmsprop_weight_decay": lambda: KERAS.RMSprop(weight_decay=0.1, **RMSPROP["rmsprop"]),
}


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("optimizer", sorted(WEIGHT_DECAY))
def test_keras_weight_decay_updates_an_ev_like_a_dense_variable_when_every_row_is_in_the_batch(
        sok, rng, unique_name, mode, optimizer):
    """Keras decays every row of a dense variable (row -= row * wd * lr)
  before its update; sok-ev the rows of the batch: the same on batches
  holding every row."""
    _assert_like_dense_on_covering_batches(sok, rng, unique_name(), WEIGHT_DECAY[optimizer], mode)


def test_keras_weight_decay_leaves_the_rows_outside_the_batch(sok, rng, unique_name):
    """SGD with weight decay, lazily, in NumPy: a looked-up row becomes
  row - lr * (wd * row) - lr * gradient; the others keep their value."""
    lr, decay = 0.3, 0.1
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=4)
    upstreams = _upstreams(rng, batches)
    got = _train_ev(sok, unique_name(), matrix, lambda: KERAS.SGD(lr, weight_decay=decay), batches,
                    upstreams, "eager")
    value = matrix.astype(np.float64).copy()
    expected = []
    for batch, upstream in zip(batches, upstreams):
        for key, g in ref.numpy_batch_gradient(matrix.shape, batch, upstream).items():
            value[key] -= lr * decay * value[key]
            value[key] -= lr * g
        expected.append(value.copy())
    _assert_trajectories_equal(got, expected, batches, rtol=1e-5, atol=1e-6)


def test_an_ev_excluded_from_weight_decay_trains_as_without_it(sok, rng, unique_name):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=3)
    upstreams = _upstreams(rng, batches)

    def excluding():
        optimizer = KERAS.AdamW(weight_decay=0.05, **ADAM)
        optimizer.exclude_from_weight_decay(var_names=["excluded"])
        return optimizer

    got = _train_ev(sok, "excluded", matrix, excluding, batches, upstreams, "eager")
    expected = _lazy_adam(matrix, batches, upstreams)
    _assert_trajectories_equal(got, expected, batches, rtol=1e-5, atol=1e-6)


def test_keras_optimizer_updates_evs_and_dense_variables_together(sok, rng, unique_name):
    """One apply_gradients with an Embedding Variable and a dense variable:
    both updated, the step counted once (Adam's bias correction sees it)."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=3)
    upstreams = _upstreams(rng, batches)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    scale = tf.Variable(np.ones(DIM, np.float32))
    scale_ref = tf.Variable(np.ones(DIM, np.float32))
    table_ref = tf.Variable(matrix)
    opt, opt_ref = KERAS.Adagrad(0.1), KERAS.Adagrad(0.1)
    for batch, upstream in zip(batches, upstreams):
        with tf.GradientTape(persistent=True) as tape:
            out = sok.lookup_sparse([ev], [batch.sp_ids()], "sum")[0] * scale
            out_ref = ref.dense_lookup_sparse(table_ref, batch, "sum", False) * scale_ref
            loss = tf.reduce_sum(out * upstream)
            loss_ref = tf.reduce_sum(out_ref * upstream)
        opt.apply_gradients(zip(tape.gradient(loss, [ev, scale]), [ev, scale]))
        grads_ref = [
            tf.convert_to_tensor(g) for g in tape.gradient(loss_ref, [table_ref, scale_ref])
        ]
        opt_ref.apply_gradients(zip(grads_ref, [table_ref, scale_ref]))
    assert int(opt.iterations) == int(opt_ref.iterations) == len(batches)
    np.testing.assert_allclose(scale.numpy(), scale_ref.numpy(), rtol=2e-6)
    stored = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    dense = table_ref.numpy()
    ref.assert_rows_close(stored, {k: dense[k] for k in stored}, rtol=2e-6, atol=2e-6)


def _with_and_without_the_hook(train):
    """`train()` with the Keras hook installed, then with Keras's own code
    (the reference): (hooked result, original result)."""
    from sok_ev import keras_optimizers  # pylint: disable=import-outside-toplevel
    hooked = train()
    keras_optimizers.uninstall_keras_optimizer_hook()
    try:
        original = train()
    finally:
        keras_optimizers.install_keras_optimizer_hook()
    return hooked, original


def test_keras_hook_leaves_dense_training_bit_identical(sok, rng):
    from sok_ev import keras_optimizers  # pylint: disable=import-outside-toplevel

    def train():
        table = tf.Variable(ref.random_matrix(np.random.default_rng(7), N_ROWS, DIM))
        opt = KERAS.Adam(0.01)
        for t in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.embedding_lookup(table, [t, t + 1, t])**2)
            opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        return table.numpy()

    assert keras_optimizers.keras_optimizer_hook_installed()
    hooked, original = _with_and_without_the_hook(train)
    np.testing.assert_array_equal(hooked, original)


def test_keras_apply_gradients_without_the_hook(sok, rng, unique_name):
    """sok_ev.keras_optimizers.apply_gradients(opt, pairs): the patch-free way."""
    from sok_ev import keras_optimizers  # pylint: disable=import-outside-toplevel
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=2)
    upstreams = _upstreams(rng, batches)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    opt = KERAS.SGD(0.3)
    keras_optimizers.uninstall_keras_optimizer_hook()
    try:
        for batch, upstream in zip(batches, upstreams):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(sok.lookup_sparse([ev], [batch.sp_ids()], "sum")[0] * upstream)
            keras_optimizers.apply_gradients(opt, zip(tape.gradient(loss, [ev]), [ev]))
    finally:
        keras_optimizers.install_keras_optimizer_hook()
    expected = _train_dense(matrix, lambda: KERAS.SGD(0.3), batches, upstreams)
    stored = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    ref.assert_rows_close(stored, {k: expected[-1][k] for k in stored}, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- refusals


def _apply_once(sok, ev, opt):
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 4], tf.int64), [2, 1])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([ev], [ids], "sum")[0])
    opt.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))


@pytest.mark.parametrize("optimizer", ["Nadam", "Adamax", "Adadelta", "Lion", "Lamb"])
def test_unsupported_keras_optimizer_raises_listing_the_supported_ones(sok, unique_name, optimizer):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
    with pytest.raises(TypeError) as error:
        _apply_once(sok, ev, getattr(KERAS, optimizer)(0.1))
    assert ref.error_names(error.value, optimizer, ev.name, "tf.keras.optimizers.SGD",
                           "tf.keras.optimizers.Adagrad", "tf.keras.optimizers.Adam",
                           "tf.keras.optimizers.Ftrl", "tf.keras.optimizers.RMSprop")
    assert int(ev.total_count()) == 2  # the lookup inserted; nothing was applied


@pytest.mark.parametrize("setting,make", [
    ("amsgrad", lambda: KERAS.Adam(0.1, amsgrad=True)),
    ("use_ema", lambda: KERAS.Ftrl(0.1, use_ema=True)),
    ("gradient_accumulation_steps", lambda: KERAS.SGD(0.1, gradient_accumulation_steps=2)),
])
def test_keras_setting_without_a_fused_form_raises_naming_it(sok, unique_name, setting, make):
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=DIM,
                                    initializer=tf.zeros_initializer())
    with pytest.raises(ValueError) as error:
        _apply_once(sok, ev, make())
    assert ref.error_names(error.value, setting, ev.name)
    keys, rows = ev.export()
    np.testing.assert_array_equal(rows.numpy(), np.zeros((2, DIM), np.float32))  # unchanged


def _steps_with_a_weight(sok, name, make_optimizer, matrix, batches, upstreams, weights, mode,
                         use_ev):
    """Trains rows starting at `matrix` (an Embedding Variable, or the dense
  tf.Variable reference fed the dense gradient) and a dense weight vector
  `w` together with `make_optimizer()`; loss = sum(lookup * upstream * w),
  scaled by a LossScaleOptimizer's `scale_loss` as `model.fit` does.
  Returns, after every step: the rows, w and the optimizer."""
    opt = make_optimizer()
    table = ref.matrix_ev(sok, name, matrix) if use_ev else tf.Variable(matrix)
    w = tf.Variable(weights)
    scale_loss = getattr(opt, "scale_loss", lambda loss: loss)

    def step(indices, keys, shape, upstream):
        with tf.GradientTape() as tape:
            batch = tf.SparseTensor(indices, keys, shape)
            if use_ev:
                out = sok.lookup_sparse([table], [batch], "sum")[0]
            else:  # trailing empty samples dropped by TensorFlow: zeros
                out = tf.nn.embedding_lookup_sparse(table, batch, None, combiner="sum")
                out = tf.pad(out, [[0, shape[0] - tf.shape(out, out_type=tf.int64)[0]], [0, 0]])
            loss = scale_loss(tf.reduce_sum(out * upstream * w))
        grad, w_grad = tape.gradient(loss, [table, w])
        if not use_ev:
            grad = tf.convert_to_tensor(grad)
        opt.apply_gradients([(grad, table), (w_grad, w)])

    step = tf.function(step) if mode == "tf_function" else step
    for batch, upstream in zip(batches, upstreams):
        step(batch.indices, batch.keys, np.array(batch.dense_shape, np.int64), upstream)
        rows = (ref.export_to_dict(
            *[t.numpy() for t in table.export()]) if use_ev else table.numpy().copy())
        yield rows, w.numpy().copy(), opt


def _assert_steps_alike(got, expected, batches, state=lambda opt: ()):
    """The Embedding Variable's rows, w and state(optimizer) equal the dense
  reference's after every step (rows of the keys seen so far)."""
    seen = set()
    for t, ((rows, w, opt), (dense, dense_w, dense_opt),
            batch) in enumerate(zip(got, expected, batches)):
        seen |= set(int(k) for k in batch.keys)
        ref.assert_rows_close(rows, {k: dense[k] for k in seen},
                              rtol=1e-6,
                              atol=1e-7,
                              what=f"step {t + 1}")
        np.testing.assert_allclose(w, dense_w, rtol=1e-6, atol=1e-7, err_msg=f"step {t + 1}")
        assert state(opt) == state(dense_opt), f"step {t + 1}"


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("inner", ["sgd", "adagrad"])
def test_loss_scale_optimizer_trains_an_ev_like_a_dense_variable_and_skips_non_finite_steps(
        sok, rng, unique_name, mode, inner):
    """Keras's LossScaleOptimizer (model.fit's under mixed_float16) around
  SGD or Adagrad, on an Embedding Variable and a dense weight together,
  equals the same on a dense tf.Variable step for step: the gradients
  unscaled by the dynamic scale, which doubles every 2 finite steps; a step
  with an infinite gradient (step 3: an infinite upstream value) changes no
  row, no weight and no iterations, and halves the scale."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=6)
    upstreams = _upstreams(rng, batches)
    upstreams[2][0, 0] = np.inf
    weights = rng.normal(size=DIM).astype(np.float32)
    make = lambda: KERAS.LossScaleOptimizer(
        DENSE_EQUIVALENT[inner](), initial_scale=2.0**10, dynamic_growth_steps=2)
    args = (sok, unique_name(), make, matrix, batches, upstreams, weights, mode)
    state = lambda opt: (float(opt.dynamic_scale), int(opt.step_counter), int(opt.iterations))
    got = [(rows, w, state(opt)) for rows, w, opt in _steps_with_a_weight(*args, use_ev=True)]
    expected = [(rows, w, state(opt)) for rows, w, opt in _steps_with_a_weight(*args, use_ev=False)]
    assert [s[0] for _, _, s in expected] == [2.0**10, 2.0**11, 2.0**10, 2.0**10, 2.0**11, 2.0**11]
    assert [s[2] for _, _, s in expected] == [1, 2, 2, 3, 4, 5]
    _assert_steps_alike(got, expected, batches, state=lambda recorded: recorded)
    # The skipped step left every row as the step before it; its lookup's
    # new keys hold their initial rows.
    (skipped, skipped_w, _), (before, before_w, _) = got[2], got[1]
    np.testing.assert_array_equal(skipped_w, before_w)
    for key, row in skipped.items():
        np.testing.assert_array_equal(row, before[key] if key in before else matrix[key])


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_keras_global_clipnorm_clips_an_ev_and_dense_weights_by_their_joint_norm(
        sok, rng, unique_name, mode, optimizer):
    """global_clipnorm scales the table's gradient (its rows summed by key)
  and the dense weight's by Keras's factor for their joint norm, as Keras
  does for a dense table: the clip is small enough to act on every step."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng)
    upstreams = _upstreams(rng, batches)
    weights = rng.normal(size=DIM).astype(np.float32)
    make = lambda: {
        "sgd": KERAS.SGD(0.3, global_clipnorm=0.5),
        "adagrad": KERAS.Adagrad(0.2, global_clipnorm=0.5)
    }[optimizer]
    args = (sok, unique_name(), make, matrix, batches, upstreams, weights, mode)
    got = [(rows, w, None) for rows, w, _ in _steps_with_a_weight(*args, use_ev=True)]
    expected = [(rows, w, None) for rows, w, _ in _steps_with_a_weight(*args, use_ev=False)]
    _assert_steps_alike(got, expected, batches)
    # Clipping acted: without it the rows differ.
    unclipped = lambda: {"sgd": KERAS.SGD(0.3), "adagrad": KERAS.Adagrad(0.2)}[optimizer]
    free = [
        rows for rows, _, _ in _steps_with_a_weight(sok, unique_name(), unclipped, matrix, batches,
                                                    upstreams, weights, mode, True)
    ]
    key = int(batches[0].keys[0])
    assert not np.allclose(free[-1][key], got[-1][0][key])


def test_loss_scale_optimizer_refuses_an_unsupported_inner_optimizer_before_anything_changes(
        sok, unique_name):
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=DIM,
                                    initializer=tf.zeros_initializer())
    scale = tf.Variable(np.ones(DIM, np.float32))
    opt = KERAS.LossScaleOptimizer(KERAS.Adamax(0.1))
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 4], tf.int64), [2, 1])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([ev], [ids], "sum")[0] * scale)
    grads = tape.gradient(loss, [ev, scale])
    with pytest.raises(TypeError) as error:
        opt.apply_gradients(zip(grads, [ev, scale]))
    assert ref.error_names(error.value, "Adamax", ev.name)
    assert not opt.built and int(opt.iterations) == 0
    np.testing.assert_array_equal(scale.numpy(), np.ones(DIM, np.float32))
    np.testing.assert_array_equal(ev.export()[1].numpy(), np.zeros((2, DIM), np.float32))


def test_loss_scale_optimizer_takes_an_ev_without_the_hook_too(sok, unique_name):
    from sok_ev import keras_optimizers  # pylint: disable=import-outside-toplevel
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=DIM,
                                    initializer=tf.zeros_initializer())
    opt = KERAS.LossScaleOptimizer(KERAS.SGD(0.5), initial_scale=4.0)
    grad = tf.IndexedSlices(4.0 * tf.ones([1, DIM]), tf.constant([3], tf.int64))
    keras_optimizers.apply_gradients(opt, [(grad, ev)])
    np.testing.assert_array_equal(
        ev.sparse_read(tf.constant([3], tf.int64)).numpy(), np.full((1, DIM), -0.5, np.float32))
    assert int(opt.iterations) == 1


def test_loss_scale_optimizer_on_dense_variables_is_bit_identical_to_keras(sok):
    from sok_ev import keras_optimizers  # pylint: disable=import-outside-toplevel

    def train():
        table = tf.Variable(ref.random_matrix(np.random.default_rng(3), N_ROWS, DIM))
        opt = KERAS.LossScaleOptimizer(KERAS.Adam(0.01), initial_scale=2.0**10)
        for t in range(3):
            with tf.GradientTape() as tape:
                loss = opt.scale_loss(tf.reduce_sum(tf.nn.embedding_lookup(table, [t, t + 1])**2))
            opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        return table.numpy(), float(opt.dynamic_scale)

    hooked, original = _with_and_without_the_hook(train)
    np.testing.assert_array_equal(hooked[0], original[0])
    assert hooked[1] == original[1]


def test_uninstalling_the_keras_hook_restores_every_patched_method(sok):
    from sok_ev import keras_optimizers  # pylint: disable=import-outside-toplevel
    classes = [KERAS.Optimizer, KERAS.LossScaleOptimizer]
    keras_optimizers.uninstall_keras_optimizer_hook()
    try:
        before = [dict(vars(cls)) for cls in classes]
        keras_optimizers.install_keras_optimizer_hook()
        assert [vars(cls).get("apply") for cls in classes] != [b.get("apply") for b in before]
        keras_optimizers.uninstall_keras_optimizer_hook()
        assert [dict(vars(cls)) for cls in classes] == before
    finally:
        keras_optimizers.install_keras_optimizer_hook()


# --------------------------------------------------------------------------- slot names, checkpoints

SLOTTED = {
    "Adagrad": lambda **kw: KERAS.Adagrad(0.2, **kw),
    "Adam": lambda **kw: KERAS.Adam(**ADAM, **kw),
    "Ftrl": lambda **kw: KERAS.Ftrl(0.2, l1_regularization_strength=0.01, **kw),
}


def _columns(ev):
    return sorted(n.decode() for n in ev.export_full()[4].numpy())


@pytest.mark.parametrize("optimizer,default,slots", [
    ("SGD", "sgd", []),
    ("Adagrad", "adagrad", ["accumulator"]),
    ("Adam", "adam", ["m", "v"]),
    ("Ftrl", "ftrl", ["accum", "linear"]),
    ("RMSprop", "rm_sprop", ["velocity", "momentum"]),
    ("AdamW", "adam_w", ["m", "v"]),
])
def test_keras_slot_columns_drop_the_auto_name_suffix(sok, unique_name, optimizer, default, slots):
    from sok_ev import keras_optimizers  # pylint: disable=import-outside-toplevel
    # Keras names unnamed optimizers <default>, <default>_1, ... in creation order.
    created = [getattr(KERAS, optimizer)(0.1) for _ in range(3)]
    assert all(re.fullmatch(default + r"(_\d+)?", o.name) for o in created)
    assert len({o.name for o in created}) == 3
    assert [keras_optimizers.slot_prefix(o) for o in created] == [default] * 3
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
    _apply_once(sok, ev, created[-1])
    assert _columns(ev) == sorted(f"{default}/{slot}" for slot in slots)


def test_explicit_keras_optimizer_names_are_kept_as_slot_prefixes(sok):
    from sok_ev import keras_optimizers  # pylint: disable=import-outside-toplevel
    assert keras_optimizers.slot_prefix(KERAS.Adagrad(0.1, name="item_adagrad")) == "item_adagrad"
    assert keras_optimizers.slot_prefix(KERAS.Adagrad(0.1, name="adagrad_item")) == "adagrad_item"
    assert keras_optimizers.slot_prefix(KERAS.Adam(0.1, name="adagrad_2")) == "adagrad_2"
    # Indistinguishable from an auto-name, so it shares the default column.
    assert keras_optimizers.slot_prefix(KERAS.Adagrad(0.1, name="adagrad_2")) == "adagrad"


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("optimizer", sorted(SLOTTED))
def test_keras_checkpoint_restores_ev_slots_into_fresh_optimizers_like_a_dense_variable(
        sok, rng, unique_name, tmp_path, mode, optimizer):
    """Train 3 steps, write, read into freshly built objects (after other
    optimizers of the class exist, so Keras auto-names them differently), train
    3 more. Reference: the same with a dense tf.Variable (for Adam, DeepRec's
    lazy Adam over all 6 steps, which the dense Adam is not)."""
    make = SLOTTED[optimizer]
    # Ftrl matches the dense variable from zero rows (see the module docstring).
    matrix = (np.zeros(
        (N_ROWS, DIM), np.float32) if optimizer == "Ftrl" else ref.random_matrix(rng, N_ROWS, DIM))
    batches = _batches(rng, steps=6)
    upstreams = _upstreams(rng, batches)
    name = unique_name()

    def build(dense):
        table = tf.Variable(matrix) if dense else ref.matrix_ev(sok, name, matrix)
        opt = make()
        return table, opt, tf.train.Checkpoint(table=table, optimizer=opt)

    def train(dense):
        table, opt, ckpt = build(dense)
        step = (lambda b, u: _dense_step(table, opt, b, u)) if dense else _ev_step(
            sok, table, opt, mode)
        for b, u in zip(batches[:3], upstreams[:3]):
            step(b, u)
        path = ckpt.write(str(tmp_path / ("dense" if dense else "ev")))
        make()  # one more optimizer of the class: the next auto-name moves on
        fresh, fresh_opt, fresh_ckpt = build(dense)
        assert fresh_opt.name != opt.name
        fresh_ckpt.read(path).assert_existing_objects_matched()
        fresh_step = (lambda b, u: _dense_step(fresh, fresh_opt, b, u)) if dense else _ev_step(
            sok, fresh, fresh_opt, mode)
        for b, u in zip(batches[3:], upstreams[3:]):
            fresh_step(b, u)
        assert int(fresh_opt.iterations) == 6
        return fresh

    ev = train(dense=False)
    assert _columns(ev) == sorted(f"{optimizer.lower()}/{slot}" for slot in {
        "Adagrad": ["accumulator"],
        "Adam": ["m", "v"],
        "Ftrl": ["accum", "linear"]
    }[optimizer])
    if optimizer == "Adam":
        expected = _lazy_adam(matrix, batches, upstreams)[-1]
    else:
        expected = train(dense=True).numpy()
    stored = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    ref.assert_rows_close(stored, {k: expected[k] for k in stored}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("name,column", [(None, "adagrad/accumulator"),
                                         ("shared", "shared/accumulator")])
def test_two_live_keras_optimizers_sharing_an_ev_column_raise_naming_both(
        sok, unique_name, mode, name, column):
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=DIM,
                                    initializer=tf.zeros_initializer())
    # Unnamed: Keras names them adagrad_<i> and adagrad_<i+1>.
    first, second = KERAS.Adagrad(0.1, name=name), KERAS.Adagrad(0.1, name=name)
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 4], tf.int64), [2, 1])

    def step(opt):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([ev], [ids], "sum")[0])
        opt.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))

    if mode == "tf_function":
        step_first, step_second = tf.function(lambda: step(first)), tf.function(
            lambda: step(second))
    else:
        step_first, step_second = lambda: step(first), lambda: step(second)
    step_first()
    before = ev.export_full()
    with pytest.raises(ValueError) as error:
        step_second()
    assert ref.error_names(error.value, first.name, second.name, ev.name, column, "name=")
    after = ev.export_full()
    # Keys, rows with slots, versions and slot columns unchanged (frequencies
    # count the failed step's lookup).
    for a, b in zip(ref.in_key_order(*(after[i].numpy() for i in (0, 1, 3))),
                    ref.in_key_order(*(before[i].numpy() for i in (0, 1, 3)))):
        np.testing.assert_array_equal(a, b)
    for i in (4, 5):
        np.testing.assert_array_equal(after[i].numpy(), before[i].numpy())
    assert int(second.iterations) == 0
    step_first()  # the first keeps training


def test_explicitly_named_keras_optimizers_keep_separate_state_on_one_ev(sok, rng, unique_name):
    """Two Adagrads, alternating on one table, each with its own accumulator:
    as on a dense variable."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, steps=4)
    upstreams = _upstreams(rng, batches)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    dense = tf.Variable(matrix)
    opts = [KERAS.Adagrad(0.2, name="user_a"), KERAS.Adagrad(0.1, name="user_b")]
    opts_ref = [KERAS.Adagrad(0.2), KERAS.Adagrad(0.1)]
    for t, (b, u) in enumerate(zip(batches, upstreams)):
        _ev_step(sok, ev, opts[t % 2], "eager")(b, u)
        _dense_step(dense, opts_ref[t % 2], b, u)
    assert _columns(ev) == ["user_a/accumulator", "user_b/accumulator"]
    stored = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    ref.assert_rows_close(stored, {k: dense.numpy()[k] for k in stored}, rtol=2e-6, atol=2e-6)


def test_a_garbage_collected_keras_optimizer_releases_its_slot_columns(sok, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
    first = KERAS.Adagrad(0.1)
    _apply_once(sok, ev, first)
    del first
    gc.collect()
    _apply_once(sok, ev, KERAS.Adagrad(0.1))  # the accumulator's owner is gone: no error
    assert _columns(ev) == ["adagrad/accumulator"]
