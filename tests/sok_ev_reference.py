"""Reference computations shared by the single-worker CPU tests.

Everything here is either plain NumPy or stock TensorFlow on dense
`tf.Variable`s; nothing calls sok_ev except the small constructors at the
end, which only spell the public API once. The tests compare sok_ev against
these references.

The key idea used throughout: an Embedding Variable created with
`InitializerOption(default_value_dim=N)` and `tf.constant_initializer(M)`
(M an [N, dim] matrix) starts key k at row M[k mod N] (non-negative mod, as
in DeepRec). So a dense `tf.Variable` holding M[unique_keys mod N], indexed
by each key's position among the unique keys, is an exact stand-in for the
Embedding Variable, and stock TF ops on it are the reference.
"""
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import tensorflow as tf

COMBINERS = ("sum", "mean", "sqrtn")
KEY_DTYPES = (np.int32, np.int64)

# ---------------------------------------------------------------------------
# Random sparse batches
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class SparseBatch:
    """A ragged [batch_size, max_hotness] batch of keys, in canonical order.

    indices: (nnz, 2) int64 (sample, position), row-major sorted.
    keys:    (nnz,) int32 or int64.
    weights: (nnz,) float32, all positive (so 'mean' and 'sqrtn' are defined).
    """

    indices: np.ndarray
    keys: np.ndarray
    weights: np.ndarray
    batch_size: int
    max_hotness: int

    @property
    def dense_shape(self):
        return [self.batch_size, self.max_hotness]

    def sp_ids(self):
        return tf.SparseTensor(self.indices, self.keys, self.dense_shape)

    def sp_weights(self):
        return tf.SparseTensor(self.indices, self.weights, self.dense_shape)

    def ids_value(self):
        """The ids as a feedable value for tf.compat.v1.sparse_placeholder."""
        return tf.compat.v1.SparseTensorValue(self.indices, self.keys, self.dense_shape)

    def unique_keys(self):
        return np.unique(self.keys)


def random_sparse_batch(rng,
                        batch_size,
                        max_hotness,
                        draw_keys,
                        key_dtype,
                        with_empty_rows=True,
                        with_duplicates=True):
    """Draws a ragged batch; `draw_keys(n)` returns n candidate keys.

    With the default flags the batch always contains a duplicated key inside
    sample 0, an empty sample in the middle and an empty last sample (the
    last one matters: tf.nn.embedding_lookup_sparse drops trailing empty
    rows, sok_ev must return zeros for them).
    """
    assert batch_size >= 3 and max_hotness >= 2
    hotness = rng.integers(1, max_hotness + 1, size=batch_size)
    if with_empty_rows:
        hotness[rng.integers(1, batch_size - 1)] = 0
        hotness[-1] = 0
    if with_duplicates:
        hotness[0] = max(hotness[0], 2)
    sample = np.repeat(np.arange(batch_size), hotness)
    position = np.concatenate([np.arange(h) for h in hotness])
    indices = np.stack([sample, position], axis=1).astype(np.int64)
    keys = np.asarray(draw_keys(len(sample))).astype(key_dtype)
    if with_duplicates:
        keys[1] = keys[0]  # entries 0 and 1 both belong to sample 0
    weights = rng.uniform(0.25, 2.0, size=len(sample)).astype(np.float32)
    return SparseBatch(indices, keys, weights, batch_size, max_hotness)


