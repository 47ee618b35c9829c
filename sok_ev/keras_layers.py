"""Keras layers holding Embedding Variables: `sok_ev.keras`.

  layer = sok_ev.keras.Embedding(16, combiner="mean", name="item")
  pooled = layer(ragged_ids)                      # [batch, 16]
  model.compile(optimizer=keras.optimizers.Adagrad(0.1), loss="mse")
  model.fit(dataset)

`Embedding` holds one Embedding Variable (no input_dim: the table grows as
ids arrive); `GroupedEmbedding` looks up many of them in one
`sok_ev.lookup_sparse` call.

The layers are layers of whichever Keras `tf.keras` is: Keras 3 (TF 2.21's
default, also `import keras`), or legacy Keras 2 (`tf_keras`) when
TF_USE_LEGACY_KERAS=1 was set before TensorFlow was imported. Under
tf_keras, the layer's table is a tracked tf.Variable attribute, so it is in
the layer's `trainable_weights` (and `non_trainable_weights` when frozen) as
tf_keras does for its own variables; its `train_step` calls
`optimizer.minimize`, whose `apply_gradients` the same hook serves. tf_keras
saves the tables with `model.save_weights(path)` in the TensorFlow format
(a path not ending in `.h5`), `model.save(directory)` (a SavedModel that
`tf.keras.models.load_model` reads back with its tables) or
`tf.train.Checkpoint(model=model)`. Its HDF5 formats read every weight as a
dense array: `save_weights` / `load_weights` of an `.h5` path (or
save_format='h5'), and `model.save` of one, with such a layer in the model
raise ValueError naming the layer and those alternatives, before the file
is touched.

How `fit` trains the tables: Keras 3's `train_step` differentiates the loss
with respect to `model.trainable_weights` and hands the pairs to
`optimizer.apply_gradients`. These layers add their Embedding Variable to
their `weights` (so to the model's `trainable_weights`), and nothing else:
`variables`, `trainable_variables` and Keras's own weight saving keep only
`keras.Variable`s, so the optimizer never builds dense slots for a table.
The gradient of a table is tf.IndexedSlices keyed by raw ids, and
`sok_ev.keras_optimizers`'s hook on `Optimizer.apply` (installed when a layer
is created, as by `sok_ev.init()`) updates it with the fused kernel and leaves
the dense weights to Keras. SGD, Adagrad, Adam, AdamW, Ftrl and RMSprop are supported; any
other optimizer raises at the first training step, naming the optimizer and
the table (`<layer name>/embeddings`), before anything changes.

`model.get_weights()` / `set_weights()` (and callbacks built on them, such
as EarlyStopping(restore_best_weights=True)) do not work with these layers
in a model: a table has no dense value.

Lookups in `evaluate` and `predict` insert unseen ids with their initial
values, as every sok-ev lookup does (it changes no trained row, but grows
the table and counts the ids in a feature filter's frequencies).

Saving (one worker): `tf.train.Checkpoint(model=model)` saves each table
with its slots (the table is a tracked attribute; `sok_ev.init()` must have
run, as for every checkpoint of an Embedding Variable), and
`model.save_weights` / `load_weights` write and read the whole table through
`save_own_variables` / `load_own_variables`. Keras restores an optimizer's
own variables (`iterations`, dense slots) only once the optimizer is built:
`model.optimizer.build(model.trainable_variables)` before `load_weights`.
`get_config` is refused, so `model.save("m.keras")` of a functional or
Sequential model raises NotImplementedError naming those alternatives.

The layers refuse XLA (`supports_jit = False`): the lookups are custom ops,
so with them in a model `compile(jit_compile="auto")` resolves to False, and
`jit_compile=True` falls back to False with Keras's warning.
"""

import numbers
from typing import List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from sok_ev import communication
from sok_ev import keras_optimizers
from sok_ev.keras_horovod import BroadcastGlobalVariablesCallback
from sok_ev.keras_horovod import DistributedOptimizer
from sok_ev import lookup as lookup_lib
from sok_ev.embedding_variable import MAX_EMBEDDING_DIM
from sok_ev.embedding_variable import get_embedding_variable

COMBINERS = lookup_lib.COMBINERS

