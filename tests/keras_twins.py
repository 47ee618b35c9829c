"""Twin Keras models for the tests that run in their own processes (tf_keras
under TF_USE_LEGACY_KERAS=1, Horovod workers): a model on
sok_ev.keras.Embedding and the same model on keras.layers.Embedding holding
the same rows (the reference), built with whichever Keras `tf.keras` is.

The twin looks up each distinct id once and repeats the rows, so its
optimizer gets each row's gradient summed over its duplicates, as an
Embedding Variable's is. Key k of the sok-ev table starts at matrix[k]
(DeepRec's default_value_dim rule), so both start equal.
"""
import numpy as np
import tensorflow as tf

OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.2),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.3, initial_accumulator_value=0.2),
    "adam": lambda: tf.keras.optimizers.Adam(0.05, beta_1=0.8, beta_2=0.9, epsilon=1e-6),
    "ftrl": lambda: tf.keras.optimizers.Ftrl(0.2, l1_regularization_strength=0.01),
}
# Keras moves rows of a dense variable outside the batch under these (their
# moments decay), sok-ev does not (lazy, as DeepRec): their batches look up
# every row.
NOT_LAZY_ON_DENSE = ("adam", "ftrl")
# Input kinds and their combiners (None: one row per id).
COMBINER = {"dense": None, "dense_pooled": "sum", "ragged": "sqrtn", "sparse": "mean"}


def batches(rng, kind, id_dtype, steps, batch, n_rows, hotness=3, cover_all=False, leave_out=0):
    """`steps` batches ((ids, weights), y): row 0 holds a duplicate id, ragged
  and sparse ones an empty middle row and an empty last row; with cover_all
  every id in [0, n_rows) appears in every batch, else ids are drawn from
  [0, n_rows - leave_out)."""
    drawn = n_rows - leave_out
    out = []
    for _ in range(steps):
        if kind.startswith("dense"):
            if cover_all:
                extra = rng.integers(0, n_rows, size=batch * hotness - n_rows)
                ids = rng.permutation(np.concatenate([np.arange(n_rows), extra]))
                ids = ids.reshape(batch, hotness)
            else:
                ids = rng.integers(0, drawn, size=(batch, hotness))
                ids[0, 1] = ids[0, 0]
            weights = rng.uniform(0.25, 2.0, size=ids.shape).astype(np.float32)
            x = (tf.constant(ids.astype(id_dtype)), tf.constant(weights))
        else:
            lengths = rng.integers(1, hotness + 1, size=batch)
            lengths[0] = max(lengths[0], 2)
            lengths[rng.integers(1, batch - 1)] = 0
            lengths[-1] = 0
            rows = [list(rng.integers(0, drawn, size=n)) for n in lengths]
            rows[0][1] = rows[0][0]
            if cover_all:
                rows[0].extend(range(n_rows))
            lengths = tf.constant([len(r) for r in rows], tf.int64)
            flat = np.concatenate([np.array(r, np.int64) for r in rows]).astype(id_dtype)
            weights = rng.uniform(0.25, 2.0, size=len(flat)).astype(np.float32)
            x = (tf.RaggedTensor.from_row_lengths(flat, lengths),
                 tf.RaggedTensor.from_row_lengths(weights, lengths))
            if kind == "sparse":
                x = tuple(t.to_sparse() for t in x)
        y = tf.constant(rng.normal(size=(batch, 1)).astype(np.float32))
        out.append((x, y))
    return out


def as_dataset(batch_list):
    """A tf.data.Dataset yielding `batch_list` in order."""
    spec = tf.nest.map_structure(tf.type_spec_from_value, batch_list[0])
    spec = tf.nest.map_structure(_unknown_batch, spec)
    dataset = tf.data.Dataset.from_generator(lambda: iter(batch_list), output_signature=spec)
    return dataset.apply(tf.data.experimental.assert_cardinality(len(batch_list)))


def _unknown_batch(spec):
    if isinstance(spec, tf.TensorSpec):
        return tf.TensorSpec([None] + spec.shape.as_list()[1:], spec.dtype)
    if isinstance(spec, tf.RaggedTensorSpec):
        return tf.RaggedTensorSpec([None, None],
                                   spec.dtype,
                                   ragged_rank=1,
                                   row_splits_dtype=tf.int64)
    return tf.SparseTensorSpec([None, None], spec.dtype)


