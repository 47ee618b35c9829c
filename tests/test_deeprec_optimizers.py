"""DeepRec's AdamAsyncOptimizer and AdagradDecayOptimizer (sok_ev.deeprec_optimizers).

Each is pinned against a NumPy implementation of DeepRec's rule, written
below from its kernels (ApplyAdamAsync, SparseApplyAdamAsync,
KvResourceSparseApplyAdamAsync, ApplyAdagradDecay, SparseApplyAdagradDecay,
KvResourceSparseApplyAdagradDecay), on Embedding Variables and dense
tf.Variables, over several steps of batches with duplicate keys and empty
samples, int32 and int64 keys, in graph mode (Session) and in a tf.function.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

N_ROWS, DIM, BATCH, STEPS = 12, 4, 6, 6
RTOL, ATOL = 1e-4, 1e-5  # float32 against float64 NumPy, over the steps
LR, BETA1, BETA2, EPSILON = 0.05, 0.8, 0.9, 1e-6
DECAY_STEP, DECAY_RATE, INITIAL_ACCUMULATOR = 2, 0.5, 0.1

# --- DeepRec's rules in NumPy ------------------------------------------------


def _row_gradients(batch, upstream):
    """{row: summed gradient} of sum(sum_combine(lookup) * upstream)."""
    return ref.numpy_batch_gradient((N_ROWS, DIM), batch, upstream)


class NumpyAdamAsync:
    """DeepRec's AdamAsync on a [rows, dim] variable, float64."""

    def __init__(self, matrix, rmsprop=False):
        self.value = matrix.astype(np.float64).copy()
        self.m = np.zeros_like(self.value)
        self.v = np.zeros_like(self.value)
        self.beta1_power, self.beta2_power = BETA1, BETA2
        self.rmsprop = rmsprop

    def sparse(self, grads):
        """KvResourceSparseApplyAdamAsync / SparseApplyAdamAsync: summed rows."""
        if not grads:
            return  # N == 0: nothing changes, not even the beta powers
        alpha = LR * np.sqrt(1 - self.beta2_power) / (1 - self.beta1_power)
        for row, g in grads.items():
            self.v[row] = self.v[row] * BETA2 + g * g * (1 - BETA2)
            if self.rmsprop:
                self.m[row] = self.m[row] * BETA1 + LR * g / np.sqrt(self.v[row] + EPSILON)
                self.value[row] -= self.m[row]
            else:
                self.m[row] = self.m[row] * BETA1 + g * (1 - BETA1)
                self.value[row] -= alpha * self.m[row] / (np.sqrt(self.v[row]) + EPSILON)
        if not self.rmsprop:
            self.beta1_power *= BETA1
            self.beta2_power *= BETA2

    def dense(self, g):
        """ApplyAdamAsync."""
        alpha = LR * np.sqrt(1 - self.beta2_power) / (1 - self.beta1_power)
        self.m = self.m * BETA1 + g * (1 - BETA1)
        self.v = self.v * BETA2 + g * g * (1 - BETA2)
        self.value -= alpha * self.m / (np.sqrt(self.v) + EPSILON)
        self.beta1_power *= BETA1
        self.beta2_power *= BETA2


class NumpyAdagradDecay:
    """DeepRec's AdagradDecay on a [rows, dim] variable, float64."""

    def __init__(self, matrix):
        self.value = matrix.astype(np.float64).copy()
        self.accumulator = np.full_like(self.value, INITIAL_ACCUMULATOR)
        self.power = np.zeros(self.value.shape[0], np.int64)  # a row's decays
        self.dense_power = 0  # ApplyAdagradDecay's one count

    def _decay(self, accumulator):
        return np.maximum(accumulator * DECAY_RATE, INITIAL_ACCUMULATOR)

    def sparse(self, grads, global_step):
        count = (global_step + 1) // DECAY_STEP  # DeepRec reads global_step + 1
        for row, g in grads.items():
            if count > self.power[row]:
                self.accumulator[row] = self._decay(self.accumulator[row])
                self.power[row] += 1
            self.accumulator[row] += g * g
            self.value[row] -= LR * g / np.sqrt(self.accumulator[row])

    def dense(self, g, global_step):
        if (global_step + 1) // DECAY_STEP > self.dense_power:
            self.accumulator = self._decay(self.accumulator)
            self.dense_power += 1
        self.accumulator += g * g
        self.value -= LR * g / np.sqrt(self.accumulator)