# The Keras the layers belong to: tf.keras (Keras 3, or tf_keras under
# TF_USE_LEGACY_KERAS=1, read when TensorFlow was imported).
_LEGACY_KERAS = keras_optimizers.legacy_keras()
_Layer = tf.keras.layers.Layer

# What saves the tables of a model, in the refusals' messages.
_SAVE_INSTEAD = ("model.save_weights('<path without .h5>') (TensorFlow format), "
                 "model.save('<directory>') or tf.train.Checkpoint(model=model)" if _LEGACY_KERAS
                 else "model.save_weights('*.weights.h5') or tf.train.Checkpoint(model=model)")
_HDF5_SUFFIXES = (".h5", ".hdf5", ".keras")

# What save_weights stores of a table: export_full()'s outputs, in order.
_TABLE_ENTRIES = ("table_keys", "table_rows", "table_frequencies", "table_versions",
                  "table_slot_names", "table_slot_initial_values")


def _check_int(layer, argument, value, low, high=None):
    if (not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low or
        (high is not None and value > high)):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{layer}: {argument} must be an integer {bound}, got {value!r}")


class _Batch:
    """One table's ids as lookup_sparse takes them, and how to shape its
  result: `ids` a rank-2 RaggedTensor or SparseTensor, `weights` the same
  kind or None, `combiner` the lookup's, `finish(rows)` the layer's output
  from lookup_sparse's `[rows, dim]` result."""

    def __init__(self, ids, weights, combiner, finish):
        self.ids, self.weights, self.combiner, self.finish = ids, weights, combiner, finish


