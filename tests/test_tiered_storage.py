"""DeepRec's HBM_DRAM storage: a GPU Embedding Variable whose rows beyond an
HBM budget live in host memory (cc/tiered_table_gpu.h).

The reference for a tiered table is the same table with every row in HBM
(and, for checkpoints, on the CPU): whatever the budget and cache strategy,
every lookup, update, export and checkpoint must give the same bits. The
option checks and errors run everywhere (a CPU-only machine refuses HBM_DRAM,
naming it); the tiers themselves need a GPU, and those tests skip without
one.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

GPU = bool(tf.config.list_physical_devices("GPU"))
needs_gpu = pytest.mark.skipif(not GPU, reason="HBM_DRAM keeps rows in a GPU's memory")

DIM = 8


def hbm_dram(sok, hbm_bytes, strategy=None):
    strategy = sok.CacheStrategy.LFU if strategy is None else strategy
    return sok.EmbeddingVariableOption(storage_option=sok.StorageOption(
        storage_type=sok.StorageType.HBM_DRAM, storage_size=[hbm_bytes], cache_strategy=strategy))


def budget_of_rows(rows, dim=DIM, slots=0):
    """storage_size[0] for `rows` rows of values and `slots` optimizer slots."""
    return rows * 4 * dim * (1 + slots)


# --------------------------------------------------------------------------- options and errors


@pytest.mark.parametrize("budget", [0, -4, 4 * DIM - 1, 1.5e6, True, "1GB"])
def test_an_hbm_budget_below_one_row_or_not_an_integer_is_refused_naming_it(
        sok, unique_name, budget):
    name = unique_name()
    with pytest.raises(ValueError) as error:
        sok.get_embedding_variable(name, embedding_dim=DIM, ev_option=hbm_dram(sok, budget))
    assert ref.error_names(error.value, name, "storage_size[0]", repr(budget), str(4 * DIM))


@pytest.mark.parametrize("strategy", [2, -1, "LFU", None, 1.0])
def test_an_unknown_cache_strategy_is_refused_naming_it(sok, unique_name, strategy):
    name = unique_name()
    option = sok.EmbeddingVariableOption(storage_option=sok.StorageOption(
        storage_type=sok.StorageType.HBM_DRAM, storage_size=[1 << 20], cache_strategy=strategy))
    with pytest.raises(ValueError) as error:
        sok.get_embedding_variable(name, embedding_dim=DIM, ev_option=option)
    assert ref.error_names(error.value, name, "cache_strategy", repr(strategy))


@pytest.mark.parametrize("storage_type", ["HBM_DRAM_SSDHASH", "DRAM_PMEM", "PMEM_MEMKIND"])
def test_storage_types_not_built_are_refused_naming_them(sok, unique_name, storage_type):
    path = "/tmp/sok_ev_unused" if "SSD" in storage_type else None
    option = sok.EmbeddingVariableOption(storage_option=sok.StorageOption(
        storage_type=getattr(sok.StorageType, storage_type), storage_path=path))
    name = unique_name()
    with pytest.raises(ValueError) as error:
        sok.get_embedding_variable(name, embedding_dim=DIM, ev_option=option)
    assert ref.error_names(error.value, name, "storage_type", storage_type, "not supported")


def test_hbm_dram_on_a_cpu_table_is_refused_before_anything_exists(sok, unique_name):
    name = unique_name()
    with tf.device("/CPU:0"):
        with pytest.raises(ValueError) as error:
            sok.get_embedding_variable(name, embedding_dim=DIM, ev_option=hbm_dram(sok, 1 << 20))
    assert ref.error_names(error.value, name, "HBM_DRAM", "CPU", "GPU")


def test_hbm_dram_in_a_graph_placed_on_the_cpu_is_refused_before_the_variable_exists(sok):
    with ref.graph_session():
        with tf.device("/CPU:0"):
            with pytest.raises(ValueError) as error:
                sok.get_embedding_variable("tiered",
                                           embedding_dim=DIM,
                                           ev_option=hbm_dram(sok, 1 << 20))
        assert not tf.compat.v1.global_variables()
    assert ref.error_names(error.value, "tiered", "HBM_DRAM", "CPU")


def _raw_table(name, key_dtype=tf.int64):
    """A table's handle from the raw op, past the Python checks."""
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    handle = ops().sok_ev_embedding_variable_handle(shared_name=name,
                                                    key_dtype=key_dtype,
                                                    embedding_dim=DIM)
    return ops(), handle


def _initialize(ops, handle, key_dtype=tf.int64, **storage):
    return ops.sok_ev_initialize_embedding_variable(handle,
                                                    tf.zeros([0, DIM]),
                                                    key_dtype=key_dtype,
                                                    embedding_dim=DIM,
                                                    initializer_kind=0,
                                                    param_a=0.5,
                                                    **storage)


