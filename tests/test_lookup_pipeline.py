"""sok_ev.LookupPipeline on one worker: lookup_sparse one batch routed ahead.

Reference: a dense tf.Variable holding each key's initial row (keys in
[0, N), so row k is key k), looked up with tf.nn.embedding_lookup_sparse and
trained by TensorFlow's own Adagrad on the same batches, in the same order.
Each step's loss is sum(embedding * upstream), with a fresh upstream per
step carried as the batch's extras: a batch paired with another step's
extras would train the wrong rows and fail the comparison.
The multi-worker pipeline (key exchange ahead, 1-3 workers, graph mode and
tf.function) is pinned in tests/multiworker (modes "pipelined" and
"pipelined_fn" of harness.CASES).
"""
import threading

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

# The same float32 operations in the same order as lookup_sparse; against
# TensorFlow's dense path only the order of the combiner's sums differs.
RTOL, ATOL = 1e-5, 1e-5
N_ROWS, DIM, BATCH, MAX_HOTNESS, STEPS = 24, 8, 10, 4, 4
LEARNING_RATE = 0.2


def _batches(rng, key_dtype):
    draw = ref.key_sampler(rng, "in_range", N_ROWS, key_dtype)
    return [ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS, draw, key_dtype) for _ in range(STEPS)]


def _dense_reference(matrix, batches, upstreams, combiner):
    """Each step's embeddings and the final table: TF's lookup and Adagrad."""
    with ref.on_reference_device():
        table = tf.Variable(matrix)
        optimizer = tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE)
        embeddings = []
        for batch, upstream in zip(batches, upstreams):
            with tf.GradientTape() as tape:
                emb = ref.dense_lookup_sparse(table, batch, combiner, use_weights=True)
                loss = tf.reduce_sum(emb * upstream)
            optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
            embeddings.append(emb.numpy())
        return embeddings, table.numpy()


def _assert_table(ev_export, expected_table):
    keys, rows = ev_export
    np.testing.assert_allclose(rows, expected_table[keys.astype(np.int64)], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_pipelined_graph_training_matches_dense_tf_training_step_by_step(
        sok, rng, unique_name, key_dtype, combiner):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, key_dtype)
    upstreams = [rng.normal(size=(BATCH, DIM)).astype(np.float32) for _ in range(STEPS)]
    expected_embeddings, expected_table = _dense_reference(matrix, batches, upstreams, combiner)

    with ref.graph_session() as sess:
        ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype)
        ids = tf.compat.v1.sparse_placeholder(tf.as_dtype(key_dtype))
        weights = tf.compat.v1.sparse_placeholder(tf.float32)
        upstream = tf.compat.v1.placeholder(tf.float32, [BATCH, DIM])
        pipeline = sok.LookupPipeline([ev], [combiner])
        prime = pipeline.prefetch([ids], [weights], extras={"upstream": upstream})
        (emb,), extras = pipeline.lookup()
        loss = tf.reduce_sum(emb * extras["upstream"])
        train = tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE).minimize(loss)
        step = tf.group(train, pipeline.prefetch([ids], [weights], extras={"upstream": upstream}))
        export = ev.export()

        def feed(s):
            return {
                ids:
                    batches[s].ids_value(),
                weights:
                    tf.compat.v1.SparseTensorValue(batches[s].indices, batches[s].weights,
                                                   batches[s].dense_shape),
                upstream:
                    upstreams[s]
            }

        # The unstaged keys are still UniqueKeys': the fused apply skips its sort.
        applies = [
            op for op in sess.graph.get_operations() if op.type == "SokEv>SparseApplyOptimizer"
        ]
        assert [op.get_attr("keys_are_unique") for op in applies] == [[True]]
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(prime, feed(0))
        for s in range(STEPS):
            # Step s trains batch s and routes batch s + 1; the last one routes none.
            fetch, fed = (step, feed(s + 1)) if s + 1 < STEPS else (train, {})
            got, _ = sess.run([emb, fetch], fed)
            np.testing.assert_allclose(got,
                                       expected_embeddings[s],
                                       rtol=RTOL,
                                       atol=ATOL,
                                       err_msg=f"step {s}")
        _assert_table(sess.run(export), expected_table)


def test_pipelined_tf_function_training_matches_dense_tf_training(sok, rng, unique_name):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, np.int64)
    upstreams = [rng.normal(size=(BATCH, DIM)).astype(np.float32) for _ in range(STEPS)]
    expected_embeddings, expected_table = _dense_reference(matrix, batches, upstreams, "sqrtn")
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    pipeline = sok.LookupPipeline([ev], "sqrtn")
    optimizer = tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE)

    def prefetch(s):
        pipeline.prefetch([batches[s].sp_ids()], [batches[s].sp_weights()],
                          extras=tf.constant(upstreams[s]))

    @tf.function
    def train():
        with tf.GradientTape() as tape:
            (emb,), upstream = pipeline.lookup()
            loss = tf.reduce_sum(emb * upstream)
        optimizer.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))
        return emb

    prefetch(0)
    for s in range(STEPS):
        got = train()
        if s + 1 < STEPS:
            prefetch(s + 1)
        np.testing.assert_allclose(got.numpy(),
                                   expected_embeddings[s],
                                   rtol=RTOL,
                                   atol=ATOL,
                                   err_msg=f"step {s}")
    _assert_table([x.numpy() for x in ev.export()], expected_table)