class DenseTwin(tf.keras.layers.Layer):
    """keras.layers.Embedding holding `matrix`, pooled with the combiners of
  tf.nn.embedding_lookup_sparse (empty rows give zeros)."""

    def __init__(self, matrix, combiner=None, **kwargs):
        super().__init__(**kwargs)
        # As sok-ev's layers: XLA has no kernels for the ragged ops below, and
        # on a GPU compile(jit_compile="auto") would otherwise choose XLA.
        self.supports_jit = False
        self.combiner = combiner
        self.embedding = tf.keras.layers.Embedding(
            matrix.shape[0],
            matrix.shape[1],
            embeddings_initializer=tf.keras.initializers.Constant(matrix))

    def _rows(self, ids):
        unique, position = tf.unique(tf.reshape(ids, [-1]))
        rows = tf.gather(self.embedding(unique), position)
        dim = self.embedding.output_dim
        rows = tf.reshape(rows, tf.concat([tf.shape(ids), [dim]], 0))
        rows.set_shape(ids.shape.concatenate([dim]))
        return rows

    def call(self, ids, weights=None):
        if isinstance(ids, tf.SparseTensor):
            ids = tf.RaggedTensor.from_sparse(ids)
            weights = None if weights is None else tf.RaggedTensor.from_sparse(weights)
        if isinstance(ids, tf.RaggedTensor):
            if weights is None:
                weights = tf.ones_like(ids, tf.float32)
            rows = ids.with_flat_values(self._rows(ids.flat_values))
            weights = weights.with_flat_values(weights.flat_values[:, None])
        else:
            rows = self._rows(ids)
            if self.combiner is None:
                return rows if weights is None else rows * weights[..., None]
            if weights is None:
                weights = tf.ones_like(ids, tf.float32)
            weights = weights[..., None]
        total = tf.reduce_sum(rows * weights, axis=1)
        if self.combiner == "mean":
            total = tf.math.divide_no_nan(total, tf.reduce_sum(weights, axis=1))
        elif self.combiner == "sqrtn":
            total = tf.math.divide_no_nan(total, tf.sqrt(tf.reduce_sum(weights * weights, axis=1)))
        return total

    def rows(self):
        return self.embedding.embeddings.numpy().copy()


class Tower(tf.keras.Model):
    """embedding -> flatten -> Dense(1) named 'head', from a given kernel."""

    def __init__(self, embedding, kernel):
        super().__init__()
        self.embedding = embedding
        self.flatten = tf.keras.layers.Flatten()
        self.head = tf.keras.layers.Dense(1,
                                          kernel_initializer=tf.keras.initializers.Constant(kernel),
                                          bias_initializer="zeros",
                                          name="head")

    def call(self, inputs):
        ids, weights = inputs
        return self.head(self.flatten(self.embedding(ids, weights)))


class History(tf.keras.callbacks.Callback):
    """After every callback step: the batch index Keras reports, the
  optimizer's iterations, the table's rows, the head's kernel and the loss."""

    def __init__(self, read_rows):
        super().__init__()
        self.read_rows = read_rows
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(
            dict(batch=batch,
                 iterations=int(self.model.optimizer.iterations.numpy()),
                 rows=self.read_rows(),
                 kernel=self.model.get_layer("head").kernel.numpy().copy(),
                 loss=float(logs["loss"])))


def sok_layer(sok_ev, matrix, combiner=None, key_dtype=tf.int64, name=None):
    """A sok_ev.keras.Embedding whose key k starts at matrix[k]."""
    option = sok_ev.EmbeddingVariableOption(init_option=sok_ev.InitializerOption(
        default_value_dim=matrix.shape[0]))
    return sok_ev.keras.Embedding(matrix.shape[1],
                                  combiner=combiner,
                                  key_dtype=key_dtype,
                                  initializer=tf.constant_initializer(matrix),
                                  ev_option=option,
                                  name=name)


def table_rows(layer, n_rows):
    """Rows 0..n_rows-1 of a sok-ev layer's table (absent keys read their
  initial value without being inserted)."""
    return layer.embedding_variable.sparse_read(tf.range(n_rows, dtype=layer.key_dtype)).numpy()


def random_matrix(rng, n_rows, dim):
    return rng.normal(size=(n_rows, dim)).astype(np.float32)