def test_the_cpu_kernel_refuses_an_hbm_budget_and_keeps_the_table_it_had(sok, unique_name):
    name = unique_name()
    with tf.device("/CPU:0"):
        ops, handle = _raw_table(name)
        _initialize(ops, handle)
        ops.sok_ev_find_or_insert([handle], [tf.constant([3, 5, 7], tf.int64)],
                                  [tf.ones([3], tf.int64)],
                                  embedding_dims=[DIM])
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            _initialize(ops, handle, hbm_bytes=1 << 20)
        assert int(ops.sok_ev_embedding_variable_size(handle)) == 3
    assert ref.error_names(error.value, name, "HBM_DRAM", "CPU")


@pytest.mark.parametrize("storage, fragments", [
    (dict(hbm_bytes=4 * DIM - 1), ["storage_size[0]", str(4 * DIM - 1)]),
    (dict(hbm_bytes=1 << 20, cache_strategy=7), ["cache_strategy", "7"]),
])
def test_the_initializer_kernel_checks_its_storage_attributes(sok, unique_name, storage, fragments):
    name = unique_name()
    with tf.device("/CPU:0"):
        ops, handle = _raw_table(name)
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            _initialize(ops, handle, **storage)
    assert ref.error_names(error.value, name, *fragments)


def test_a_cpu_table_counts_its_rows_in_host_memory_and_nothing_else(sok, unique_name):
    with tf.device("/CPU:0"):
        ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
        sok.lookup_sparse([ev], [tf.ragged.constant([[1, 2, 2], [], [9]], tf.int64)])
        counters = ev.tier_counters()
    assert counters == dict(hits=0,
                            misses=0,
                            rows_to_hbm=0,
                            rows_to_host=0,
                            pcie_bytes=0,
                            calls=0,
                            hbm_rows=0,
                            host_rows=3,
                            choose_us=0,
                            write_back_us=0,
                            bring_in_us=0,
                            host_tier_us=0,
                            wait_us=0)


def test_deeprec_names_the_cache_strategy_as_deeprec_does(sok):
    sok.install_deeprec_api()
    from tensorflow.core.framework.embedding import config_pb2  # pylint: disable=import-error
    assert tf.CacheStrategy is sok.CacheStrategy is config_pb2.CacheStrategy
    assert (sok.CacheStrategy.LRU, sok.CacheStrategy.LFU) == (0, 1)


def test_a_restore_into_a_cpu_table_with_an_hbm_budget_is_refused_and_changes_nothing(
        sok, unique_name, tmp_path):
    """The checkpoint layout holds no storage: the restore op takes each
  table's own (storage_specs); an HBM budget for a CPU table is refused
  before the table changes."""
    with tf.device("/CPU:0"):
        ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
        sok.lookup_sparse([ev], [tf.ragged.constant([[4, 5]], tf.int64)])
        path = tf.train.Checkpoint(table=ev).write(str(tmp_path / "ckpt"))
        sok.lookup_sparse([ev], [tf.ragged.constant([[6]], tf.int64)])
        # As a variable made with HBM_DRAM would ask (get_embedding_variable
        # refuses making one on the CPU).
        ev._storage_attributes = {"hbm_bytes": 1 << 20, "cache_strategy": 1}
        try:
            with pytest.raises(tf.errors.InvalidArgumentError) as error:
                tf.train.Checkpoint(table=ev).read(path)
        finally:
            ev._storage_attributes = {"hbm_bytes": 0, "cache_strategy": 1}
        assert int(ev.total_count()) == 3
        tf.train.Checkpoint(table=ev).read(path).assert_consumed()
        assert int(ev.total_count()) == 2
    assert ref.error_names(error.value, "HBM_DRAM", "CPU")


# --------------------------------------------------------------------------- the tiers (GPU)


def _draw_batches(rng, steps, batch_size, num_keys, key_dtype):
    """Ragged batches of Zipf-like keys over [0, num_keys) with duplicates and
  empty rows: hot keys stay in HBM, cold ones come and go."""
    ranks = np.arange(1, num_keys + 1, dtype=np.float64)
    p = ranks**-1.1 / np.sum(ranks**-1.1)
    keys = rng.permutation(num_keys)
    batches = []
    for _ in range(steps):
        batch = ref.random_sparse_batch(rng, batch_size, 4,
                                        lambda n: keys[rng.choice(num_keys, n, p=p)], key_dtype)
        batches.append(batch)
    return batches


def _ragged(batch):
    lengths = np.bincount(batch.indices[:, 0], minlength=batch.batch_size)
    return tf.RaggedTensor.from_row_lengths(tf.constant(batch.keys), lengths)


