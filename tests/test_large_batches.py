"""Batches large enough that the CPU kernels spread their work over threads,
and that tables grow inside one grouped op.

The multi-table ops schedule by size: many tables run side by side, each
table's stages on one thread (its backward then walks entries in sample
order); a few big tables run one after another with each stage spread over
the pool (the backward then sums per key). The small batches of the other
tests take neither route. Pinned down here: both routes equal TensorFlow's
dense lookup, gradient and Adagrad step, and one table's output, gradient
and updated rows are bit-identical whichever route it took.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

RTOL, ATOL = 1e-5, 1e-5
N_ROWS, DIM, MAX_HOTNESS = 4000, 16, 8
# 1500 samples of mean hotness 4.5: 6750 entries, above the 4096 below
# which a multi-table op stays on the calling thread.
BATCH = 1500
GROUP = 6  # tables looked up together: each holds 1/6 of the work


def _batch(rng):
    return ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                   ref.key_sampler(rng, "in_range", N_ROWS, np.int64), np.int64)


def _lookup_grad_step(sok, evs, batches, combiners, weighted, upstreams):
    """One Adagrad step of sum(lookup * upstream) on `evs` (one call);
  returns (outputs, gradients as {key: row}, rows after the step)."""
    opt = tf.compat.v1.train.AdagradOptimizer(0.1)
    with tf.GradientTape() as tape:
        outs = sok.lookup_sparse(
            evs, [b.sp_ids() for b in batches],
            combiners=combiners,
            sp_weights=[b.sp_weights() if w else None for b, w in zip(batches, weighted)])
        loss = tf.add_n([tf.reduce_sum(o * u) for o, u in zip(outs, upstreams)])
    grads = tape.gradient(loss, evs)
    opt.apply_gradients(zip(grads, evs))
    rows = []
    for ev in evs:
        keys, values = ev.export()[:2]
        rows.append(ref.export_to_dict(keys.numpy(), values.numpy()))
    return ([o.numpy() for o in outs],
            [ref.indexed_slices_to_dict(g.indices.numpy(), g.values.numpy()) for g in grads], rows)


def _dense_adagrad_step(matrix, batch, combiner, weighted, upstream):
    """{key: row} after one Adagrad step on a dense Variable of the batch's rows."""
    uniq, ids = ref.remap_to_unique(batch.keys)
    table = tf.Variable(ref.initial_rows(matrix, uniq))
    opt = tf.compat.v1.train.AdagradOptimizer(0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(
            ref.dense_lookup_sparse(table, batch, combiner, weighted, ids) * upstream)
    opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
    return {int(k): row for k, row in zip(uniq, table.numpy())}


@pytest.mark.parametrize("tables", [1, GROUP], ids=["one_big_table", "tables_side_by_side"])
def test_large_batches_match_tf_lookup_gradient_and_adagrad(sok, rng, unique_name, tables):
    combiners = [ref.COMBINERS[t % len(ref.COMBINERS)] for t in range(tables)]
    weighted = [t % 2 == 1 for t in range(tables)]
    matrices = [ref.random_matrix(rng, N_ROWS, DIM) for _ in range(tables)]
    evs = [ref.matrix_ev(sok, unique_name(), m) for m in matrices]
    batches = [_batch(rng) for _ in range(tables)]
    upstreams = [rng.normal(size=(BATCH, DIM)).astype(np.float32) for _ in range(tables)]

    outs, grads, rows = _lookup_grad_step(sok, evs, batches, combiners, weighted, upstreams)

    for t in range(tables):
        args = (matrices[t], batches[t], combiners[t], weighted[t])
        np.testing.assert_allclose(outs[t], ref.reference_lookup(*args), rtol=RTOL, atol=ATOL)
        ref.assert_rows_close(grads[t], ref.reference_gradient(*args, upstreams[t]), RTOL, ATOL,
                              f"gradient of table {t}")
        ref.assert_rows_close(rows[t], _dense_adagrad_step(*args, upstreams[t]), RTOL, ATOL,
                              f"rows of table {t} after Adagrad")


@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_a_table_gives_the_same_bits_alone_and_among_many(sok, rng, unique_name, combiner):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batch = _batch(rng)
    upstream = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    others = [_batch(rng) for _ in range(GROUP - 1)]
    other_upstreams = [rng.normal(size=(BATCH, DIM)).astype(np.float32) for _ in others]

    alone = _lookup_grad_step(sok, [ref.matrix_ev(sok, unique_name(), matrix)], [batch], [combiner],
                              [True], [upstream])
    among = _lookup_grad_step(sok, [ref.matrix_ev(sok, unique_name(), matrix)] +
                              [ref.matrix_ev(sok, unique_name(), matrix) for _ in others],
                              [batch] + others, [combiner] * GROUP, [True] * GROUP,
                              [upstream] + other_upstreams)

    np.testing.assert_array_equal(alone[0][0], among[0][0])
    for what, a, b in (("gradient", alone[1][0], among[1][0]), ("rows", alone[2][0], among[2][0])):
        assert sorted(a) == sorted(b), what
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{what} of key {key}")


# One table's update large enough that the optimizer kernel spreads the
# table's shards over the pool threads: about 76k distinct keys a step, each
# a value and an Adagrad slot of DIM floats (2.4M floats, above the 2^20
# below which an update stays on the calling thread).
SPREAD_ROWS, SPREAD_BATCH, SPREAD_STEPS = 120_000, 24_000, 2
SPREAD_MIN_FLOATS = 1 << 20


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
def test_an_update_spread_over_threads_matches_dense_adagrad(sok, rng, unique_name, key_dtype):
    """Two lookups of one table in one loss: its gradient repeats keys (the
  kernel sums them), and after every step each row equals the same Adagrad
  steps on a dense tf.Variable."""
    matrix = ref.random_matrix(rng, SPREAD_ROWS, DIM)
    draw = ref.key_sampler(rng, "in_range", SPREAD_ROWS, key_dtype)
    steps = [[ref.random_sparse_batch(rng, SPREAD_BATCH, 4, draw, key_dtype)
              for _ in range(2)]
             for _ in range(SPREAD_STEPS)]
    upstreams = [[rng.normal(size=(SPREAD_BATCH, DIM)).astype(np.float32)
                  for _ in range(2)]
                 for _ in range(SPREAD_STEPS)]
    ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype=key_dtype)
    dense = tf.Variable(matrix)
    opt, dense_opt = (tf.compat.v1.train.AdagradOptimizer(0.1) for _ in range(2))
    touched = set()
    for batches, ups in zip(steps, upstreams):
        with tf.GradientTape() as tape:
            loss = tf.add_n([
                tf.reduce_sum(sok.lookup_sparse([ev], [b.sp_ids()], combiners=["sum"])[0] * u)
                for b, u in zip(batches, ups)
            ])
        grad, = tape.gradient(loss, [ev])
        keys = grad.indices.numpy()
        assert len(np.unique(keys)) < len(keys), "the update must see repeated keys"
        assert len(np.unique(keys)) * 2 * DIM >= SPREAD_MIN_FLOATS, "the update must spread"
        opt.apply_gradients([(grad, ev)])
        with tf.GradientTape() as tape:
            loss = tf.add_n([
                tf.reduce_sum(ref.dense_lookup_sparse(dense, b, "sum", False) * u)
                for b, u in zip(batches, ups)
            ])
        dense_opt.apply_gradients(zip(tape.gradient(loss, [dense]), [dense]))
        touched.update(int(k) for b in batches for k in b.keys)
        exported_keys, exported_values = ev.export()[:2]
        rows = ref.export_to_dict(exported_keys.numpy(), exported_values.numpy())
        expected = {k: row for k, row in zip(sorted(touched), dense.numpy()[sorted(touched)])}
        ref.assert_rows_close(rows, expected, RTOL, ATOL, "rows after Adagrad")