class Embedding(_Layer):
    """A Keras layer holding one Embedding Variable.

  Shapes (`dim` = embedding_dim; every output is float32):
  * dense ids, any shape `S`: output `S + [dim]` (one row per id) without a
    combiner; with one, rank >= 2 ids are pooled over the last axis:
    `S[:-1] + [dim]` (every id counts, none is padding: rows of different
    lengths come as a ragged tensor).
  * `tf.RaggedTensor` `[batch, None]`: pooled to `[batch, dim]` with a
    combiner (an empty row gives zeros); without one, `[batch, None, dim]`
    (any ragged rank: one row per id).
  * `tf.SparseTensor` `[batch, max_hotness]` (rows in order): pooled to
    `[batch, dim]`; a combiner is required.
  Ids are int32 or int64: int32 ids are widened for an int64 table, int64
  ids for an int32 table are refused.

  `weights` (optional, float) has the ids' structure: the same shape (dense),
  the same row splits (ragged), the same indices (sparse). Each row is
  multiplied by its weight; 'mean' divides by the sum of the weights, 'sqrtn'
  by the root of the sum of their squares (tf.nn.embedding_lookup_sparse).

  Args:
    embedding_dim: int in [1, 65536], the length of each row.
    combiner: None, 'sum', 'mean' or 'sqrtn'.
    key_dtype: tf.int64 (default) or tf.int32, the table's key dtype.
    initializer: initializer of new rows (get_embedding_variable's; default
      truncated normal, mean 0, stddev 1).
    ev_option: a sok_ev.EmbeddingVariableOption (filters, eviction, DeepRec's
      default_value_dim).
    target_gpu: -1 shards the table over every worker; k keeps it on worker k.
    name: the layer's name (Keras's unique default otherwise); the table is
      named `<name>/embeddings`.
    **kwargs: other keras.layers.Layer arguments (e.g. trainable).

  Raises:
    ValueError: embedding_dim not an integer in [1, 65536], an unknown
      combiner, a bad target_gpu or an unsupported ev_option.
    TypeError: a key_dtype other than int32/int64, or a bad initializer.
  """

    def __init__(self,
                 embedding_dim: int,
                 combiner: Optional[str] = None,
                 key_dtype: tf.DType = tf.int64,
                 initializer=None,
                 ev_option=None,
                 target_gpu: int = -1,
                 name: Optional[str] = None,
                 **kwargs):
        super().__init__(name=name, **kwargs)
        what = f"sok_ev.keras.Embedding('{self.name}')"
        _check_int(what, "embedding_dim", embedding_dim, 1, MAX_EMBEDDING_DIM)
        if combiner is not None and combiner not in COMBINERS:
            raise ValueError(f"{what}: combiner must be None or one of {COMBINERS}, "
                             f"got {combiner!r}")
        self.embedding_dim = int(embedding_dim)
        self.combiner = combiner
        # The lookups are custom ops XLA cannot compile.
        self.supports_jit = False
        # Eager, whatever graph the layer is made in: the table outlives traces.
        with tf.init_scope():
            variable = get_embedding_variable(f"{self.name}/embeddings",
                                              embedding_dim=self.embedding_dim,
                                              key_dtype=key_dtype,
                                              initializer=initializer,
                                              ev_option=ev_option,
                                              target_gpu=target_gpu)
        # Tracked by TensorFlow (tf.train.Checkpoint), not by Keras's tracker,
        # which only takes keras.Variables.
        self.embedding_variable = variable
        # Keras reads `regularizer` of every trainable weight (the model's
        # regularization losses); a table has none.
        variable.regularizer = None
        keras_optimizers.install_keras_optimizer_hook()
        if _LEGACY_KERAS:
            _install_hdf5_weights_guard()

    @property
    def key_dtype(self) -> tf.DType:
        """tf.int32 or tf.int64: the table's key dtype."""
        return self.embedding_variable.key_dtype

    @property
    def weights(self):
        """Keras's weights, then the Embedding Variable while the layer is
    trainable: Keras 3's train_step takes gradients for the model's
    trainable_weights, which are read from here. (Keras freezes a layer by
    marking its variables untrainable; a table's `trainable` is fixed, so a
    frozen layer leaves it out instead.)"""
        # tf_keras tracks the table itself (a tf.Variable attribute).
        if _LEGACY_KERAS or not self.trainable:
            return super().weights
        return super().weights + [self.embedding_variable]

    def get_weights(self):
        raise TypeError(f"sok_ev.keras.Embedding('{self.name}') has no dense weights to get: "
                        "read its table with layer.embedding_variable.export(), save it with "
                        "tf.train.Checkpoint or model.save_weights.")

    def set_weights(self, weights):
        raise TypeError(f"sok_ev.keras.Embedding('{self.name}') has no dense weights to set: "
                        "restore its table with tf.train.Checkpoint or model.load_weights.")

    def call(self, ids, weights=None):
        """Looks up `ids` (see the class docstring for shapes).

    Raises:
      TypeError: ids that are not int32/int64 (or int64 for an int32 table),
        weights that are not float or of another kind than the ids.
      ValueError: sparse ids without a combiner, pooled ids of the wrong
        rank, weights of another static shape than the ids.
      tf.errors.InvalidArgumentError: at run time, before any table changes:
        weights whose shape (dense), row splits (ragged) or indices (sparse)
        differ from the ids'.
    """
        batch = self._batch(ids, weights)
        rows = lookup_lib.lookup_sparse([self.embedding_variable], [batch.ids], [batch.combiner],
                                        [batch.weights])[0]
        return batch.finish(rows)

    def compute_output_spec(self, ids, weights=None):
        """Symbolic calls (functional models) trace `call`."""
        del weights
        if isinstance(ids, keras.KerasTensor):
            shape = list(ids.shape)
            if self.combiner is None:
                shape = shape + [self.embedding_dim]
            else:
                shape = shape[:-1] + [self.embedding_dim]
            return keras.KerasTensor(shape, dtype="float32")
        return super().compute_output_spec(ids)

    def _batch(self, ids, weights):
        """The `_Batch` of `ids` and `weights`, checked."""
        what = f"sok_ev.keras.Embedding('{self.name}')"
        ids = self._as_keys(ids, what)
        if weights is not None:
            weights = _check_weights(ids, weights, what)
        combiner = self.combiner
        dim = self.embedding_dim
        if isinstance(ids, tf.SparseTensor):
            if combiner is None:
                raise ValueError(f"{what}: tf.SparseTensor ids are pooled and need a combiner "
                                 f"(one of {COMBINERS}), got combiner=None; pass a "
                                 "tf.RaggedTensor for one row per id")
            rank = ids.shape.rank
            if rank is not None and rank != 2:
                raise ValueError(f"{what}: tf.SparseTensor ids must have rank 2 "
                                 f"([batch, max_hotness]), got shape {ids.shape}")
            return _Batch(ids, weights, combiner, lambda rows: rows)
        if isinstance(ids, tf.RaggedTensor):
            if combiner is None:
                flat = ids.flat_values
                flat_weights = None if weights is None else weights.flat_values
                return _Batch(_one_per_row(flat), _one_per_row(flat_weights), "sum",
                              lambda rows: ids.with_flat_values(rows))
            if ids.ragged_rank != 1 or ids.shape.rank != 2:
                raise ValueError(f"{what}: pooled tf.RaggedTensor ids must have shape "
                                 f"[batch, None], got shape {ids.shape}")
            return _Batch(ids, weights, combiner, lambda rows: rows)
        shape = tf.shape(ids, out_type=tf.int64)
        if combiner is None:
            flat = tf.reshape(ids, [-1])
            flat_weights = None if weights is None else tf.reshape(weights, [-1])

            def finish(rows):
                out = tf.reshape(rows, tf.concat([shape, [dim]], 0))
                out.set_shape(ids.shape.concatenate([dim]))
                return out

            return _Batch(_one_per_row(flat), _one_per_row(flat_weights), "sum", finish)
        if ids.shape.rank is not None and ids.shape.rank < 2:
            raise ValueError(f"{what}: with combiner={combiner!r} dense ids are pooled over "
                             f"their last axis and must have rank >= 2, got shape {ids.shape}")
        hotness = shape[-1]
        rows_of = lambda t: tf.RaggedTensor.from_tensor(tf.reshape(t, tf.stack([-1, hotness])))

        def finish_pooled(rows):
            out = tf.reshape(rows, tf.concat([shape[:-1], [dim]], 0))
            out.set_shape(ids.shape[:-1].concatenate([dim]))
            return out

        return _Batch(rows_of(ids), None if weights is None else rows_of(weights), combiner,
                      finish_pooled)

    def _as_keys(self, ids, what):
        """`ids` with the table's key dtype (int32 widened to int64)."""
        if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
            ids = tf.convert_to_tensor(ids)
        if ids.dtype == self.key_dtype:
            return ids
        if ids.dtype == tf.int32 and self.key_dtype == tf.int64:
            if isinstance(ids, tf.SparseTensor):
                return tf.SparseTensor(ids.indices, tf.cast(ids.values, tf.int64), ids.dense_shape)
            return tf.cast(ids, tf.int64)
        raise TypeError(f"{what}: ids must be int32 or int64 (int32 for a key_dtype=int32 "
                        f"table), got {ids.dtype.name}; for a functional model use "
                        f"keras.Input(..., dtype='{self.key_dtype.name}')")

    def save_own_variables(self, store):
        """Writes the whole table to a Keras weights store (`save_weights`):
    keys, rows with the optimizers' slot columns, frequencies, versions,
    slot names and initial values, as `export_full()` returns them.

    Raises:
      NotImplementedError: with several workers (each holds one shard); use
        tf.train.Checkpoint, which saves every shard.
    """
        super().save_own_variables(store)
        if communication.world_size() > 1:
            raise NotImplementedError(
                f"sok_ev.keras.Embedding('{self.name}'): model.save_weights saves one worker's "
                "shard only; save the model with tf.train.Checkpoint(model=model) on every "
                "worker instead.")
        exported = [t.numpy() for t in self.embedding_variable.export_full()]
        # Keras's stores take numbers only: the slot names go as the bytes of
        # their newline-joined text.
        exported[4] = np.frombuffer(b"\n".join(exported[4]), dtype=np.uint8)
        for entry, value in zip(_TABLE_ENTRIES, exported):
            store[entry] = value

    def load_own_variables(self, store):
        """Replaces the table with what save_own_variables wrote.

    Raises:
      ValueError: the store holds no table for this layer (e.g. weights saved
        from another kind of layer), before the table changes.
    """
        missing = [entry for entry in _TABLE_ENTRIES if entry not in store.keys()]
        if missing:
            raise ValueError(f"sok_ev.keras.Embedding('{self.name}'): the weights file has no "
                             f"table for this layer (missing {missing}); it was not saved from "
                             "a sok_ev.keras.Embedding layer at this place in the model.")
        values = [np.asarray(store[entry]) for entry in _TABLE_ENTRIES]
        text = values[4].astype(np.uint8).tobytes()
        values[4] = np.array(text.split(b"\n") if text else [], dtype=object)
        self.embedding_variable.import_full(*values)

    def get_config(self):
        """Refused: a model holding the layer cannot be saved whole.

    Raises:
      NotImplementedError: always, naming what saves the model instead.
    """
        raise NotImplementedError(
            f"sok_ev.keras.Embedding('{self.name}') cannot be serialized (model.save('*.keras'), "
            "get_config, clone_model): its table's initializer and options have no Keras "
            f"config. Rebuild the model in code and save its state with {_SAVE_INSTEAD}.")


