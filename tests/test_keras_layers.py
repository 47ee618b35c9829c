"""sok_ev.keras: Keras 3 layers holding Embedding Variables, trained by fit.

The reference for every lookup is NumPy on the table's rows; the reference
for training is the same model built on `keras.layers.Embedding` holding the
same rows (key k starts at M[k], DeepRec's default_value_dim rule on the
Embedding Variable), compiled with the same optimizer and fed the same
batches: the tables, the dense weights and the losses must agree after every
step. Adam and Ftrl on a dense Keras variable also move rows outside the
batch (sok-ev is lazy, as DeepRec), so their batches look up every row at
least once; SGD and Adagrad batches leave rows out, which must not move.

Batches are drawn fresh per test, with a duplicated id in a row and (ragged,
sparse) empty rows; ids come as int32 and int64.

Covered: lookups of dense, ragged and sparse ids (NumPy); bad arguments and
inputs (named in the error, nothing stored); fit in tf.function (Keras's
default), with steps_per_execution > 1 and run eagerly, on subclassed and
functional models; evaluate and predict; unsupported optimizers; a frozen
layer; GroupedEmbedding; tf.train.Checkpoint, save_weights/load_weights and
ModelCheckpoint round trips (tables with slots, then training on alike); and
model.save('*.keras') refused.
"""
import numpy as np
import pytest
import tensorflow as tf
import keras

import keras_twins
from keras_twins import DenseTwin, History, Tower

N_ROWS, DIM, BATCH, HOTNESS = 12, 4, 6, 3

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.2),
    "adagrad": lambda: keras.optimizers.Adagrad(0.3, initial_accumulator_value=0.2),
    "adam": lambda: keras.optimizers.Adam(0.05, beta_1=0.8, beta_2=0.9, epsilon=1e-6),
    "ftrl": lambda: keras.optimizers.Ftrl(0.2, l1_regularization_strength=0.01),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.05, rho=0.8, momentum=0.5, epsilon=1e-6),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1, epsilon=1e-6),
    "sgd_nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.8, nesterov=True),
}
# Optimizers that move rows a dense Keras variable has outside the batch.
NOT_LAZY_ON_DENSE = ("adam", "ftrl", "rmsprop", "adamw", "sgd_nesterov")

# ---------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------


def _ragged_ids(rng, dtype, cover_all=False, batch=BATCH):
    """Ragged ids `[batch, None]`: row 0 holds a duplicate, a middle row and
  the last row are empty; with cover_all every key in [0, N_ROWS) appears."""
    lengths = rng.integers(1, HOTNESS + 1, size=batch)
    lengths[0] = max(lengths[0], 2)
    lengths[rng.integers(1, batch - 1)] = 0
    lengths[-1] = 0
    rows = [list(rng.integers(0, N_ROWS, size=n)) for n in lengths]
    rows[0][1] = rows[0][0]
    if cover_all:
        rows[0].extend(range(N_ROWS))
    return [np.array(r, dtype) for r in rows]


def _ragged_weights(rng, rows):
    return [rng.uniform(0.25, 2.0, size=len(r)).astype(np.float32) for r in rows]


def _dense_ids(rng, dtype, cover_all=False, batch=BATCH):
    """Dense ids `[batch, HOTNESS]` with a duplicate in row 0; with cover_all
  every key instead, and random others (duplicates), in random places."""
    if cover_all:
        extra = rng.integers(0, N_ROWS, size=batch * HOTNESS - N_ROWS)
        return rng.permutation(np.concatenate([np.arange(N_ROWS),
                                               extra])).reshape(batch, HOTNESS).astype(dtype)
    ids = rng.integers(0, N_ROWS, size=(batch, HOTNESS))
    ids[0, 1] = ids[0, 0]
    return ids.astype(dtype)


def _ragged(rows, dtype):
    return tf.RaggedTensor.from_row_lengths(tf.constant(np.concatenate(rows).astype(dtype)),
                                            tf.constant([len(r) for r in rows], tf.int64))


def _sparse(ragged):
    return ragged.to_sparse()


# ---------------------------------------------------------------------------
# NumPy references
# ---------------------------------------------------------------------------


def _np_pool(matrix, rows, weights, combiner):
    """tf.nn.embedding_lookup_sparse's combiners in NumPy; empty rows give 0."""
    out = np.zeros((len(rows), matrix.shape[1]), np.float64)
    for i, (keys, w) in enumerate(zip(rows, weights)):
        if len(keys) == 0:
            continue
        total = (matrix[keys] * w[:, None]).sum(axis=0)
        if combiner == "mean":
            total /= w.sum()
        elif combiner == "sqrtn":
            total /= np.sqrt((w * w).sum())
        out[i] = total
    return out


_sok_layer = keras_twins.sok_layer


def _table_rows(layer, n_rows=N_ROWS):
    return keras_twins.table_rows(layer, n_rows)


def _matrix(rng):
    return rng.normal(size=(N_ROWS, DIM)).astype(np.float32)


# ---------------------------------------------------------------------------
# Lookups
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("id_dtype, key_dtype", [(np.int32, tf.int32), (np.int32, tf.int64),
                                                 (np.int64, tf.int64)])
