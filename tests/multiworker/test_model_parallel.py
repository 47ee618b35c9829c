"""Model parallelism over Horovod equals one process training the global batch.

Each case (SCENARIO:PLACEMENT:MODE, see harness.CASES) trained two tables
(dims 128 and 4, hotness 10 and 3, sum combiner) for 10 Adagrad steps on 2
or 3 Gloo workers, each worker feeding its own part of the global batch, or
on one worker running the same multi-worker pipeline over a one-rank
exchange.
The reference is one process running `tf.nn.embedding_lookup_sparse` over
dense `tf.Variable`s that start with the same rows (row k =
default_rows[k mod N], what `InitializerOption(default_value_dim=N)` with
`tf.constant_initializer(default_rows)` gives each new key) on the global
batch, with the same loss (a sum over samples, so the global loss is the sum
of the workers') and the same optimizer.

Tolerance: both sides do the same float32 arithmetic in a different order
(the combiner's sum of up to 10 rows; a key's gradient summed over workers
by the owner instead of over the global batch), so results differ by a few
ulps of values of order 1-10: rtol = atol = 1e-5.
"""
import collections
import functools

import numpy as np
import pytest
import tensorflow as tf

import harness

RTOL = ATOL = 1e-5


@functools.lru_cache(maxsize=None)
def reference(scenario, workers):
    """Single-process training on the global batch.

    Returns:
      dict: "loss" [steps], "emb" list over steps of per-table [B, dim]
      arrays, "tables" the final dense tables, "seen" per table the set of
      keys looked up over all steps, "occurrences" per table a Counter of
      each key's occurrences in every step's global batch.
    """
    tables = [tf.Variable(harness.initial_dense_table(t)) for t in harness.TABLES]
    optimizer = tf.compat.v1.train.AdagradOptimizer(harness.LEARNING_RATE)
    losses, embeddings = [], []
    occurrences = [collections.Counter() for _ in harness.TABLES]
    for step in range(harness.STEPS):
        batches, targets = harness.make_step_data(scenario, workers, step)
        with tf.GradientTape() as tape:
            step_embeddings, loss = [], 0.0
            for t, table in enumerate(harness.TABLES):
                batch = harness.global_batch(batches, t)
                occurrences[t].update(batch.values.tolist())
                ids = tf.SparseTensor(batch.indices, batch.values,
                                      [batch.batch_size, table["hotness"]])
                emb = tf.nn.embedding_lookup_sparse(tables[t], ids, None, combiner="sum")
                y = np.concatenate([target[t] for target in targets])
                loss += 0.5 * tf.reduce_sum(tf.square(emb - y))
                step_embeddings.append(emb.numpy())
        grads = tape.gradient(loss, tables)
        optimizer.apply_gradients(zip(grads, tables))
        losses.append(float(loss))
        embeddings.append(step_embeddings)
    return {
        "loss": np.array(losses),
        "emb": embeddings,
        "tables": [t.numpy() for t in tables],
        "seen": [set(counts) for counts in occurrences],
        "occurrences": occurrences
    }


def placement_targets(placement, workers):
    """Mirror of lookup_worker.placement."""
    return {"sharded": [-1, -1], "target": [workers - 1, 0], "mixed": [-1, workers - 1]}[placement]


def shards_of(result, case, t, workers):
    return [(result.results[r][f"{case}/keys{t}"], result.results[r][f"{case}/values{t}"])
            for r in range(workers)]


ALL_CASES = [(w, case) for w, cases in harness.CASES.items() for case in cases]
# The world sizes with a second worker: to leave idle, to own no key, to feed
# the same keys.
SHARED_SIZES = [w for w in sorted(harness.CASES) if w > 1]
IDS = [f"{w}workers-{case}" for w, case in ALL_CASES]


@pytest.mark.parametrize("workers,case", ALL_CASES, ids=IDS)
def test_losses_and_embeddings_match_single_process(lookup_run, workers, case):
    result = lookup_run(workers)
    scenario = case.split(":")[0]
    ref = reference(scenario, workers)
    # The global loss is the sum of the workers' local losses.
    total = sum(result.results[r][f"{case}/loss"] for r in range(workers))
    np.testing.assert_allclose(total, ref["loss"], rtol=RTOL, atol=ATOL)
    for step in range(harness.STEPS):
        batches, _ = harness.make_step_data(scenario, workers, step)
        for t in range(len(harness.TABLES)):
            start = 0
            for r in range(workers):
                size = batches[r][t].batch_size
                got = result.results[r][f"{case}/emb{t}"][step]
                np.testing.assert_allclose(got,
                                           ref["emb"][step][t][start:start + size],
                                           rtol=RTOL,
                                           atol=ATOL,
                                           err_msg=f"step {step}, table {t}, worker {r}")
                start += size


@pytest.mark.parametrize("workers,case", ALL_CASES, ids=IDS)
def test_final_tables_match_single_process(lookup_run, workers, case):
    result = lookup_run(workers)
    ref = reference(case.split(":")[0], workers)
    for t in range(len(harness.TABLES)):
        keys = np.concatenate([k for k, _ in shards_of(result, case, t, workers)])
        values = np.concatenate([v for _, v in shards_of(result, case, t, workers)])
        np.testing.assert_allclose(values,
                                   ref["tables"][t][keys],
                                   rtol=RTOL,
                                   atol=ATOL,
                                   err_msg=f"table {t}")