def _tables_of(model) -> List[str]:
    """Names of the sok_ev.keras.Embedding layers in `model`, nested ones included."""
    layers = model._flatten_layers(include_self=False)  # pylint: disable=protected-access
    return [layer.name for layer in layers if isinstance(layer, Embedding)]


def _install_hdf5_weights_guard():
    """tf_keras: Model.save, save_weights and load_weights of an HDF5 path
  refuse a model holding tables (tf_keras would read each table as a dense
  array and fail half way, leaving a partial file) before the file is
  touched."""
    model_class = tf.keras.Model
    if getattr(model_class.save_weights, "_sok_ev_guard", False):
        return

    def guarded(method, verb):

        def run(self, filepath, *args, **kwargs):
            save_format = kwargs.get("save_format")
            hdf5 = (str(save_format).lower() in ("h5", "hdf5", "keras")
                    if save_format else str(filepath).lower().endswith(_HDF5_SUFFIXES))
            tables = _tables_of(self) if hdf5 else []
            if tables:
                raise ValueError(
                    f"model.{verb}({str(filepath)!r}): an HDF5 or .keras file cannot hold the "
                    f"tables of sok_ev.keras.Embedding {tables} (a table has no dense value); "
                    f"use {_SAVE_INSTEAD}.")
            return method(self, filepath, *args, **kwargs)

        run._sok_ev_guard = True  # pylint: disable=protected-access
        run.__doc__ = method.__doc__
        return run

    for verb in ("save", "save_weights", "load_weights"):
        setattr(model_class, verb, guarded(getattr(model_class, verb), verb))