def _reference(optimizer, matrix):
    if optimizer == "adagrad_decay":
        return NumpyAdagradDecay(matrix)
    return NumpyAdamAsync(matrix, rmsprop=optimizer == "adam_async_rmsprop")


def _make_optimizer(optimizer, global_step):
    if optimizer == "adagrad_decay":
        return tf.compat.v1.train.AdagradDecayOptimizer(
            LR,
            global_step,
            initial_accumulator_value=INITIAL_ACCUMULATOR,
            accumulator_decay_step=DECAY_STEP,
            accumulator_decay_rate=DECAY_RATE)
    return tf.compat.v1.train.AdamAsyncOptimizer(
        LR,
        beta1=BETA1,
        beta2=BETA2,
        epsilon=EPSILON,
        apply_sparse_rmsprop=optimizer == "adam_async_rmsprop")


OPTIMIZERS = ["adam_async", "adam_async_rmsprop", "adagrad_decay"]


@pytest.fixture(scope="module")
def deeprec(sok):
    sok.install_deeprec_api()
    return sok


def _draw(rng, key_dtype, steps=STEPS):
    batches = [
        ref.random_sparse_batch(rng, BATCH, 3, ref.key_sampler(rng, "in_range", N_ROWS, key_dtype),
                                key_dtype) for _ in range(steps)
    ]
    upstreams = [rng.normal(size=(BATCH, DIM)).astype(np.float32) for _ in range(steps)]
    return batches, upstreams


def _dense_lookup(var, sp_ids):
    """Sum-combined rows of a dense variable: its gradient is tf.IndexedSlices
  with the batch's duplicate keys (the sparse apply's input)."""
    rows = tf.gather(var, sp_ids.values)
    return tf.math.unsorted_segment_sum(rows, sp_ids.indices[:, 0], tf.shape(sp_ids)[0])


def _loss(sok, ev, var, sp_ids, upstream):
    return (tf.reduce_sum(sok.lookup_sparse([ev], [sp_ids], combiners=["sum"])[0] * upstream) +
            tf.reduce_sum(_dense_lookup(var, sp_ids) * upstream))


def _check_step(optimizer, t, ev_rows, var_value, ev_reference, dense_reference):
    for key, row in ev_rows.items():
        np.testing.assert_allclose(row,
                                   ev_reference.value[key],
                                   rtol=RTOL,
                                   atol=ATOL,
                                   err_msg=f"{optimizer} EV key {key} after step {t + 1}")
    np.testing.assert_allclose(var_value,
                               dense_reference.value,
                               rtol=RTOL,
                               atol=ATOL,
                               err_msg=f"{optimizer} tf.Variable after step {t + 1}")


def _advance(optimizer, reference, batch, upstream, t):
    grads = _row_gradients(batch, upstream)
    if optimizer == "adagrad_decay":
        reference.sparse(grads, t)
    else:
        reference.sparse(grads)


