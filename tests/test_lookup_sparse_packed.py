"""sok_ev.lookup_sparse with its ids packed in one RaggedTensor [N, batch, None],
and with a list of rank-2 RaggedTensors.

The packed form must give, table by table, what stock
tf.nn.embedding_lookup_sparse gives over a dense tf.Variable holding the
same rows (forward and gradient), and train exactly as the list of
SparseTensors does. Its mistakes are errors naming the argument, raised
before any table changes. Batches hold duplicated keys, empty samples
(including the last), and tables of different batch sizes; keys are int32
and int64.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

RTOL, ATOL = 1e-6, 1e-6
N_ROWS, MAX_HOTNESS = 16, 5
DIMS = (4, 8, 3)


def _ragged(batch, values=None):
    """A SparseBatch's keys (or `values`, one per key) as a rank-2
  RaggedTensor [batch_size, None]."""
    return tf.RaggedTensor.from_value_rowids(batch.keys if values is None else values,
                                             batch.indices[:, 0],
                                             nrows=batch.batch_size)


def _ragged_weights(batch):
    return _ragged(batch, batch.weights)


def _tables_and_batches(sok, rng, unique_name, key_dtype, batch_sizes=(9, 9, 9)):
    matrices = [ref.random_matrix(rng, N_ROWS, dim) for dim in DIMS]
    evs = [ref.matrix_ev(sok, unique_name(), m, key_dtype) for m in matrices]
    batches = [
        ref.random_sparse_batch(rng, size, MAX_HOTNESS,
                                ref.key_sampler(rng, "beyond_n", N_ROWS, key_dtype), key_dtype)
        for size in batch_sizes
    ]
    return matrices, evs, batches


def _sizes(evs):
    return [int(ev.total_count()) for ev in evs]


@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("use_weights", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_packed_lookup_matches_tf_embedding_lookup_sparse_per_table(sok, rng, unique_name, combiner,
                                                                    use_weights, key_dtype):
    matrices, evs, batches = _tables_and_batches(sok, rng, unique_name, key_dtype, (9, 4, 13))
    packed = tf.ragged.stack([_ragged(b) for b in batches])
    weights = tf.ragged.stack([_ragged_weights(b) for b in batches]) if use_weights else None
    assert packed.shape.rank == 3 and packed.ragged_rank == 2

    outs = sok.lookup_sparse(evs, packed, combiner, sp_weights=weights)

    assert len(outs) == len(evs)
    for out, matrix, batch in zip(outs, matrices, batches):
        assert out.shape == (batch.batch_size, matrix.shape[1])
        expected = ref.reference_lookup(matrix, batch, combiner, use_weights)
        np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_packed_gradient_is_each_tables_tf_gradient_keyed_by_raw_keys(sok, rng, unique_name,
                                                                      combiner):
    matrices, evs, batches = _tables_and_batches(sok, rng, unique_name, np.int64)
    packed = tf.ragged.stack([_ragged(b) for b in batches])
    weights = tf.ragged.stack([_ragged_weights(b) for b in batches])
    upstreams = [
        rng.normal(size=(b.batch_size, m.shape[1])).astype(np.float32)
        for b, m in zip(batches, matrices)
    ]

    with tf.GradientTape() as tape:
        outs = sok.lookup_sparse(evs, packed, combiner, sp_weights=weights)
        loss = tf.add_n([tf.reduce_sum(o * u) for o, u in zip(outs, upstreams)])
    grads = tape.gradient(loss, evs)

    for grad, matrix, batch, upstream in zip(grads, matrices, batches, upstreams):
        assert isinstance(grad, tf.IndexedSlices)
        actual = ref.indexed_slices_to_dict(grad.indices.numpy(), grad.values.numpy())
        expected = ref.reference_gradient(matrix, batch, combiner, True, upstream)
        ref.assert_rows_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_packed_training_equals_the_sparse_list_bit_for_bit(sok, rng, unique_name):
    # The same Adagrad steps through both forms: same tables afterwards.
    matrices = [ref.random_matrix(rng, N_ROWS, dim) for dim in DIMS]
    tables = {
        form: [ref.matrix_ev(sok, unique_name(), m) for m in matrices]
        for form in ("packed", "sparse")
    }
    optimizers = {form: tf.compat.v1.train.AdagradOptimizer(0.3) for form in tables}
    for _ in range(3):
        batches = [
            ref.random_sparse_batch(rng, 11, MAX_HOTNESS,
                                    ref.key_sampler(rng, "in_range", 3 * N_ROWS, np.int64),
                                    np.int64) for _ in DIMS
        ]
        ids = {
            "packed": tf.ragged.stack([_ragged(b) for b in batches]),
            "sparse": [b.sp_ids() for b in batches]
        }
        for form, evs in tables.items():
            with tf.GradientTape() as tape:
                outs = sok.lookup_sparse(evs, ids[form], "mean")
                loss = tf.add_n([tf.reduce_sum(tf.square(o)) for o in outs])
            optimizers[form].apply_gradients(zip(tape.gradient(loss, evs), evs))

    for packed_ev, sparse_ev in zip(tables["packed"], tables["sparse"]):
        # keys, rows (value and accumulator), frequencies, versions; by key.
        packed_state = [x.numpy() for x in packed_ev.export_full()[:4]]
        sparse_state = [x.numpy() for x in sparse_ev.export_full()[:4]]
        packed_order, sparse_order = np.argsort(packed_state[0]), np.argsort(sparse_state[0])
        for a, b in zip(packed_state, sparse_state):
            np.testing.assert_array_equal(a[packed_order], b[sparse_order])


def test_list_of_ragged_tensors_equals_the_sparse_list(sok, rng, unique_name):
    matrices, evs, batches = _tables_and_batches(sok, rng, unique_name, np.int32, (7, 12, 5))
    # A mixed list: RaggedTensors and a SparseTensor, weights likewise.
    ids = [_ragged(batches[0]), batches[1].sp_ids(), _ragged(batches[2])]
    weights = [_ragged_weights(batches[0]), None, batches[2].sp_weights()]

    outs = sok.lookup_sparse(evs, ids, ["sqrtn", "sum", "mean"], sp_weights=weights)

    for out, matrix, batch, combiner, weighted in zip(outs, matrices, batches,
                                                      ["sqrtn", "sum", "mean"],
                                                      [True, False, True]):
        expected = ref.reference_lookup(matrix, batch, combiner, weighted)
        np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)


def test_packed_lookup_in_tf_function_takes_batches_of_any_size(sok, rng, unique_name):
    matrices, evs, _ = _tables_and_batches(sok, rng, unique_name, np.int64)

    @tf.function(input_signature=[tf.RaggedTensorSpec([len(evs), None, None], tf.int64, 2)])
    def lookup(packed):
        return sok.lookup_sparse(evs, packed, "sum")

    for size in (3, 17):
        batches = [
            ref.random_sparse_batch(rng, size, MAX_HOTNESS,
                                    ref.key_sampler(rng, "beyond_n", N_ROWS, np.int64), np.int64)
            for _ in evs
        ]
        outs = lookup(tf.ragged.stack([_ragged(b) for b in batches]))
        for out, matrix, batch in zip(outs, matrices, batches):
            expected = ref.reference_lookup(matrix, batch, "sum", use_weights=False)
            np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)


def test_packed_lookup_in_graph_mode_session_matches_reference(sok, rng):
    matrices = [ref.random_matrix(rng, N_ROWS, dim) for dim in DIMS]
    batches = [
        ref.random_sparse_batch(rng, 8, MAX_HOTNESS,
                                ref.key_sampler(rng, "beyond_n", N_ROWS, np.int64), np.int64)
        for _ in DIMS
    ]
    expected = [ref.reference_lookup(m, b, "mean", True) for m, b in zip(matrices, batches)]
    rows = [b.indices[:, 0] for b in batches]
    with ref.graph_session() as sess:
        evs = [ref.matrix_ev(sok, f"packed_graph_{t}", m) for t, m in enumerate(matrices)]
        packed = tf.compat.v1.ragged.placeholder(tf.int64, ragged_rank=2, value_shape=[])
        weights = tf.compat.v1.ragged.placeholder(tf.float32, ragged_rank=2, value_shape=[])
        outs = sok.lookup_sparse(evs, packed, "mean", sp_weights=weights)
        sess.run(tf.compat.v1.global_variables_initializer())
        # Fed as the placeholders' components: flat values and both splits.
        sample_splits = _splits(
            np.concatenate([np.bincount(r, minlength=b.batch_size) for r, b in zip(rows, batches)]))
        table_splits = _splits([b.batch_size for b in batches])
        values = sess.run(
            outs, {
                packed.flat_values: np.concatenate([b.keys for b in batches]),
                packed.values.row_splits: sample_splits,
                packed.row_splits: table_splits,
                weights.flat_values: np.concatenate([b.weights for b in batches]),
                weights.values.row_splits: sample_splits,
                weights.row_splits: table_splits,
            })
    for value, want in zip(values, expected):
        np.testing.assert_allclose(value, want, rtol=RTOL, atol=ATOL)


def _splits(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


# --- Mistakes: an error naming the argument, and no table changed -------------


def _packed_with_splits(keys, inner, outer, dtype=tf.int64):
    """A packed batch built without TensorFlow's validation (malformed on purpose)."""
    return tf.RaggedTensor.from_nested_row_splits(
        tf.constant(keys, dtype),
        [tf.constant(outer, tf.int64), tf.constant(inner, tf.int64)],
        validate=False)