def _one_per_row(flat):
    """A RaggedTensor `[n, 1]` of a flat tensor `[n]`: one id per row, so a
  'sum' lookup returns each id's row (None stays None)."""
    if flat is None:
        return None
    return tf.RaggedTensor.from_tensor(tf.reshape(flat, [-1, 1]))


def _check_weights(ids, weights, what):
    """`weights` as a float tensor of the kind of `ids`, statically checked."""
    kinds = (tf.SparseTensor, tf.RaggedTensor)
    if not isinstance(weights, kinds):
        weights = tf.convert_to_tensor(weights)
    id_kind = next((k for k in kinds if isinstance(ids, k)), tf.Tensor)
    weight_kind = next((k for k in kinds if isinstance(weights, k)), tf.Tensor)
    if id_kind is not weight_kind:
        raise TypeError(f"{what}: weights must be a {id_kind.__name__} like the ids, got "
                        f"{weight_kind.__name__}")
    if not weights.dtype.is_floating:
        raise TypeError(f"{what}: weights must be float, got {weights.dtype.name}")
    if weights.dtype != tf.float32:
        weights = tf.cast(weights, tf.float32)
    if id_kind is tf.Tensor and not ids.shape.is_compatible_with(weights.shape):
        raise ValueError(f"{what}: weights must have the ids' shape {ids.shape}, got "
                         f"{weights.shape}")
    # lookup_sparse checks one weight per id, not which row each belongs to.
    message = f"{what}: weights must have the ids' " + {
        tf.Tensor: "shape",
        tf.RaggedTensor: "row splits",
        tf.SparseTensor: "indices"
    }[id_kind]
    if id_kind is tf.Tensor:
        checks = [(tf.shape(ids), tf.shape(weights))]
    elif id_kind is tf.RaggedTensor:
        checks = list(zip(ids.nested_row_splits, weights.nested_row_splits))
        if len(ids.nested_row_splits) != len(weights.nested_row_splits):
            raise ValueError(f"{message}: ids have ragged_rank {ids.ragged_rank}, weights "
                             f"{weights.ragged_rank}")
    else:
        checks = [(ids.indices, weights.indices), (ids.dense_shape, weights.dense_shape)]
    asserts = [tf.debugging.assert_equal(a, b, message=message) for a, b in checks]
    with tf.control_dependencies(asserts):
        return tf.nest.map_structure(tf.identity, weights, expand_composites=True)


