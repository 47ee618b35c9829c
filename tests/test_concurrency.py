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

The same holds for six trainer threads applying to one table in each way a
script can run them: Session threads sharing one train op or each with its
own, next to Adagrad and Momentum trainers whose slots are added to the
table while the SGD applies run, threads calling one tf.function that looks
up and applies, and eager threads with their own GradientTapes. And it
holds under more pressure: threads updating the same rows in step, new keys
inserted by several threads while others apply, readers reading rows
mid-update (never half-updated; every occurrence counted), and every
optimizer with slots (threads give the serial run bit for bit).
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


# --- Several threads applying to one table: the serial result, exactly ------
#
# THREADS trainer threads, each with its own fixed batch over the KEYS keys
# [0, KEYS), apply SGD with loss = sum of the sum-combined embeddings
# APPLIES times. Each apply subtracts LR * (occurrences of the key in its
# batch) from every element of the key's row, whatever the interleaving, so
# the table must end at the serial result, computed with NumPy below
# (`_serial_sgd_rows`): ones - LR * APPLIES * (occurrences over all batches).
# Dense TensorFlow resource variables give exactly that (their sparse apply
# ops lock the variable).
THREADS, APPLIES, KEYS = 6, 400, 71


def _trainer_batches(rng, threads=THREADS):
    """One [BATCH, MAX_HOTNESS] batch of keys in [0, KEYS) per trainer; every
    batch holds keys 0..7, so the trainers always overlap."""
    batches = []
    for _ in range(threads):
        batch = ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                        lambda n: rng.integers(0, KEYS, size=n), np.int64)
        batch.keys[:8] = np.arange(8)[:len(batch.keys)]
        batches.append(batch)
    return batches


def _occurrences(batches, applies=APPLIES):
    """[KEYS] float64: how often each key occurs over every apply of every batch."""
    counts = np.zeros(KEYS)
    for batch in batches:
        np.add.at(counts, batch.keys, applies)
    return counts


def _serial_sgd_rows(batches, applies=APPLIES):
    """{key: row} after the applies one after another, from ones."""
    occurrences = _occurrences(batches, applies)
    return {
        k: np.full(DIM, 1.0 - LR * occurrences[k], np.float32) for k in range(KEYS) if occurrences[k]
    }


def _assert_rows_equal(got, want, what):
    assert sorted(got) == sorted(want), f"{what}: key sets differ"
    wrong = [k for k in want if not np.array_equal(got[k], want[k])]
    assert not wrong, (f"{what}: {len(wrong)} of {len(want)} keys lost or gained updates, e.g. "
                       f"key {wrong[0]}: got {got[wrong[0]][0]}, want {want[wrong[0]][0]}")


def _repeat(fn, times):
    return lambda: [fn() for _ in range(times)]


def _session_config():
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4, intra_op_parallelism_threads=4)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("train_ops", ["one_shared", "one_per_thread"])
def test_session_threads_applying_sgd_to_one_table_give_the_serial_result(sok, rng, train_ops):
    batches = _trainer_batches(rng)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=_session_config()) as sess:
        ev = sok.get_embedding_variable("emb", embedding_dim=DIM, initializer=tf.ones_initializer())
        opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        if train_ops == "one_shared":
            ids = tf.compat.v1.sparse_placeholder(tf.int64)
            rows = sok.lookup_sparse([ev], [ids], combiners=["sum"])[0]
            train = opt.minimize(tf.reduce_sum(rows))
            steps = [lambda b=b: sess.run(train, {ids: b.ids_value()}) for b in batches]
        else:
            steps = []
            for batch in batches:
                rows = sok.lookup_sparse([ev], [batch.sp_ids()], combiners=["sum"])[0]
                steps.append(lambda op=opt.minimize(tf.reduce_sum(rows)): sess.run(op))
        exported = ev.export()
        sess.run(tf.compat.v1.global_variables_initializer())
        graph.finalize()
        _run_threads([_repeat(step, APPLIES) for step in steps])
        got = ref.export_to_dict(*sess.run(exported))
    _assert_rows_equal(got, _serial_sgd_rows(batches), "SGD from 6 Session threads")


