"""Concurrent lookups and optimizer applies on one Embedding Variable lose nothing.

Several Python threads share one tf.compat.v1.Session: trainer threads each
run their own SGD train op over overlapping keys (many keys are first seen
by several threads at once, so inserts race too) while reader threads keep
looking up and counting the same keys. With loss = sum of the embeddings and
a sum combiner, every apply subtracts lr * (occurrences of the key in that
op's batch) from the key's row, whatever the interleaving, so the final
table is known exactly: init - lr * sum over applies of occurrences. The
learning rate is a power of two and the ones initializer is used so that
every intermediate value is exact in float32: any lost or doubled update
shows up as an exact mismatch, with no tolerance to hide it.
"""
import threading

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

LR = 2.0**-12
DIM, BATCH, MAX_HOTNESS = 8, 16, 4
TRAINERS, READERS, STEPS_PER_TRAINER, POOL = 4, 2, 400, 48


def _run_threads(targets):
    errors = []

    def guard(fn):

        def run():
            try:
                fn()
            except BaseException as e:  # reported after join, in the main thread
                errors.append(e)

        return run

    threads = [threading.Thread(target=guard(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.timeout(300)
def test_concurrent_sgd_applies_and_lookups_lose_no_update(sok, rng):
    batches = [
        ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS, lambda n: rng.integers(0, POOL, size=n),
                                np.int64) for _ in range(TRAINERS)
    ]
    expected_steps = {}  # key -> total occurrences over all applies
    for batch in batches:
        keys, counts = np.unique(batch.keys, return_counts=True)
        for k, c in zip(keys.tolist(), counts.tolist()):
            expected_steps[k] = expected_steps.get(k, 0) + c * STEPS_PER_TRAINER
    # Overlap is what makes the test meaningful.
    shared = set(
        batches[0].keys.tolist()).intersection(*[set(b.keys.tolist()) for b in batches[1:]])
    assert shared, "trainer batches must share keys"

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4,
                                      intra_op_parallelism_threads=4)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=config) as sess:
        ev = sok.get_embedding_variable("emb", embedding_dim=DIM, initializer=tf.ones_initializer())
        opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        train_ops = []
        for batch in batches:
            rows = sok.lookup_sparse([ev], [batch.sp_ids()], combiners=["sum"])[0]
            train_ops.append(opt.minimize(tf.reduce_sum(rows)))
        reader_ids = tf.SparseTensor(
            np.stack([np.arange(POOL), np.zeros(POOL)], 1).astype(np.int64),
            np.arange(POOL, dtype=np.int64), [POOL, 1])
        read_op = [sok.lookup_sparse([ev], [reader_ids], combiners=["mean"])[0], ev.total_count()]
        exported = ev.export()
        sess.run(tf.compat.v1.global_variables_initializer())
        graph.finalize()  # no op may be added while threads run

        stop = threading.Event()

        def trainer(op):

            def loop():
                for _ in range(STEPS_PER_TRAINER):
                    sess.run(op)

            return loop

        def reader():
            while True:  # at least once, so every pool key gets stored
                values, count = sess.run(read_op)
                # A reader may see any mix of applied steps, but values only
                # ever go down from 1 and are never NaN.
                assert np.isfinite(values).all()
                assert (values <= 1.0).all() and count <= POOL
                if stop.is_set():
                    break

        def trainers_then_stop():
            try:
                _run_threads([trainer(op) for op in train_ops])
            finally:
                stop.set()

        _run_threads([trainers_then_stop] + [reader] * READERS)
        keys, values = sess.run(exported)

    got = ref.export_to_dict(keys, values)
    # Readers look up the whole pool, so every pool key is stored.
    assert sorted(got) == list(range(POOL))
    for k in range(POOL):
        want = np.full(DIM, 1.0 - LR * expected_steps.get(k, 0), np.float32)
        np.testing.assert_array_equal(got[k], want, err_msg=f"key {k}: lost or extra updates")


@pytest.mark.timeout(300)
def test_concurrent_eager_lookups_of_new_keys_insert_each_key_once(sok, rng, unique_name):
    # Many threads see the same brand-new keys at once: each key must be
    # stored once, with its initial value (key k -> M[k mod N]).
    matrix = ref.random_matrix(rng, 13, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    key_sets = [rng.integers(-10**9, 10**9, size=200) for _ in range(3)]
    results = {}

    def looker(i, keys):

        def run():
            for _ in range(10):
                sp = tf.SparseTensor(
                    np.stack([np.arange(len(keys)), np.zeros(len(keys))], 1).astype(np.int64), keys,
                    [len(keys), 1])
                results[i] = sok.lookup_sparse([ev], [sp], combiners=["sum"])[0].numpy()

        return run

    # Every thread sees each key set: 2 threads per set.
    _run_threads([looker(i, key_sets[i % 3]) for i in range(6)])

    all_keys = set(np.concatenate(key_sets).tolist())
    assert int(ev.total_count()) == len(all_keys)
    for i, rows in results.items():
        np.testing.assert_array_equal(rows, ref.initial_rows(matrix, key_sets[i % 3]))
    stored = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    assert sorted(stored) == sorted(all_keys)