@pytest.mark.parametrize("key_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_graph_mode_matches_deeprec_rule(deeprec, rng, unique_name, optimizer, key_dtype):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches, upstreams = _draw(rng, key_dtype)
    ev_reference, dense_reference = _reference(optimizer, matrix), _reference(optimizer, matrix)
    with ref.graph_session() as sess:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        ev = ref.matrix_ev(deeprec, unique_name(), matrix, key_dtype=key_dtype)
        var = tf.Variable(matrix, name="dense")
        sp_ids = tf.compat.v1.sparse_placeholder(tf.as_dtype(key_dtype), shape=[None, None])
        upstream = tf.compat.v1.placeholder(tf.float32, shape=[None, DIM])
        opt = _make_optimizer(optimizer, global_step)
        train_op = opt.minimize(_loss(deeprec, ev, var, sp_ids, upstream), global_step=global_step)
        exported = ev.export()
        sess.run(tf.compat.v1.global_variables_initializer())
        for t, (batch, up) in enumerate(zip(batches, upstreams)):
            sess.run(train_op, {sp_ids: batch.ids_value(), upstream: up})
            _advance(optimizer, ev_reference, batch, up, t)
            _advance(optimizer, dense_reference, batch, up, t)
            _check_step(optimizer, t, ref.export_to_dict(*sess.run(exported)), sess.run(var),
                        ev_reference, dense_reference)
        if optimizer == "adam_async":
            beta1_power = sess.run(opt.get_slot(ev, "beta1_power"))
            np.testing.assert_allclose(beta1_power, [BETA1**(STEPS + 1)], rtol=1e-5)
            np.testing.assert_allclose(sess.run(opt.get_slot(var, "beta2_power")),
                                       BETA2**(STEPS + 1),
                                       rtol=1e-5)
        if optimizer == "adagrad_decay":
            keys, powers = sess.run(opt.get_slot(ev, "accumulator_decay_power").export())
            for key, power in zip(keys, powers):
                np.testing.assert_array_equal(power, np.full(DIM, ev_reference.power[key]))
            assert max(ev_reference.power) >= 2, "the steps never decayed twice"


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_tf_function_matches_deeprec_rule_with_an_empty_batch(deeprec, rng, unique_name, optimizer):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches, upstreams = _draw(rng, np.int64)
    # A batch without a key: DeepRec's N == 0 leaves everything as it is.
    batches[2] = ref.SparseBatch(np.zeros((0, 2), np.int64), np.zeros(0, np.int64),
                                 np.zeros(0, np.float32), BATCH, 3)
    ev_reference, dense_reference = _reference(optimizer, matrix), _reference(optimizer, matrix)
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    ev = ref.matrix_ev(deeprec, unique_name(), matrix)
    var = tf.Variable(matrix)
    opt = _make_optimizer(optimizer, global_step)

    @tf.function(input_signature=[
        tf.SparseTensorSpec([None, None], tf.int64),
        tf.TensorSpec([None, DIM], tf.float32)
    ])
    def step(sp_ids, upstream):
        with tf.GradientTape() as tape:
            loss = _loss(deeprec, ev, var, sp_ids, upstream)
        grads = tape.gradient(loss, [ev, var])
        opt.apply_gradients(zip(grads, [ev, var]), global_step=global_step)

    for t, (batch, up) in enumerate(zip(batches, upstreams)):
        step(batch.sp_ids(), tf.constant(up))
        _advance(optimizer, ev_reference, batch, up, t)
        _advance(optimizer, dense_reference, batch, up, t)
        _check_step(optimizer, t, ref.export_to_dict(*[x.numpy() for x in ev.export()]),
                    var.numpy(), ev_reference, dense_reference)
    if optimizer == "adam_async":  # six steps, one without a key
        np.testing.assert_allclose(opt.get_slot(ev, "beta1_power").numpy(), [BETA1**STEPS],
                                   rtol=1e-5)


@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("optimizer", ["adam_async", "adagrad_decay"])
def test_dense_gradient_matches_deeprec_rule(deeprec, rng, optimizer, use_resource):
    """Resource variables, and the ref variables tf.disable_v2_behavior()
  makes (DeepRec's scripts' dense layers)."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    reference = _reference(optimizer, matrix)
    with ref.graph_session() as sess:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        var = tf.compat.v1.Variable(matrix, use_resource=use_resource)
        weights = tf.compat.v1.placeholder(tf.float32, shape=[N_ROWS, DIM])
        opt = _make_optimizer(optimizer, global_step)
        train_op = opt.minimize(tf.reduce_sum(var * weights), global_step=global_step)
        sess.run(tf.compat.v1.global_variables_initializer())
        for t in range(STEPS):
            g = rng.normal(size=(N_ROWS, DIM)).astype(np.float32)
            sess.run(train_op, {weights: g})
            if optimizer == "adagrad_decay":
                reference.dense(g.astype(np.float64), t)
            else:
                reference.dense(g.astype(np.float64))
            np.testing.assert_allclose(sess.run(var), reference.value, rtol=RTOL, atol=ATOL)
        if optimizer == "adagrad_decay":
            assert reference.dense_power >= 2
            assert sess.run(opt.get_slot(var, "accumulator_decay_power")).flat[0] == \
                reference.dense_power


@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("optimizer", ["adam_async", "adagrad_decay"])
def test_a_gathered_gradient_with_duplicates_matches_deeprec_sparse_rule(
        deeprec, rng, optimizer, use_resource):
    """tf.gather's IndexedSlices gradient, duplicate rows summed first (as
  DeepRec's SparseApply kernels are given them), on resource and ref
  variables; rows never gathered stay as they were."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    reference = _reference(optimizer, matrix)
    with ref.graph_session() as sess:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        var = tf.compat.v1.Variable(matrix, use_resource=use_resource)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        upstream = tf.compat.v1.placeholder(tf.float32, [None, DIM])
        opt = _make_optimizer(optimizer, global_step)
        train_op = opt.minimize(tf.reduce_sum(tf.gather(var, ids) * upstream),
                                global_step=global_step)
        sess.run(tf.compat.v1.global_variables_initializer())
        for t in range(STEPS):
            batch = rng.integers(0, N_ROWS // 2, size=2 * N_ROWS)  # duplicates, half the rows
            up = rng.normal(size=(len(batch), DIM)).astype(np.float32)
            sess.run(train_op, {ids: batch, upstream: up})
            grads = {}
            for row, g in zip(batch, up.astype(np.float64)):
                grads[row] = grads.get(row, 0.0) + g
            if optimizer == "adagrad_decay":
                reference.sparse(grads, t)
            else:
                reference.sparse(grads)
            np.testing.assert_allclose(sess.run(var), reference.value, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(sess.run(var)[N_ROWS // 2:], matrix[N_ROWS // 2:])


def _state(sess, opt, ev, var, slot_names):
    state = {}
    for name in slot_names:
        slot = opt.get_slot(ev, name)
        if hasattr(slot, "export"):
            state[f"ev/{name}"] = ref.export_to_dict(*sess.run(slot.export()))
        else:
            state[f"ev/{name}"] = sess.run(slot)
        state[f"var/{name}"] = sess.run(opt.get_slot(var, name))
    state["ev"] = ref.export_to_dict(*sess.run(ev.export()))
    state["var"] = sess.run(var)
    return state


def _assert_same_state(actual, expected):
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        if isinstance(value, dict):
            assert actual[name].keys() == value.keys(), name
            for key in value:
                np.testing.assert_array_equal(actual[name][key], value[key], err_msg=name)
        else:
            np.testing.assert_array_equal(actual[name], value, err_msg=name)


SLOTS = {
    "adam_async": ["m", "v", "beta1_power", "beta2_power"],
    "adagrad_decay": ["accumulator", "accumulator_decay_power"],
}
# DeepRec's checkpoint names of the Embedding Variable's table slots.
DEEPREC_SLOTS = {
    "adam_async": {
        "AdamAsync": "m",
        "AdamAsync_1": "v"
    },
    "adagrad_decay": {
        "AdagradDecay": "accumulator",
        "AdagradDecay_1": "accumulator_decay_power"
    },
}


@pytest.mark.parametrize("optimizer", ["adam_async", "adagrad_decay"])
def test_slots_save_restore_and_deeprec_layout(deeprec, rng, unique_name, tmp_path, optimizer):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches, upstreams = _draw(rng, np.int64, steps=4)
    with ref.graph_session() as sess:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        ev = ref.matrix_ev(deeprec, unique_name(), matrix)
        var = tf.Variable(matrix, name="dense")
        sp_ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
        upstream = tf.compat.v1.placeholder(tf.float32, shape=[None, DIM])
        opt = _make_optimizer(optimizer, global_step)
        train_op = opt.minimize(_loss(deeprec, ev, var, sp_ids, upstream), global_step=global_step)
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch, up in zip(batches[:3], upstreams[:3]):
            sess.run(train_op, {sp_ids: batch.ids_value(), upstream: up})
        saved = _state(sess, opt, ev, var, SLOTS[optimizer])
        prefix = saver.save(sess, os.path.join(tmp_path, "model"))
        sess.run(train_op, {sp_ids: batches[3].ids_value(), upstream: upstreams[3]})
        assert not np.array_equal(sess.run(var), saved["var"]), "the last step changed nothing"
        saver.restore(sess, prefix)
        _assert_same_state(_state(sess, opt, ev, var, SLOTS[optimizer]), saved)

        deeprec_prefix = os.path.join(tmp_path, "deeprec")
        deeprec.export_deeprec_checkpoint(deeprec_prefix, session=sess)
        base = ev.name[:-2]
        keys = tf.train.load_variable(deeprec_prefix, f"{base}-keys")
        for saved_name, slot in DEEPREC_SLOTS[optimizer].items():
            assert tf.train.load_variable(deeprec_prefix, f"{base}/{saved_name}-keys").tolist() == \
                keys.tolist()
            values = tf.train.load_variable(deeprec_prefix, f"{base}/{saved_name}-values")
            for key, row in zip(keys, values):
                np.testing.assert_array_equal(row, saved[f"ev/{slot}"][int(key)], err_msg=slot)
        if optimizer == "adam_async":  # dense [1] variables, as DeepRec's
            np.testing.assert_array_equal(
                tf.train.load_variable(deeprec_prefix, f"{base}/AdamAsync_2"),
                saved["ev/beta1_power"])


def test_tf_train_checkpoint_restores_slots(deeprec, rng, unique_name, tmp_path):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches, upstreams = _draw(rng, np.int64, steps=3)
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    ev = ref.matrix_ev(deeprec, unique_name(), matrix)
    var = tf.Variable(matrix)
    opt = _make_optimizer("adam_async", global_step)

    def step(batch, up):
        with tf.GradientTape() as tape:
            loss = _loss(deeprec, ev, var, batch.sp_ids(), tf.constant(up))
        opt.apply_gradients(zip(tape.gradient(loss, [ev, var]), [ev, var]), global_step=global_step)

    def state():
        return (list(ref.in_key_order(*(x.numpy() for x in opt.get_slot(ev, "m").export()))) +
                [opt.get_slot(ev, name).numpy() for name in ("beta1_power", "beta2_power")] +
                [opt.get_slot(var, "v").numpy(), var.numpy()])

    step(batches[0], upstreams[0])
    step(batches[1], upstreams[1])
    checkpoint = tf.train.Checkpoint(ev=ev, var=var, optimizer=opt)
    path = checkpoint.write(os.path.join(tmp_path, "ckpt"))
    saved = state()
    step(batches[2], upstreams[2])
    checkpoint.read(path).assert_consumed()
    for actual, expected in zip(state(), saved):
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("kwargs,name", [
    (dict(learning_rate=-0.1), "learning_rate"),
    (dict(beta1=1.0), "beta1"),
    (dict(beta1=-0.1), "beta1"),
    (dict(beta2=1.5), "beta2"),
])
def test_adam_async_refuses_bad_hyperparameters(deeprec, kwargs, name):
    arguments = dict(learning_rate=0.1)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=f"{name} must be .*{kwargs[name]!r}"):
        tf.compat.v1.train.AdamAsyncOptimizer(**arguments)


@pytest.mark.parametrize("kwargs,name", [
    (dict(learning_rate=-0.1), "learning_rate"),
    (dict(accumulator_decay_step=0), "accumulator_decay_step"),
    (dict(accumulator_decay_step=-5), "accumulator_decay_step"),
    (dict(accumulator_decay_rate=0.0), "accumulator_decay_rate"),
    (dict(accumulator_decay_rate=1.5), "accumulator_decay_rate"),
    (dict(initial_accumulator_value=0.0), "initial_accumulator_value"),
])
def test_adagrad_decay_refuses_bad_hyperparameters(deeprec, kwargs, name):
    arguments = dict(learning_rate=0.1, global_step=tf.Variable(0, dtype=tf.int64))
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=f"{name} must be .*{kwargs[name]!r}"):
        tf.compat.v1.train.AdagradDecayOptimizer(**arguments)


def test_installed_names(deeprec):
    for module in (tf.train, tf.compat.v1.train):
        assert module.AdamAsyncOptimizer is deeprec.AdamAsyncOptimizer
        assert module.AdagradDecayOptimizer is deeprec.AdagradDecayOptimizer
    # DeepRec's defaults.
    opt = deeprec.AdamAsyncOptimizer(0.1)
    assert (opt._beta1, opt._beta2, opt._epsilon, opt.get_name()) == (0.9, 0.999, 1e-8, "AdamAsync")
    decay = deeprec.AdagradDecayOptimizer(0.1, tf.Variable(0, dtype=tf.int64))
    assert (decay._initial_accumulator_value, decay._accumulator_decay_step,
            decay._accumulator_decay_rate, decay.get_name()) == (0.1, 100000, 0.9, "AdagradDecay")
