"""A short TensorFlow training run of sok-ev on the GPU, for compute-sanitizer.

tests/gpu/run_on_device.sh runs it under `compute-sanitizer --tool memcheck`
with TF_GPU_ALLOCATOR=cuda_malloc_async: every tensor is then its own CUDA
allocation, so an access outside it is reported (TensorFlow's default BFC
allocator carves tensors out of one large block, which memcheck sees as a
single allocation). The run covers each stage of the TF GPU path: lookups of
two tables (int64 keys, 'sum' with weights, dim 128; int32 keys, 'mean',
dim 4) with duplicated keys, empty rows and new keys in every step, their
gradients, the fused apply of Adagrad, Adam and Ftrl, and an export; in a
Session and in a tf.function; and the many-worker row message packed and
unpacked (rows of whole float4s and of odd widths, with and without
positions), combined and written in place at both ends; and, on a GPU,
HBM_DRAM tables whose rows cross between the tiers every step. It fails
unless every SokEv op ran on GPU:0 (--allow-cpu: the CPU dry run of the
device script).

  python tests/gpu/tf_memcheck_workload.py [--allow-cpu]
"""
import argparse
import os
import sys

import numpy as np
import tensorflow as tf

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)

import sok_ev_reference as ref  # noqa: E402  pylint: disable=wrong-import-position
from test_device_placement import executed_ops_by_device  # noqa: E402  pylint: disable=wrong-import-position

import sok_ev  # noqa: E402  pylint: disable=wrong-import-position

TABLES = [
    dict(dim=128, key_dtype=np.int64, combiner="sum", weighted=True),
    dict(dim=4, key_dtype=np.int32, combiner="mean", weighted=False)
]
BATCH, HOTNESS, STEPS = 64, 8, 3
OPTIMIZERS = {
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01),
}


def _batches(rng, step):
    # Keys from a range that grows every step: each step inserts new keys.
    return [
        ref.random_sparse_batch(rng, BATCH, HOTNESS,
                                ref.key_sampler(rng, "in_range", 200 * (step + 1), t["key_dtype"]),
                                t["key_dtype"]) for t in TABLES
    ]


def _new_evs(rng, prefix):
    return [
        ref.matrix_ev(sok_ev, f"{prefix}_{i}", ref.random_matrix(rng, 16, t["dim"]), t["key_dtype"])
        for i, t in enumerate(TABLES)
    ]


def _loss(embeddings):
    return tf.add_n([tf.reduce_sum(e * e) for e in embeddings])


def run_session(rng, name, make_optimizer, expected_device):
    with ref.graph_session() as sess:
        evs = _new_evs(rng, name)
        ids = [
            tf.compat.v1.sparse_placeholder(tf.as_dtype(t["key_dtype"]), shape=[None, None])
            for t in TABLES
        ]
        weights = [
            tf.compat.v1.sparse_placeholder(tf.float32, shape=[None, None])
            if t["weighted"] else None for t in TABLES
        ]
        embeddings = sok_ev.lookup_sparse(evs, ids, [t["combiner"] for t in TABLES], weights)
        train = make_optimizer().minimize(_loss(embeddings))
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(STEPS):
            feed = {}
            for t, batch in enumerate(_batches(rng, step)):
                feed[ids[t]] = batch.ids_value()
                if weights[t] is not None:
                    feed[weights[t]] = tf.compat.v1.SparseTensorValue(batch.indices, batch.weights,
                                                                      batch.dense_shape)
            if step == STEPS - 1:
                ran = executed_ops_by_device(sess, [train] + [ev.export() for ev in evs], feed)
                misplaced = {op: d for op, d in ran.items() if d != {expected_device}}
                assert ran and not misplaced, f"{name}: not on {expected_device}: {misplaced}"
            else:
                sess.run(train, feed)
        for keys, values in sess.run([ev.export() for ev in evs]):
            assert len(keys) and np.isfinite(values).all(), name
    print(f"{name}: {STEPS} steps in a Session, every SokEv op on {expected_device}")


def run_tf_function(rng, expected_device):
    evs = _new_evs(rng, "tf_function")
    optimizer = OPTIMIZERS["adagrad"]()

    @tf.function(input_signature=[[
        tf.SparseTensorSpec([None, None], tf.as_dtype(t["key_dtype"])) for t in TABLES
    ]])
    def step(ids):
        with tf.GradientTape() as tape:
            embeddings = sok_ev.lookup_sparse(evs, ids, [t["combiner"] for t in TABLES])
            loss = _loss(embeddings)
        optimizer.apply_gradients(zip(tape.gradient(loss, evs), evs))
        return embeddings

    for s in range(STEPS):
        embeddings = step([batch.sp_ids() for batch in _batches(rng, s)])
    for embedding in embeddings:
        assert embedding.device.endswith(expected_device[len("/device:"):]), embedding.device
        assert np.isfinite(embedding.numpy()).all()
    print(f"tf.function: {STEPS} steps, outputs on {embeddings[0].device}")


