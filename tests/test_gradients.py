"""Gradients of sok_ev.lookup_sparse with respect to Embedding Variables.

Pinned down: the gradient reaching an EV is a tf.IndexedSlices whose indices
are the raw keys of the batch, each once (deduplicated), and whose values
are the gradient summed over every occurrence of the key. The values must
equal TF's own gradient of tf.nn.embedding_lookup_sparse on a dense
tf.Variable holding the same rows (GradientTape on both; TF's IndexedSlices
densified, ours turned into {key: row}).
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

# A key's gradient is a sum over its occurrences of upstream * weight (and
# the mean/sqrtn scale); only the summation order differs from TF.
RTOL, ATOL = 1e-5, 1e-6

N_ROWS, DIM, BATCH, MAX_HOTNESS = 16, 6, 12, 5


def _assert_gradient_matches(grad, matrix, batch, combiner, use_weights, upstream):
    assert isinstance(grad, tf.IndexedSlices), type(grad)
    keys = grad.indices.numpy().reshape(-1)
    assert len(np.unique(keys)) == len(keys), f"duplicate keys in gradient indices: {keys}"
    # The raw keys, not positions in some internal table.
    assert sorted(keys.astype(np.int64).tolist()) == batch.unique_keys().astype(np.int64).tolist()
    expected = ref.reference_gradient(matrix, batch, combiner, use_weights, upstream)
    actual = ref.indexed_slices_to_dict(keys, grad.values.numpy())
    ref.assert_rows_close(actual, expected, RTOL, ATOL, "gradient")


@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("use_weights", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_gradient_matches_tf_gradient_of_dense_lookup(sok, rng, unique_name, combiner, use_weights,
                                                      key_dtype):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype)
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "beyond_n", N_ROWS, key_dtype), key_dtype)
    upstream = rng.normal(size=(BATCH, DIM)).astype(np.float32)

    with tf.GradientTape() as tape:
        out = sok.lookup_sparse([ev], [batch.sp_ids()],
                                combiners=[combiner],
                                sp_weights=[batch.sp_weights()] if use_weights else None)[0]
        loss = tf.reduce_sum(out * upstream)
    grad = tape.gradient(loss, ev)

    _assert_gradient_matches(grad, matrix, batch, combiner, use_weights, upstream)


def test_gradient_of_a_key_repeated_across_samples_is_summed_once(sok, rng, unique_name):
    # Key 7 appears three times (twice in sample 0, once in sample 2); with a
    # sum combiner and upstream u its gradient is 2*u[0] + u[2], reported once.
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    sp_ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0], [2, 0]], tf.constant([7, 7, 3, 7], tf.int64),
                             [4, 2])
    upstream = rng.normal(size=(4, DIM)).astype(np.float32)

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([ev], [sp_ids], combiners=["sum"])[0] * upstream)
    grad = tape.gradient(loss, ev)

    got = ref.indexed_slices_to_dict(grad.indices.numpy(), grad.values.numpy())
    assert sorted(got) == [3, 7] and len(grad.indices.numpy()) == 2
    np.testing.assert_allclose(got[7], 2 * upstream[0] + upstream[2], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got[3], upstream[1], rtol=RTOL, atol=ATOL)


def test_gradients_of_several_tables_in_one_call(sok, rng, unique_name):
    specs = [(3, np.int64, "sum", True), (8, np.int32, "mean", False), (5, np.int64, "sqrtn", True)]
    matrices = [ref.random_matrix(rng, N_ROWS, dim) for dim, _, _, _ in specs]
    evs = [ref.matrix_ev(sok, unique_name(), m, kd) for m, (_, kd, _, _) in zip(matrices, specs)]
    batches = [
        ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                ref.key_sampler(rng, "beyond_n", N_ROWS, kd), kd)
        for _, kd, _, _ in specs
    ]
    upstreams = [rng.normal(size=(BATCH, dim)).astype(np.float32) for dim, _, _, _ in specs]

    with tf.GradientTape() as tape:
        outs = sok.lookup_sparse(
            evs, [b.sp_ids() for b in batches],
            combiners=[s[2] for s in specs],
            sp_weights=[b.sp_weights() if s[3] else None for b, s in zip(batches, specs)])
        loss = tf.add_n([tf.reduce_sum(o * u) for o, u in zip(outs, upstreams)])
    grads = tape.gradient(loss, evs)

    for grad, matrix, batch, (_, _, combiner,
                              weighted), upstream in zip(grads, matrices, batches, specs,
                                                         upstreams):
        _assert_gradient_matches(grad, matrix, batch, combiner, weighted, upstream)


def _empty_batch(key_dtype):
    return ref.SparseBatch(np.zeros((0, 2), np.int64), np.zeros(0, key_dtype),
                           np.zeros(0, np.float32), BATCH, MAX_HOTNESS)


def test_many_tables_of_mixed_forms_get_the_gradients_each_would_get_alone(sok, rng, unique_name):
    # More tables than one GPU launch of the backward's sums carries (32,
    # cc/segment_sum_gpu.cu), each launch mixing what its tables may differ
    # in: dims with and without float4 rows, unweighted sums beside
    # weighted means and square roots, int32 and int64 keys, and tables
    # whose batch has no entries at all.
    n_tables = 37
    specs = [([1, 3, 4, 8, 16][t % 5], ref.KEY_DTYPES[t % 2], ref.COMBINERS[t % 3], t % 4 == 1)
             for t in range(n_tables)]
    empty = {5, 33}
    matrices = [ref.random_matrix(rng, N_ROWS, dim) for dim, _, _, _ in specs]
    batches = [
        _empty_batch(kd) if t in empty else ref.random_sparse_batch(
            rng, BATCH, MAX_HOTNESS, ref.key_sampler(rng, "beyond_n", N_ROWS, kd), kd)
        for t, (_, kd, _, _) in enumerate(specs)
    ]
    upstreams = [rng.normal(size=(BATCH, dim)).astype(np.float32) for dim, _, _, _ in specs]

    def gradients(tables):
        evs = [ref.matrix_ev(sok, unique_name(), matrices[t], specs[t][1]) for t in tables]
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(
                evs, [batches[t].sp_ids() for t in tables],
                combiners=[specs[t][2] for t in tables],
                sp_weights=[batches[t].sp_weights() if specs[t][3] else None for t in tables])
            loss = tf.add_n([tf.reduce_sum(o * upstreams[t]) for o, t in zip(outs, tables)])
        return outs, tape.gradient(loss, evs)

    outs, together = gradients(list(range(n_tables)))
    for t, (_, _, combiner, weighted) in enumerate(specs):
        alone = gradients([t])[1][0]
        if t in empty:  # every sample empty: zeros out, no key to train
            np.testing.assert_array_equal(outs[t].numpy(), np.zeros((BATCH, specs[t][0])))
            assert together[t].indices.shape[0] == 0 and alone.indices.shape[0] == 0
            continue
        _assert_gradient_matches(together[t], matrices[t], batches[t], combiner, weighted,
                                 upstreams[t])
        # The same bits: grouping the tables changes nothing a table sums.
        got, want = [
            ref.indexed_slices_to_dict(g.indices.numpy(), g.values.numpy())
            for g in (together[t], alone)
        ]
        assert sorted(got) == sorted(want), f"table {t}"
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"table {t}, key {key}")


@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_compute_gradients_in_graph_mode_gives_key_indexed_slices(sok, rng, combiner):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "beyond_n", N_ROWS, np.int64), np.int64)
    upstream = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    expected = ref.reference_gradient(matrix, batch, combiner, True, upstream)

    with ref.graph_session() as sess:
        ev = ref.matrix_ev(sok, "table", matrix)
        out = sok.lookup_sparse([ev], [batch.sp_ids()],
                                combiners=[combiner],
                                sp_weights=[batch.sp_weights()])[0]
        loss = tf.reduce_sum(out * upstream)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        (grad, var), = opt.compute_gradients(loss, var_list=[ev])
        assert var is ev
        assert isinstance(grad, tf.IndexedSlices), type(grad)
        sess.run(tf.compat.v1.global_variables_initializer())
        keys, values = sess.run([grad.indices, grad.values])

    assert len(np.unique(keys)) == len(keys)
    ref.assert_rows_close(ref.indexed_slices_to_dict(keys, values), expected, RTOL, ATOL,
                          "graph-mode gradient")


def test_lookups_inside_a_v1_while_loop_train_as_a_dense_variable_does(sok, rng, monkeypatch):
    # DeepRec scripts call tf.disable_v2_behavior(), which also turns TF1
    # control flow back on; the gradient leaves the loop through TF's
    # IndexedSlices accumulator, which reads the handle op's `shape` attr.
    from tensorflow.python.ops import control_flow_util  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(control_flow_util, "ENABLE_CONTROL_FLOW_V2", False)
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    lambda n: rng.integers(0, N_ROWS, size=n), np.int64)

    with ref.graph_session() as sess:
        ev = ref.matrix_ev(sok, "table", matrix)
        dense = tf.Variable(matrix)  # the reference

        def body(i, loss):
            out = sok.lookup_sparse([ev], [batch.sp_ids()], combiners=["mean"])[0]
            expected = tf.nn.embedding_lookup_sparse(dense, batch.sp_ids(), None, combiner="mean")
            scale = tf.cast(i + 1, tf.float32)  # each iteration its own gradient
            return i + 1, loss + tf.reduce_sum(tf.square(out * scale)) + tf.reduce_sum(
                tf.square(expected * scale))

        _, loss = tf.compat.v1.while_loop(lambda i, _: i < 3, body, [0, 0.0])
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss,
                                                                           var_list=[ev, dense])
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        rows = ref.export_to_dict(*sess.run(ev.export()))
        dense_rows = sess.run(dense)

    assert sorted(rows) == batch.unique_keys().astype(np.int64).tolist()
    ref.assert_rows_close(rows, {k: dense_rows[k] for k in rows}, RTOL, ATOL, "rows after a step")


def test_explicit_tape_watch_of_an_ev_gives_its_gradient(sok, rng, unique_name):
    # Users who turn automatic watching off watch the EV themselves.
    ev = sok.get_embedding_variable(unique_name(), 3)
    keys = rng.integers(0, 50, size=4)
    ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0], [1, 1]], tf.constant(keys, tf.int64), [2, 2])
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(ev)
        emb, = sok.lookup_sparse([ev], [ids], combiners="sum")
        loss = tf.reduce_sum(emb)
    grad = tape.gradient(loss, ev)
    # d(sum of sums)/d(row) is 1 per occurrence of the key.
    expected = {int(k): np.full(3, float(np.sum(keys == k))) for k in np.unique(keys)}
    actual = ref.indexed_slices_to_dict(grad.indices.numpy(), grad.values.numpy())
    assert sorted(actual) == sorted(expected)
    for k in expected:
        np.testing.assert_array_equal(actual[k], expected[k])


def test_a_table_whose_result_the_loss_does_not_use_gets_no_gradient_as_a_dense_variable(
        sok, rng, unique_name):
    matrices = [ref.random_matrix(rng, N_ROWS, DIM) for _ in range(2)]
    used, unused = [ref.matrix_ev(sok, unique_name(), m) for m in matrices]
    dense_used, dense_unused = [tf.Variable(m) for m in matrices]
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "in_range", N_ROWS, np.int64), np.int64)
    adam = tf.keras.optimizers.Adam(0.1)
    before = unused.sparse_read(batch.unique_keys()).numpy()

    @tf.function
    def step():
        with tf.GradientTape(persistent=True) as tape:
            emb_used, _ = sok.lookup_sparse([used, unused], [batch.sp_ids()] * 2, "sum")
            dense_emb = [
                tf.nn.embedding_lookup_sparse(v, batch.sp_ids(), None, combiner="sum")
                for v in (dense_used, dense_unused)
            ]
            loss = tf.reduce_sum(emb_used)
            dense_loss = tf.reduce_sum(dense_emb[0])
        grads = tape.gradient(loss, [used, unused])
        dense_grads = tape.gradient(dense_loss, [dense_used, dense_unused])
        assert dense_grads[1] is None  # TensorFlow's reference
        assert isinstance(grads[0], tf.IndexedSlices) and grads[1] is None
        # So Adam, which moves a row on a zero gradient, leaves the table
        # alone (Keras skips a None gradient).
        adam.apply_gradients(zip(grads, [used, unused]))

    step()
    np.testing.assert_array_equal(unused.sparse_read(batch.unique_keys()).numpy(), before)
    assert not np.array_equal(
        used.sparse_read(batch.unique_keys()).numpy(),
        ref.initial_rows(matrices[0], batch.unique_keys()))


def test_an_unused_result_gets_no_gradient_from_tf_gradients_either(sok, rng):
    with tf.Graph().as_default():
        tables = [sok.get_embedding_variable(f"t{i}", embedding_dim=2) for i in range(2)]
        ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 4], tf.int64), [2, 1])
        first, _ = sok.lookup_sparse(tables, [ids] * 2, "sum")
        grads = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).compute_gradients(
            tf.reduce_sum(first), tables)
        assert isinstance(grads[0][0], tf.IndexedSlices) and grads[1][0] is None


def test_a_session_step_that_fetches_only_the_update_still_counts_each_key(sok):
    # A loss linear in the embeddings has a gradient that reads none of the
    # lookup's outputs; the step must still run the lookup, which counts each
    # key's occurrences (DeepRec's frequency) and admits filtered keys.
    counted = []
    for option in (None, sok.CounterFilter(filter_freq=2)):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            ev_option = None if option is None else sok.EmbeddingVariableOption(
                filter_option=option)
            ev = sok.get_embedding_variable("linear",
                                            embedding_dim=2,
                                            initializer=tf.ones_initializer(),
                                            ev_option=ev_option)
            ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([2, 2, 1], tf.int64),
                                  [2, 2])
            emb, = sok.lookup_sparse([ev], [ids], "sum")
            train = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(tf.reduce_sum(emb))
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            keys, _, frequencies, _, _, _ = sess.run(ev.export_full())
            counted.append(dict(zip(keys.tolist(), frequencies.tolist())))
    # Key 2 twice a step and key 1 once, for 3 steps; with CounterFilter(2)
    # both are admitted (key 1 at its second occurrence) and counted alike.
    assert counted == [{2: 6, 1: 3}, {2: 6, 1: 3}]


@pytest.mark.parametrize("batch_size", [12, 3000], ids=["small", "spread_over_threads"])
@pytest.mark.parametrize("use_weights", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_backward_of_a_cpu_unique_keys_matches_tf_on_any_device(rng, combiner, use_weights,
                                                                batch_size):
    # UniqueKeys on the CPU writes no `order` (the CPU backward adds entries
    # through unique_index); CombineBackward on the default device, a GPU
    # where there is one, then groups the entries by key itself. The large
    # batch spreads one table's backward over the CPU's threads.
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    # About 20 entries a key at batch 3000: repeats, yet sums short enough
    # for float32 sums in another order to stay within RTOL.
    batch = ref.random_sparse_batch(rng, batch_size, MAX_HOTNESS,
                                    lambda n: rng.integers(0, max(N_ROWS, batch_size // 6), n),
                                    np.int64)
    weights = tf.constant(batch.weights if use_weights else np.zeros([0], np.float32))
    with tf.device("/CPU:0"):
        (unique_keys, _, unique_index, order, segments,
         row_offsets) = ops().sok_ev_unique_keys([tf.constant(batch.keys)],
                                                 [tf.constant(batch.indices)], [weights],
                                                 [tf.constant(batch.dense_shape, tf.int64)],
                                                 weighted=[use_weights])
    assert order[0].shape == (0,)
    upstream = rng.normal(size=(batch_size, DIM)).astype(np.float32)

    grad_unique = ops().sok_ev_combine_backward([tf.constant(upstream)],
                                                unique_index,
                                                order,
                                                segments,
                                                row_offsets, [weights],
                                                combiners=[combiner],
                                                weighted=[use_weights])[0]

    expected = ref.reference_gradient(matrix, batch, combiner, use_weights, upstream)
    actual = ref.indexed_slices_to_dict(unique_keys[0].numpy(), grad_unique.numpy())
    # Float32 sums in another order than TF's differ by up to about
    # terms x largest term x eps (more than ATOL where a sum cancels).
    terms = np.unique(batch.keys, return_counts=True)[1].max()
    largest = np.abs(upstream).max() * (batch.weights.max() if use_weights else 1.0)
    atol = max(ATOL, terms * largest * np.finfo(np.float32).eps)
    ref.assert_rows_close(actual, expected, RTOL, atol, "gradient")