def _pair(sok, unique_name, key_dtype, option, initializer_seed=11, **kwargs):
    """A tiered table and the same table all in HBM."""
    initializer = tf.compat.v1.truncated_normal_initializer(seed=initializer_seed)
    make = lambda ev_option: sok.get_embedding_variable(unique_name(),
                                                        embedding_dim=DIM,
                                                        key_dtype=key_dtype,
                                                        initializer=initializer,
                                                        ev_option=ev_option,
                                                        **kwargs)
    return make(option), make(None)


def _state(ev):
    """Every key's row (value and slots), frequency and version, by key."""
    return ref.in_key_order(*(t.numpy() for t in ev.export_full()[:4]))


def _assert_same_state(actual, expected):
    for a, e, what in zip(_state(actual), _state(expected),
                          ("keys", "rows", "frequencies", "versions")):
        np.testing.assert_array_equal(a, e, err_msg=what)


V1 = tf.compat.v1.train
OPTIMIZERS = {
    "v1_sgd": lambda: V1.GradientDescentOptimizer(0.3),
    "v1_adagrad": lambda: V1.AdagradOptimizer(0.2),
    "v1_adam": ref.make_adam,
    "v1_ftrl": lambda: V1.FtrlOptimizer(0.2, l1_regularization_strength=0.01),
    "v1_momentum": lambda: V1.MomentumOptimizer(0.1, momentum=0.8),
    "v1_rmsprop": lambda: V1.RMSPropOptimizer(0.05, momentum=0.5, centered=True),
    "keras_sgd": lambda: tf.keras.optimizers.SGD(0.3),
    "keras_adagrad": lambda: tf.keras.optimizers.Adagrad(0.2),
    "keras_adam": lambda: tf.keras.optimizers.Adam(0.05),
    "keras_ftrl": lambda: tf.keras.optimizers.Ftrl(0.2),
}
SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2, "momentum": 1, "rmsprop": 3}


def _train(sok, tables, make_optimizer, batches, rng, after_step=None):
    """Trains `tables` side by side on the same batches and upstream
  gradients (one optimizer); returns each step's embeddings per table.
  after_step(batch) runs after each step's update."""
    optimizer = make_optimizer()
    keras = isinstance(optimizer, tf.keras.optimizers.Optimizer)
    step = tf.Variable(0, dtype=tf.int64)
    outputs = []
    for batch in batches:
        ids = _ragged(batch)
        upstream = tf.constant(rng.normal(size=(batch.batch_size, DIM)).astype(np.float32))
        with tf.GradientTape() as tape:
            embeddings = sok.lookup_sparse(list(tables), [ids] * len(tables),
                                           combiners=["sum"] * len(tables))
            loss = tf.add_n([tf.reduce_sum(e * upstream) for e in embeddings])
        grads = tape.gradient(loss, list(tables))
        if keras:
            optimizer.apply_gradients(zip(grads, tables))
        else:
            optimizer.apply_gradients(zip(grads, tables), global_step=step)
        outputs.append([e.numpy() for e in embeddings])
        if after_step is not None:
            after_step(batch)
    return outputs