@pytest.mark.timeout(300)
def test_adagrad_and_momentum_slots_created_while_sgd_applies_run_lose_nothing(sok, rng):
    # Next to the SGD trainers, Adagrad and Momentum trainers with learning
    # rate 0 start at the same moment: their first applies add their slots
    # to the table (re-laying every row out) while SGD applies run. Their
    # slots are exact too: with momentum 1 Momentum's slot is the sum of the
    # gradients, and Adagrad's accumulator its initial value plus the sum of
    # their squares (the gradients are small integers).
    sgd_batches = _trainer_batches(rng)
    slot_batches = _trainer_batches(rng, threads=2)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=_session_config()) as sess:
        ev = sok.get_embedding_variable("emb", embedding_dim=DIM, initializer=tf.ones_initializer())
        sgd = tf.compat.v1.train.GradientDescentOptimizer(LR)
        adagrad = tf.compat.v1.train.AdagradOptimizer(0.0, initial_accumulator_value=0.5)
        momentum = tf.compat.v1.train.MomentumOptimizer(0.0, momentum=1.0)

        def train_op(opt, batch):
            rows = sok.lookup_sparse([ev], [batch.sp_ids()], combiners=["sum"])[0]
            return opt.minimize(tf.reduce_sum(rows))

        ops_and_times = [(train_op(sgd, b), APPLIES) for b in sgd_batches]
        ops_and_times += [
            (train_op(opt, b), APPLIES // 4) for opt in (adagrad, momentum) for b in slot_batches
        ]
        exported = ev.export()
        accumulator = adagrad.get_slot(ev, "accumulator").export()
        velocity = momentum.get_slot(ev, "momentum").export()
        sess.run(tf.compat.v1.global_variables_initializer())
        graph.finalize()
        start = threading.Barrier(len(ops_and_times))

        def trainer(op, times):

            def run():
                start.wait()
                for _ in range(times):
                    sess.run(op)

            return run

        _run_threads([trainer(op, times) for op, times in ops_and_times])
        got, got_accumulator, got_velocity = (
            ref.export_to_dict(*sess.run(t)) for t in (exported, accumulator, velocity))
    want = _serial_sgd_rows(sgd_batches)
    for k in _serial_sgd_rows(slot_batches):
        want.setdefault(k, np.ones(DIM, np.float32))  # looked up, never moved by SGD
    _assert_rows_equal(got, want, "SGD next to slot creation")
    # Per apply, each key's gradient element is its occurrences in the batch.
    sums, squares = np.zeros(KEYS), np.zeros(KEYS)
    for batch in slot_batches:
        keys, counts = np.unique(batch.keys, return_counts=True)
        sums[keys] += counts * (APPLIES // 4)
        squares[keys] += counts.astype(np.float64)**2 * (APPLIES // 4)
    _assert_rows_equal(got_velocity, {k: np.full(DIM, sums[k], np.float32) for k in want},
                       "Momentum slot")
    _assert_rows_equal(got_accumulator,
                       {k: np.full(DIM, 0.5 + squares[k], np.float32) for k in want},
                       "Adagrad accumulator")


@pytest.mark.timeout(300)
def test_threads_calling_one_tf_function_that_looks_up_and_applies_give_the_serial_result(
        sok, rng, unique_name):
    batches = _trainer_batches(rng)
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=DIM,
                                    initializer=tf.ones_initializer())
    opt = tf.compat.v1.train.GradientDescentOptimizer(LR)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([ev], [ids], combiners=["sum"])[0])
        opt.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))

    step(tf.SparseTensor(np.zeros([0, 2], np.int64), np.zeros([0], np.int64),
                         [1, 1]))  # traced once
    sparse = [b.sp_ids() for b in batches]
    _run_threads([_repeat(lambda ids=ids: step(ids), APPLIES) for ids in sparse])
    got = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    _assert_rows_equal(got, _serial_sgd_rows(batches), "SGD from 6 threads in one tf.function")