def test_dense_ids_without_combiner_give_one_row_per_id(sok, rng, id_dtype, key_dtype):
    matrix = _matrix(rng)
    layer = _sok_layer(sok, matrix, key_dtype=key_dtype)
    ids = rng.integers(0, N_ROWS, size=(2, 3, 5)).astype(id_dtype)
    weights = rng.uniform(0.5, 2.0, size=ids.shape).astype(np.float32)
    out = layer(tf.constant(ids))
    assert out.shape == (2, 3, 5, DIM) and out.dtype == tf.float32
    np.testing.assert_allclose(out.numpy(), matrix[ids], rtol=1e-6)
    weighted = layer(tf.constant(ids), weights=tf.constant(weights))
    np.testing.assert_allclose(weighted.numpy(), matrix[ids] * weights[..., None], rtol=1e-6)
    vector = layer(tf.constant(ids[0, 0]))
    np.testing.assert_allclose(vector.numpy(), matrix[ids[0, 0]], rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_dense_ids_with_a_combiner_are_pooled_over_the_last_axis(sok, rng, combiner, id_dtype):
    matrix = _matrix(rng)
    layer = _sok_layer(sok, matrix, combiner)
    ids = rng.integers(0, N_ROWS, size=(2, BATCH, HOTNESS)).astype(id_dtype)
    ids[0, 0, 1] = ids[0, 0, 0]
    weights = rng.uniform(0.25, 2.0, size=ids.shape).astype(np.float32)
    out = layer(tf.constant(ids), weights=tf.constant(weights))
    assert out.shape == (2, BATCH, DIM)
    expected = _np_pool(matrix, list(ids.reshape(-1, HOTNESS)), list(weights.reshape(-1, HOTNESS)),
                        combiner)
    np.testing.assert_allclose(out.numpy().reshape(-1, DIM), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("kind", ["ragged", "sparse"])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_ragged_and_sparse_ids_are_pooled_per_row_and_empty_rows_are_zero(
        sok, rng, combiner, kind, id_dtype):
    matrix = _matrix(rng)
    layer = _sok_layer(sok, matrix, combiner)
    rows = _ragged_ids(rng, id_dtype)
    weights = _ragged_weights(rng, rows)
    ids, w = _ragged(rows, id_dtype), _ragged(weights, np.float32)
    if kind == "sparse":
        ids, w = _sparse(ids), _sparse(w)
    expected = _np_pool(matrix, rows, weights, combiner)
    np.testing.assert_allclose(layer(ids, weights=w).numpy(), expected, rtol=1e-5, atol=1e-6)
    unweighted = _np_pool(matrix, rows, [np.ones(len(r), np.float32) for r in rows], combiner)
    np.testing.assert_allclose(layer(ids).numpy(), unweighted, rtol=1e-5, atol=1e-6)


def test_ragged_ids_without_a_combiner_give_a_ragged_row_per_id(sok, rng):
    matrix = _matrix(rng)
    layer = _sok_layer(sok, matrix)
    rows = _ragged_ids(rng, np.int64)
    weights = _ragged_weights(rng, rows)
    out = layer(_ragged(rows, np.int64), weights=_ragged(weights, np.float32))
    assert isinstance(out, tf.RaggedTensor) and out.shape.as_list() == [BATCH, None, DIM]
    for got, keys, w in zip(out.to_list(), rows, weights):
        np.testing.assert_allclose(np.array(got).reshape(-1, DIM),
                                   matrix[keys] * w[:, None],
                                   rtol=1e-6)


def test_a_lookup_inserts_the_ids_and_only_them(sok, rng):
    matrix = _matrix(rng)
    layer = _sok_layer(sok, matrix, "sum")
    ids = _dense_ids(rng, np.int64)
    layer(ids)
    keys, values = (t.numpy() for t in layer.embedding_variable.export())
    assert sorted(keys) == sorted(set(ids.reshape(-1)))
    np.testing.assert_allclose(values, matrix[keys])


# ---------------------------------------------------------------------------
# Bad arguments
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(embedding_dim=0), ValueError, "embedding_dim must be an integer in [1, 65536], got 0"),
    (dict(embedding_dim=4.0), ValueError,
     "embedding_dim must be an integer in [1, 65536], got 4.0"),
    (dict(embedding_dim=True), ValueError,
     "embedding_dim must be an integer in [1, 65536], got True"),
    (dict(embedding_dim=4, combiner="avg"), ValueError, "combiner must be None or one of"),
    (dict(embedding_dim=4, key_dtype=tf.float32), TypeError, "key_dtype must be tf.int32 or"),
    (dict(embedding_dim=4, target_gpu=-2), ValueError, "target_gpu must be -1"),
])
def test_bad_constructor_arguments_raise_naming_the_argument_and_value(
        sok, kwargs, error, fragment):
    with pytest.raises(error) as raised:
        sok.keras.Embedding(name="bad_args", **kwargs)
    assert fragment in str(raised.value)
    if "combiner" in kwargs:
        assert "'avg'" in str(raised.value) and "bad_args" in str(raised.value)