def key_sampler(rng, kind, n_rows, key_dtype):
    """Returns draw_keys(n) for one of the key ranges the tests exercise.

    in_range: [0, N), many repeats.   beyond_n: [0, 1000 N).
    negative: int64 keys of both signs, far beyond N (DeepRec rule: row is
              the non-negative key mod N).
    """
    info = np.iinfo(key_dtype)
    if kind == "in_range":
        return lambda n: rng.integers(0, n_rows, size=n)
    if kind == "beyond_n":
        return lambda n: rng.integers(0, min(1000 * n_rows, info.max), size=n)
    if kind == "negative":
        return lambda n: rng.integers(info.min // 4, info.max // 4, size=n, dtype=np.int64)
    raise ValueError(kind)


# ---------------------------------------------------------------------------
# Dense references
# ---------------------------------------------------------------------------


def initial_rows(matrix, keys):
    """DeepRec's default_value_dim rule: key k starts at matrix[k mod N]."""
    keys = np.asarray(keys, dtype=np.int64)
    return matrix[np.mod(keys, matrix.shape[0])]


def remap_to_unique(keys):
    """(unique keys, position of each key among them)."""
    uniq, inverse = np.unique(np.asarray(keys, dtype=np.int64), return_inverse=True)
    return uniq, inverse.reshape(-1).astype(np.int64)


def dense_lookup_sparse(table, batch, combiner, use_weights, ids=None):
    """tf.nn.embedding_lookup_sparse on a dense table, padded to batch_size.

    `ids` are row numbers of `table` for batch.keys (defaults to batch.keys).
    tf.nn.embedding_lookup_sparse drops trailing empty samples from its
    output, so the missing rows are appended as zeros (what an empty sample
    combines to).
    """
    ids = batch.keys.astype(np.int64) if ids is None else ids
    sp_ids = tf.SparseTensor(batch.indices, ids, batch.dense_shape)
    sp_w = batch.sp_weights() if use_weights else None
    out = tf.nn.embedding_lookup_sparse(table, sp_ids, sp_w, combiner=combiner)
    missing = batch.batch_size - tf.shape(out)[0]
    return tf.pad(out, [[0, missing], [0, 0]])


def reference_lookup(matrix, batch, combiner, use_weights):
    """Lookup of `batch` against a dense Variable holding the batch's rows."""
    uniq, ids = remap_to_unique(batch.keys)
    table = tf.Variable(initial_rows(matrix, uniq))
    return dense_lookup_sparse(table, batch, combiner, use_weights, ids).numpy()


def reference_gradient(matrix, batch, combiner, use_weights, upstream):
    """d(sum(lookup * upstream)) / d(row of each key), as {key: row}.

    Computed with GradientTape on a dense Variable; TF's IndexedSlices
    gradient is densified, so duplicate occurrences are summed by TF.
    """
    uniq, ids = remap_to_unique(batch.keys)
    table = tf.Variable(initial_rows(matrix, uniq))
    with tf.GradientTape() as tape:
        out = dense_lookup_sparse(table, batch, combiner, use_weights, ids)
        loss = tf.reduce_sum(out * upstream)
    dense = tf.convert_to_tensor(tape.gradient(loss, table)).numpy()
    return {int(k): dense[i] for i, k in enumerate(uniq)}


def indexed_slices_to_dict(indices, values):
    """{key: summed row} from IndexedSlices parts (numpy)."""
    out = {}
    for k, row in zip(np.asarray(indices).reshape(-1), np.asarray(values)):
        k = int(k)
        out[k] = out[k] + row if k in out else np.array(row, dtype=np.float64)
    return out


def export_to_dict(keys, values):
    """{key: row} from the two arrays EV.export() returns."""
    keys = np.asarray(keys).reshape(-1)
    assert len(np.unique(keys)) == len(keys), "export() returned a key twice"
    return {int(k): np.asarray(v) for k, v in zip(keys, values)}


def deeprec_keys(ids):
    """The int64 keys DeepRec derives from feature ids (the reference
  mapping): strings hash to Fingerprint64 modulo 2**63 - 1, integers are
  their own keys."""
    if ids.dtype == object:
        return tf.strings.to_hash_bucket_fast(ids, 2**63 - 1).numpy()
    return ids.astype(np.int64)


def in_key_order(keys, *columns):
    """`keys` and each of `columns` (arrays of one row a key) sorted by key:
  a GPU table exports its keys in no fixed order, not even between two
  exports of an unchanged table."""
    keys = np.asarray(keys).reshape(-1)
    order = np.argsort(keys, kind="stable")
    return (keys[order],) + tuple(np.asarray(c)[order] for c in columns)


def assert_rows_close(actual, expected, rtol, atol, what=""):
    """Compares two {key: row} dicts: same keys, rows within tolerance."""
    assert sorted(actual) == sorted(expected), (
        f"{what}: key sets differ: only actual {sorted(set(actual) - set(expected))[:10]}, "
        f"only expected {sorted(set(expected) - set(actual))[:10]}")
    for k in expected:
        np.testing.assert_allclose(actual[k],
                                   expected[k],
                                   rtol=rtol,
                                   atol=atol,
                                   err_msg=f"{what}: key {k}")


# ---------------------------------------------------------------------------
# Optimizers
# ---------------------------------------------------------------------------

V1 = tf.compat.v1.train

# name -> factory of a stock tf.compat.v1.train optimizer. Non-default
# hyperparameters so every code path (l1/l2/shrinkage, nesterov, centered,
# momentum) is exercised.
DENSE_EQUIVALENT_OPTIMIZERS = {
    "sgd":
        lambda: V1.GradientDescentOptimizer(0.3),
    "adagrad":
        lambda: V1.AdagradOptimizer(0.2),
    "adagrad_initial_accumulator":
        lambda: V1.AdagradOptimizer(0.2, initial_accumulator_value=0.5),
    "ftrl":
        lambda: V1.FtrlOptimizer(0.2),
    "ftrl_l1_l2":
        lambda: V1.FtrlOptimizer(
            0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02),
    "ftrl_shrinkage_power":
        lambda: V1.FtrlOptimizer(0.2,
                                 learning_rate_power=-0.7,
                                 initial_accumulator_value=0.2,
                                 l1_regularization_strength=0.01,
                                 l2_regularization_strength=0.02,
                                 l2_shrinkage_regularization_strength=0.03),
    "momentum":
        lambda: V1.MomentumOptimizer(0.1, momentum=0.8),
    "momentum_nesterov":
        lambda: V1.MomentumOptimizer(0.1, momentum=0.8, use_nesterov=True),
    "rmsprop":
        lambda: V1.RMSPropOptimizer(0.05),
    "rmsprop_momentum":
        lambda: V1.RMSPropOptimizer(0.05, decay=0.8, momentum=0.5),
    "rmsprop_centered":
        lambda: V1.RMSPropOptimizer(0.05, centered=True),
    "rmsprop_centered_momentum":
        lambda: V1.RMSPropOptimizer(0.05, decay=0.7, momentum=0.5, epsilon=1e-6, centered=True),
}

ADAM_HYPERPARAMETERS = dict(learning_rate=0.05, beta1=0.8, beta2=0.9, epsilon=1e-6)


def make_adam():
    return V1.AdamOptimizer(**ADAM_HYPERPARAMETERS)


def on_reference_device():
    """Device scope of the dense optimizer references: the CPU.

    TensorFlow has no GPU kernel for ResourceSparseApplyMomentum,
    ResourceSparseApplyRMSProp or ResourceSparseApplyCenteredRMSProp, so a
    dense Variable trained by those optimizers cannot live on a GPU. Every
    dense optimizer reference trains on the CPU, whose kernels are then the
    reference on every machine; the sok-ev side stays on the default device
    (GPU:0 where there is one).
    """
    return tf.device("/CPU:0")


def dense_training_trajectory(make_optimizer, matrix, batches, upstreams, combiner="sum"):
    """Trains a dense Variable(matrix) with a stock optimizer; keys index rows.

    Step t minimises sum(lookup(batches[t]) * upstreams[t]). Returns the
    table after every step: a list of [N, dim] arrays. Runs on the CPU
    (on_reference_device).
    """
    with on_reference_device():
        table = tf.Variable(matrix)
        opt = make_optimizer()
        history = []
        for batch, upstream in zip(batches, upstreams):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(dense_lookup_sparse(table, batch, combiner, False) * upstream)
            grads = tape.gradient(loss, [table])
            opt.apply_gradients(zip(grads, [table]))
            history.append(table.numpy().copy())
    return history


def numpy_batch_gradient(matrix_shape, batch, upstream):
    """Per-row gradient of sum(sum_combine(lookup) * upstream), as {key: row}.

    Sum combiner, no weights: each occurrence of key k in sample b adds
    upstream[b] to k's gradient.
    """
    grads = {}
    for (sample, _), key in zip(batch.indices, batch.keys):
        key = int(key)
        grads[key] = grads.get(key, np.zeros(matrix_shape[1], np.float64)) + upstream[sample]
    return grads


def numpy_lazy_adam_trajectory(matrix, batches, upstreams, learning_rate, beta1, beta2, epsilon):
    """DeepRec's lazy Adam, in float64 NumPy.

    Only rows in the batch change; their m and v are updated with the summed
    gradient; rows outside the batch keep m, v and value (no decay). The bias
    correction uses beta^t with t the number of apply steps so far (TF's
    beta1_power / beta2_power), the same for every row.
    """
    value = matrix.astype(np.float64).copy()
    m = np.zeros_like(value)
    v = np.zeros_like(value)
    history = []
    for t, (batch, upstream) in enumerate(zip(batches, upstreams), start=1):
        lr_t = learning_rate * np.sqrt(1 - beta2**t) / (1 - beta1**t)
        for key, g in numpy_batch_gradient(matrix.shape, batch, upstream).items():
            m[key] = beta1 * m[key] + (1 - beta1) * g
            v[key] = beta2 * v[key] + (1 - beta2) * g * g
            value[key] -= lr_t * m[key] / (np.sqrt(v[key]) + epsilon)
        history.append(value.copy())
    return history


# ---------------------------------------------------------------------------
# Graph mode and sok_ev constructors
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def graph_session():
    """A fresh tf.compat.v1 graph and a Session on it (DeepRec users' mode)."""
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.Session(graph=graph) as sess:
            yield sess


def matrix_ev(sok, name, matrix, key_dtype=np.int64, **kwargs):
    """An EV whose key k starts at matrix[k mod N] (DeepRec default_value_dim)."""
    option = sok.EmbeddingVariableOption(init_option=sok.InitializerOption(
        default_value_dim=matrix.shape[0]))
    return sok.get_embedding_variable(name,
                                      embedding_dim=matrix.shape[1],
                                      key_dtype=tf.as_dtype(key_dtype),
                                      initializer=tf.constant_initializer(matrix),
                                      ev_option=option,
                                      **kwargs)


def random_matrix(rng, n_rows, dim):
    return rng.normal(0.0, 1.0, size=(n_rows, dim)).astype(np.float32)


def error_names(error, *fragments):
    """True if the error message contains every fragment (case-insensitive)."""
    message = str(error).lower()
    return all(re.search(re.escape(str(f).lower()), message) for f in fragments)


def sok_ev_import_root():
    """The sys.path entry this process imports sok_ev from.

    Test subprocesses put it first on their path, so they run the same sok_ev
    as the tests: the checkout in CI, the installed artifact on the device.
    """
    import sok_ev  # pylint: disable=import-outside-toplevel
    return os.path.dirname(os.path.dirname(os.path.abspath(sok_ev.__file__)))


def child_env(*paths, **variables):
    """os.environ for a test's child process: this process's sok_ev first on
  PYTHONPATH, then `paths`, then the inherited PYTHONPATH (where a GPU
  machine's TensorFlow lives); `variables` set on top (TF_CPP_MIN_LOG_LEVEL
  defaults to 2)."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.update(variables)
    env["PYTHONPATH"] = os.pathsep.join([sok_ev_import_root(), *paths] + inherited)
    return env


def run_legacy_keras_worker(worker, out_path, seed, failure):
    """Runs `worker OUT_PATH SEED` in a child process under tf_keras
  (TF_USE_LEGACY_KERAS=1, read at TensorFlow's import), importing this
  checkout's sok_ev and the tests' own modules; returns the arrays it wrote
  to `out_path` (.npz). Asserts it exited 0, `failure` heading its stderr."""
    env = child_env(os.path.dirname(os.path.abspath(__file__)), TF_USE_LEGACY_KERAS="1")
    result = subprocess.run(
        [sys.executable, worker, out_path, str(seed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False)
    assert result.returncode == 0, f"{failure}:\n" + result.stderr[-6000:]
    with np.load(out_path) as data:
        return {key: data[key] for key in data.files}


def legacy_keras_facts(tmp_path_factory, worker, seed_offset, failure):
    """run_legacy_keras_worker in a fresh temporary folder, with the suite's
  seed (SOK_EV_TEST_SEED) plus `seed_offset`: (its arrays, the json "facts"
  array it wrote, decoded)."""
    name = os.path.splitext(os.path.basename(worker))[0]
    path = str(tmp_path_factory.mktemp(name) / "out.npz")
    seed = int(os.environ.get("SOK_EV_TEST_SEED", "0")) + seed_offset
    arrays = run_legacy_keras_worker(worker, path, seed, failure)
    return arrays, json.loads(str(arrays["facts"]))


# What a Keras worker records after every callback step of a model.
STEP_FIELDS = ("batch", "iterations", "rows", "kernel", "loss")


def assert_same_steps(arrays, case, model, reference):
    """`<case>/<model>/<field>` went through the steps of
  `<case>/<reference>/<field>`: the same batches and iterations, and rows,
  kernel and loss equal up to float32 rounding. Returns the steps' count."""
    got = {f: arrays[f"{case}/{model}/{f}"] for f in STEP_FIELDS}
    want = {f: arrays[f"{case}/{reference}/{f}"] for f in STEP_FIELDS}
    assert len(got["batch"]) == len(want["batch"]) > 0
    np.testing.assert_array_equal(got["batch"], want["batch"])
    np.testing.assert_array_equal(got["iterations"], want["iterations"])
    for field in ("rows", "kernel", "loss"):
        np.testing.assert_allclose(got[field],
                                   want[field],
                                   rtol=2e-5,
                                   atol=2e-6,
                                   err_msg=f"{case}: {field}")
    return len(got["batch"])


# ---------------------------------------------------------------------------
# The user example
# ---------------------------------------------------------------------------

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python",
                       "examples", "deeprec_sok_example.py")
# The floats numpy prints: '2.', '30.0', '1.8006e+00'.
PRINTED_FLOAT = re.compile(r"[-+]?\d+\.\d*(?:[eE][-+]?\d+)?")


def example_replay(workers=1, steps=3, lr=0.1, initial_accumulator=0.1):
    """The floats python/examples/deeprec_sok_example.py prints, in NumPy.

    Every key starts at ones(3); sample 0 holds key 1 twice and sample 1 keys
    3, 4, 5; loss = sum(2 * emb). Each of `workers` feeds that same batch, so
    a key's gradient is summed over the workers (by its owner) before
    Adagrad(lr), with TF's initial accumulator, applies it. Returns, per step,
    the 6 embedding values and then the loss (the mean over workers, equal to
    each worker's own).
    """
    samples = [[1, 1], [3, 4, 5]]
    value = {k: np.ones(3) for k in (1, 3, 4, 5)}
    accum = {k: np.full(3, initial_accumulator) for k in value}
    numbers = []
    for _ in range(steps):
        emb = np.stack([sum(value[k] for k in sample) for sample in samples])
        numbers += emb.reshape(-1).tolist() + [2.0 * emb.sum()]
        grad = {k: np.zeros(3) for k in value}
        for sample in samples:
            for k in sample:
                grad[k] += 2.0 * workers  # d loss / d emb = 2, from each worker
        for k, g in grad.items():
            accum[k] += g * g
            value[k] -= lr * g / np.sqrt(accum[k])
    return numbers