@needs_gpu
@pytest.mark.parametrize("strategy", ["LFU", "LRU"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_tiered_table_trains_bit_for_bit_as_the_same_table_all_in_hbm(
        sok, rng, unique_name, optimizer, strategy):
    """100 steps with a budget of 48 rows over 3000 Zipf keys: rows are
  written back and brought in every step, and every lookup and the final
  rows, slots, frequencies and versions equal the all-HBM table's."""
    key_dtype = np.int32 if sorted(OPTIMIZERS).index(optimizer) % 2 else np.int64
    slots = SLOTS[optimizer.split("_", 1)[1]]
    option = hbm_dram(sok, budget_of_rows(48, slots=slots), getattr(sok.CacheStrategy, strategy))
    tiered, all_hbm = _pair(sok, unique_name, key_dtype, option)
    batches = _draw_batches(rng, 100, 64, 3000, key_dtype)
    outputs = _train(sok, (tiered, all_hbm), OPTIMIZERS[optimizer], batches, rng)
    for step, (a, b) in enumerate(outputs):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    _assert_same_state(tiered, all_hbm)
    counters = tiered.tier_counters()
    assert counters["rows_to_host"] > 0 and counters["rows_to_hbm"] > 0
    assert counters["hbm_rows"] + counters["host_rows"] == int(all_hbm.total_count())
    assert int(tiered.total_count()) == int(all_hbm.total_count())


@needs_gpu
def test_hbm_holds_at_most_the_budget_beyond_the_batch_in_use(sok, rng, unique_name):
    budget = 40
    tiered, all_hbm = _pair(sok, unique_name, np.int64,
                            hbm_dram(sok, budget_of_rows(budget, slots=1)))

    def check(batch):
        counters = tiered.tier_counters()
        assert counters["hbm_rows"] <= max(budget, len(np.unique(batch.keys)))

    _train(sok, (tiered, all_hbm), OPTIMIZERS["v1_adagrad"],
           _draw_batches(rng, 30, 32, 2000, np.int64), rng, check)
    _assert_same_state(tiered, all_hbm)


@needs_gpu
def test_all_miss_all_hit_and_empty_batches_are_counted_and_read_as_all_hbm(sok, rng, unique_name):
    tiered, all_hbm = _pair(sok, unique_name, np.int64, hbm_dram(sok, budget_of_rows(16)))
    fresh = rng.choice(10**6, 12, replace=False).astype(np.int64)
    ids = tf.RaggedTensor.from_row_lengths(tf.constant(fresh), [5, 0, 7])

    def lookup():
        a, b = sok.lookup_sparse([tiered, all_hbm], [ids, ids])
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        return tiered.tier_counters()

    before = tiered.tier_counters()
    all_miss = lookup()
    assert all_miss["misses"] - before["misses"] == 12 and all_miss["hits"] == before["hits"]
    all_hit = lookup()
    assert all_hit["hits"] - all_miss["hits"] == 12 and all_hit["misses"] == all_miss["misses"]
    empty = tf.RaggedTensor.from_row_lengths(tf.constant([], tf.int64), [0, 0])
    a, b = sok.lookup_sparse([tiered, all_hbm], [empty, empty])
    np.testing.assert_array_equal(a.numpy(), np.zeros((2, DIM), np.float32))
    np.testing.assert_array_equal(b.numpy(), a.numpy())
    after = tiered.tier_counters()
    assert (after["hits"], after["misses"]) == (all_hit["hits"], all_hit["misses"])
    _assert_same_state(tiered, all_hbm)


@needs_gpu
def test_a_batch_larger_than_the_budget_is_held_whole_then_written_back(sok, rng, unique_name):
    tiered, all_hbm = _pair(sok, unique_name, np.int32, hbm_dram(sok, budget_of_rows(1)))
    first = rng.choice(10**5, 300, replace=False).astype(np.int32)
    second = rng.choice(10**5, 300, replace=False).astype(np.int32) + 10**5
    for keys in (first, second, first):
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(keys), [100, 150, 50])
        a, b = sok.lookup_sparse([tiered, all_hbm], [ids, ids])
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    counters = tiered.tier_counters()
    assert counters["hbm_rows"] == 300 and counters["host_rows"] == 300
    assert counters["rows_to_hbm"] == 300
    _assert_same_state(tiered, all_hbm)


@needs_gpu
def test_a_call_whose_keys_all_hit_brings_hbm_back_within_the_budget(sok, rng, unique_name):
    """A pre-fill larger than the budget is held whole; the next lookup, of
  keys that all hit, writes the rows it does not use back to host memory
  (before, HBM stayed over the budget for as long as every key hit)."""
    budget = 40
    tiered, all_hbm = _pair(sok, unique_name, np.int64, hbm_dram(sok, budget_of_rows(budget)))
    keys = rng.choice(10**6, 300, replace=False).astype(np.int64)
    for batch in (keys, keys[:10]):
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(batch), [len(batch)])
        a, b = sok.lookup_sparse([tiered, all_hbm], [ids, ids])
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    counters = tiered.tier_counters()
    assert 10 <= counters["hbm_rows"] <= budget, counters
    assert counters["hbm_rows"] + counters["host_rows"] == 300
    assert counters["rows_to_hbm"] == 0
    _assert_same_state(tiered, all_hbm)