@pytest.mark.timeout(300)
def test_eager_threads_with_gradient_tapes_applying_sgd_give_the_serial_result(
        sok, rng, unique_name):
    batches = _trainer_batches(rng)
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=DIM,
                                    initializer=tf.ones_initializer())
    opt = tf.compat.v1.train.GradientDescentOptimizer(LR)

    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([ev], [ids], combiners=["sum"])[0])
        opt.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))

    sparse = [b.sp_ids() for b in batches]
    _run_threads([_repeat(lambda ids=ids: step(ids), APPLIES // 4) for ids in sparse])
    got = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    _assert_rows_equal(got, _serial_sgd_rows(batches, APPLIES // 4), "eager SGD from 6 threads")


# --- Applies, lookups and inserts at once, against exact references --------
#
# The tests below put the table's locks under the most pressure a script
# can: every thread updates the same rows in the same order at the same
# time, new keys arrive in every step from several threads while others
# apply, readers read rows mid-update, and optimizers with slots run side by
# side. Each checks every key against a reference computed without threads.
#
# With loss = sum of the looked-up rows, an apply adds -LR * (occurrences of
# the key in its batch) to every element of the key's row; LR is a power of
# two and the rows start at ones, so every value stays exact in float32.


def _ids(keys):
    """`keys` as a [len, 1] SparseTensor: one key a sample."""
    keys = np.asarray(keys)
    indices = np.stack([np.arange(len(keys)), np.zeros(len(keys))], 1).astype(np.int64)
    return tf.SparseTensor(indices, keys, [len(keys), 1])


def _counts(batches, times=1):
    """{key: occurrences over `times` applies of each batch}."""
    counts = {}
    for batch in batches:
        for k, c in zip(*np.unique(batch, return_counts=True)):
            counts[int(k)] = counts.get(int(k), 0) + int(c) * times
    return counts


SAME_ROWS_KEYS, SAME_ROWS_APPLIES = 4096, 40


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("runner", ["session", "tf_function"])
def test_threads_updating_the_same_rows_at_once_give_the_serial_result(
        sok, rng, unique_name, key_dtype, runner):
    # Every thread applies the same batch (each key twice, in one shuffled
    # order), so concurrent updates walk the same rows in step: a row
    # updated without its lock held exclusively loses updates here first.
    # (A dense tf.Variable is no reference here: TF's sparse SGD on one,
    # through tf.nn.embedding_lookup's gradient, was measured losing a few
    # updates in this very setting.)
    batch = np.repeat(np.arange(SAME_ROWS_KEYS), 2).astype(key_dtype)
    rng.shuffle(batch)
    opt = tf.compat.v1.train.GradientDescentOptimizer(LR)

    def loss(ev, ids):
        return tf.reduce_sum(sok.lookup_sparse([ev], [ids], combiners=["sum"])[0])

    def table(name):
        return sok.get_embedding_variable(name,
                                          embedding_dim=DIM,
                                          key_dtype=tf.as_dtype(key_dtype),
                                          initializer=tf.ones_initializer())

    if runner == "session":
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.Session(graph=graph,
                                                      config=_session_config()) as sess:
            ev = table("emb")
            train = opt.minimize(loss(ev, _ids(batch)))
            exported = ev.export()
            sess.run(tf.compat.v1.global_variables_initializer())
            graph.finalize()
            _run_threads([_repeat(lambda: sess.run(train), SAME_ROWS_APPLIES)] * THREADS)
            got = ref.export_to_dict(*sess.run(exported))
    else:
        ev = table(unique_name())

        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                value = loss(ev, ids)
            opt.apply_gradients(zip(tape.gradient(value, [ev]), [ev]))

        ids = _ids(batch)
        _run_threads([_repeat(lambda: step(ids), SAME_ROWS_APPLIES)] * THREADS)
        got = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    # Serially: each of the THREADS * SAME_ROWS_APPLIES applies moves every
    # row by -LR * 2.
    serial = np.full(DIM, 1.0 - LR * 2 * THREADS * SAME_ROWS_APPLIES, np.float32)
    _assert_rows_equal(got, {k: serial for k in range(SAME_ROWS_KEYS)},
                       f"{THREADS} threads on the same rows")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
def test_new_keys_inserted_by_threads_while_others_apply_are_stored_once_and_exact(
        sok, rng, key_dtype):
    # Step s of every thread brings keys of window s, which no earlier step
    # had: several threads insert the same new keys at once while others
    # apply to older keys, and the table grows all along. Every key must be
    # stored once, with every update and every occurrence counted (its
    # frequency), as a serial run gives.
    steps, window = 30, 1500
    fresh = (rng.permutation(10**6)[:steps * window] * 37 - 10**7).astype(key_dtype)
    plans = [[
        np.concatenate([
            rng.choice(fresh[s * window:(s + 1) * window], 400),
            rng.choice(fresh[:(s + 1) * window], 200)
        ]) for s in range(steps)
    ] for _ in range(THREADS)]
    want = _counts([batch for plan in plans for batch in plan])
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=_session_config()) as sess:
        ev = sok.get_embedding_variable("emb",
                                        embedding_dim=DIM,
                                        key_dtype=tf.as_dtype(key_dtype),
                                        initializer=tf.ones_initializer())
        ids = tf.compat.v1.placeholder(key_dtype, [None])
        train = tf.compat.v1.train.GradientDescentOptimizer(LR).minimize(
            tf.reduce_sum(tf.nn.embedding_lookup(ev, ids)))
        exported = ev.export_full()
        sess.run(tf.compat.v1.global_variables_initializer())
        graph.finalize()
        start = threading.Barrier(THREADS)

        def trainer(plan):

            def run():
                start.wait()
                for batch in plan:
                    sess.run(train, {ids: batch})

            return run

        _run_threads([trainer(plan) for plan in plans])
        keys, rows, frequencies = sess.run(exported)[:3]
    assert len(keys) == len(set(keys.tolist())) == len(want), "a key stored twice or lost"
    serial = {k: np.full(DIM, 1.0 - LR * c, np.float32) for k, c in want.items()}
    _assert_rows_equal(ref.export_to_dict(keys, rows), serial, "new keys under concurrent inserts")
    assert dict(zip(keys.tolist(), frequencies.tolist())) == want, "frequencies"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
def test_lookups_racing_applies_read_whole_rows_and_count_every_occurrence(sok, rng, key_dtype):
    # Every apply moves all elements of a row by the same amount, so a row
    # read half-updated would hold two values. Readers (a counting lookup and
    # a sparse_read, which counts nothing) run while the trainers apply; at
    # the end each key's frequency is its occurrences in every apply and
    # every counting read, and its row the serial result.
    pool = (rng.choice(10**6, 3000, replace=False) - 500000).astype(key_dtype)
    batches = [rng.choice(pool, 500) for _ in range(4)]  # repeats within and across
    read_keys = rng.choice(pool, 700)
    applies = 60
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=_session_config()) as sess:
        ev = sok.get_embedding_variable("emb",
                                        embedding_dim=DIM,
                                        key_dtype=tf.as_dtype(key_dtype),
                                        initializer=tf.ones_initializer())
        opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        train_ops = [
            opt.minimize(tf.reduce_sum(sok.lookup_sparse([ev], [_ids(b)], combiners=["sum"])[0]))
            for b in batches
        ]
        reads = [
            sok.lookup_sparse([ev], [_ids(read_keys)], combiners=["sum"])[0],
            ev.sparse_read(tf.constant(pool))
        ]
        exported = ev.export_full()
        sess.run(tf.compat.v1.global_variables_initializer())
        graph.finalize()
        stop, counted_reads, torn = threading.Event(), [], []

        def reader():
            while not stop.is_set():
                for rows in sess.run(reads):
                    torn.extend(r for r in rows if not (r == r[0]).all())
                counted_reads.append(1)

        def trainers():
            try:
                _run_threads([_repeat(lambda op=op: sess.run(op), applies) for op in train_ops])
            finally:
                stop.set()

        _run_threads([trainers, reader, reader])
        keys, rows, frequencies = sess.run(exported)[:3]
    assert not torn, f"{len(torn)} rows read half-updated, e.g. {torn[0]}"
    updates = _counts(batches, applies)
    want_frequencies = _counts([read_keys], len(counted_reads))
    for k, c in updates.items():
        want_frequencies[k] = want_frequencies.get(k, 0) + c
    assert dict(zip(keys.tolist(), frequencies.tolist())) == want_frequencies, "frequencies"
    got = ref.export_to_dict(keys, rows)
    serial = {k: np.full(DIM, 1.0 - LR * c, np.float32) for k, c in updates.items()}
    _assert_rows_equal({k: got[k] for k in updates}, serial, "rows next to readers")


# Each key occurs exactly twice in each batch that holds it, so every apply
# gives it the same gradient (2 in every element): its trajectory then depends
# only on how many applies it got, and threads must reproduce the serial run
# bit for bit, slots included, whatever the optimizer. (Adam with beta1 =
# beta2 = 0 keeps its beta powers, which each train op advances, at 0: the
# learning rate every apply reads is then the same in any interleaving.)
_OPTIMIZERS = {
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(LR, initial_accumulator_value=0.5),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(LR, beta1=0.0, beta2=0.0),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(LR, l1_regularization_strength=0.001),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(LR, momentum=0.5),
    "nesterov": lambda: tf.compat.v1.train.MomentumOptimizer(LR, 0.5, use_nesterov=True),
    "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(LR, momentum=0.5, centered=True),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer", sorted(_OPTIMIZERS))
def test_threads_applying_any_optimizer_give_the_serial_result_and_slots(sok, rng, optimizer):
    pool = np.arange(-300, 300) * 7919
    batches = [np.repeat(rng.choice(pool, 200, replace=False), 2) for _ in range(THREADS)]
    for batch in batches:
        rng.shuffle(batch)

    def train(threaded):
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.Session(graph=graph,
                                                      config=_session_config()) as sess:
            ev = sok.get_embedding_variable("emb",
                                            embedding_dim=DIM,
                                            initializer=tf.ones_initializer())
            opt = _OPTIMIZERS[optimizer]()
            ids = tf.compat.v1.placeholder(tf.int64, [None])
            train_op = opt.minimize(tf.reduce_sum(tf.nn.embedding_lookup(ev, ids)))
            exported = ev.export_full()
            sess.run(tf.compat.v1.global_variables_initializer())
            graph.finalize()
            steps = [_repeat(lambda b=b: sess.run(train_op, {ids: b}), 50) for b in batches]
            if threaded:
                _run_threads(steps)
            else:
                for step in steps:
                    step()
            keys, rows = sess.run(exported)[:2]
        return ref.export_to_dict(keys, rows)  # each row with its slots

    _assert_rows_equal(train(threaded=True), train(threaded=False),
                       f"{optimizer} from {THREADS} threads, slots included")