def _bad_calls():
    """case -> (layer's combiner and key_dtype, call, error, message fragment)."""
    ragged = tf.ragged.constant([[1, 2], [], [3]], tf.int32)
    dense = tf.constant([[1, 2]], tf.int32)
    return {
        "float ids": (
            ("sum", tf.int64), lambda l: l(tf.constant([[1.0, 2.0]])), TypeError,
            "ids must be int32 or int64 (int32 for a key_dtype=int32 table), got float32"),
        "int64 ids for an int32 table": (
            ("sum", tf.int32), lambda l: l(tf.cast(dense, tf.int64)), TypeError, "got int64"),
        "sparse ids without a combiner": (
            (None, tf.int32), lambda l: l(ragged.to_sparse()), ValueError, "need a combiner"),
        "rank-1 dense ids with a combiner": (
            ("sum", tf.int32), lambda l: l(dense[0]), ValueError, "rank >= 2, got shape (2,)"),
        "ragged ids, dense weights": ((None, tf.int32), lambda l: l(ragged, tf.ones([3, 2])),
                                      TypeError, "weights must be a RaggedTensor like the ids, "
                                      "got Tensor"),
        "ragged ids of rank 3 with a combiner": (
            ("sum", tf.int32), lambda l: l(tf.ragged.constant([[[1]], [[2, 3]]], tf.int32)),
            ValueError, "pooled tf.RaggedTensor ids must have shape "
            "[batch, None], got shape (2, None, None)"),
        "sparse ids of rank 3": (
            ("sum",
             tf.int32), lambda l: l(tf.sparse.from_dense(tf.constant([[[1]], [[2]]], tf.int32))),
            ValueError, "tf.SparseTensor ids must have rank 2 ([batch, max_hotness]), "
            "got shape (2, 1, 1)"),
        "int weights": (("sum", tf.int32), lambda l: l(dense, dense), TypeError,
                        "weights must be float, got int32"),
        "dense weights of another static shape": (
            ("sum", tf.int32), lambda l: l(dense, tf.ones([1, 3])), ValueError,
            "weights must have the ids' shape (1, 2), got "
            "(1, 3)"),
        "ragged weights of other row splits": (
            ("sum", tf.int32), lambda l: l(ragged, tf.ragged.constant([[1.0], [], [1.0, 2.0]])),
            tf.errors.InvalidArgumentError, "weights must have the ids' row splits"),
        "sparse weights of other indices": (
            ("mean", tf.int32), lambda l: l(ragged.to_sparse(),
                                            tf.ragged.constant([[1.0], [2.0], [1.0]]).to_sparse()),
            tf.errors.InvalidArgumentError, "weights must have the ids' indices"),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
def test_bad_ids_or_weights_raise_before_the_table_changes(sok, case):
    (combiner, key_dtype), call, error, fragment = _bad_calls()[case]
    layer = sok.keras.Embedding(DIM, combiner=combiner, key_dtype=key_dtype, name="bad_call")
    with pytest.raises(error) as raised:
        call(layer)
    assert fragment in str(raised.value) and "bad_call" in str(raised.value)
    assert int(layer.embedding_variable.total_count()) == 0


# ---------------------------------------------------------------------------
# Training with fit: a model and its keras.layers.Embedding twin
# ---------------------------------------------------------------------------


def _head(kernel):
    """Dense(1) named 'head' (History reads it) starting at `kernel`."""
    return keras.layers.Dense(1,
                              kernel_initializer=keras.initializers.Constant(kernel),
                              bias_initializer="zeros",
                              name="head")


# Input kinds: (combiner, how a batch of ids and weights is made).
KINDS = ("dense", "dense_pooled", "ragged", "sparse")


def _dataset(rng, kind, id_dtype, steps, cover_all):
    """`steps` batches of ((ids, weights), y) of one input kind."""
    batches = []
    for _ in range(steps):
        if kind.startswith("dense"):
            ids = _dense_ids(rng, id_dtype, cover_all)
            weights = rng.uniform(0.25, 2.0, size=ids.shape).astype(np.float32)
            x = (tf.constant(ids), tf.constant(weights))
        else:
            rows = _ragged_ids(rng, id_dtype, cover_all)
            x = (_ragged(rows, id_dtype), _ragged(_ragged_weights(rng, rows), np.float32))
            if kind == "sparse":
                x = tuple(_sparse(t) for t in x)
        y = tf.constant(rng.normal(size=(BATCH, 1)).astype(np.float32))
        batches.append((x, y))
    return batches


def _combiner(kind):
    return None if kind == "dense" else "mean" if kind == "sparse" else "sqrtn" if kind == "ragged" else "sum"


def _twins(sok, rng, kind, key_dtype=tf.int64, matrix=None, kernel=None):
    """A Tower on a sok_ev.keras.Embedding and its DenseTwin Tower, from the
  same initial rows and head kernel (drawn unless given); returns both
  (model, embedding layer) and the initial rows."""
    matrix = _matrix(rng) if matrix is None else matrix
    width = DIM * (HOTNESS if kind == "dense" else 1)
    kernel = rng.normal(size=(width, 1)).astype(np.float32) if kernel is None else kernel
    sok_layer = _sok_layer(sok, matrix, _combiner(kind), key_dtype)
    twin = DenseTwin(matrix, _combiner(kind))
    return (Tower(sok_layer, kernel), sok_layer), (Tower(twin, kernel), twin), matrix


def _fit_both(sok,
              rng,
              optimizer,
              kind,
              id_dtype=np.int64,
              steps=4,
              steps_per_execution=1,
              run_eagerly=False):
    """Fits the sok-ev model and its keras.layers.Embedding twin on the same
  batches; returns both History callbacks, both (model, embedding layer),
  the batches and the initial rows."""
    (model, layer), (twin_model, twin), matrix = _twins(sok, rng, kind)
    batches = _dataset(rng, kind, id_dtype, steps, cover_all=optimizer in NOT_LAZY_ON_DENSE)
    histories = []
    for m, read in ((model, lambda: _table_rows(layer)),
                    (twin_model, lambda: twin.embedding.embeddings.numpy().copy())):
        m.compile(optimizer=OPTIMIZERS[optimizer](),
                  loss="mse",
                  steps_per_execution=steps_per_execution,
                  run_eagerly=run_eagerly)
        history = History(read)
        m.fit(keras_twins.as_dataset(batches),
              epochs=1,
              verbose=0,
              callbacks=[history],
              shuffle=False)
        histories.append(history)
    return histories, (model, layer), (twin_model, twin), batches, matrix


def _assert_same_steps(actual, expected):
    assert len(actual.steps) == len(expected.steps) > 0
    for got, want in zip(actual.steps, expected.steps):
        assert got["batch"] == want["batch"] and got["iterations"] == want["iterations"]
        np.testing.assert_allclose(got["rows"], want["rows"], rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(got["kernel"], want["kernel"], rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_fit_equals_the_keras_embedding_model_step_for_step(sok, rng, optimizer, kind):
    id_dtype = np.int32 if kind in ("dense_pooled", "sparse") else np.int64
    (history,
     twin_history), (_, layer), _, batches, matrix = _fit_both(sok, rng, optimizer, kind, id_dtype)
    _assert_same_steps(history, twin_history)
    # Every step moved the table: the comparison is not between untrained rows.
    first, last = history.steps[0]["rows"], history.steps[-1]["rows"]
    assert not np.allclose(first, last)
    if optimizer not in NOT_LAZY_ON_DENSE:
        seen = set()
        for (ids, _), _ in batches:
            values = ids.values if isinstance(ids, tf.SparseTensor) else ids
            values = values.flat_values if isinstance(values, tf.RaggedTensor) else values
            seen.update(np.asarray(values).reshape(-1).tolist())
        unseen = sorted(set(range(N_ROWS)) - seen)
        # Rows never looked up are neither inserted nor moved.
        assert not set(layer.embedding_variable.export()[0].numpy().tolist()) & set(unseen)
        np.testing.assert_array_equal(_table_rows(layer)[unseen], matrix[unseen])


def test_fit_with_adam_moves_only_looked_up_rows_and_its_first_step_equals_keras(sok, rng):
    """Keras's Adam on keras.layers.Embedding also moves rows outside the
  batch after the first step (their moments decay); sok-ev's is lazy."""
    (history, twin_history), (_, layer), _, batches, matrix = _fit_both(sok,
                                                                        rng,
                                                                        "adam",
                                                                        "ragged",
                                                                        steps=4)
    first, twin_first = history.steps[0], twin_history.steps[0]
    np.testing.assert_allclose(first["rows"], twin_first["rows"], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(first["kernel"], twin_first["kernel"], rtol=2e-5, atol=2e-6)
    before = matrix
    for step, ((ids, _), _) in zip(history.steps, batches):
        batch = sorted(set(ids.flat_values.numpy().tolist()))
        outside = sorted(set(range(N_ROWS)) - set(batch))
        np.testing.assert_array_equal(step["rows"][outside], before[outside])
        assert not np.allclose(step["rows"][batch], before[batch])
        before = step["rows"]


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_fit_with_steps_per_execution_equals_the_keras_model_and_callbacks_see_each_step(
        sok, rng, optimizer):
    (history, twin_history), _, _, _, _ = _fit_both(sok,
                                                    rng,
                                                    optimizer,
                                                    "ragged",
                                                    steps=6,
                                                    steps_per_execution=3)
    _assert_same_steps(history, twin_history)
    # Keras calls back once per execution, with the index of its last step.
    assert [s["batch"] for s in history.steps] == [2, 5]
    assert [s["iterations"] for s in history.steps] == [3, 6]


@pytest.mark.parametrize("optimizer", ["adagrad", "ftrl"])
def test_fit_run_eagerly_equals_the_keras_model_step_for_step(sok, rng, optimizer):
    (history, twin_history), _, _, _, _ = _fit_both(sok,
                                                    rng,
                                                    optimizer,
                                                    "sparse",
                                                    steps=3,
                                                    run_eagerly=True)
    _assert_same_steps(history, twin_history)


@pytest.mark.parametrize("run_eagerly", [False, True])
@pytest.mark.parametrize("inner", ["sgd", "adagrad"])
def test_fit_with_a_loss_scale_optimizer_equals_the_keras_model_step_for_step(
        sok, rng, monkeypatch, inner, run_eagerly):
    """model.fit scales the loss by the LossScaleOptimizer's dynamic scale
  and the optimizer unscales the table's gradient with the dense ones:
  the table, the head and the loss equal the keras.layers.Embedding
  model's after every step, and the scale grows alike."""
    monkeypatch.setitem(
        OPTIMIZERS, "loss_scaled", lambda: keras.optimizers.LossScaleOptimizer(
            OPTIMIZERS[inner](), initial_scale=2.0**12, dynamic_growth_steps=2))
    (history, twin_history), (model, _), (twin_model, _), _, _ = _fit_both(sok,
                                                                           rng,
                                                                           "loss_scaled",
                                                                           "ragged",
                                                                           steps=5,
                                                                           run_eagerly=run_eagerly)
    _assert_same_steps(history, twin_history)
    assert [s["iterations"] for s in history.steps] == [1, 2, 3, 4, 5]
    assert float(model.optimizer.dynamic_scale) == float(twin_model.optimizer.dynamic_scale)
    assert float(model.optimizer.dynamic_scale) == 2.0**14


def test_fit_under_a_mixed_float16_policy_trains_the_table_and_skips_the_steps_keras_skips(
        sok, rng):
    """Under keras.mixed_precision's mixed_float16 policy, compile wraps the
  optimizer in a LossScaleOptimizer (initial scale 2^15): fit trains the
  table (float32 rows) and the float16 head, and skips, as the
  keras.layers.Embedding model does, the steps whose float16 gradients
  overflow, halving the scale alike."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        (model, layer), (twin_model, _), matrix = _twins(sok, rng, "ragged")
        batches = _dataset(rng, "ragged", np.int64, 6, cover_all=False)
        losses = []
        for m in (model, twin_model):
            m.compile(optimizer=OPTIMIZERS["adagrad"](), loss="mse")
            losses.append(m.fit(keras_twins.as_dataset(batches), verbose=0).history["loss"])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert int(model.optimizer.iterations) == int(twin_model.optimizer.iterations) > 0
    assert float(model.optimizer.dynamic_scale) == float(twin_model.optimizer.dynamic_scale)
    assert np.isfinite(losses[0]).all()
    assert _table_rows(layer).dtype == np.float32
    assert not np.allclose(_table_rows(layer), matrix)


class TableOnly(keras.Model):
    """The pooled embedding's sum: a model whose only weights are the table's."""

    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding

    def call(self, inputs):
        ids, weights = inputs
        return tf.reduce_sum(self.embedding(ids, weights), axis=1, keepdims=True)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_model_whose_only_weights_are_tables_trains_like_keras_and_counts_each_step(
        sok, rng, optimizer):
    matrix = _matrix(rng)
    batches = _dataset(rng, "ragged", np.int64, 3, cover_all=optimizer in NOT_LAZY_ON_DENSE)
    layer, twin = _sok_layer(sok, matrix, "sqrtn"), DenseTwin(matrix, "sqrtn")
    losses = []
    for model in (TableOnly(layer), TableOnly(twin)):
        model.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse")
        losses.append(model.fit(keras_twins.as_dataset(batches), verbose=0).history["loss"])
        assert int(model.optimizer.iterations) == 3
    np.testing.assert_allclose(losses[0], losses[1], rtol=2e-5)
    np.testing.assert_allclose(_table_rows(layer),
                               twin.embedding.embeddings.numpy(),
                               rtol=2e-5,
                               atol=2e-6)
    assert not np.allclose(_table_rows(layer), matrix)


class _OwnLookup(keras.layers.Layer):
    """A user's layer that calls sok_ev.lookup_sparse itself (SOK's habit),
  holding its table as an attribute, or reaching it through a function."""

    def __init__(self, sok, table, hold_table=True, **kwargs):
        super().__init__(**kwargs)
        self.lookup_sparse = sok.lookup_sparse
        if hold_table:
            self.table = table
        else:
            self.get_table = lambda: table

    def call(self, ids):
        table = self.table if hasattr(self, "table") else self.get_table()
        return self.lookup_sparse([table], [tf.sparse.from_dense(ids)])[0]


@pytest.fixture
def looks_like_a_gpu_machine(monkeypatch):
    """Keras's jit_compile="auto" as on a machine with a GPU: it asks
  tf.config.list_physical_devices() for a device that is not a CPU."""
    devices = tf.config.list_physical_devices()
    fake = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda *args: devices + [fake])


def _own_lookup_model(layer, jit_compile):
    ids = keras.Input((HOTNESS,), dtype="int64")
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    model.compile(optimizer=OPTIMIZERS["adagrad"](), loss="mse", jit_compile=jit_compile)
    return model


@pytest.mark.parametrize("jit_compile", ["auto", True])
def test_a_users_layer_holding_a_table_trains_without_xla_on_a_gpu_machine(
        sok, rng, unique_name, looks_like_a_gpu_machine, jit_compile):
    """On a GPU, compile(jit_compile="auto") picks XLA when every layer
  supports it, and a user's layer does by default; sok-ev's kernels have no
  XLA form. A layer holding an Embedding Variable counts as not supporting
  it (sok_ev.keras_jit), so the model trains as it does on a CPU."""
    table = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
    model = _own_lookup_model(_OwnLookup(sok, table), jit_compile)
    assert model.jit_compile is False
    batch = (tf.constant(_dense_ids(rng, np.int64)) + 1, tf.zeros([BATCH, 1]))
    model.fit(keras_twins.as_dataset([batch]), verbose=0)
    assert int(table.export()[0].shape[0]) == len(np.unique(batch[0].numpy()))


def test_a_table_keras_cannot_see_under_xla_is_refused_naming_the_fix(sok, rng, unique_name,
                                                                      looks_like_a_gpu_machine):
    """A table reached through a function is not seen at compile, so "auto"
  picks XLA; the trace then stops with a ValueError naming the fix, before
  the table changes, instead of TensorFlow's "no registered OpKernel for
  XLA_GPU_JIT" at the first step."""
    table = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
    model = _own_lookup_model(_OwnLookup(sok, table, hold_table=False), "auto")
    assert model.jit_compile is True
    batch = (tf.constant(_dense_ids(rng, np.int64)) + 1, tf.zeros([BATCH, 1]))
    with pytest.raises(ValueError, match="jit_compile=True") as error:
        model.fit(keras_twins.as_dataset([batch]), verbose=0)
    assert "supports_jit = False" in str(error.value)
    assert "jit_compile=False" in str(error.value)
    assert int(table.export()[0].shape[0]) == 0


def test_a_functional_model_refuses_xla_and_fits_like_its_keras_twin(sok, rng):
    """keras.Input(dtype='int32') ids into an int64 table (widened), pooled."""
    matrix = _matrix(rng)
    kernel = rng.normal(size=(DIM, 1)).astype(np.float32)
    histories = []
    batches = [(tf.constant(_dense_ids(rng, np.int32)),
                tf.constant(rng.normal(size=(BATCH, 1)), tf.float32)) for _ in range(3)]
    sok_layer = _sok_layer(sok, matrix, "mean")
    twin = DenseTwin(matrix, "mean")
    for embedding, read in ((sok_layer, lambda: _table_rows(sok_layer)),
                            (twin, lambda: twin.embedding.embeddings.numpy().copy())):
        ids = keras.Input((HOTNESS,), dtype="int32")
        model = keras.Model(ids, _head(kernel)(embedding(ids)))
        model.compile(optimizer=OPTIMIZERS["adagrad"](), loss="mse", jit_compile=True)
        if embedding is sok_layer:
            assert model.jit_compile is False
        history = History(read)
        model.fit(keras_twins.as_dataset(batches), verbose=0, callbacks=[history])
        histories.append(history)
    _assert_same_steps(*histories)


def test_evaluate_and_predict_equal_the_keras_model_and_leave_trained_rows_alone(sok, rng):
    _, (model, layer), (twin_model, _), _, _ = _fit_both(sok, rng, "adagrad", "sparse", steps=3)
    trained = layer.embedding_variable.export()
    trained = dict(zip(trained[0].numpy().tolist(), trained[1].numpy()))
    test = _dataset(rng, "sparse", np.int64, 2, cover_all=False)
    np.testing.assert_allclose(model.evaluate(keras_twins.as_dataset(test), verbose=0),
                               twin_model.evaluate(keras_twins.as_dataset(test), verbose=0),
                               rtol=1e-5)
    np.testing.assert_allclose(model.predict(keras_twins.as_dataset(test), verbose=0),
                               twin_model.predict(keras_twins.as_dataset(test), verbose=0),
                               rtol=1e-5,
                               atol=1e-6)
    after = layer.embedding_variable.export()
    after = dict(zip(after[0].numpy().tolist(), after[1].numpy()))
    for key, row in trained.items():
        np.testing.assert_array_equal(after[key], row)
    assert int(model.optimizer.iterations) == 3


@pytest.mark.parametrize("optimizer", [
    lambda: keras.optimizers.Nadam(0.1),
    lambda: keras.optimizers.Lion(0.1),
    lambda: keras.optimizers.Adafactor(0.1),
])
def test_an_unsupported_optimizer_is_refused_naming_it_and_the_layer_before_anything_changes(
        sok, rng, optimizer):
    (model, layer), _, _ = _twins(sok, rng, "ragged")
    layer_name = layer.name
    opt = optimizer()
    model.compile(optimizer=opt, loss="mse")
    batches = _dataset(rng, "ragged", np.int64, 2, cover_all=False)
    with pytest.raises((TypeError, ValueError)) as raised:
        model.fit(keras_twins.as_dataset(batches), verbose=0)
    message = str(raised.value)
    assert type(opt).__name__ in message and f"{layer_name}/embeddings" in message
    assert int(layer.embedding_variable.total_count()) == 0
    assert int(opt.iterations) == 0


def test_a_frozen_layer_keeps_its_table_while_the_dense_head_trains(sok, rng):
    (model, layer), _, matrix = _twins(sok, rng, "dense_pooled")
    layer.trainable = False
    model.compile(optimizer=keras.optimizers.Adagrad(0.3), loss="mse")
    batches = _dataset(rng, "dense_pooled", np.int64, 2, cover_all=False)
    model(batches[0][0])  # builds the head
    assert not any(w is layer.embedding_variable for w in model.trainable_weights)
    kernel = model.head.kernel.numpy().copy()
    model.fit(keras_twins.as_dataset(batches), verbose=0)
    keys, values = (t.numpy() for t in layer.embedding_variable.export())
    assert len(keys) > 0
    np.testing.assert_array_equal(values, matrix[keys])
    assert not np.allclose(model.head.kernel.numpy(), kernel)


# ---------------------------------------------------------------------------
# GroupedEmbedding
# ---------------------------------------------------------------------------


def test_grouped_embedding_equals_numpy_per_table_in_one_lookup_sparse_call(sok, rng, monkeypatch):
    from sok_ev import lookup as lookup_lib  # pylint: disable=import-outside-toplevel
    matrices = [_matrix(rng) for _ in range(3)]
    layers = [
        _sok_layer(sok, matrices[0], "sum"),
        _sok_layer(sok, matrices[1], "mean", key_dtype=tf.int32),
        _sok_layer(sok, matrices[2]),
    ]
    grouped = sok.keras.GroupedEmbedding(layers)
    rows = _ragged_ids(rng, np.int64)
    weights = _ragged_weights(rng, rows)
    sparse_rows = _ragged_ids(rng, np.int32)
    dense = rng.integers(0, N_ROWS, size=(BATCH, HOTNESS)).astype(np.int32)
    calls = []
    original = lookup_lib.lookup_sparse
    monkeypatch.setattr(
        lookup_lib, "lookup_sparse",
        lambda params, *a, **k: calls.append(len(params)) or original(params, *a, **k))
    out = grouped(
        [_ragged(rows, np.int64),
         _sparse(_ragged(sparse_rows, np.int32)),
         tf.constant(dense)],
        weights=[_ragged(weights, np.float32), None, None])
    assert calls == [3]
    np.testing.assert_allclose(out[0].numpy(),
                               _np_pool(matrices[0], rows, weights, "sum"),
                               rtol=1e-5)
    ones = [np.ones(len(r), np.float32) for r in sparse_rows]
    np.testing.assert_allclose(out[1].numpy(),
                               _np_pool(matrices[1], sparse_rows, ones, "mean"),
                               rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(out[2].numpy(), matrices[2][dense], rtol=1e-6)
    assert len(grouped.trainable_weights) == 3


class TwoTables(keras.Model):
    """Two pooled tables looked up by `lookup` (a list in, a list out),
  concatenated -> Dense(1), with the head's kernel given."""

    def __init__(self, lookup, kernel):
        super().__init__()
        self.lookup = lookup
        self.head = _head(kernel)

    def call(self, inputs):
        ids, weights = inputs
        return self.head(tf.concat(self.lookup(list(ids), list(weights)), axis=1))


class EachTwin(keras.layers.Layer):
    """The reference of GroupedEmbedding: each DenseTwin on its own ids."""

    def __init__(self, twins):
        super().__init__()
        self.twins = twins

    def call(self, ids, weights):
        return [twin(i, w) for twin, i, w in zip(self.twins, ids, weights)]


@pytest.mark.parametrize("optimizer", ["adagrad", "ftrl"])
def test_grouped_embedding_fit_equals_keras_embeddings_step_for_step(sok, rng, optimizer):
    cover_all = optimizer in NOT_LAZY_ON_DENSE
    matrices = [_matrix(rng), _matrix(rng)]
    kernel = rng.normal(size=(2 * DIM, 1)).astype(np.float32)
    layers = [_sok_layer(sok, matrices[0], "sqrtn"), _sok_layer(sok, matrices[1], "sum", tf.int32)]
    twins = [DenseTwin(matrices[0], "sqrtn"), DenseTwin(matrices[1], "sum")]
    batches = []
    for _ in range(4):
        rows = _ragged_ids(rng, np.int64, cover_all)
        dense = _dense_ids(rng, np.int32, cover_all)
        ids = (_ragged(rows, np.int64), tf.constant(dense))
        weights = (_ragged(_ragged_weights(rng, rows), np.float32),
                   tf.constant(rng.uniform(0.25, 2.0, size=dense.shape).astype(np.float32)))
        batches.append(((ids, weights), tf.constant(rng.normal(size=(BATCH, 1)), tf.float32)))
    histories = []
    for lookup, read in ((sok.keras.GroupedEmbedding(layers),
                          lambda: np.concatenate([_table_rows(l) for l in layers])),
                         (EachTwin(twins),
                          lambda: np.concatenate([t.embedding.embeddings.numpy() for t in twins]))):
        model = TwoTables(lookup, kernel)
        model.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse")
        history = History(read)
        model.fit(keras_twins.as_dataset(batches), verbose=0, callbacks=[history])
        histories.append(history)
    _assert_same_steps(*histories)
    assert not np.allclose(histories[0].steps[0]["rows"], histories[0].steps[-1]["rows"])


@pytest.mark.parametrize("embeddings, error, fragment", [
    ("not a list", TypeError, "embeddings must be a list of sok_ev.keras.Embedding, got str"),
    ([], ValueError, "embeddings is empty"),
    ([keras.layers.Dense(2)
     ], TypeError, "embeddings[0] must be a sok_ev.keras.Embedding, got Dense"),
])
def test_grouped_embedding_refuses_what_is_not_a_list_of_embedding_layers(
        sok, embeddings, error, fragment):
    with pytest.raises(error) as raised:
        sok.keras.GroupedEmbedding(embeddings, name="bad_group")
    assert fragment in str(raised.value) and "bad_group" in str(raised.value)


def test_grouped_embedding_refuses_a_layer_listed_twice_and_ids_per_table_mismatch(sok):
    layer = sok.keras.Embedding(DIM, "sum", name="twice")
    with pytest.raises(ValueError, match=r"embeddings\[1\] \('twice'\) is listed twice"):
        sok.keras.GroupedEmbedding([layer, layer])
    other = sok.keras.Embedding(DIM, "sum")
    grouped = sok.keras.GroupedEmbedding([layer, other], name="pair")
    ids = tf.constant([[1, 2]], tf.int64)
    with pytest.raises(ValueError, match="pair.*ids has 1 entries but there are 2 tables"):
        grouped([ids])
    with pytest.raises(TypeError, match="pair.*ids must be a list of 2"):
        grouped(ids)
    with pytest.raises(ValueError, match="pair.*weights has 1 entries but there are 2 tables"):
        grouped([ids, ids], weights=[None])
    assert int(layer.embedding_variable.total_count()) == 0
    assert int(other.embedding_variable.total_count()) == 0


# ---------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------


def _table_state(layer):
    """Everything a table holds, by key: (value and slot columns, frequency,
  version), and its slot names."""
    keys, rows, frequencies, versions, names, _ = (
        t.numpy() for t in layer.embedding_variable.export_full())
    by_key = {int(k): (r, f, v) for k, r, f, v in zip(keys, rows, frequencies, versions)}
    return by_key, sorted(names.tolist())


def _assert_same_table_state(layer, other):
    rows, names = _table_state(layer)
    other_rows, other_names = _table_state(other)
    assert names == other_names and names, "the optimizer's slots were not saved"
    assert sorted(rows) == sorted(other_rows)
    for key, (row, frequency, version) in rows.items():
        np.testing.assert_array_equal(other_rows[key][0], row)
        assert other_rows[key][1:] == (frequency, version)


def _trained_pair(sok, rng, optimizer="adam", steps=3):
    """A sok-ev Tower trained `steps` steps, a fresh one built from the same
  code (same initializer and initial kernel; its table has the first batch's
  ids at their initial values, no slots) and 2 further batches."""
    matrix = _matrix(rng)
    kernel = rng.normal(size=(DIM, 1)).astype(np.float32)
    (model, layer), _, _ = _twins(sok, rng, "ragged", matrix=matrix, kernel=kernel)
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse")
    batches = _dataset(rng, "ragged", np.int64, steps + 2, cover_all=False)
    model.fit(keras_twins.as_dataset(batches[:steps]), verbose=0)
    (fresh, fresh_layer), _, _ = _twins(sok, rng, "ragged", matrix=matrix, kernel=kernel)
    fresh.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse")
    # Builds the head, and the optimizer: Keras restores an optimizer's
    # variables only once it is built.
    fresh(batches[0][0])
    fresh.optimizer.build(fresh.trainable_variables)
    return (model, layer), (fresh, fresh_layer), batches[steps:]


def _assert_training_continues_identically(model, layer, restored, restored_layer, batches):
    """The restored model holds the trained one's state (iterations, tables
  with slots, frequencies and versions), and both train on alike."""
    assert int(restored.optimizer.iterations) == int(model.optimizer.iterations) > 0
    _assert_same_table_state(layer, restored_layer)
    histories = []
    for m, l in ((model, layer), (restored, restored_layer)):
        history = History(lambda l=l: _table_rows(l))
        m.fit(keras_twins.as_dataset(batches), verbose=0, callbacks=[history])
        histories.append(history)
    _assert_same_steps(*histories)
    _assert_same_table_state(layer, restored_layer)


def test_tf_train_checkpoint_restores_tables_with_slots_and_training_continues_identically(
        sok, rng, tmp_path):
    (model, layer), (fresh, fresh_layer), more = _trained_pair(sok, rng)
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=fresh).read(path).assert_consumed()
    _assert_training_continues_identically(model, layer, fresh, fresh_layer, more)


def test_save_weights_and_load_weights_restore_tables_with_slots_and_training_continues_identically(
        sok, rng, tmp_path):
    (model, layer), (fresh, fresh_layer), more = _trained_pair(sok, rng, "adagrad")
    path = str(tmp_path / "tower.weights.h5")
    model.save_weights(path)
    fresh.load_weights(path)
    _assert_training_continues_identically(model, layer, fresh, fresh_layer, more)


def test_model_checkpoint_callback_saving_weights_restores_the_table_with_slots(sok, rng, tmp_path):
    (model, layer), (fresh, fresh_layer), more = _trained_pair(sok, rng, "ftrl", steps=1)
    path = str(tmp_path / "epoch{epoch}.weights.h5")
    model.fit(keras_twins.as_dataset(more),
              epochs=2,
              verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    fresh.load_weights(path.format(epoch=2))
    assert int(fresh.optimizer.iterations) == int(model.optimizer.iterations) == 5
    _assert_same_table_state(layer, fresh_layer)


def test_load_weights_without_a_table_for_the_layer_raises_before_the_table_changes(
        sok, rng, tmp_path):
    matrix = _matrix(rng)
    dense = keras.Sequential([keras.Input((HOTNESS,), dtype="int64"), keras.layers.Flatten()])
    path = str(tmp_path / "other.weights.h5")
    dense.save_weights(path)
    layer = _sok_layer(sok, matrix, "sum", name="no_table_saved")
    model = keras.Sequential([keras.Input((HOTNESS,), dtype="int64"), layer])
    model(tf.constant([[1, 2, 3]], tf.int64))
    before = _table_state(layer)
    with pytest.raises(ValueError, match="no_table_saved.*has no table for this layer"):
        model.load_weights(path)
    assert _table_state(layer)[0].keys() == before[0].keys()


@pytest.mark.parametrize("kind", ["functional", "sequential"])
def test_saving_a_model_to_a_keras_file_is_refused_naming_the_alternatives(sok, tmp_path, kind):
    ids = keras.Input((HOTNESS,), dtype="int64")
    layer = sok.keras.Embedding(DIM, "sum", name="not_serializable")
    if kind == "functional":
        model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    else:
        model = keras.Sequential([ids, layer, keras.layers.Dense(1)])
    with pytest.raises(NotImplementedError) as raised:
        model.save(str(tmp_path / "m.keras"))
    assert "not_serializable" in str(raised.value)
    for alternative in ("model.save_weights", "tf.train.Checkpoint"):
        assert alternative in str(raised.value)
