"""Data and NumPy references of the compressed exchange tests.

One step of harness.TABLES (dims 128 and 4, int64 and int32 keys; the sum
combiner, or the mean of weighted rows) on every worker, from fixed seeds, with what makes an exchange
interesting: duplicate keys within a sample, the same sample on every
worker (so an owner receives one key's row requests and gradients from
several workers), and empty samples. The loss is linear,
sum(embeddings * coefficients), so each sample's gradient is its
coefficients exactly and the step's error is the exchange's alone.
"""

import numpy as np

import harness

LEARNING_RATE = 0.5
EMPTY_SAMPLE = 1  # no keys on any worker
SHARED_SAMPLE = 0  # the same keys on every worker
REPEATED_SAMPLE = 2  # one key three times
# Rounding of the float32 arithmetic both sides do (sums of <= 10 terms, one
# multiply-add per step), per unit of the magnitudes summed.
FLOAT32_SLACK = 16 * 2.0**-24


def step_data(workers):
    """(batches, coefficients): batches[w][t] a harness.Batch; coefficients[w][t]
  the `[batch_size, dim]` float32 gradient of worker w's embeddings. The
  weights of the weighted cases are `entry_weights(batch)`."""
    rng = np.random.default_rng(1212)
    shared = [rng.choice(harness.VOCABULARY, size=table["hotness"]) for table in harness.TABLES]
    batches, coefficients = [], []
    for _ in range(workers):
        worker_batches, worker_coefficients = [], []
        for t, table in enumerate(harness.TABLES):
            rows = []
            for b in range(harness.PER_WORKER_BATCH):
                if b == EMPTY_SAMPLE:
                    rows.append(np.array([], np.int64))
                elif b == SHARED_SAMPLE:
                    rows.append(shared[t])
                elif b == REPEATED_SAMPLE:
                    rows.append(np.repeat(rng.integers(harness.VOCABULARY), 3))
                else:
                    hotness = rng.integers(1, table["hotness"] + 1)
                    rows.append(rng.choice(harness.VOCABULARY, size=hotness))
            worker_batches.append(_to_batch(rows, table))
            worker_coefficients.append(
                rng.normal(size=(len(rows), table["dim"])).astype(np.float32))
        batches.append(worker_batches)
        coefficients.append(worker_coefficients)
    return batches, coefficients


def _to_batch(rows, table):
    indices = np.array([[b, j] for b, row in enumerate(rows) for j in range(len(row))],
                       np.int64).reshape(-1, 2)
    values = np.concatenate(rows).astype(table["key_dtype"])
    return harness.Batch(indices, values, len(rows))


def entry_weights(batch):
    """`[nnz]` float32 weights in [0.25, 2) for a batch's entries, from its keys
  (the same on every worker for the same key)."""
    return (0.25 + (np.abs(batch.values.astype(np.int64)) % 7) / 4.0).astype(np.float32)


def _sample_scale(batch, combiner):
    """`[nnz]` what each entry's row is multiplied by in its sample's result:
  1 for "sum"; w_i / sum of its sample's w for "mean" over entry_weights."""
    if combiner == "sum":
        return np.ones(len(batch.values))
    weights = entry_weights(batch).astype(np.float64)
    totals = np.zeros(batch.batch_size)
    np.add.at(totals, batch.indices[:, 0], weights)
    return weights / totals[batch.indices[:, 0]]


def initial_rows(t, keys):
    """Rows of `keys` before any step (harness.initial_dense_table), float32."""
    rows = harness.default_rows(harness.TABLES[t])
    return rows[np.asarray(keys, np.int64) % len(rows)]


def owners(batch, placement, workers):
    """`[nnz]` the worker that owns each entry's key: by harness.owner_of
  ("sharded", target_gpu -1), or worker 1 ("worker1", target_gpu 1)."""
    if placement == "worker1":
        return np.ones(len(batch.values), np.int64)
    return np.array([harness.owner_of(k, workers) for k in batch.values.tolist()], np.int64)


def forward(batch, t, cast=None, combiner="sum", exact=None):
    """(embeddings, magnitudes) in float64: each sample's combination of its
  keys' rows (sum, or the mean weighted by entry_weights, as
  tf.nn.embedding_lookup_sparse computes it), and the sum of the absolute
  values of the terms (what the error bound scales with). `cast` maps the
  float32 rows first (the rounding a reference emulates), except the rows of
  the entries where the `[nnz]` bool mask `exact` is set."""
    rows = initial_rows(t, batch.values)
    if cast is not None:
        cast_rows = cast(rows)
        rows = cast_rows if exact is None else np.where(exact[:, None], rows, cast_rows)
    rows = rows.astype(np.float64) * _sample_scale(batch, combiner)[:, None]
    emb = np.zeros((batch.batch_size, rows.shape[1]))
    magnitude = np.zeros_like(emb)
    np.add.at(emb, batch.indices[:, 0], rows)
    np.add.at(magnitude, batch.indices[:, 0], np.abs(rows))
    return emb, magnitude


def key_gradients(batches, coefficients, t, combiner="sum"):
    """{key: `[workers, dim]` float64}: the gradient of the key's row each
  requester sends its owner (its samples' coefficients, times each entry's
  share of its sample under `combiner`, summed per key)."""
    gradients = {}
    for w, (worker_batches, worker_coefficients) in enumerate(zip(batches, coefficients)):
        batch = worker_batches[t]
        scale = _sample_scale(batch, combiner)
        for (b, _), key, s in zip(batch.indices, batch.values.tolist(), scale):
            per_worker = gradients.setdefault(key, np.zeros((len(batches), batch_dim(t))))
            per_worker[w] += s * worker_coefficients[t][b]
    return gradients


def batch_dim(t):
    return harness.TABLES[t]["dim"]