def test_a_rank_2_ragged_tensor_as_the_packed_form_is_a_value_error(sok, rng, unique_name):
    _, evs, batches = _tables_and_batches(sok, rng, unique_name, np.int64)
    with pytest.raises(ValueError, match=r"indices.*\[num_tables, batch, None\]"):
        sok.lookup_sparse(evs, _ragged(batches[0]))
    assert _sizes(evs) == [0, 0, 0]


def test_packing_more_tables_than_params_is_a_value_error(sok, rng, unique_name):
    _, evs, batches = _tables_and_batches(sok, rng, unique_name, np.int64)
    packed = tf.ragged.stack([_ragged(b) for b in batches])
    with pytest.raises(ValueError, match=r"indices packs 3 tables but params has 2"):
        sok.lookup_sparse(evs[:2], packed)
    assert _sizes(evs) == [0, 0, 0]


def test_packing_another_table_count_in_a_tf_function_fails_at_run_time_naming_it(
        sok, rng, unique_name):
    _, evs, batches = _tables_and_batches(sok, rng, unique_name, np.int64)

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None, None], tf.int64, 2)])
    def lookup(packed):
        return sok.lookup_sparse(evs, packed)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices.row_splits must have 4"):
        lookup(tf.ragged.stack([_ragged(b) for b in batches[:2]]))
    assert _sizes(evs) == [0, 0, 0]