@pytest.mark.parametrize("workers,case", ALL_CASES, ids=IDS)
def test_each_key_frequency_counts_its_occurrences_in_every_worker_batch(lookup_run, workers, case):
    """A key several workers look up reaches its owner once from each, with
    its count in that worker's batch; the owner's frequency is the sum: the
    key's occurrences in the global batch, over every step (DeepRec's
    frequency)."""
    result = lookup_run(workers)
    ref = reference(case.split(":")[0], workers)
    for t in range(len(harness.TABLES)):
        stored = {}
        for r in range(workers):
            keys = result.results[r][f"{case}/keys{t}"]
            frequencies = result.results[r][f"{case}/frequencies{t}"]
            stored.update(zip(keys.tolist(), frequencies.tolist()))
        assert stored == dict(ref["occurrences"][t]), f"table {t}"


GRAPH_CASES = [(w, case) for w, case in ALL_CASES if case.endswith(":graph")]
# Graph-mode cases, sok_ev.LookupPipeline's included (its keys come staged).
APPLY_CASES = [(w, case) for w, case in ALL_CASES if case.endswith((":graph", ":pipelined"))]


@pytest.mark.parametrize("workers,case",
                         APPLY_CASES,
                         ids=[f"{w}workers-{case}" for w, case in APPLY_CASES])
def test_owners_apply_their_keys_as_distinct_without_a_second_deduplication(
        lookup_run, workers, case):
    """The owner deduplicated what every worker sent in the forward pass
    (UniqueOwnedKeys), so the optimizer's fused apply is told its keys are
    distinct and skips its own sort."""
    result = lookup_run(workers)
    for r in range(workers):
        flags = result.results[r][f"{case}/keys_are_unique"]
        assert flags.size == len(harness.TABLES) and flags.all(), f"worker {r}: {flags}"


@pytest.mark.parametrize("workers,case",
                         GRAPH_CASES,
                         ids=[f"{w}workers-{case}" for w, case in GRAPH_CASES])
def test_the_step_routes_keys_through_the_exchange_on_any_worker_count(lookup_run, workers, case):
    """Every worker count, one included (sok_ev.lookup.exchange_on_one_worker),
    builds the multi-worker pipeline: the step's one lookup sends one key
    message."""
    result = lookup_run(workers)
    for r in range(workers):
        assert int(result.results[r][f"{case}/key_messages"]) == 1, f"worker {r}"


@pytest.mark.parametrize("workers,case", ALL_CASES, ids=IDS)
def test_every_key_lives_on_exactly_its_owner(lookup_run, workers, case):
    """Each key seen is stored once, on owner_of(key) (target -1) or on the
    table's target worker; the union of the shards is the keys seen."""
    result = lookup_run(workers)
    scenario, placement, _ = case.split(":")
    ref = reference(scenario, workers)
    targets = placement_targets(placement, workers)
    for t in range(len(harness.TABLES)):
        stored_on = {}
        for r, (keys, _) in enumerate(shards_of(result, case, t, workers)):
            for key in keys.tolist():
                assert key not in stored_on, (
                    f"table {t}: key {key} on workers {stored_on[key]} and {r}")
                stored_on[key] = r
        assert set(stored_on) == ref["seen"][t], f"table {t}"
        for key, r in stored_on.items():
            owner = (harness.owner_of(key, workers) if targets[t] == -1 else targets[t])
            assert r == owner, f"table {t}: key {key} on {r}, owner {owner}"


@pytest.mark.parametrize("workers", SHARED_SIZES)
def test_worker_with_empty_batch(lookup_run, workers):
    """The last worker feeds no samples yet takes part in every exchange
    (it owns keys): its embeddings are empty and its loss is zero."""
    result = lookup_run(workers)
    case = next(c for c in harness.CASES[workers] if c.startswith("empty:"))
    last = result.results[workers - 1]
    assert last[f"{case}/emb0"].shape == (harness.STEPS, 0, 128)
    np.testing.assert_array_equal(last[f"{case}/loss"], 0.0)
    # Sharded tables still put keys on the idle worker.
    assert any(result.results[workers - 1][f"{case}/keys{t}"].size
               for t in range(len(harness.TABLES))
               if placement_targets(case.split(":")[1], workers)[t] == -1)


@pytest.mark.parametrize("workers", SHARED_SIZES)
def test_all_keys_owned_by_one_worker(lookup_run, workers):
    """With every key owned by worker 0, the other shards stay empty."""
    result = lookup_run(workers)
    case = next(c for c in harness.CASES[workers] if c.startswith("one_owner:"))
    for t in range(len(harness.TABLES)):
        assert result.results[0][f"{case}/keys{t}"].size > 0
        for r in range(1, workers):
            assert result.results[r][f"{case}/keys{t}"].size == 0


@pytest.mark.parametrize("workers", SHARED_SIZES)
def test_duplicate_keys_across_workers(lookup_run, workers):
    """Every worker feeds the same keys: each key's gradient arrives from
    every worker and the owner sums them (the final tables match the
    reference, checked above); all workers see the same embeddings."""
    result = lookup_run(workers)
    case = next(c for c in harness.CASES[workers] if c.startswith("duplicates:"))
    for t in range(len(harness.TABLES)):
        first = result.results[0][f"{case}/emb{t}"]
        for r in range(1, workers):
            np.testing.assert_array_equal(result.results[r][f"{case}/emb{t}"], first)