def test_prefetched_batches_come_out_first_in_first_out_with_their_extras(sok, rng, unique_name):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = _batches(rng, np.int64)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    pipeline = sok.LookupPipeline([ev], "sum")
    for s, batch in enumerate(batches):
        pipeline.prefetch([batch.sp_ids()], extras=(tf.constant(s), {"name": tf.constant(f"b{s}")}))
    for s, batch in enumerate(batches):
        (emb,), (number, named) = pipeline.lookup()
        assert int(number) == s and named["name"].numpy() == f"b{s}".encode()
        # No training: each batch's rows are still the initial ones.
        np.testing.assert_allclose(emb.numpy(),
                                   ref.reference_lookup(matrix, batch, "sum", False),
                                   rtol=RTOL,
                                   atol=ATOL)


def _run_with_deadline(function, seconds=60):
    """function()'s exception (None if it returned); fails if it runs past
  `seconds` (a lookup that waits for a batch instead of failing)."""
    outcome = {}

    def target():
        try:
            function()
        except Exception as error:  # pylint: disable=broad-except
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return outcome.get("error")


def test_a_lookup_with_no_batch_waiting_fails_instead_of_waiting(sok, rng, unique_name):
    batch = _batches(rng, np.int64)[0]
    with ref.graph_session() as sess:
        ev = ref.matrix_ev(sok, unique_name(), ref.random_matrix(rng, N_ROWS, DIM))
        pipeline = sok.LookupPipeline([ev], name=unique_name("pipeline"))
        prime = pipeline.prefetch([batch.sp_ids()])
        (emb,), _ = pipeline.lookup()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(prime)
        sess.run(emb)
        error = _run_with_deadline(lambda: sess.run(emb))
    assert isinstance(error, tf.errors.InvalidArgumentError), error
    assert ref.error_names(error, "no prefetched batch", pipeline.name)

    eager = sok.LookupPipeline([ref.matrix_ev(sok, unique_name(), ref.random_matrix(rng, 4, 2))])
    eager.prefetch([batch.sp_ids()])
    eager.lookup()
    error = _run_with_deadline(eager.lookup)
    assert isinstance(error, tf.errors.InvalidArgumentError), error
    assert ref.error_names(error, "no prefetched batch")


def test_a_lookup_before_any_prefetch_is_refused_when_built(sok, unique_name):
    pipeline = sok.LookupPipeline([sok.get_embedding_variable(unique_name(), embedding_dim=4)])
    with pytest.raises(ValueError, match="before any prefetch"):
        pipeline.lookup()


def test_a_batch_of_another_form_is_refused_and_nothing_is_staged(sok, rng, unique_name):
    batch = _batches(rng, np.int64)[0]
    ev = ref.matrix_ev(sok, unique_name(), ref.random_matrix(rng, N_ROWS, DIM))
    pipeline = sok.LookupPipeline([ev])
    pipeline.prefetch([batch.sp_ids()], extras={"labels": tf.zeros([BATCH])})
    with pytest.raises(ValueError, match="extras has structure"):
        pipeline.prefetch([batch.sp_ids()], extras=[tf.zeros([BATCH])])
    with pytest.raises(ValueError, match="extras has"):
        pipeline.prefetch([batch.sp_ids()], extras={"labels": tf.zeros([BATCH], tf.int32)})
    with pytest.raises(ValueError, match="sp_weights"):
        pipeline.prefetch([batch.sp_ids()], [batch.sp_weights()],
                          extras={"labels": tf.zeros([BATCH])})
    pipeline.lookup()  # the one batch staged
    error = _run_with_deadline(pipeline.lookup)
    assert isinstance(error, tf.errors.InvalidArgumentError), error


def test_bad_arguments_are_refused_naming_them(sok, rng, unique_name):
    ev = ref.matrix_ev(sok, unique_name(), ref.random_matrix(rng, N_ROWS, DIM))
    with pytest.raises(TypeError, match=r"params\[1\].*Embedding Variable"):
        sok.LookupPipeline([ev, tf.Variable(tf.zeros([2, 2]))])
    with pytest.raises(ValueError, match="params"):
        sok.LookupPipeline([])
    with pytest.raises(ValueError, match="exchange_dtype.*float64"):
        sok.LookupPipeline([ev], exchange_dtype="float64")
    with pytest.raises(ValueError, match="name"):
        sok.LookupPipeline([ev], name="")
    taken = sok.LookupPipeline([ev], name=unique_name("pipeline"))
    with pytest.raises(ValueError, match=f"name '{taken.name}' is taken"):
        sok.LookupPipeline([ev], name=taken.name)
    pipeline = sok.LookupPipeline([ev], combiners=["max"])
    int32_ids = _batches(rng, np.int32)[0].sp_ids()
    with pytest.raises(ValueError, match=r"combiners\[0\].*'max'"):
        pipeline.prefetch([int32_ids])
    pipeline = sok.LookupPipeline([ev])
    with pytest.raises(TypeError, match=r"indices\[0\] has int32"):
        pipeline.prefetch([int32_ids])
    int64_ids = _batches(rng, np.int64)[0].sp_ids()
    with pytest.raises(TypeError, match=r"extras must hold tensors.*object"):
        pipeline.prefetch([int64_ids], extras={"labels": object()})