@needs_gpu
@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("strategy", ["LFU", "LRU"])
def test_a_write_back_takes_the_lowest_ranked_rows_that_the_call_does_not_use(
        sok, rng, unique_name, strategy, key_dtype):
    """DeepRec's cache strategies: the rows written back are those of lowest
  frequency (LFU) or oldest update step (LRU), ties broken by the lower key
  (negative keys included), among the rows whose keys the call does not
  ask for; as many as take HBM an eighth of the budget below it. The
  reference ranks the table's own exported scores with NumPy."""
    budget = 24
    tiered, _ = _pair(sok, unique_name, key_dtype,
                      hbm_dram(sok, budget_of_rows(budget), getattr(sok.CacheStrategy, strategy)))
    old = rng.choice(np.arange(-10**4, 10**4), 20, replace=False).astype(key_dtype)
    optimizer = V1.GradientDescentOptimizer(0.1)
    step = tf.Variable(0, dtype=tf.int64)
    for batch in [old] + [rng.choice(old, rng.integers(4, 16)) for _ in range(3)]:
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(batch), [len(batch)])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([tiered], [ids])[0])
        optimizer.apply_gradients(zip(tape.gradient(loss, [tiered]), [tiered]), global_step=step)
    assert tiered.tier_counters()["hbm_rows"] == 20

    keys, _, frequencies, versions = (t.numpy() for t in tiered.export_full()[:4])
    scores = frequencies if strategy == "LFU" else versions
    assert len(np.unique(scores)) < len(scores)  # ties, for the key to break
    new = (rng.choice(10**4, 10, replace=False) + 10**4).astype(key_dtype)
    asked = rng.permutation(np.concatenate([old[:4], old[:2], new, new[:3]]))
    candidates = np.flatnonzero(~np.isin(keys, asked))
    count = min(len(candidates), 20 + len(new) - budget + budget // 8)
    ranked = candidates[np.lexsort((keys[candidates], scores[candidates]))]
    written_back = np.sort(keys[ranked[:count]])

    ids = tf.RaggedTensor.from_row_lengths(tf.constant(asked), [7, 0, len(asked) - 7])
    sok.lookup_sparse([tiered], [ids])
    counters = tiered.tier_counters()
    assert (counters["host_rows"], counters["hbm_rows"]) == (count, 20 - count + len(new))
    exported = tiered.export_full()[0].numpy()  # HBM's keys first, then host memory's
    np.testing.assert_array_equal(np.sort(exported[counters["hbm_rows"]:]), written_back)


@needs_gpu
def test_a_lookup_whose_keys_all_hit_waits_once_for_all_its_tables_and_copies_no_keys(
        sok, rng, unique_name):
    """HBM's residency check runs on the GPU: when every key is in HBM, a
  lookup of three tiered tables waits for the GPU once more than the same
  lookup of the tables all in HBM (not once a table), and no key crosses to
  the host (before, every call copied its keys there and sorted them)."""
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    pairs = [
        _pair(sok, unique_name, np.int64, hbm_dram(sok, budget_of_rows(1000))) for _ in range(3)
    ]
    tiered, all_hbm = [p[0] for p in pairs], [p[1] for p in pairs]
    keys = rng.choice(10**6, 200, replace=False).astype(np.int64)
    ids = tf.RaggedTensor.from_row_lengths(tf.constant(keys), [120, 0, 80])

    def lookup(tables):
        before = int(ops().sok_ev_gpu_host_syncs())
        rows = [e.numpy() for e in sok.lookup_sparse(tables, [ids] * 3)]
        return int(ops().sok_ev_gpu_host_syncs()) - before, rows

    lookup(tiered), lookup(all_hbm)  # every key new: rows made
    before = [t.tier_counters() for t in tiered]
    tiered_waits, tiered_rows = lookup(tiered)
    all_hbm_waits, all_hbm_rows = lookup(all_hbm)
    np.testing.assert_array_equal(tiered_rows, all_hbm_rows)
    assert tiered_waits == all_hbm_waits + 1
    for table, counted in zip(tiered, before):
        now = table.tier_counters()
        assert now["hits"] - counted["hits"] == 200 and now["misses"] == counted["misses"]
        assert now["pcie_bytes"] - counted["pcie_bytes"] < 8 * 200, (counted, now)


@needs_gpu
def test_tables_of_one_lookup_move_their_rows_together_and_train_as_all_hbm(sok, rng, unique_name):
    """A lookup of several tiered tables (different budgets and strategies,
  one table listed twice, int32 and int64 keys in separate lookups) moves
  every table's rows stage by stage together: rows cross both ways in the
  same calls, each step waits for the GPU at most four times more than all
  in HBM, plus one read of each table's counters when its HBM insert may
  need room, and every step and the final state equal the all-HBM twins'."""
    from sok_ev._ops import ops  # pylint: disable=import-outside-toplevel
    for key_dtype in (np.int32, np.int64):
        options = [
            hbm_dram(sok, budget_of_rows(24, slots=1), sok.CacheStrategy.LFU),
            hbm_dram(sok, budget_of_rows(40, slots=1), sok.CacheStrategy.LRU),
            hbm_dram(sok, budget_of_rows(64, slots=1), sok.CacheStrategy.LFU),
        ]
        pairs = [
            _pair(sok, unique_name, key_dtype, option, initializer_seed=t)
            for t, option in enumerate(options)
        ]
        tiered, all_hbm = [p[0] for p in pairs], [p[1] for p in pairs]
        # The first table twice: its two spans are made resident at once.
        lists = (tiered + tiered[:1], all_hbm + all_hbm[:1])
        optimizer = V1.AdagradOptimizer(0.2)
        extra_waits = []
        for batch, other in zip(_draw_batches(rng, 25, 48, 1500, key_dtype),
                                _draw_batches(rng, 25, 48, 1500, key_dtype)):
            ids = [_ragged(batch)] * 3 + [_ragged(other)]
            outputs, waits = [], []
            with tf.GradientTape() as tape:
                for tables in lists:
                    before = int(ops().sok_ev_gpu_host_syncs())
                    outputs.append(sok.lookup_sparse(tables, ids))
                    waits.append(int(ops().sok_ev_gpu_host_syncs()) - before)
                loss = tf.add_n([tf.reduce_sum(e * e) for e in outputs[0] + outputs[1]])
            extra_waits.append(waits[0] - waits[1])
            for a, b in zip(*outputs):
                np.testing.assert_array_equal(a.numpy(), b.numpy())
            variables = tiered + all_hbm
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        for a, b in zip(tiered, all_hbm):
            counters = a.tier_counters()
            assert counters["rows_to_host"] > 0 and counters["rows_to_hbm"] > 0, counters
            _assert_same_state(a, b)
        assert max(extra_waits) <= 4 + len(tiered), extra_waits


@needs_gpu
def test_the_hbm_arena_stops_growing_at_the_budget_while_rows_come_and_go(sok, rng, unique_name):
    """A budget above the arena's first size (65,536 rows): the arena grows
  to the budget, not by its growth factor past it, and the rows written back
  are reused by the keys that come in, so after 320,000 keys the table's GPU
  memory (TensorFlow's allocator) is about the budget's rows, not every
  key's. The all-HBM twin, trained on the same keys, holds them all."""
    budget, dim = 80000, 64
    row_bytes = 4 * dim * 2 + 16  # value, Adagrad slot, frequency, version
    option = hbm_dram(sok, budget_of_rows(budget, dim=dim, slots=1))
    before = tf.config.experimental.get_memory_info("GPU:0")["current"]
    initializer = tf.compat.v1.truncated_normal_initializer(seed=11)

    def make(ev_option):
        return sok.get_embedding_variable(unique_name(),
                                          embedding_dim=dim,
                                          initializer=initializer,
                                          ev_option=ev_option)

    tiered = make(option)
    optimizer = V1.AdagradOptimizer(0.2)

    def train(table, keys):
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(keys), [len(keys) // 2] * 2)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table], [ids])[0]**2)
        optimizer.apply_gradients([(tape.gradient(loss, table), table)])

    batches = [(np.arange(40000) + s * 40000).astype(np.int64) for s in range(8)]
    for keys in batches:
        train(tiered, keys)
    tiered_bytes = tf.config.experimental.get_memory_info("GPU:0")["current"] - before
    counters = tiered.tier_counters()
    assert counters["hbm_rows"] <= budget and counters["hbm_rows"] + counters["host_rows"] == 320000
    # The budget's rows, the free-row stack and the index (about 40 bytes a
    # key): 1.1x the raw rows; an arena grown by its factor past the budget
    # (120,000 rows) would be 1.55x.
    assert tiered_bytes <= 1.25 * budget * row_bytes, (tiered_bytes, budget * row_bytes)
    all_hbm = make(None)
    for keys in batches:
        train(all_hbm, keys)
    _assert_same_state(tiered, all_hbm)


# A child process whose address space is capped 256 MiB above what it uses
# once its tiered table (rows of 256 KiB, 8 in HBM) holds 16 keys: keys then
# arrive one lookup at a time, each writing a row back to host memory, until
# the host tier cannot grow. It prints the error, the keys the table holds
# after it, whether the first 16 keys' rows are what they were, and the
# count after the same lookup is retried with memory there again.
_HOST_MEMORY_CHILD = textwrap.dedent("""
    import resource
    import numpy as np
    import tensorflow as tf
    import sok_ev
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    dim = 1024
    option = sok_ev.EmbeddingVariableOption(storage_option=sok_ev.StorageOption(
        storage_type=sok_ev.StorageType.HBM_DRAM, storage_size=[8 * dim * 4],
        cache_strategy=sok_ev.CacheStrategy.LFU))
    table = sok_ev.get_embedding_variable("short_of_host_memory", embedding_dim=dim,
                                          ev_option=option)
    lookup = lambda key: sok_ev.lookup_sparse(
        [table], [tf.ragged.constant([list(range(key, key + 64))], tf.int64)])
    first = tf.range(64, dtype=tf.int64)
    for key in range(0, 16, 64):
        lookup(key)
    rows = table.sparse_read(first).numpy()
    with open("/proc/self/status") as status:
        used = [int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize:")][0]
    resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 28), resource.RLIM_INFINITY))
    key = 64
    try:
        while key < 10**7:
            lookup(key)
            key += 64
    except tf.errors.ResourceExhaustedError as error:
        print("ERROR:", error.message.splitlines()[0])
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("KEPT:", int(table.total_count()), key)
    print("SAME:", bool(np.array_equal(table.sparse_read(first).numpy(), rows)))
    lookup(key)
    print("AGAIN:", int(table.total_count()))
    """)


@needs_gpu
def test_host_memory_running_out_is_an_error_naming_the_table_and_loses_nothing():
    """When the host tier cannot grow, the lookup that needs it fails with
  ResourceExhaustedError naming the table; the table holds exactly the keys
  it held before that lookup, with their rows, and the same lookup succeeds
  once memory is there again."""
    result = subprocess.run([sys.executable, "-c", _HOST_MEMORY_CHILD],
                            env=ref.child_env(),
                            capture_output=True,
                            text=True,
                            timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    message = lines.get("ERROR", "")
    for fragment in ("Embedding Variable 'short_of_host_memory", "host memory"):
        assert fragment in message, (message, result.stderr[-2000:])
    kept, failed_key = (int(v) for v in lines["KEPT"].split())
    assert 64 < kept == failed_key < 10**7, lines
    assert lines["SAME"] == "True"
    assert int(lines["AGAIN"]) == kept + 64


@needs_gpu
def test_sparse_read_and_export_see_both_tiers(sok, rng, unique_name):
    tiered, all_hbm = _pair(sok, unique_name, np.int64, hbm_dram(sok, budget_of_rows(8)))
    _train(sok, (tiered, all_hbm), OPTIMIZERS["v1_sgd"], _draw_batches(rng, 10, 32, 500, np.int64),
           rng)
    assert tiered.tier_counters()["host_rows"] > 0
    keys = tf.constant(np.concatenate([_state(all_hbm)[0][:50], [-7, 10**9]]).astype(np.int64))
    np.testing.assert_array_equal(
        tiered.sparse_read(keys).numpy(),
        all_hbm.sparse_read(keys).numpy())
    k1, v1 = (t.numpy() for t in tiered.export())
    k2, v2 = (t.numpy() for t in all_hbm.export())
    np.testing.assert_array_equal(v1[np.argsort(k1)], v2[np.argsort(k2)])


@needs_gpu
def test_a_lookup_pipeline_trains_a_tiered_table_as_all_hbm(sok, rng, unique_name):
    """The next batch is routed while this one trains; the rows this batch
  uses stay in HBM until its update is applied."""
    tiered, all_hbm = _pair(sok, unique_name, np.int64, hbm_dram(sok, budget_of_rows(32, slots=1)))
    batches = _draw_batches(rng, 20, 48, 1500, np.int64)
    optimizer = V1.AdagradOptimizer(0.2)
    pipeline = sok.LookupPipeline([tiered, all_hbm], combiners=["sum", "sum"])
    pipeline.prefetch([_ragged(batches[0])] * 2)
    for s in range(len(batches)):
        with tf.GradientTape() as tape:
            (a, b), _ = pipeline.lookup()
            if s + 1 < len(batches):
                pipeline.prefetch([_ragged(batches[s + 1])] * 2)
            loss = tf.reduce_sum(a * a) + tf.reduce_sum(b * b)
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        optimizer.apply_gradients(zip(tape.gradient(loss, [tiered, all_hbm]), [tiered, all_hbm]))
    _assert_same_state(tiered, all_hbm)


@needs_gpu
def test_a_counter_filter_and_steps_to_live_work_on_a_tiered_table(sok, rng, unique_name):
    option = hbm_dram(sok, budget_of_rows(24, slots=1))
    option.filter_option = sok.CounterFilter(filter_freq=2)
    plain = sok.EmbeddingVariableOption(filter_option=sok.CounterFilter(filter_freq=2))
    initializer = tf.compat.v1.truncated_normal_initializer(seed=5)
    tiered, all_hbm = (sok.get_embedding_variable(unique_name(),
                                                  embedding_dim=DIM,
                                                  initializer=initializer,
                                                  steps_to_live=5,
                                                  ev_option=o) for o in (option, plain))
    _train(sok, (tiered, all_hbm), OPTIMIZERS["v1_adagrad"],
           _draw_batches(rng, 20, 32, 800, np.int64), rng)
    _assert_same_state(tiered, all_hbm)
    from sok_ev._ops import ops
    evicted = [
        int(ops().sok_ev_embedding_variable_evict(ev.handle,
                                                  tf.constant(20, tf.int64),
                                                  key_dtype=tf.int64,
                                                  steps_to_live=5)) for ev in (tiered, all_hbm)
    ]
    assert evicted[0] == evicted[1] > 0
    _assert_same_state(tiered, all_hbm)


@needs_gpu
@pytest.mark.parametrize("target", ["all_hbm", "other_budget", "cpu"])
def test_a_checkpoint_with_rows_in_both_tiers_restores_exactly_into_any_storage(
        sok, rng, unique_name, tmp_path, target):
    tiered, all_hbm = _pair(sok, unique_name, np.int64,
                            hbm_dram(sok, budget_of_rows(20, slots=2), sok.CacheStrategy.LRU))
    _train(sok, (tiered, all_hbm), OPTIMIZERS["v1_ftrl"], _draw_batches(rng, 15, 32, 600, np.int64),
           rng)
    counters = tiered.tier_counters()
    assert counters["hbm_rows"] > 0 and counters["host_rows"] > 0
    path = tf.train.Checkpoint(table=tiered).write(str(tmp_path / "tiered"))
    options = {
        "all_hbm": None,
        "other_budget": hbm_dram(sok, budget_of_rows(7, slots=2)),
        "cpu": None,
    }
    device = "/CPU:0" if target == "cpu" else "/GPU:0"
    with tf.device(device):
        restored = sok.get_embedding_variable(
            unique_name(),
            embedding_dim=DIM,
            initializer=tf.compat.v1.truncated_normal_initializer(seed=11),
            ev_option=options[target])
    tf.train.Checkpoint(table=restored).read(path).assert_consumed()
    _assert_same_state(restored, all_hbm)
    # ...and back: the restored table's checkpoint restores into a tiered one.
    back_path = tf.train.Checkpoint(table=restored).write(str(tmp_path / "back"))
    back = sok.get_embedding_variable(unique_name(),
                                      embedding_dim=DIM,
                                      ev_option=hbm_dram(sok, budget_of_rows(5, slots=2)))
    tf.train.Checkpoint(table=back).read(back_path).assert_consumed()
    _assert_same_state(back, all_hbm)
    counters = back.tier_counters()  # a restore leaves HBM within its budget
    assert counters["hbm_rows"] <= 5 and counters["host_rows"] > 0


@needs_gpu
def test_an_incremental_checkpoint_of_a_tiered_table_restores_the_full_state(sok, rng, tmp_path):
    batches = _draw_batches(rng, 12, 32, 500, np.int64)
    with ref.graph_session() as sess:
        ids = tf.compat.v1.ragged.placeholder(tf.int64, 1, [])
        ev = sok.get_embedding_variable("tiered",
                                        embedding_dim=DIM,
                                        ev_option=hbm_dram(sok, budget_of_rows(16, slots=1)))
        loss = tf.reduce_sum(sok.lookup_sparse([ev], [ids], combiners=["sum"])[0]**2)
        step = tf.compat.v1.train.get_or_create_global_step()
        train = V1.AdagradOptimizer(0.1).minimize(loss, global_step=step)
        saver = sok.Saver(incremental_save_restore=True)
        sess.run(tf.compat.v1.global_variables_initializer())
        feed = lambda b: {
            ids:
                tf.compat.v1.ragged.RaggedTensorValue(
                    b.keys,
                    np.concatenate(
                        [[0], np.cumsum(np.bincount(b.indices[:, 0], minlength=b.batch_size))]))
        }
        for b in batches[:6]:
            sess.run(train, feed(b))
        # tf.compat.v1.train.Saver saves into a folder that exists.
        (tmp_path / "full").mkdir()
        (tmp_path / "incr").mkdir()
        saver.save(sess, str(tmp_path / "full" / "model"), global_step=step)
        for b in batches[6:]:
            sess.run(train, feed(b))
        incremental = saver.incremental_save(sess,
                                             str(tmp_path / "incr" / "model"),
                                             global_step=step)
        expected = [t for t in sess.run(ev.export_full())]
        saver.restore(sess, incremental)
        restored = sess.run(ev.export_full())
    for e, r in zip(ref.in_key_order(*expected[:4]), ref.in_key_order(*restored[:4])):
        np.testing.assert_array_equal(r, e)


@needs_gpu
def test_a_thousand_steps_keep_gpu_and_host_memory_flat(sok, rng, unique_name):
    """Rows cross both ways every step; between steps 200 and 1,000 neither
  the GPU memory TensorFlow's allocator holds nor the process's resident
  host memory (the host tier, its pinned staging) grows."""
    tiered = sok.get_embedding_variable(unique_name(),
                                        embedding_dim=DIM,
                                        ev_option=hbm_dram(sok, budget_of_rows(64, slots=1)))
    batches = _draw_batches(rng, 50, 64, 4000, np.int64)
    optimizer = V1.AdagradOptimizer(0.1)
    memory, resident = [], []
    for step in range(1000):
        ids = _ragged(batches[step % len(batches)])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([tiered], [ids], combiners=["sum"])[0]**2)
        optimizer.apply_gradients([(tape.gradient(loss, tiered), tiered)])
        if step in (199, 999):
            memory.append(tf.config.experimental.get_memory_info("GPU:0")["current"])
            with open("/proc/self/status") as status:
                resident.append(
                    [int(l.split()[1]) * 1024 for l in status if l.startswith("VmRSS:")][0])
    assert tiered.tier_counters()["rows_to_host"] > 1000
    assert memory[1] <= memory[0] * 1.05 + (1 << 20), memory
    assert resident[1] <= resident[0] * 1.05 + (16 << 20), resident
