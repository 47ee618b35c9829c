"""A malformed batch is rejected before any table changes.

sok_ev.lookup_sparse checks every table's SparseTensor (rows in order, rows
inside the batch, one weight per value) in its first op, before any key is
inserted or counted. Pinned down in eager mode and in a Session, with the
bad table second in a two-table call, so the first (valid) table must stay
untouched too: same keys, same rows, same frequencies as before the call.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

DIM = 4

# (name, indices of the bad SparseTensor, dense_shape, number of weights or
# None, what the error must name)
MALFORMED = {
    "rows_out_of_order": ([[1, 0], [0, 0], [2, 0]], [3, 2], None, ("indices[1]", "order", "row 0")),
    "row_outside_the_batch": ([[0, 0], [1, 0],
                               [5, 0]], [3, 2], None, ("indices[1]", "row 5", "[0, 3)")),
    "negative_row": ([[-1, 0], [0, 0], [1, 0]], [3, 2], None, ("indices[1]", "row -1")),
    "weight_count_mismatch": ([[0, 0], [1, 0], [2, 0]], [3, 2], 2, ("sp_weights[1]", "2", "3")),
}


def _state(ev_export):
    return ref.in_key_order(*ev_export)


def _lookup_args(case):
    indices, dense_shape, num_weights, _ = MALFORMED[case]
    good = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([5, 6, 7], tf.int64), [2, 2])
    bad = tf.SparseTensor(tf.constant(indices, tf.int64), tf.constant([8, 9, 10], tf.int64),
                          dense_shape)
    weights = None
    if num_weights is not None:
        good_weights = tf.SparseTensor(good.indices, tf.ones([3]), good.dense_shape)
        bad_weights = tf.SparseTensor(tf.constant(indices[:num_weights], tf.int64),
                                      tf.ones([num_weights]), dense_shape)
        weights = [good_weights, bad_weights]
    return [good, bad], weights


def _export(ev):
    keys, rows, frequencies, _, _, _ = ev.export_full()
    return keys, rows, frequencies


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_batch_is_rejected_before_the_table_changes_eager(sok, unique_name, case):
    evs = [sok.get_embedding_variable(unique_name(), embedding_dim=DIM) for _ in range(2)]
    seed = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([5, 8], tf.int64), [2, 1])
    for ev in evs:
        sok.lookup_sparse([ev], [seed])  # a table with keys and frequencies
    before = [_state([t.numpy() for t in _export(ev)]) for ev in evs]

    ids, weights = _lookup_args(case)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)) as error:
        sok.lookup_sparse(evs, ids, combiners=["sum", "sum"], sp_weights=weights)

    assert ref.error_names(error.value, *MALFORMED[case][3])
    for ev, (keys, rows, frequencies) in zip(evs, before):
        after_keys, after_rows, after_frequencies = _state([t.numpy() for t in _export(ev)])
        np.testing.assert_array_equal(after_keys, keys)
        np.testing.assert_array_equal(after_rows, rows)
        np.testing.assert_array_equal(after_frequencies, frequencies)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_batch_is_rejected_before_the_table_changes_in_a_session(sok, case):
    with ref.graph_session() as sess:
        evs = [sok.get_embedding_variable(f"table_{t}", embedding_dim=DIM) for t in range(2)]
        seed = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([5, 8], tf.int64), [2, 1])
        seed_lookups = [sok.lookup_sparse([ev], [seed]) for ev in evs]
        ids, weights = _lookup_args(case)
        try:
            bad_lookup = sok.lookup_sparse(evs, ids, combiners=["sum", "sum"], sp_weights=weights)
        except ValueError as error:  # caught while building the graph: nothing ran
            assert ref.error_names(error, *MALFORMED[case][3])
            return
        exports = [_export(ev) for ev in evs]
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(seed_lookups)
        before = [_state(sess.run(e)) for e in exports]
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            sess.run(bad_lookup)
        assert ref.error_names(error.value, *MALFORMED[case][3])
        for export, (keys, rows, frequencies) in zip(exports, before):
            after_keys, after_rows, after_frequencies = _state(sess.run(export))
            np.testing.assert_array_equal(after_keys, keys)
            np.testing.assert_array_equal(after_rows, rows)
            np.testing.assert_array_equal(after_frequencies, frequencies)
