"""One fused apply updates every Embedding Variable of an optimizer step.

A stock tf.compat.v1.train optimizer (through the hook), sok_ev.OptimizerWrapper
and a Keras optimizer apply all their Embedding Variables with one
SokEv>SparseApplyOptimizer op per device, whose tables run side by side. The
grouping must change nothing a user sees:

* each table, int32 or int64 keyed, ends where the same optimizer leaves a
  dense tf.Variable trained on its batches alone (lazy NumPy Adam for Adam,
  whose shared beta powers must advance once per step, after the update);
* a variable given twice to apply_gradients is updated twice, in order;
* every input of every table is checked before any table changes.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref
from sok_ev._ops import ops

RTOL, ATOL = 1e-5, 1e-5
ADAM_RTOL, ADAM_ATOL = 1e-4, 1e-5
BATCH, MAX_HOTNESS, STEPS = 8, 4, 4
# (rows, dim, key dtype) of each table of the model.
TABLES = [(24, 4, np.int64), (16, 4, np.int32), (30, 8, np.int64)]


def _draw(rng):
    """Per table: its initial matrix, its batches and its upstream gradients."""
    drawn = []
    for n_rows, dim, key_dtype in TABLES:
        batches = [
            ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "in_range", n_rows, key_dtype), key_dtype)
            for _ in range(STEPS)
        ]
        upstreams = [rng.normal(size=(BATCH, dim)).astype(np.float32) for _ in range(STEPS)]
        drawn.append((ref.random_matrix(rng, n_rows, dim), batches, upstreams))
    return drawn


def _apply_ops(graph):
    return [op for op in graph.get_operations() if op.type == "SokEv>SparseApplyOptimizer"]


def _train(sok, mode, make_optimizer, drawn, name):
    """Trains one EV per table with one optimizer; returns each table's
  {key: row} after the last step."""
    key_dtypes = [key_dtype for _, _, key_dtype in TABLES]
    if mode == "graph_minimize":
        with ref.graph_session() as sess:
            evs = [
                ref.matrix_ev(sok, f"{name}_{t}", matrix, key_dtype)
                for t, ((matrix, _, _), key_dtype) in enumerate(zip(drawn, key_dtypes))
            ]
            sp_ids = [
                tf.compat.v1.sparse_placeholder(tf.as_dtype(k), shape=[None, None])
                for k in key_dtypes
            ]
            upstreams = [
                tf.compat.v1.placeholder(tf.float32, shape=[None, dim]) for _, dim, _ in TABLES
            ]
            outs = sok.lookup_sparse(evs, sp_ids, combiners=["sum"] * len(evs))
            loss = sum(tf.reduce_sum(out * up) for out, up in zip(outs, upstreams))
            train_op = make_optimizer().minimize(loss)
            [apply] = _apply_ops(sess.graph)
            assert apply.get_attr("N") == len(TABLES)
            exported = [ev.export() for ev in evs]
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(STEPS):
                feed = {}
                for t, (_, batches, ups) in enumerate(drawn):
                    feed[sp_ids[t]] = batches[step].ids_value()
                    feed[upstreams[t]] = ups[step]
                sess.run(train_op, feed)
            return [ref.export_to_dict(*sess.run(e)) for e in exported]

    evs = [
        ref.matrix_ev(sok, f"{name}_{t}", matrix, key_dtype)
        for t, ((matrix, _, _), key_dtype) in enumerate(zip(drawn, key_dtypes))
    ]
    opt = make_optimizer()

    def step_fn(sp_ids, upstreams):
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(evs, sp_ids, combiners=["sum"] * len(evs))
            loss = sum(tf.reduce_sum(out * up) for out, up in zip(outs, upstreams))
        opt.apply_gradients(zip(tape.gradient(loss, evs), evs))

    run = tf.function(step_fn) if mode == "tf_function" else step_fn
    for step in range(STEPS):
        run([batches[step].sp_ids() for _, batches, _ in drawn],
            [tf.constant(ups[step]) for _, _, ups in drawn])
    if mode == "tf_function":
        graph = run.get_concrete_function([batches[0].sp_ids() for _, batches, _ in drawn],
                                          [tf.constant(ups[0]) for _, _, ups in drawn]).graph
        [apply] = _apply_ops(graph)
        assert apply.get_attr("N") == len(TABLES)
    return [ref.export_to_dict(*ev.export()) for ev in evs]


def _assert_tables_match(rows_by_table, reference_by_table, rtol, atol):
    for t, (rows, reference) in enumerate(zip(rows_by_table, reference_by_table)):
        ref.assert_rows_close(rows, {k: reference[k] for k in rows}, rtol, atol, f"table {t}")


MAKERS = {
    "sgd": ref.DENSE_EQUIVALENT_OPTIMIZERS["sgd"],
    "adagrad": ref.DENSE_EQUIVALENT_OPTIMIZERS["adagrad"],
    "ftrl_l1_l2": ref.DENSE_EQUIVALENT_OPTIMIZERS["ftrl_l1_l2"],
    "rmsprop_centered_momentum": ref.DENSE_EQUIVALENT_OPTIMIZERS["rmsprop_centered_momentum"],
}


@pytest.mark.parametrize("mode", ["graph_minimize", "eager_apply_gradients", "tf_function"])
@pytest.mark.parametrize("optimizer", sorted(MAKERS))
def test_one_apply_op_trains_every_table_as_a_dense_variable(sok, rng, unique_name, optimizer,
                                                             mode):
    drawn = _draw(rng)
    rows = _train(sok, mode, MAKERS[optimizer], drawn, unique_name())
    dense = [
        ref.dense_training_trajectory(MAKERS[optimizer], matrix, batches, upstreams)[-1]
        for matrix, batches, upstreams in drawn
    ]
    _assert_tables_match(rows, dense, RTOL, ATOL)


@pytest.mark.parametrize("mode", ["graph_minimize", "eager_apply_gradients"])
def test_grouped_adam_is_lazy_adam_with_beta_powers_advanced_once_a_step(
        sok, rng, unique_name, mode):
    drawn = _draw(rng)
    rows = _train(sok, mode, ref.make_adam, drawn, unique_name())
    lazy = [
        ref.numpy_lazy_adam_trajectory(matrix, batches, upstreams, **ref.ADAM_HYPERPARAMETERS)[-1]
        for matrix, batches, upstreams in drawn
    ]
    _assert_tables_match(rows, lazy, ADAM_RTOL, ADAM_ATOL)


@pytest.mark.parametrize("wrap", ["wrapper", "keras"])
def test_wrapper_and_keras_optimizers_group_their_tables_too(sok, rng, unique_name, wrap):
    drawn = _draw(rng)
    if wrap == "wrapper":
        make = lambda: sok.OptimizerWrapper(MAKERS["adagrad"]())
    else:
        make = lambda: tf.keras.optimizers.SGD(0.3)  # as MAKERS["sgd"]
    rows = _train(sok, "tf_function", make, drawn, unique_name())
    make_dense = MAKERS["adagrad"] if wrap == "wrapper" else MAKERS["sgd"]
    dense = [
        ref.dense_training_trajectory(make_dense, matrix, batches, upstreams)[-1]
        for matrix, batches, upstreams in drawn
    ]
    _assert_tables_match(rows, dense, RTOL, ATOL)


def test_a_variable_given_twice_is_updated_twice_in_order(sok, rng, unique_name):
    # Adagrad's second update depends on the first's accumulator, so the
    # order shows; the reference applies the two gradients one after another.
    (matrix, batches, upstreams), (other_matrix, other_batches, other_ups), _ = _draw(rng)

    def gradient(matrix, batch, upstream, key_dtype):
        by_key = ref.reference_gradient(matrix, batch, "sum", False, upstream)
        keys = np.array(sorted(by_key), dtype=key_dtype)
        return tf.IndexedSlices(tf.constant(np.stack([by_key[int(k)] for k in keys])),
                                tf.constant(keys))

    first, second = (gradient(matrix, batches[s], upstreams[s], np.int64) for s in range(2))
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    other = ref.matrix_ev(sok, unique_name(), other_matrix, np.int32)
    MAKERS["adagrad"]().apply_gradients([(first, ev),
                                         (gradient(other_matrix, other_batches[0], other_ups[0],
                                                   np.int32), other), (second, ev)])

    with ref.on_reference_device():
        dense = tf.Variable(matrix)
        dense_opt = MAKERS["adagrad"]()
        for grad in (first, second):
            dense_opt.apply_gradients([(grad, dense)])
    rows = ref.export_to_dict(*ev.export())
    ref.assert_rows_close(rows, {k: dense.numpy()[k] for k in rows}, RTOL, ATOL, "twice")


def _snapshot(evs):
    snapshot = []
    for ev in evs:
        keys, values, frequencies, versions, slot_names, _ = ev.export_full()
        snapshot.append((keys.numpy(), values.numpy(), frequencies.numpy(), versions.numpy(),
                         slot_names.numpy().tolist()))
    return snapshot


def _assert_unchanged(before, after):
    for (k0, v0, f0, s0, n0), (k1, v1, f1, s1, n1) in zip(before, after):
        order0, order1 = np.argsort(k0), np.argsort(k1)
        np.testing.assert_array_equal(k0[order0], k1[order1])
        np.testing.assert_array_equal(v0[order0], v1[order1])
        np.testing.assert_array_equal(f0[order0], f1[order1])
        np.testing.assert_array_equal(s0[order0], s1[order1])
        assert n0 == n1


def test_a_bad_gradient_in_the_last_table_changes_no_table(sok, rng, unique_name):
    evs = [ref.matrix_ev(sok, unique_name(), ref.random_matrix(rng, 10, 4)) for _ in range(3)]
    keys = tf.constant([1, 5, 7], tf.int64)
    for ev in evs:  # some rows to change
        sok.lookup_sparse([ev], [tf.SparseTensor([[0, 0], [1, 0], [2, 0]], keys, [3, 1])])
    before = _snapshot(evs)
    grads = [tf.ones([3, 4]), tf.ones([3, 4]), tf.ones([3, 5])]
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        ops().sok_ev_sparse_apply_optimizer([ev.handle for ev in evs], [keys] * 3,
                                            grads,
                                            tf.constant([0.1]),
                                            tf.constant(1, tf.int64),
                                            optimizer="adagrad",
                                            slot_names=["Adagrad/accumulator"],
                                            slot_initial_values=[0.1],
                                            keys_are_unique=[True] * 3)
    assert ref.error_names(error.value, evs[2].name.split(":")[0], "[3, 4]", "[3,5]")
    _assert_unchanged(before, _snapshot(evs))


def test_a_dense_gradient_for_one_table_raises_before_any_table_changes(sok, rng, unique_name):
    # Eagerly the hook would apply as it goes; the grouped update waits for
    # the last table, so the first is still untouched when the second fails.
    evs = [ref.matrix_ev(sok, unique_name(), ref.random_matrix(rng, 10, 4)) for _ in range(2)]
    keys = tf.constant([1, 5], tf.int64)
    for ev in evs:
        sok.lookup_sparse([ev], [tf.SparseTensor([[0, 0], [1, 0]], keys, [2, 1])])
    before = _snapshot(evs)
    good = tf.IndexedSlices(tf.ones([2, 4]), keys)
    with pytest.raises(TypeError) as error:
        MAKERS["adagrad"]().apply_gradients([(good, evs[0]), (tf.ones([10, 4]), evs[1])])
    assert ref.error_names(error.value, evs[1].name, "IndexedSlices")
    _assert_unchanged(before, _snapshot(evs))