def run_tiered(rng):
    """HBM_DRAM tables (a budget of 8 rows each; LFU for one, LRU for the
  other) trained with Adagrad beside the same tables all in HBM, keys new in
  every step: rows are chosen, written back and brought in every step, and
  every table ends with the all-HBM table's rows, frequencies and versions."""
    strategies = [sok_ev.CacheStrategy.LFU, sok_ev.CacheStrategy.LRU]
    tiered, all_hbm = [], []
    for i, t in enumerate(TABLES):
        storage = sok_ev.StorageOption(storage_type=sok_ev.StorageType.HBM_DRAM,
                                       storage_size=[8 * 4 * t["dim"] * 2],
                                       cache_strategy=strategies[i])
        for tables, option in ((tiered, sok_ev.EmbeddingVariableOption(storage_option=storage)),
                               (all_hbm, None)):
            tables.append(
                sok_ev.get_embedding_variable(
                    f"tiered_{i}_{option is None}",
                    embedding_dim=t["dim"],
                    key_dtype=tf.as_dtype(t["key_dtype"]),
                    initializer=tf.compat.v1.truncated_normal_initializer(seed=i),
                    ev_option=option))
    optimizer = OPTIMIZERS["adagrad"]()
    evs = tiered + all_hbm
    for s in range(STEPS + 2):
        ids = [batch.sp_ids() for batch in _batches(rng, s)] * 2
        with tf.GradientTape() as tape:
            loss = _loss(sok_ev.lookup_sparse(evs, ids, [t["combiner"] for t in TABLES] * 2))
        optimizer.apply_gradients(zip(tape.gradient(loss, evs), evs))
    for a, b in zip(tiered, all_hbm):
        counters = a.tier_counters()
        assert counters["rows_to_host"] > 0 and counters["rows_to_hbm"] > 0, counters
        for x, y in zip(ref.in_key_order(*(v.numpy() for v in a.export_full()[:4])),
                        ref.in_key_order(*(v.numpy() for v in b.export_full()[:4]))):
            np.testing.assert_array_equal(x, y)
    print(f"tiered: {STEPS + 2} steps, rows moved both ways, the same state as all in HBM")


def run_row_messages(rng):
    """PackRowMessage then UnpackRowMessage for 3 workers: float4 rows (dims
  128 and 4) in one message, odd widths (3, 1) in another, with every block
  in the message and with worker 1's beside it (a view of the rows, or a
  copy); the rows come back where they were, CombineRowMessage reads them
  in place (float4 rows and rows off 16-byte boundaries), and
  CombineRowMessageGrad writes their gradients in place."""
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    for dims in ([128, 4], [3, 1]):
        counts = rng.integers(0, 40, size=(len(dims), 3)).astype(np.int64)
        rows = [
            rng.standard_normal((int(c.sum()), d)).astype(np.float32) for c, d in zip(counts, dims)
        ]
        positions = [rng.permutation(len(r)).astype(np.int64) for r in rows]
        for given in ([], positions):
            for local_worker in (-1, 1):
                message, _, local = ops().sok_ev_pack_row_message(rows,
                                                                  counts,
                                                                  given,
                                                                  local_worker=local_worker)
                back = ops().sok_ev_unpack_row_message(message,
                                                       counts,
                                                       given,
                                                       local if local_worker >= 0 else [],
                                                       N=len(dims),
                                                       dims=dims,
                                                       local_worker=local_worker)
                for t, table in enumerate(rows):
                    np.testing.assert_array_equal(back[t].numpy(), table)
        # The requester's combine of the message in place: one entry per
        # row, so each sample is its row (unique_index, order, segments,
        # row_offsets, weights).
        one_per_row = ([np.arange(len(r), dtype=np.int64) for r in rows
                       ], [np.arange(len(r), dtype=np.int64) for r in rows
                          ], [np.arange(len(r) + 1, dtype=np.int64) for r in rows
                             ], [np.arange(len(r) + 1, dtype=np.int64) for r in rows],
                       [np.zeros([0], np.float32)] * len(dims))
        attrs = dict(dims=dims,
                     combiners=["sum"] * len(dims),
                     weighted=[False] * len(dims),
                     local_worker=1)
        message, _, local = ops().sok_ev_pack_row_message(rows, counts, positions, local_worker=1)
        embeddings = ops().sok_ev_combine_row_message(message, counts, positions, local,
                                                      *one_per_row, **attrs)
        for t, table in enumerate(rows):
            np.testing.assert_array_equal(embeddings[t].numpy(), table)
        # Its gradient written in place: each row's gradient is its sample's,
        # so the message that comes back is the one that went out.
        grad_message, grad_local = ops().sok_ev_combine_row_message_grad(
            rows, counts, positions, *one_per_row, **attrs)
        np.testing.assert_array_equal(grad_message.numpy(), message.numpy())
        for t, table in enumerate(local):
            np.testing.assert_array_equal(grad_local[t].numpy(), table.numpy())


