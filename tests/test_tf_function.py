"""TF2 habits with Embedding Variables: tf.function arguments, tapes outside
the tf.function, and no warnings a user did not cause.

Pinned down:
* an Embedding Variable (or a list of them, as SOK's TF2 tests pass) is a
  valid tf.function argument: the function traces once per variable, reads
  and trains the variable it was given (never another's), and trains like
  the same loop on a dense tf.Variable argument;
* a GradientTape opened outside the tf.function that does the lookup (as
  TFRA's eager tests do) gets the Embedding Variable's gradient, equal to
  TensorFlow's on a dense variable;
* tracing tf.functions that use sok-ev (OptimizerWrapper, the optimizer
  hooks, tf.nn lookups) logs and prints no AutoGraph warning.
"""
import logging

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

N_ROWS, DIM = 16, 4


def _batch(rng, key_dtype=np.int64):
    return ref.random_sparse_batch(rng, 6, 3, lambda n: rng.integers(0, N_ROWS, size=n), key_dtype)


# --------------------------------------------------------------------------- arguments


def test_ev_as_tf_function_argument_trains_like_a_dense_variable_argument(sok, rng, unique_name):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = [_batch(rng) for _ in range(4)]
    upstreams = [rng.normal(size=(b.batch_size, DIM)).astype(np.float32) for b in batches]

    ev = ref.matrix_ev(sok, unique_name(), matrix)
    ev_opt = tf.compat.v1.train.AdagradOptimizer(0.2)

    @tf.function
    def ev_step(table, indices, keys, shape, upstream):
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([table], [tf.SparseTensor(indices, keys, shape)], "sum")[0]
            loss = tf.reduce_sum(out * upstream)
        ev_opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    dense = tf.Variable(matrix)
    dense_opt = tf.compat.v1.train.AdagradOptimizer(0.2)

    @tf.function
    def dense_step(table, indices, keys, shape, upstream):
        with tf.GradientTape() as tape:
            sp_ids = tf.SparseTensor(indices, keys, shape)
            out = tf.nn.embedding_lookup_sparse(table, sp_ids, None, combiner="sum")
            out = tf.pad(out, [[0, shape[0] - tf.shape(out, out_type=tf.int64)[0]], [0, 0]])
            loss = tf.reduce_sum(out * upstream)
        dense_opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    for batch, upstream in zip(batches, upstreams):
        args = (batch.indices, batch.keys, np.array(batch.dense_shape, np.int64), upstream)
        ev_step(ev, *args)
        dense_step(dense, *args)
    # The Embedding Variable argument retraces no more than the dense one.
    assert ev_step.experimental_get_tracing_count() <= dense_step.experimental_get_tracing_count()
    stored = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    expected = dense.numpy()
    ref.assert_rows_close(stored, {k: expected[k] for k in stored}, rtol=1e-6, atol=1e-6)


def test_tf_function_reads_the_ev_it_is_given_and_traces_once_per_ev(sok, rng, unique_name):
    matrices = [ref.random_matrix(rng, N_ROWS, DIM) for _ in range(2)]
    evs = [ref.matrix_ev(sok, unique_name(), m) for m in matrices]
    keys = rng.integers(0, N_ROWS, size=5)

    @tf.function
    def rows(table, ids):
        return tf.nn.embedding_lookup(table, ids)

    for _ in range(2):  # the second round reuses both traces
        for ev, matrix in zip(evs, matrices):
            np.testing.assert_array_equal(rows(ev, tf.constant(keys)).numpy(), matrix[keys])
    assert rows.experimental_get_tracing_count() == 2


def test_list_of_evs_as_tf_function_argument(sok, rng, unique_name):
    """SOK's TF2 tests pass the list of tables to the step function."""
    matrices = [ref.random_matrix(rng, N_ROWS, DIM) for _ in range(2)]
    evs = [ref.matrix_ev(sok, unique_name(), m) for m in matrices]
    batch = _batch(rng)

    @tf.function
    def forward(tables, sp_ids):
        return sok.lookup_sparse(tables, [sp_ids, sp_ids], combiners=["sum", "mean"])

    out = forward(evs, batch.sp_ids())
    for combiner, got, matrix in zip(["sum", "mean"], out, matrices):
        np.testing.assert_allclose(got.numpy(),
                                   ref.reference_lookup(matrix, batch, combiner, False),
                                   rtol=1e-6,
                                   atol=1e-6)