class GroupedEmbedding(_Layer):
    """Many `Embedding` layers looked up in one `sok_ev.lookup_sparse` call.

  Each table's ids and weights are as its `Embedding` layer takes them, with
  the same output; the layers keep their tables (and their own `__call__`
  still works). The lookup is one `lookup_sparse` call, so with Horovod it
  is model parallel as `lookup_sparse` is (not yet tested under `fit` with
  several workers).

  Args:
    embeddings: a non-empty list of distinct sok_ev.keras.Embedding layers.
    name, **kwargs: keras.layers.Layer's.

  Raises:
    TypeError: embeddings not a list or tuple of sok_ev.keras.Embedding.
    ValueError: an empty list, or a layer listed twice.
  """

    def __init__(self, embeddings: Sequence[Embedding], name: Optional[str] = None, **kwargs):
        super().__init__(name=name, **kwargs)
        what = f"sok_ev.keras.GroupedEmbedding('{self.name}')"
        if not isinstance(embeddings, (list, tuple)):
            raise TypeError(f"{what}: embeddings must be a list of sok_ev.keras.Embedding, got "
                            f"{type(embeddings).__name__}")
        if not embeddings:
            raise ValueError(f"{what}: embeddings is empty; pass at least one "
                             "sok_ev.keras.Embedding")
        for i, layer in enumerate(embeddings):
            if not isinstance(layer, Embedding):
                raise TypeError(f"{what}: embeddings[{i}] must be a sok_ev.keras.Embedding, got "
                                f"{type(layer).__name__}")
            if any(other is layer for other in embeddings[:i]):
                raise ValueError(f"{what}: embeddings[{i}] ('{layer.name}') is listed twice")
        self.supports_jit = False
        self.embeddings = list(embeddings)

    def build(self, *args, **kwargs):
        # Nothing to build (the tables exist): without this Keras traces call()
        # to build the member layers, a lookup more at the first call.
        del args, kwargs
        self.built = True

    def call(self, ids: Sequence, weights: Optional[Sequence] = None) -> List[tf.Tensor]:
        """Looks up table t's `ids[t]` (weighted by `weights[t]`); returns the
    list of each Embedding layer's outputs.

    Raises:
      TypeError, ValueError: ids or weights not a list of one entry per
        table, or an entry its Embedding layer refuses (named there).
    """
        what = f"sok_ev.keras.GroupedEmbedding('{self.name}')"
        count = len(self.embeddings)
        ids = _as_entries(what, "ids", ids, count)
        weights = [None] * count if weights is None else _as_entries(what, "weights", weights,
                                                                     count)
        batches = [layer._batch(i, w) for layer, i, w in zip(self.embeddings, ids, weights)]  # pylint: disable=protected-access
        rows = lookup_lib.lookup_sparse([layer.embedding_variable for layer in self.embeddings],
                                        [b.ids for b in batches], [b.combiner for b in batches],
                                        [b.weights for b in batches])
        return [b.finish(r) for b, r in zip(batches, rows)]

    def compute_output_spec(self, ids, weights=None):
        del weights
        return [layer.compute_output_spec(i) for layer, i in zip(self.embeddings, ids)]


def _as_entries(what, argument, value, count):
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what}: {argument} must be a list of {count} (one per table), got "
                        f"{type(value).__name__}")
    if len(value) != count:
        raise ValueError(f"{what}: {argument} has {len(value)} entries but there are {count} "
                         "tables")
    return list(value)


__all__ = [
    "Embedding", "GroupedEmbedding", "COMBINERS", "DistributedOptimizer",
    "BroadcastGlobalVariablesCallback"
]