# Tables that grow inside one grouped op: every step brings each table more
# distinct keys than a GPU table's first index holds (65536 slots at load
# 0.75), so the one insert launch of the lookup (and of the update) runs
# after each table was resized on its own. One call holds both key dtypes,
# two widths (float4 and scalar rows) and a variable listed twice, whose
# second listing grows it again after its first listing's rows were found.
GROW_ROWS, GROW_BATCH, GROW_STEPS = 150_000, 40_000, 2
GROW_FIRST_INDEX_KEYS = 49_152
# (variable, key dtype, dim, combiner) of each table of the call.
GROW_TABLES = [(0, np.int64, 8, "sum"), (1, np.int32, 8, "mean"), (0, np.int64, 8, "sqrtn"),
               (2, np.int32, 5, "sum")]


def test_tables_that_grow_within_one_grouped_step_match_dense_lookup_and_adagrad(
        sok, rng, unique_name):
    variables = sorted({v for v, _, _, _ in GROW_TABLES})
    dtype_of = {v: dtype for v, dtype, _, _ in GROW_TABLES}
    matrices = {v: ref.random_matrix(rng, GROW_ROWS, dim) for v, _, dim, _ in GROW_TABLES}
    evs = {
        v: ref.matrix_ev(sok, unique_name(), matrices[v], key_dtype=dtype_of[v]) for v in variables
    }
    dense = {v: tf.Variable(matrices[v]) for v in variables}
    opt, dense_opt = (tf.compat.v1.train.AdagradOptimizer(0.1) for _ in range(2))
    touched = {v: set() for v in variables}
    for step in range(GROW_STEPS):
        batches = [
            ref.random_sparse_batch(rng, GROW_BATCH, 4,
                                    ref.key_sampler(rng, "in_range", GROW_ROWS, dtype), dtype)
            for _, dtype, _, _ in GROW_TABLES
        ]
        for b in batches:
            assert len(b.unique_keys()) > GROW_FIRST_INDEX_KEYS, "each table must outgrow its index"
        upstreams = [
            rng.normal(size=(GROW_BATCH, dim)).astype(np.float32) for _, _, dim, _ in GROW_TABLES
        ]
        combiners = [c for _, _, _, c in GROW_TABLES]
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse([evs[v] for v, _, _, _ in GROW_TABLES],
                                     [b.sp_ids() for b in batches],
                                     combiners=combiners)
            loss = tf.add_n([tf.reduce_sum(o * u) for o, u in zip(outs, upstreams)])
        grads = tape.gradient(loss, [evs[v] for v in variables])
        opt.apply_gradients(zip(grads, [evs[v] for v in variables]))

        with tf.GradientTape() as tape:
            dense_outs = [
                ref.dense_lookup_sparse(dense[v], b, c, False)
                for (v, _, _, c), b in zip(GROW_TABLES, batches)
            ]
            loss = tf.add_n([tf.reduce_sum(o * u) for o, u in zip(dense_outs, upstreams)])
        dense_grads = tape.gradient(loss, [dense[v] for v in variables])
        dense_opt.apply_gradients(zip(dense_grads, [dense[v] for v in variables]))

        for t, (out, expected) in enumerate(zip(outs, dense_outs)):
            np.testing.assert_allclose(out.numpy(),
                                       expected.numpy(),
                                       rtol=RTOL,
                                       atol=ATOL,
                                       err_msg=f"step {step}, table {t}")
        for (v, _, _, _), b in zip(GROW_TABLES, batches):
            touched[v].update(int(k) for k in b.keys)
        for v in variables:
            keys, values = evs[v].export()[:2]
            rows = ref.export_to_dict(keys.numpy(), values.numpy())
            seen = sorted(touched[v])
            expected = dict(zip(seen, dense[v].numpy()[seen]))
            ref.assert_rows_close(rows, expected, RTOL, ATOL, f"step {step}, variable {v}")