# --------------------------------------------------------------------------- tape outside


@pytest.mark.parametrize("combiner", ref.COMBINERS)
@pytest.mark.parametrize("use_weights", [False, True])
@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES)
@pytest.mark.parametrize("as_argument", [False, True])
def test_tape_outside_the_tf_function_gets_the_ev_gradient(sok, rng, unique_name, combiner,
                                                           use_weights, key_dtype, as_argument):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype)
    batch = _batch(rng, key_dtype)
    upstream = rng.normal(size=(batch.batch_size, DIM)).astype(np.float32)
    weights = [batch.sp_weights()] if use_weights else None

    @tf.function
    def forward_closure(sp_ids):
        return sok.lookup_sparse([ev], [sp_ids], [combiner], weights)[0]

    @tf.function
    def forward_argument(table, sp_ids):
        return sok.lookup_sparse([table], [sp_ids], [combiner], weights)[0]

    with tf.GradientTape() as tape:
        out = forward_argument(ev, batch.sp_ids()) if as_argument else forward_closure(
            batch.sp_ids())
        loss = tf.reduce_sum(out * upstream)
    grad = tape.gradient(loss, ev)
    assert isinstance(grad, tf.IndexedSlices)
    got = ref.indexed_slices_to_dict(grad.indices.numpy(), grad.values.numpy())
    expected = ref.reference_gradient(matrix, batch, combiner, use_weights, upstream)
    ref.assert_rows_close(got, expected, rtol=1e-5, atol=1e-5, what="gradient")


def test_tape_outside_the_tf_function_trains_through_tf_nn_embedding_lookup(sok, rng, unique_name):
    """TFRA's eager pattern: forward in a tf.function, tape and optimizer outside."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    dense = tf.Variable(matrix)
    ids = [rng.integers(0, N_ROWS, size=7) for _ in range(3)]

    @tf.function
    def forward(table, keys):
        return tf.reduce_sum(tf.nn.embedding_lookup(table, keys)**2)

    opts = [tf.keras.optimizers.Adagrad(0.1), tf.keras.optimizers.Adagrad(0.1)]
    for keys in ids:
        for table, opt in zip((ev, dense), opts):
            with tf.GradientTape() as tape:
                loss = forward(table, tf.constant(keys))
            grad = tape.gradient(loss, table)
            if table is dense:
                grad = tf.convert_to_tensor(grad)  # duplicates summed, as for the EV
            opt.apply_gradients([(grad, table)])
    stored = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    ref.assert_rows_close(stored, {k: dense.numpy()[k] for k in stored}, rtol=2e-6, atol=2e-6)


# --------------------------------------------------------------------------- no stray warnings


class _Records(logging.Handler):

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_tracing_sok_ev_in_tf_function_logs_no_autograph_warning(sok, rng, unique_name, capsys):
    records = _Records()
    logger = tf.get_logger()
    logger.addHandler(records)
    try:
        ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
        wrapped = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        hooked = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        keras = tf.keras.optimizers.SGD(0.1)

        @tf.function
        def step(sp_ids):
            loss = lambda: tf.reduce_sum(sok.lookup_sparse([ev], [sp_ids])[0])
            wrapped.minimize(loss(), var_list=[ev])
            with tf.GradientTape() as tape:
                total = tf.reduce_sum(tf.nn.embedding_lookup_sparse(ev, sp_ids, None)) + loss()
            grads = tape.gradient(total, [ev])
            hooked.apply_gradients(zip(grads, [ev]))
            keras.apply_gradients(zip(grads, [ev]))
            return total

        for hotness in (2, 3):  # two traces: the sparse shapes differ
            batch = ref.random_sparse_batch(rng, 4, hotness, lambda n: rng.integers(0, 50, size=n),
                                            np.int64)
            step(batch.sp_ids())
        assert step.experimental_get_tracing_count() == 2
    finally:
        logger.removeHandler(records)
    printed = capsys.readouterr()
    for text in records.messages + [printed.out, printed.err]:
        assert "AutoGraph" not in text, text
        assert "could not parse" not in text, text