def run_owner_row_messages(rng):
    """The owner's end for 3 workers, dims 128 and 4 (float4 rows), then 3
  and 1 (rows off 16-byte boundaries): FindOrInsertRowMessage looks the
  received keys (repeated across workers, new and stored ones) up straight
  into the message and worker 1's block, and FindOrInsertRowMessageGrad sums
  each unique key's gradients read in place."""
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    for dims in ([128, 4], [3, 1]):
        key_dtypes = [np.int64, np.int32]
        matrices = [ref.random_matrix(rng, 16, d) for d in dims]
        tables = [
            ref.matrix_ev(sok_ev, f"owner_{dims[0]}_{t}", m, k)
            for t, (m, k) in enumerate(zip(matrices, key_dtypes))
        ]
        counts = rng.integers(0, 40, size=(len(dims), 3)).astype(np.int64)
        # Each worker's block sorted, as a GPU worker sends it: merged.
        keys = [
            np.concatenate(
                [np.sort(rng.choice(64, size=int(c), replace=False))
                 for c in table_counts]).astype(k)
            for table_counts, k in zip(counts, key_dtypes)
        ]
        owned = ops().sok_ev_unique_owned_keys([tf.constant(k) for k in keys],
                                               [tf.ones([len(k)], tf.int64) for k in keys], counts)
        message, _, local = ops().sok_ev_find_or_insert_row_message([t.handle for t in tables],
                                                                    *owned,
                                                                    counts,
                                                                    embedding_dims=dims,
                                                                    local_worker=1)
        rows = [m[k.astype(np.int64) % 16] for m, k in zip(matrices, keys)]
        want, _, want_local = ops().sok_ev_pack_row_message(rows, counts, [], local_worker=1)
        np.testing.assert_array_equal(message.numpy(), want.numpy())
        for t in range(len(dims)):
            np.testing.assert_array_equal(local[t].numpy(), want_local[t].numpy())
        # The same message as gradients: each unique key sums its rows.
        grad_unique = ops().sok_ev_find_or_insert_row_message_grad(message,
                                                                   counts,
                                                                   local,
                                                                   *owned[2:],
                                                                   dims=dims,
                                                                   local_worker=1)
        for t, table_rows in enumerate(rows):
            sums = np.zeros(grad_unique[t].shape, np.float64)
            np.add.at(sums, owned[2][t].numpy(), table_rows)
            np.testing.assert_allclose(grad_unique[t].numpy(), sums, rtol=1e-5, atol=1e-6)


def run_owned_key_runs(rng):
    """UniqueOwnedKeys over 3 workers' blocks of keys, sorted (the GPU merges
  them) and shuffled (the merge's places collide, and it sorts instead)."""
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    counts = rng.integers(0, 3000, size=(2, 3)).astype(np.int64)
    for shuffle in (False, True):
        keys = [
            np.concatenate([
                np.sort(rng.choice(5000, size=int(c), replace=False))
                if not shuffle else rng.choice(5000, size=int(c), replace=False)
                for c in table_counts
            ])
            for table_counts in counts
        ]
        owned = ops().sok_ev_unique_owned_keys([tf.constant(k) for k in keys],
                                               [tf.ones([len(k)], tf.int64) for k in keys], counts)
        for t, k in enumerate(keys):
            uniq, index = owned[0][t].numpy(), owned[2][t].numpy()
            np.testing.assert_array_equal(np.sort(uniq), np.unique(k))
            np.testing.assert_array_equal(uniq[index], k)
            np.testing.assert_array_equal(owned[1][t].numpy(), np.bincount(index))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU")
    args = parser.parse_args()
    gpus = tf.config.list_physical_devices("GPU")
    assert gpus or args.allow_cpu, "no GPU visible to TensorFlow"
    expected = "/device:GPU:0" if gpus else "/device:CPU:0"
    sok_ev.init()
    rng = np.random.default_rng(8)
    for name, make_optimizer in OPTIMIZERS.items():
        run_session(rng, name, make_optimizer, expected)
    run_tf_function(rng, expected)
    if gpus:
        run_tiered(rng)
    run_row_messages(rng)
    run_owner_row_messages(rng)
    run_owned_key_runs(rng)
    print(f"workload done on {expected}: sok_ev {sok_ev.__file__}")


if __name__ == "__main__":
    main()
