"""Stock tf.compat.v1.train optimizers training Embedding Variables.

After sok_ev.init(), GradientDescent, Adagrad, Ftrl, Momentum (incl.
Nesterov) and RMSProp (incl. centered and momentum) update an EV through
minimize, compute_gradients + apply_gradients (graph mode), apply_gradients
with a GradientTape, minimize with a callable loss (eager) and inside a
tf.function, and after every one of several steps the EV equals the same
optimizer applied to a dense tf.Variable holding the same rows. Rows outside
a step's batch do not change in that step. Adam on an EV is lazy (DeepRec):
it is pinned against a NumPy lazy Adam. sok_ev.OptimizerWrapper gives the
same results without the hook.

Every step t minimises sum(lookup_sum(batch_t) * upstream_t) with fresh
random keys in [0, N) (so rows drop in and out of batches) and a random
upstream gradient.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

# Our fused row update follows TF's sparse-apply kernels formula by formula
# in float32; only the order in which duplicate-key gradients are summed
# (and compiler contraction) may differ, compounded over the steps.
RTOL, ATOL = 1e-5, 1e-5
# The NumPy lazy-Adam reference runs in float64, the EV in float32.
ADAM_RTOL, ADAM_ATOL = 1e-4, 1e-5

N_ROWS, DIM, BATCH, MAX_HOTNESS, STEPS = 24, 4, 8, 4, 6

MODES = [
    "graph_minimize", "graph_compute_apply", "eager_apply_gradients", "eager_minimize",
    "tf_function"
]


def _draw_steps(rng, n_rows=N_ROWS, steps=STEPS):
    batches = [
        ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                ref.key_sampler(rng, "in_range", n_rows, np.int64), np.int64)
        for _ in range(steps)
    ]
    upstreams = [rng.normal(size=(BATCH, DIM)).astype(np.float32) for _ in range(steps)]
    return batches, upstreams


def _train_ev(sok, mode, make_optimizer, matrix, batches, upstreams, name):
    """Trains an EV (key k starts at matrix[k]) and returns {key: row} after each step."""
    history = []
    if mode.startswith("graph"):
        with ref.graph_session() as sess:
            ev = ref.matrix_ev(sok, name, matrix)
            sp_ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
            upstream = tf.compat.v1.placeholder(tf.float32, shape=[None, DIM])
            loss = tf.reduce_sum(sok.lookup_sparse([ev], [sp_ids], combiners=["sum"])[0] * upstream)
            opt = make_optimizer()
            if mode == "graph_minimize":
                train_op = opt.minimize(loss)  # var_list from TRAINABLE_VARIABLES
            else:
                train_op = opt.apply_gradients(opt.compute_gradients(loss))
            exported = ev.export()
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch, up in zip(batches, upstreams):
                sess.run(train_op, {sp_ids: batch.ids_value(), upstream: up})
                history.append(ref.export_to_dict(*sess.run(exported)))
        return history

    ev = ref.matrix_ev(sok, name, matrix)
    opt = make_optimizer()

    def loss_of(sp_ids, upstream):
        return tf.reduce_sum(sok.lookup_sparse([ev], [sp_ids], combiners=["sum"])[0] * upstream)

    def tape_step(sp_ids, upstream):
        with tf.GradientTape() as tape:
            loss = loss_of(sp_ids, upstream)
        grads = tape.gradient(loss, [ev])
        opt.apply_gradients(zip(grads, [ev]))

    # One trace for every step: the batches differ in nnz and batch size.
    compiled_step = tf.function(tape_step,
                                input_signature=[
                                    tf.SparseTensorSpec([None, None], tf.int64),
                                    tf.TensorSpec([None, DIM], tf.float32)
                                ])
    for batch, up in zip(batches, upstreams):
        if mode == "eager_apply_gradients":
            tape_step(batch.sp_ids(), up)
        elif mode == "eager_minimize":
            opt.minimize(lambda: loss_of(batch.sp_ids(), up), var_list=[ev])
        elif mode == "tf_function":
            compiled_step(batch.sp_ids(), tf.constant(up))
        else:
            raise ValueError(mode)
        history.append(ref.export_to_dict(*[t.numpy() for t in ev.export()]))
    return history


def _assert_rows_outside_batch_unchanged(history, batches):
    """Exactly equal: an update that touches other rows is a bug, not round-off."""
    checked = 0
    for t in range(1, len(history)):
        in_batch = set(batches[t].unique_keys().tolist())
        for key, row in history[t - 1].items():
            if key not in in_batch:
                np.testing.assert_array_equal(history[t][key],
                                              row,
                                              err_msg=f"key {key} changed in step {t}")
                checked += 1
    assert checked > 0, "the data never left a stored key out of a batch"


def _assert_matches_dense(history, dense_history, batches, rtol, atol):
    seen = set()
    for t, (ev_rows, dense) in enumerate(zip(history, dense_history)):
        seen |= set(batches[t].unique_keys().tolist())
        expected = {k: dense[k] for k in seen}
        ref.assert_rows_close(ev_rows, expected, rtol, atol, f"after step {t + 1}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("optimizer", sorted(ref.DENSE_EQUIVALENT_OPTIMIZERS))
def test_optimizer_on_ev_matches_same_optimizer_on_dense_variable(sok, rng, unique_name, optimizer,
                                                                  mode):
    make_optimizer = ref.DENSE_EQUIVALENT_OPTIMIZERS[optimizer]
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches, upstreams = _draw_steps(rng)

    history = _train_ev(sok, mode, make_optimizer, matrix, batches, upstreams, unique_name())

    dense_history = ref.dense_training_trajectory(make_optimizer, matrix, batches, upstreams)
    _assert_matches_dense(history, dense_history, batches, RTOL, ATOL)
    _assert_rows_outside_batch_unchanged(history, batches)


@pytest.mark.parametrize("mode", MODES)
def test_adam_on_ev_is_lazy_adam(sok, rng, unique_name, mode):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches, upstreams = _draw_steps(rng)

    history = _train_ev(sok, mode, ref.make_adam, matrix, batches, upstreams, unique_name())

    lazy = ref.numpy_lazy_adam_trajectory(matrix, batches, upstreams, **ref.ADAM_HYPERPARAMETERS)
    _assert_matches_dense(history, lazy, batches, ADAM_RTOL, ADAM_ATOL)
    _assert_rows_outside_batch_unchanged(history, batches)
    # The data must tell lazy from TF's dense (decay-everything) Adam, or the
    # comparison above would not show laziness.
    dense = ref.dense_training_trajectory(ref.make_adam, matrix, batches, upstreams)
    seen = sorted(set(np.concatenate([b.unique_keys() for b in batches]).tolist()))
    assert not np.allclose(dense[-1][seen], lazy[-1][seen], rtol=ADAM_RTOL, atol=ADAM_ATOL)


def test_numpy_lazy_adam_equals_tf_adam_when_every_row_is_in_every_batch(rng):
    # Checks the reference itself: with no row ever left out, lazy and dense
    # Adam coincide, so the NumPy reference must reproduce TF's AdamOptimizer.
    n_rows = 5
    batches = []
    for _ in range(STEPS):
        batch = ref.random_sparse_batch(rng,
                                        BATCH,
                                        MAX_HOTNESS,
                                        lambda n: rng.integers(0, n_rows, size=n),
                                        np.int64,
                                        with_empty_rows=False)
        batch.keys[:n_rows] = np.arange(n_rows)  # every row at least once
        batches.append(batch)
    assert all(len(b.unique_keys()) == n_rows for b in batches)
    upstreams = [rng.normal(size=(BATCH, DIM)).astype(np.float32) for _ in range(STEPS)]
    matrix = ref.random_matrix(rng, n_rows, DIM)

    lazy = ref.numpy_lazy_adam_trajectory(matrix, batches, upstreams, **ref.ADAM_HYPERPARAMETERS)
    dense = ref.dense_training_trajectory(ref.make_adam, matrix, batches, upstreams)

    for t in range(STEPS):
        np.testing.assert_allclose(dense[t], lazy[t], rtol=ADAM_RTOL, atol=ADAM_ATOL)


@pytest.mark.parametrize(
    "optimizer", ["sgd", "adagrad", "ftrl_l1_l2", "momentum_nesterov", "rmsprop_centered_momentum"])
@pytest.mark.parametrize(
    "mode", ["graph_minimize", "graph_compute_apply", "eager_apply_gradients", "eager_minimize"])
def test_optimizer_wrapper_matches_dense_optimizer(sok, rng, unique_name, optimizer, mode):
    make_stock = ref.DENSE_EQUIVALENT_OPTIMIZERS[optimizer]
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches, upstreams = _draw_steps(rng)

    history = _train_ev(sok, mode, lambda: sok.OptimizerWrapper(make_stock()), matrix, batches,
                        upstreams, unique_name())

    dense_history = ref.dense_training_trajectory(make_stock, matrix, batches, upstreams)
    _assert_matches_dense(history, dense_history, batches, RTOL, ATOL)


def test_optimizer_wrapper_adam_is_lazy_adam(sok, rng, unique_name):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches, upstreams = _draw_steps(rng)

    history = _train_ev(sok, "graph_minimize", lambda: sok.OptimizerWrapper(ref.make_adam()),
                        matrix, batches, upstreams, unique_name())

    lazy = ref.numpy_lazy_adam_trajectory(matrix, batches, upstreams, **ref.ADAM_HYPERPARAMETERS)
    _assert_matches_dense(history, lazy, batches, ADAM_RTOL, ADAM_ATOL)


@pytest.mark.parametrize("optimizer", ["adagrad", "momentum", "rmsprop_centered"])
def test_one_minimize_updates_evs_and_dense_variables_together(sok, rng, optimizer):
    # A model mixes EVs and dense weights: the hook must leave the dense path
    # exactly stock, and global_step must still advance once per step.
    make_optimizer = ref.DENSE_EQUIVALENT_OPTIMIZERS[optimizer]
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    weight0 = rng.normal(size=(DIM,)).astype(np.float32)
    batches, upstreams = _draw_steps(rng)

    # Reference: the same model with the embedding held in a dense Variable.
    with ref.on_reference_device():
        table, weight = tf.Variable(matrix), tf.Variable(weight0)
        opt = make_optimizer()
        for batch, up in zip(batches, upstreams):
            with tf.GradientTape() as tape:
                out = ref.dense_lookup_sparse(table, batch, "sum", False)
                loss = tf.reduce_sum(out * up * weight)
            opt.apply_gradients(zip(tape.gradient(loss, [table, weight]), [table, weight]))

    with ref.graph_session() as sess:
        ev = ref.matrix_ev(sok, "table", matrix)
        w = tf.compat.v1.get_variable("weight", initializer=weight0)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        sp_ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
        upstream = tf.compat.v1.placeholder(tf.float32, shape=[None, DIM])
        out = sok.lookup_sparse([ev], [sp_ids], combiners=["sum"])[0]
        train_op = make_optimizer().minimize(tf.reduce_sum(out * upstream * w),
                                             global_step=global_step)
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch, up in zip(batches, upstreams):
            sess.run(train_op, {sp_ids: batch.ids_value(), upstream: up})
        ev_rows = ref.export_to_dict(*sess.run(ev.export()))
        w_value, step = sess.run([w, global_step])

    assert step == STEPS
    np.testing.assert_allclose(w_value, weight.numpy(), rtol=RTOL, atol=ATOL)
    dense = table.numpy()
    ref.assert_rows_close(ev_rows, {k: dense[k] for k in ev_rows}, RTOL, ATOL, "EV")
    seen = set(np.concatenate([b.unique_keys() for b in batches]).tolist())
    assert set(ev_rows) == seen


def _apply_ops(graph):
    return [op for op in graph.get_operations() if op.type == "SokEv>SparseApplyOptimizer"]


@pytest.mark.parametrize("form", ["sparse_list", "packed"])
def test_the_gradient_of_one_lookup_is_applied_without_deduplicating_again(sok, rng, form):
    # A table looked up once: its gradient's keys are that lookup's unique
    # keys, so the fused apply is told they are distinct, whichever form
    # the ids came in (a SparseTensor per table, or one packed RaggedTensor).
    with ref.graph_session() as sess:
        ev = ref.matrix_ev(sok, "emb", ref.random_matrix(rng, N_ROWS, DIM))
        batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                        ref.key_sampler(rng, "in_range", N_ROWS, np.int64),
                                        np.int64)
        ids = ([batch.sp_ids()] if form == "sparse_list" else tf.expand_dims(
            tf.RaggedTensor.from_sparse(batch.sp_ids()), 0))
        loss = tf.reduce_sum(sok.lookup_sparse([ev], ids)[0])
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
        [apply] = _apply_ops(sess.graph)
        assert apply.get_attr("keys_are_unique") == [True]


@pytest.mark.parametrize("twice", ["one_call", "two_calls"])
def test_a_table_looked_up_twice_has_its_duplicate_keys_summed(sok, rng, twice):
    # TF concatenates the two lookups' gradients, so keys repeat: the apply
    # must deduplicate, and the result equals SGD on a dense variable.
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches, upstreams = _draw_steps(rng, steps=2)
    with ref.graph_session() as sess:
        ev = ref.matrix_ev(sok, "emb", matrix)
        ids = [b.sp_ids() for b in batches]
        if twice == "one_call":
            outs = sok.lookup_sparse([ev, ev], ids, "sum")
        else:
            outs = (sok.lookup_sparse([ev], ids[:1], "sum") +
                    sok.lookup_sparse([ev], ids[1:], "sum"))
        loss = sum(tf.reduce_sum(out * up) for out, up in zip(outs, upstreams))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        [apply] = _apply_ops(sess.graph)
        assert apply.get_attr("keys_are_unique") == [False]
        exported = ev.export()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train_op)
        rows = ref.export_to_dict(*sess.run(exported))

    dense = tf.Variable(matrix)
    with tf.GradientTape() as tape:
        loss = sum(
            tf.reduce_sum(ref.dense_lookup_sparse(dense, b, "sum", False) * up)
            for b, up in zip(batches, upstreams))
    tf.compat.v1.train.GradientDescentOptimizer(0.5).apply_gradients([(tape.gradient(loss, dense),
                                                                       dense)])
    expected = {k: dense.numpy()[k] for k in rows}
    ref.assert_rows_close(rows, expected, RTOL, ATOL, "after one step")


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
def test_an_update_after_its_keys_were_erased_and_their_rows_reused_lands_on_its_keys(
        sok, rng, unique_name, key_dtype):
    # The update reuses the rows its step's lookup found, unless a key of
    # their shard was erased in between. Here every looked-up key is evicted
    # and new keys take the freed rows before the update: the update must
    # re-insert the looked-up keys (at their initial rows, as a dense Adagrad
    # step from the start sees them) and leave the new keys' rows alone.
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    n_rows, batch_size = 400, 300
    matrix = ref.random_matrix(rng, n_rows, DIM)
    batch = ref.random_sparse_batch(rng, batch_size, MAX_HOTNESS,
                                    ref.key_sampler(rng, "in_range", n_rows, key_dtype), key_dtype)
    upstream = rng.normal(size=(batch_size, DIM)).astype(np.float32)
    ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype=key_dtype)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([ev], [batch.sp_ids()], "sum")[0] * upstream)
    grad, = tape.gradient(loss, [ev])
    ops().sok_ev_embedding_variable_evict_by_l2_weight(ev.handle,
                                                       key_dtype=tf.as_dtype(key_dtype),
                                                       l2_weight_threshold=1e30)
    assert ev.export()[0].shape[0] == 0
    newcomers = np.arange(n_rows, 3 * n_rows).astype(key_dtype)
    ops().sok_ev_find_or_insert([ev.handle], [tf.constant(newcomers)],
                                [tf.ones([len(newcomers)], tf.int64)],
                                embedding_dims=[DIM])
    tf.compat.v1.train.AdagradOptimizer(0.1).apply_gradients([(grad, ev)])
    rows = ref.export_to_dict(*(t.numpy() for t in ev.export()))

    dense = tf.Variable(matrix)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(ref.dense_lookup_sparse(dense, batch, "sum", False) * upstream)
    tf.compat.v1.train.AdagradOptimizer(0.1).apply_gradients([(tape.gradient(loss, dense), dense)])
    expected = {int(k): dense.numpy()[k] for k in batch.unique_keys()}
    expected.update({int(k): matrix[k % n_rows] for k in newcomers})
    ref.assert_rows_close(rows, expected, RTOL, ATOL, "after the update")


@pytest.mark.parametrize("indices_dtype", [tf.int64, tf.float32])
def test_a_gradient_whose_indices_the_table_cannot_hold_is_refused_before_any_update(
        sok, unique_name, indices_dtype):
    # An int32 table: int64 keys would be cut to 32 bits (2**40 -> 0), and
    # floats are not keys at all; the lookup refuses such ids the same way.
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=2, key_dtype=tf.int32)
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([2**40], indices_dtype))

    with pytest.raises(TypeError) as error:
        tf.compat.v1.train.GradientDescentOptimizer(0.5).apply_gradients([(grad, ev)])

    assert ref.error_names(error.value, ev.name, indices_dtype.name, "int32")
    assert int(ev.total_count()) == 0


@pytest.mark.parametrize("argument, value", [("learning_rate", 0.0), ("learning_rate", -0.1),
                                             ("learning_rate_power", 0.5)])
def test_ftrl_refuses_what_tfs_dense_ftrl_kernel_refuses_before_any_update(
        sok, unique_name, argument, value):
    # TF's ResourceSparseApplyFtrl (its CPU kernel) refuses a non-positive
    # learning rate (FTRL divides by it) and a positive learning_rate_power.
    def apply(variable):
        optimizer = tf.compat.v1.train.FtrlOptimizer(0.1)
        setattr(optimizer, f"_{argument}", value)  # past the constructor's own checks
        grad = tf.IndexedSlices(tf.ones([2, 4]), tf.constant([1, 2], tf.int64),
                                tf.constant([4, 4], tf.int64))
        optimizer.apply_gradients([(grad, variable)])

    with tf.device("/CPU:0"), pytest.raises(tf.errors.InvalidArgumentError):
        apply(tf.Variable(tf.zeros([4, 4])))  # TF's GPU kernel does not check
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        apply(ev)

    assert ref.error_names(error.value, argument, str(value).rstrip("0").rstrip("."))
    assert int(ev.total_count()) == 0


def test_a_bad_embedding_variable_gradient_stops_the_step_before_a_dense_variable_moves(
        sok, unique_name):
    # Eagerly a v1 optimizer updates each variable as its op is made; the
    # Embedding Variable's gradient is checked before any of them.
    dense = tf.Variable(tf.ones([3, 2]))
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=2)
    dense_grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))
    wrong_width = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([5], tf.int64))

    with pytest.raises(ValueError) as error:
        tf.compat.v1.train.AdagradOptimizer(0.5).apply_gradients([(dense_grad, dense),
                                                                  (wrong_width, ev)])

    assert ref.error_names(error.value, ev.name, "[n, 2]", "(1, 3)")
    np.testing.assert_array_equal(dense.numpy(), np.ones([3, 2]))
    assert int(ev.total_count()) == 0
