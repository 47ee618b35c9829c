"""sok_ev.lookup_sparse forward values, pinned against tf.nn.embedding_lookup_sparse.

Each Embedding Variable starts key k at M[k mod N] (default_value_dim=N with
tf.constant_initializer(M)), so the reference is stock
tf.nn.embedding_lookup_sparse over a dense tf.Variable holding those rows.
Covered: every combiner, with and without sp_weights, duplicated keys in a
sample, empty samples (including the last one), int32 and int64 keys, keys
beyond N and negative keys, several tables of different dims in one call,
eager, tf.function and tf.compat.v1 graph mode.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

# The forward pass gathers float32 rows and sums at most a few of them: only
# summation order can differ from TF, so float32 round-off is the tolerance.
RTOL, ATOL = 1e-6, 1e-6

N_ROWS, DIM, BATCH, MAX_HOTNESS = 16, 8, 12, 5


def _lookup_one(sok, ev, batch, combiner, use_weights):
    sp_weights = [batch.sp_weights()] if use_weights else None
    out = sok.lookup_sparse([ev], [batch.sp_ids()], combiners=[combiner], sp_weights=sp_weights)
    assert isinstance(out, list) and len(out) == 1
    return out[0]


@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("use_weights", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_lookup_matches_tf_embedding_lookup_sparse(sok, rng, unique_name, combiner, use_weights,
                                                   key_dtype):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype)
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "in_range", N_ROWS, key_dtype), key_dtype)

    out = _lookup_one(sok, ev, batch, combiner, use_weights)

    assert out.dtype == tf.float32
    assert out.shape == (BATCH, DIM)
    expected = ref.reference_lookup(matrix, batch, combiner, use_weights)
    np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_empty_samples_combine_to_zero(sok, rng, unique_name, combiner):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "in_range", N_ROWS, np.int64), np.int64)
    empty = np.setdiff1d(np.arange(BATCH), batch.indices[:, 0])
    assert BATCH - 1 in empty and len(empty) >= 2  # the batch builder guarantees it

    out = _lookup_one(sok, ev, batch, combiner, use_weights=True).numpy()

    np.testing.assert_array_equal(out[empty], np.zeros((len(empty), DIM), np.float32))


@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_keys_beyond_n_start_at_row_key_mod_n(sok, rng, unique_name, combiner, key_dtype):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype)
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "beyond_n", N_ROWS, key_dtype), key_dtype)
    assert batch.keys.max() >= N_ROWS

    out = _lookup_one(sok, ev, batch, combiner, use_weights=True)

    # reference_lookup builds its dense rows as M[key % N].
    expected = ref.reference_lookup(matrix, batch, combiner, use_weights=True)
    np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_negative_int64_keys_start_at_row_nonnegative_key_mod_n(sok, rng, unique_name, combiner):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix, np.int64)
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "negative", N_ROWS, np.int64), np.int64)
    batch.keys[-1] = -1  # row N-1 under the non-negative mod rule (C's % would give -1)
    assert (batch.keys < 0).any()

    out = _lookup_one(sok, ev, batch, combiner, use_weights=False)

    expected = ref.reference_lookup(matrix, batch, combiner, use_weights=False)
    np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)


def test_several_tables_in_one_call_each_match_their_reference(sok, rng, unique_name):
    # Different dims, key dtypes, combiners and weighting in one call.
    specs = [(4, np.int64, "sum", False),
             (16, np.int32, "mean", True), (1, np.int64, "sqrtn", True), (9, np.int32, "sum", True),
             (32, np.int64, "mean", False)]
    evs, batches, matrices = [], [], []
    for dim, key_dtype, _, _ in specs:
        matrix = ref.random_matrix(rng, N_ROWS, dim)
        matrices.append(matrix)
        evs.append(ref.matrix_ev(sok, unique_name(), matrix, key_dtype))
        batches.append(
            ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "beyond_n", N_ROWS, key_dtype), key_dtype))

    outs = sok.lookup_sparse(
        evs, [b.sp_ids() for b in batches],
        combiners=[s[2] for s in specs],
        sp_weights=[b.sp_weights() if s[3] else None for b, s in zip(batches, specs)])

    assert len(outs) == len(specs)
    for out, matrix, batch, (dim, _, combiner, weighted) in zip(outs, matrices, batches, specs):
        assert out.shape == (BATCH, dim)
        expected = ref.reference_lookup(matrix, batch, combiner, weighted)
        np.testing.assert_allclose(out.numpy(),
                                   expected,
                                   rtol=RTOL,
                                   atol=ATOL,
                                   err_msg=f"table of dim {dim}, {combiner}")


def test_tables_of_one_call_can_have_different_batch_sizes(sok, rng, unique_name):
    matrices = [ref.random_matrix(rng, N_ROWS, 3), ref.random_matrix(rng, N_ROWS, 5)]
    evs = [ref.matrix_ev(sok, unique_name(), m) for m in matrices]
    batches = [
        ref.random_sparse_batch(rng, size, MAX_HOTNESS,
                                ref.key_sampler(rng, "in_range", N_ROWS, np.int64), np.int64)
        for size in (7, 19)
    ]

    outs = sok.lookup_sparse(evs, [b.sp_ids() for b in batches], combiners=["sum", "sum"])

    for out, matrix, batch in zip(outs, matrices, batches):
        expected = ref.reference_lookup(matrix, batch, "sum", use_weights=False)
        np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)


def test_combiners_default_to_mean_as_sok_and_tf_nn_embedding_lookup_sparse(sok, rng, unique_name):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "in_range", N_ROWS, np.int64), np.int64)
    uniq, ids = ref.remap_to_unique(batch.keys)
    dense = tf.Variable(ref.initial_rows(matrix, uniq))

    out = sok.lookup_sparse([ev], [batch.sp_ids()])[0]

    # tf.nn.embedding_lookup_sparse's own default (combiner=None) is "mean".
    expected = tf.nn.embedding_lookup_sparse(dense,
                                             tf.SparseTensor(batch.indices, ids, batch.dense_shape),
                                             None)
    rows = expected.shape[0]
    np.testing.assert_allclose(out.numpy()[:rows], expected.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(out.numpy()[rows:], 0.0)


def test_sok_call_forms_give_what_lookup_sparse_gives(sok, rng, unique_name):
    # NVIDIA SOK 2.x: lookup_sparse(params, sp_ids, sp_weights=None,
    # combiners=None), and one variable with one batch returns one tensor.
    matrices = [ref.random_matrix(rng, N_ROWS, DIM), ref.random_matrix(rng, N_ROWS, 4)]
    evs = [ref.matrix_ev(sok, unique_name(), m) for m in matrices]
    batches = [
        ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                ref.key_sampler(rng, "in_range", N_ROWS, np.int64), np.int64)
        for _ in evs
    ]
    ids = [b.sp_ids() for b in batches]
    weights = [b.sp_weights() for b in batches]
    combiners = ["sqrtn", "sum"]
    expected = [
        ref.reference_lookup(m, b, c, use_weights=True)
        for m, b, c in zip(matrices, batches, combiners)
    ]

    forms = {
        "own order": sok.lookup_sparse(evs, ids, combiners, weights),
        "SOK order": sok.lookup_sparse(evs, ids, weights, combiners),
        "SOK keywords": sok.lookup_sparse(evs, sp_ids=ids, sp_weights=weights, combiners=combiners),
    }
    for form, outs in forms.items():
        for out, want in zip(outs, expected):
            np.testing.assert_allclose(out.numpy(), want, rtol=RTOL, atol=ATOL, err_msg=form)
    unweighted = sok.lookup_sparse(evs, ids, None, combiners)
    for out, m, b, c in zip(unweighted, matrices, batches, combiners):
        np.testing.assert_allclose(out.numpy(),
                                   ref.reference_lookup(m, b, c, False),
                                   rtol=RTOL,
                                   atol=ATOL)
    single = sok.lookup_sparse(evs[0], ids[0], weights[0], "sqrtn")
    assert isinstance(single, tf.Tensor)
    np.testing.assert_allclose(single.numpy(), expected[0], rtol=RTOL, atol=ATOL)


def test_ids_passed_both_as_indices_and_sp_ids_are_refused(sok, rng, unique_name):
    ev = ref.matrix_ev(sok, unique_name(), ref.random_matrix(rng, N_ROWS, DIM))
    ids = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])
    with pytest.raises(TypeError, match="as indices or as sp_ids"):
        sok.lookup_sparse([ev], [ids], sp_ids=[ids])
    with pytest.raises(TypeError, match="indices must be one tf.SparseTensor"):
        sok.lookup_sparse(ev, [ids])
    assert int(ev.total_count()) == 0


def test_repeated_lookups_return_the_same_values(sok, rng, unique_name):
    # A key's initial value is drawn once, when first seen; later lookups
    # (without training) read the stored row. Default random initializer.
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
    batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "beyond_n", N_ROWS, np.int64), np.int64)

    first = sok.lookup_sparse([ev], [batch.sp_ids()], combiners=["sum"])[0].numpy()
    second = sok.lookup_sparse([ev], [batch.sp_ids()], combiners=["sum"])[0].numpy()

    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_lookup_inside_tf_function_matches_reference(sok, rng, unique_name, combiner):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    batches = [
        ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                ref.key_sampler(rng, "beyond_n", N_ROWS, np.int64), np.int64)
        for _ in range(2)
    ]

    @tf.function
    def lookup(sp_ids, sp_weights):
        return sok.lookup_sparse([ev], [sp_ids], combiners=[combiner], sp_weights=[sp_weights])[0]

    for batch in batches:  # the second call reuses the trace with new data
        out = lookup(batch.sp_ids(), batch.sp_weights())
        expected = ref.reference_lookup(matrix, batch, combiner, use_weights=True)
        np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_lookup_in_graph_mode_session_matches_reference(sok, rng, combiner, key_dtype):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = [
        ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                ref.key_sampler(rng, "beyond_n", N_ROWS, key_dtype), key_dtype)
        for _ in range(2)
    ]
    expected = [ref.reference_lookup(matrix, b, combiner, use_weights=True) for b in batches]

    with ref.graph_session() as sess:
        ev = ref.matrix_ev(sok, "table", matrix, key_dtype)
        sp_ids = tf.compat.v1.sparse_placeholder(tf.as_dtype(key_dtype), shape=[None, None])
        sp_w = tf.compat.v1.sparse_placeholder(tf.float32, shape=[None, None])
        out = sok.lookup_sparse([ev], [sp_ids], combiners=[combiner], sp_weights=[sp_w])[0]
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch, want in zip(batches, expected):
            got = sess.run(
                out, {
                    sp_ids:
                        batch.ids_value(),
                    sp_w:
                        tf.compat.v1.SparseTensorValue(batch.indices, batch.weights,
                                                       batch.dense_shape)
                })
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_sample_whose_weights_sum_to_zero_combines_and_trains_like_tf(sok, rng, unique_name,
                                                                      combiner):
    # Sample 0's weights are all zero (zero for 'mean' and 'sqrtn'), sample 2's
    # cancel out (zero for 'mean' only). TF 2.21 divides with div_no_nan: those
    # samples give zeros and a zero gradient, never inf or NaN, and one SGD
    # step leaves the rows finite.
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    batch = ref.SparseBatch(indices=np.array([[0, 0], [0, 1], [1, 0], [2, 0], [2, 1]], np.int64),
                            keys=np.array([1, 2, 3, 4, 5], np.int64),
                            weights=np.array([0.0, 0.0, 0.7, 2.0, -2.0], np.float32),
                            batch_size=3,
                            max_hotness=2)
    upstream = rng.normal(size=(3, DIM)).astype(np.float32)
    uniq, ids = ref.remap_to_unique(batch.keys)
    dense = tf.Variable(ref.initial_rows(matrix, uniq))

    with tf.GradientTape(persistent=True) as tape:
        ours = _lookup_one(sok, ev, batch, combiner, use_weights=True)
        theirs = ref.dense_lookup_sparse(dense, batch, combiner, True, ids)
        our_loss = tf.reduce_sum(ours * upstream)
        their_loss = tf.reduce_sum(theirs * upstream)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=RTOL, atol=ATOL)
    assert np.all(np.isfinite(ours.numpy()))
    np.testing.assert_array_equal(ours.numpy()[0], np.zeros(DIM, np.float32))

    opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    our_grad, their_grad = tape.gradient(our_loss, ev), tape.gradient(their_loss, dense)
    opt.apply_gradients([(our_grad, ev), (their_grad, dense)])
    keys, rows = ev.export()
    after = ref.export_to_dict(keys.numpy(), rows.numpy())
    expected = {int(k): row for k, row in zip(uniq, dense.numpy())}
    ref.assert_rows_close(after, expected, 1e-5, 1e-6, "rows after one SGD step")
    assert all(np.all(np.isfinite(row)) for row in after.values())


@pytest.mark.parametrize("splits_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
def test_ragged_ids_and_weights_give_what_their_sparse_form_gives(sok, rng, unique_name,
                                                                  splits_dtype, key_dtype):
    """A rank-2 RaggedTensor is its SparseTensor (RaggedTensor.to_sparse):
  the same lookup, in every form rows may take (ragged with empty rows,
  uniform length, none)."""
    from sok_ev import lookup  # pylint: disable=import-outside-toplevel
    table = sok.get_embedding_variable(unique_name(), embedding_dim=4, key_dtype=key_dtype)
    lengths = [3, 0, 1, 5, 0]
    keys = rng.integers(-50, 50, sum(lengths)).astype(key_dtype.as_numpy_dtype)
    weights = rng.random(sum(lengths)).astype(np.float32)
    forms = [
        tf.RaggedTensor.from_row_lengths(keys, tf.constant(lengths, splits_dtype)),
        tf.RaggedTensor.from_uniform_row_length(keys[:8], tf.constant(2, splits_dtype)),
        tf.RaggedTensor.from_row_lengths(keys[:0], tf.constant([], splits_dtype)),
    ]
    for ids in forms:
        expected = ids.to_sparse()
        actual = lookup._ragged_to_sparse(ids)  # pylint: disable=protected-access
        for a, e in zip((actual.indices, actual.values, actual.dense_shape),
                        (expected.indices, expected.values, expected.dense_shape)):
            np.testing.assert_array_equal(a.numpy(), e.numpy())
        ragged_weights = ids.with_flat_values(weights[:int(tf.size(ids.flat_values))])
        np.testing.assert_array_equal(
            sok.lookup_sparse([table], [ids], combiners="sum",
                              sp_weights=[ragged_weights])[0].numpy(),
            sok.lookup_sparse([table], [expected],
                              combiners="sum",
                              sp_weights=[ragged_weights.to_sparse()])[0].numpy())