# A GPU table's insert reads the table's counters back only when its host
# bounds say the keys may not fit; a grouped lookup reads every such table's
# counters after one wait for the GPU, not one wait a table (issue 12's
# ten-hot step made 53 waits a step when each table waited on its own).
# Here the second lookup of the same 60,000 keys makes every table read
# (its bounds count each key as possibly new) and grow by nothing.
SYNC_KEYS = 60_000


@pytest.mark.skipif(not tf.config.list_physical_devices("GPU"),
                    reason="the CPU core never waits for a GPU")
def test_a_grouped_lookup_that_must_read_its_tables_waits_for_the_gpu_as_often_for_eight_as_for_one(
        sok, rng, unique_name):
    from sok_ev._ops import ops

    keys = rng.permutation(10 * SYNC_KEYS)[:SYNC_KEYS].astype(np.int64)
    ids = tf.SparseTensor(
        np.stack([np.arange(SYNC_KEYS), np.zeros(SYNC_KEYS)], 1).astype(np.int64), keys,
        [SYNC_KEYS, 1])

    def waits_of_second_lookup(num_tables):
        evs = [
            sok.get_embedding_variable(unique_name(), embedding_dim=4) for _ in range(num_tables)
        ]
        first = sok.lookup_sparse(evs, [ids] * num_tables)
        before = int(ops().sok_ev_gpu_host_syncs())
        second = sok.lookup_sparse(evs, [ids] * num_tables)
        waits = int(ops().sok_ev_gpu_host_syncs()) - before
        for a, b in zip(first, second):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert all(int(ev.total_count()) == SYNC_KEYS for ev in evs)
        return waits

    assert waits_of_second_lookup(8) == waits_of_second_lookup(1)