def test_packed_keys_of_another_dtype_than_a_table_is_a_type_error_naming_it(sok, rng, unique_name):
    _, evs, batches = _tables_and_batches(sok, rng, unique_name, np.int64)
    packed = tf.ragged.stack([tf.cast(_ragged(b), tf.int32) for b in batches])
    with pytest.raises(TypeError, match=r"indices has int32 values.*params\[0\].*int64"):
        sok.lookup_sparse(evs, packed)


def test_packed_ids_with_a_weights_list_is_a_type_error(sok, rng, unique_name):
    _, evs, batches = _tables_and_batches(sok, rng, unique_name, np.int64)
    packed = tf.ragged.stack([_ragged(b) for b in batches])
    with pytest.raises(TypeError, match=r"sp_weights must be None or a tf.RaggedTensor"):
        sok.lookup_sparse(evs, packed, sp_weights=[b.sp_weights() for b in batches])


def test_packed_weights_of_another_length_fail_before_any_table_changes(sok, rng, unique_name):
    _, evs, batches = _tables_and_batches(sok, rng, unique_name, np.int64)
    packed = tf.ragged.stack([_ragged(b) for b in batches])
    short = tf.ragged.stack([_ragged_weights(b) for b in batches[:2]] +
                            [_ragged_weights(batches[2])[:-2]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sp_weights has \d+ values"):
        sok.lookup_sparse(evs, packed, "mean", sp_weights=short)
    assert _sizes(evs) == [0, 0, 0]


@pytest.mark.parametrize(
    "inner, outer, message",
    [
        # Table 1's samples split its keys out of order.
        ([0, 1, 3, 2, 5, 6], [0, 2, 4, 5], r"indices\[1\]: the row splits.*got 2 at sample 1"),
        # The outer splits claim more samples than there are.
        ([0, 1, 3, 4, 5, 6], [0, 2, 4, 9], r"indices.row_splits must run from 0 to the 5 samples"),
        # The inner splits stop short of the keys.
        ([0, 1, 3, 4, 5, 5], [0, 2, 4, 5], r"must run from 0 to the 6 keys"),
    ],
    ids=["decreasing_row_split", "too_many_samples", "keys_left_over"])
def test_malformed_packed_splits_fail_naming_them_before_any_table_changes(
        sok, unique_name, inner, outer, message):
    evs = [sok.get_embedding_variable(unique_name(), embedding_dim=2) for _ in range(3)]
    packed = _packed_with_splits([1, 2, 3, 4, 5, 6], inner, outer)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        sok.lookup_sparse(evs, packed)
    assert _sizes(evs) == [0, 0, 0]
