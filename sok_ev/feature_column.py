"""DeepRec's feature columns over Embedding Variables, on stock TensorFlow.

`sok_ev.install_deeprec_api()` puts these on `tf.feature_column` and
`tf.compat.v1.feature_column` (and `group_embedding_lookup_sparse` on
`tf.nn` and `tf.compat.v1.nn`):

* `categorical_column_with_embedding(key, dtype=tf.string,
  partition_num=None, ev_option=None)`: ids whose keys index an Embedding
  Variable, no vocabulary or bucket count. As in DeepRec, a string id's key
  is `tf.strings.to_hash_bucket_fast(id, 2**63 - 1)` (int64: FarmHash
  Fingerprint64 modulo 2**63 - 1) and an integer id is its own key (int32
  ids make an int32-keyed table). Dense inputs drop -1 and "" as the stock
  columns do.
* `categorical_column_with_adaptive_embedding(key, hash_bucket_size,
  dtype=tf.string, partition_num=None, ev_option=None)`: the same keys, and
  beside the Embedding Variable a static `[hash_bucket_size, dimension]`
  variable; `input_layer`'s `adaptive_mask_tensors` say, id by id, which of
  the two it is read from (see the function).
* `embedding_column(categorical_column, dimension, combiner="mean",
  initializer=None, max_norm=None, trainable=True, ...)`: over such a
  column, an Embedding Variable named `embedding_weights` in the column's
  variable scope (`input_layer/<key>_embedding/embedding_weights`, as the
  dense variable of the stock column is named), looked up as
  `tf.nn.safe_embedding_lookup_sparse` (ids < 0 dropped, empty rows give
  zeros). Any other categorical column goes to TensorFlow's own
  `embedding_column`.
* `shared_embedding_columns(categorical_columns, dimension, ...)`: over
  such columns, one Embedding Variable shared by all, named `embedding_weights`
  under `shared_embedding_collection_name` (default: the sorted keys joined
  by "_" then "_shared_embedding") and kept in the graph collection of that
  name, as TensorFlow's v1 shared columns keep theirs. Other columns go to
  TensorFlow's own.
* tf_keras's `DenseFeatures` (TF_USE_LEGACY_KERAS=1) takes the embedding
  columns above (they are TensorFlow's v2 DenseColumns too): its build makes
  each column's Embedding Variable in the layer (`create_state`; shared
  columns share one per layer) and its call looks them up as `input_layer`
  does. An indicator (or other v2) column over a
  categorical_column_with_embedding one raises (`get_sparse_tensors`).
* `input_layer(features, feature_columns, weight_collections=None,
  trainable=True, cols_to_vars=None, cols_to_output_tensors=None)`: the v1
  input layer, `[batch, sum of column widths]` float32 in the columns'
  name order, as TensorFlow's. Columns made inside one
  `group_embedding_column_scope` are looked up together: every Embedding
  Variable column of the group in one `sok_ev.lookup_sparse` call.
* `group_embedding_column_scope(name=None)`: that context manager.
* `linear_model(features, feature_columns, units=1, sparse_combiner="sum",
  ...)`: TensorFlow's v1 linear_model (DeepRec's WDL builds its wide part
  with it, passing `do_fusion`), over TensorFlow's columns only.
* `group_embedding_lookup_sparse(params, sp_ids, combiners,
  sp_weights=None, partition_strategy="mod", is_sequence=False,
  params_num_per_group=..., name=None)`: Embedding Variables looked up in
  one `sok_ev.lookup_sparse` call; returns a list of `[batch, dim]`.

A column with `partition_num` N > 1 gets, as in DeepRec, a partitioned
Embedding Variable: N parts `embedding_weights/part_<i>` (sok_ev.
PartitionedEmbeddingVariable, what `get_embedding_variable(...,
partitioner=tf.fixed_size_partitioner(N))` makes), key k in part
(k mod 1000) mod N; its lookups and training equal one table's. Such a
column is looked up on its own, also inside a group_embedding_column_scope;
`DenseFeatures` holds its parts.

Refused with a ValueError naming the feature: DeepRec columns sok-ev does
not build (`REFUSED_FEATURES`), `partition_num` > 1 on an adaptive column,
`ckpt_to_load_from` on an Embedding Variable column, `max_norm` on a
grouped column, `is_sequence=True` and dense variables in
`group_embedding_lookup_sparse`.
Flags that only ask for an optimisation (`do_fusion`, `partition_strategy`,
`params_num_per_group`, `use_safe_embedding_lookup`) are accepted and change
nothing.
"""

import collections
import contextlib
import dataclasses
import math
import numbers
import sys
import threading
from typing import Dict, List, Optional

import tensorflow as tf
from tensorflow.python.feature_column import feature_column as _fc_v1
from tensorflow.python.feature_column import feature_column_v2 as _fc_v2

from sok_ev import embedding_variable
from sok_ev import keras_optimizers
from sok_ev import options
from sok_ev.lookup import lookup_sparse
from sok_ev.partitioned_variable import MAX_PARTITIONS, PartitionedEmbeddingVariable

# DeepRec's string ids hash into [0, 2**63 - 1): its bucket count is the
# largest int64.
STRING_KEY_BUCKETS = 2**63 - 1
_KEY_DTYPES = (tf.string, tf.int64, tf.int32)
_COMBINERS = ("sum", "mean", "sqrtn")

# TensorFlow's own functions, before install_deeprec_api() replaces them.
STOCK = {
    "embedding_column": tf.compat.v1.feature_column.embedding_column,
    "shared_embedding_columns": tf.compat.v1.feature_column.shared_embedding_columns,
    "input_layer": tf.compat.v1.feature_column.input_layer,
    "linear_model": tf.compat.v1.feature_column.linear_model,
}

# DeepRec's feature-column names sok-ev does not build -> what they are.
REFUSED_FEATURES = {
    "categorical_column_with_multi_hash_bucket": "multi-hash bucket columns",
    "weighted_categorical_column_with_multi_hash_bucket": "multi-hash bucket columns",
    "coalesced_embedding_scope": "coalesced (merged dense) embedding scopes",
}


def _refused(name, what):

    def refuse(*args, **kwargs):
        del args, kwargs
        raise ValueError(f"tf.feature_column.{name}: {what} is DeepRec's and sok-ev does not "
                         "build it yet; use categorical_column_with_embedding.")

    refuse.__name__ = name
    refuse.__doc__ = f"Refused: DeepRec's {what}, which sok-ev does not build (ValueError)."
    return refuse


REFUSED = {name: _refused(name, what) for name, what in REFUSED_FEATURES.items()}


def _check_ids_dtype(column_key, column_dtype, ids_dtype):
    """Raises ValueError unless ids of `ids_dtype` fit a column of
  `column_dtype` (strings for strings, integers for integers)."""
    if ids_dtype != tf.string and not ids_dtype.is_integer:
        raise ValueError(f"categorical_column_with_embedding('{column_key}'): ids must be "
                         f"strings or integers, got {ids_dtype.name}.")
    if (column_dtype == tf.string) != (ids_dtype == tf.string):
        raise ValueError(f"categorical_column_with_embedding('{column_key}'): the column's "
                         f"dtype is {column_dtype.name} but the ids are {ids_dtype.name}.")


class EmbeddingCategoricalColumn(
        _fc_v2.CategoricalColumn,
        _fc_v1._CategoricalColumn,  # pylint: disable=protected-access
        collections.namedtuple("EmbeddingCategoricalColumn",
                               ("key", "dtype", "partition_num", "ev_option"))):
    """See `categorical_column_with_embedding`.

  Its ids (`_get_sparse_tensors(...).id_tensor`) are a SparseTensor of the
  keys: int64 for string ids, the column's dtype for integer ones.
  """

    def __hash__(self):
        # Columns key dicts (cols_to_output_tensors); ev_option is mutable.
        return hash((self.key, self.dtype, self.partition_num))

    @property
    def _is_v2_column(self):
        return True

    @property
    def name(self):
        return self.key

    @property
    def key_dtype(self) -> tf.DType:
        """The dtype of the Embedding Variable's keys."""
        return tf.int64 if self.dtype == tf.string else self.dtype

    @property
    def parse_example_spec(self):
        return {self.key: tf.io.VarLenFeature(self.dtype)}

    @property
    def _parse_example_spec(self):
        return self.parse_example_spec

    def keys(self, ids: tf.SparseTensor) -> tf.SparseTensor:
        """The keys of `ids` (a SparseTensor of strings or integers).

    Raises:
      ValueError: ids of a kind the column does not take (names the column
        and both dtypes).
    """
        _check_ids_dtype(self.key, self.dtype, ids.dtype)
        if self.dtype == tf.string:
            values = tf.strings.to_hash_bucket_fast(ids.values, STRING_KEY_BUCKETS)
        else:
            values = tf.cast(ids.values, self.dtype)
        return tf.SparseTensor(ids.indices, values, ids.dense_shape)

    def transform_feature(self, transformation_cache, state_manager):
        ids = _fc_v2._to_sparse_input_and_drop_ignore_values(  # pylint: disable=protected-access
            transformation_cache.get(self.key, state_manager))
        return self.keys(ids)

    def _transform_feature(self, inputs):
        ids = _fc_v1._to_sparse_input_and_drop_ignore_values(inputs.get(self.key))  # pylint: disable=protected-access
        return self.keys(ids)

    @property
    def num_buckets(self):
        # As DeepRec: an Embedding Variable has no bucket count.
        return 1

    @property
    def _num_buckets(self):
        return 1

    def get_sparse_tensors(self, transformation_cache, state_manager):
        """Refused: the v2 column machinery (indicator_column, linear models,
    ...) would read the keys as ids of a one-bucket column; sok-ev's
    embedding columns read them through `transformation_cache.get(column)`.

    Raises:
      ValueError: always, naming the column.
    """
        del transformation_cache, state_manager
        raise ValueError(f"categorical_column_with_embedding('{self.key}') has no bucket count "
                         "to read its ids by; sok-ev reads such a column only through "
                         "embedding_column or shared_embedding_columns (optionally over "
                         "weighted_categorical_column).")

    def _get_sparse_tensors(self, inputs, weight_collections=None, trainable=None):
        del weight_collections, trainable
        return _fc_v2.CategoricalColumn.IdWeightPair(inputs.get(self), None)

    @property
    def parents(self):
        return [self.key]


def categorical_column_with_embedding(key: str,
                                      dtype=tf.string,
                                      partition_num: Optional[int] = None,
                                      ev_option: Optional[options.EmbeddingVariableOption] = None):
    """DeepRec's categorical column whose ids key an Embedding Variable.

  Args:
    key: the feature's name in the features dict, a non-empty string.
    dtype: tf.string (default), tf.int64 or tf.int32: the ids' kind. String
      ids become int64 keys `tf.strings.to_hash_bucket_fast(id, 2**63 - 1)`;
      integer ids are the keys.
    partition_num: None or 1 (one table), or N > 1 (at most 1024): DeepRec's
      partitioned Embedding Variable of N parts (see the module docstring).
      Either way sok-ev shards the table(s) over the workers itself.
    ev_option: a tf.EmbeddingVariableOption (filters, eviction, initializer
      option) for the column's Embedding Variable; default DeepRec's.

  Returns:
    An EmbeddingCategoricalColumn, for `embedding_column` or
    `shared_embedding_columns`.

  Raises:
    ValueError: an empty key, a dtype other than those three, or a
      partition_num that is not a whole number from 1 to 1024; each names
      the column and the value.
    TypeError: ev_option that is not an EmbeddingVariableOption.
  """
    if not isinstance(key, str) or not key:
        raise ValueError(f"categorical_column_with_embedding: key must be a non-empty string, "
                         f"got {key!r}.")
    try:
        dtype = tf.as_dtype(dtype)
    except TypeError as error:
        raise ValueError(f"categorical_column_with_embedding('{key}'): dtype {dtype!r} is not "
                         "a TensorFlow dtype; use tf.string, tf.int64 or tf.int32.") from error
    if dtype not in _KEY_DTYPES:
        raise ValueError(f"categorical_column_with_embedding('{key}'): dtype {dtype.name} is not "
                         "supported; use tf.string, tf.int64 or tf.int32.")
    if partition_num is not None and (isinstance(partition_num, bool) or
                                      not isinstance(partition_num, numbers.Integral) or
                                      not 1 <= partition_num <= MAX_PARTITIONS):
        raise ValueError(f"categorical_column_with_embedding('{key}'): partition_num="
                         f"{partition_num!r}: must be None or a whole number from 1 to "
                         f"{MAX_PARTITIONS} (the parts of its Embedding Variable).")
    if ev_option is None:
        ev_option = options.EmbeddingVariableOption()
    if not isinstance(ev_option, options.EmbeddingVariableOption):
        raise TypeError(f"categorical_column_with_embedding('{key}'): ev_option must be a "
                        f"tf.EmbeddingVariableOption, got {type(ev_option).__name__}.")
    return EmbeddingCategoricalColumn(key, dtype, partition_num, ev_option)


class AdaptiveEmbeddingCategoricalColumn(EmbeddingCategoricalColumn):
    """See `categorical_column_with_adaptive_embedding`: an
  EmbeddingCategoricalColumn whose `embedding_column` also holds a static
  `[hash_bucket_size, dimension]` variable, which `input_layer` reads for the
  ids its `adaptive_mask_tensors` mark 0."""

    def __new__(cls, key, dtype, partition_num, ev_option, hash_bucket_size):
        column = super().__new__(cls, key, dtype, partition_num, ev_option)
        column.hash_bucket_size = hash_bucket_size
        return column

    def __hash__(self):
        return hash((self.key, self.dtype, self.partition_num, self.hash_bucket_size))

    def __eq__(self, other):
        return (isinstance(other, AdaptiveEmbeddingCategoricalColumn) and
                tuple(self) == tuple(other) and self.hash_bucket_size == other.hash_bucket_size)

    def __ne__(self, other):
        return not self == other


def categorical_column_with_adaptive_embedding(
        key: str,
        hash_bucket_size: int,
        dtype=tf.string,
        partition_num: Optional[int] = None,
        ev_option: Optional[options.EmbeddingVariableOption] = None):
    """DeepRec's adaptive embedding column: an Embedding Variable beside a
  static hash-bucket variable.

  `input_layer(..., adaptive_mask_tensors={key: mask})` reads each id from
  the Embedding Variable where `mask` is 1 and from row `key mod
  hash_bucket_size` of the static variable where it is 0 (`mask`: int,
  one entry per value of the feature as fed: a SparseTensor's values, or a
  dense feature's entries in row-major order, whose "" and -1 are dropped
  with their mask entries; DeepRec's model zoo passes
  `tf.ones([batch_size], tf.int32)` for its `[batch_size]` features). A key new to the Embedding Variable starts from the
  static variable's initial row `key mod hash_bucket_size` (DeepRec copies
  the row as trained so far; the two agree while no id was read from the
  static variable, as with the model zoo's all-ones masks).

  Args:
    key, dtype, partition_num, ev_option: as
      `categorical_column_with_embedding` (the keys are the same).
    hash_bucket_size: rows of the static variable, a positive int.

  Returns:
    An AdaptiveEmbeddingCategoricalColumn, for `embedding_column`.

  Raises:
    ValueError: hash_bucket_size not a positive int, partition_num > 1, or
      the errors of `categorical_column_with_embedding`; each names the
      column and value.
  """
    column = categorical_column_with_embedding(key, dtype, partition_num, ev_option)
    if partition_num is not None and partition_num > 1:
        raise ValueError(f"categorical_column_with_adaptive_embedding('{key}'): partition_num="
                         f"{partition_num}: an adaptive column's Embedding Variable is one table "
                         "(use partition_num=None).")
    if (isinstance(hash_bucket_size, bool) or not isinstance(hash_bucket_size, int) or
            hash_bucket_size < 1):
        raise ValueError(f"categorical_column_with_adaptive_embedding('{key}'): hash_bucket_size "
                         f"must be a positive integer, got {hash_bucket_size!r}.")
    return AdaptiveEmbeddingCategoricalColumn(column.key, column.dtype, column.partition_num,
                                              column.ev_option, hash_bucket_size)


class _HashRows:
    """The initializer of an adaptive column's Embedding Variable: its
  `[hash_bucket_size, dim]` default-value matrix (a new key takes row `key
  mod hash_bucket_size`) is the static variable's initial value."""

    def __init__(self, hash_variable):
        self._hash_variable = hash_variable

    def __call__(self, shape, dtype=tf.float32, partition_info=None):
        del partition_info
        # Eagerly the static variable holds its initial value still (both are
        # made in one call); in a graph its initializer's output is read.
        value = (self._hash_variable.read_value()
                 if tf.executing_eagerly() else self._hash_variable.initial_value)
        if list(shape) != value.shape.as_list():
            raise ValueError(f"adaptive embedding: the static variable is {value.shape}, the "
                             f"Embedding Variable's default values {list(shape)}")
        return tf.cast(value, dtype)


def _ev_source(column) -> Optional[EmbeddingCategoricalColumn]:
    """The categorical_column_with_embedding column `column` reads keys from:
  itself, or the one a weighted_categorical_column wraps; None if `column`
  does not read one.

  Raises:
    ValueError: another column built on one (indicator, crossed, sequence
      ...), which TensorFlow's code would read as a one-bucket column.
  """
    if isinstance(column, EmbeddingCategoricalColumn):
        return column
    if isinstance(column, _fc_v2.WeightedCategoricalColumn):
        return _ev_source(column.categorical_column)
    pending = list(getattr(column, "parents", []))
    while pending:
        parent = pending.pop()
        if isinstance(parent, EmbeddingCategoricalColumn):
            raise ValueError(f"{type(column).__name__} '{column.name}' is built on "
                             f"categorical_column_with_embedding('{parent.key}'); sok-ev reads "
                             "such a column only through embedding_column or "
                             "shared_embedding_columns (optionally over "
                             "weighted_categorical_column).")
        pending.extend(getattr(parent, "parents", []))
    return None


# --------------------------------------------------------------------------- grouping

_groups = threading.local()


def _group_stack() -> List[str]:
    if not hasattr(_groups, "stack"):
        _groups.stack = []
    return _groups.stack


@contextlib.contextmanager
def group_embedding_column_scope(name: Optional[str] = None):
    """DeepRec's scope: Embedding Variable columns made inside it (by
  `embedding_column` or `shared_embedding_columns`) are looked up together
  by `input_layer`, in one `sok_ev.lookup_sparse` call per input layer.

  Args:
    name: the group's name (default "group_embedding", numbered from the
      second unnamed scope in a process on).

  Yields:
    The group's name.
  """
    if name is None:
        count = getattr(_groups, "unnamed", 0)
        _groups.unnamed = count + 1
        name = "group_embedding" if count == 0 else f"group_embedding_{count}"
    _group_stack().append(name)
    try:
        yield name
    finally:
        _group_stack().pop()


def _current_group() -> Optional[str]:
    stack = _group_stack()
    return stack[-1] if stack else None


# --------------------------------------------------------------------------- dense columns


def _with_global_variables(weight_collections) -> Optional[List[str]]:
    """`weight_collections` with GLOBAL_VARIABLES added (a variable given
  collections is in only those), or None when there are none."""
    collections_ = list(weight_collections or [])
    if collections_ and tf.compat.v1.GraphKeys.GLOBAL_VARIABLES not in collections_:
        collections_.append(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    return collections_ or None


class EmbeddingVariableColumn(
        _fc_v2.DenseColumn,
        _fc_v1._DenseColumn,  # pylint: disable=protected-access
        collections.namedtuple("EmbeddingVariableColumn",
                               ("categorical_column", "dimension", "combiner", "initializer",
                                "max_norm", "trainable", "shared_name", "group"))):
    """An embedding column over an EmbeddingCategoricalColumn, or over a
  weighted_categorical_column of one (see `embedding_column`, and
  `shared_embedding_columns` when `shared_name` is set). For the v1
  `input_layer` and Keras's `DenseFeatures` (tf_keras); output
  `[batch, dimension]` float32.

  In `DenseFeatures`, `create_state` makes the Embedding Variable,
  `<layer name>/<column name>/embedding_weights` (a shared column's under its
  first column's name; with partition_num N > 1, its N parts
  `.../embedding_weights/part_<i>`), and tracks it (its parts) as an
  attribute of the layer, so it is in the layer's `trainable_weights`
  (`non_trainable_weights` if the column or the layer is not trainable) and
  its checkpoints; shared columns share one Embedding Variable within one
  layer. `get_dense_tensor` looks it up as `_get_dense_tensor` does
  (`tf.nn.safe_embedding_lookup_sparse`, which sok-ev dispatches to
  `sok_ev.lookup_sparse`).
  """

    @property
    def source(self) -> EmbeddingCategoricalColumn:
        """The categorical_column_with_embedding column giving the keys."""
        return _ev_source(self.categorical_column)

    @property
    def adaptive(self) -> bool:
        """Whether the keys come from a categorical_column_with_adaptive_embedding."""
        return isinstance(self.source, AdaptiveEmbeddingCategoricalColumn)

    @property
    def partitioner(self):
        """DeepRec's partitioner of the Embedding Variable: a fixed-size one of
    the source column's partition_num parts, or None for one table."""
        parts = self.source.partition_num
        return tf.compat.v1.fixed_size_partitioner(parts) if parts and parts > 1 else None

    @property
    def name(self):
        suffix = "shared_embedding" if self.shared_name else "embedding"
        return f"{self.categorical_column.name}_{suffix}"

    @property
    def _var_scope_name(self):
        return self.shared_name or self.name

    @property
    def _is_v2_column(self):
        return bool(getattr(self.categorical_column, "_is_v2_column", False))

    @property
    def parse_example_spec(self):
        return self.categorical_column.parse_example_spec

    @property
    def _parse_example_spec(self):
        return self.categorical_column._parse_example_spec  # pylint: disable=protected-access

    def transform_feature(self, transformation_cache, state_manager):
        return transformation_cache.get(self.categorical_column, state_manager)

    def _transform_feature(self, inputs):
        return inputs.get(self.categorical_column)

    @property
    def variable_shape(self):
        return tf.TensorShape([self.dimension])

    @property
    def _variable_shape(self):
        return self.variable_shape

    def embedding_variable(self, weight_collections=None, trainable=True):
        """This column's Embedding Variable, created in the current variable
    scope (named `embedding_weights`) or, shared, found in the graph
    collection `shared_name`.

    Raises:
      ValueError: a shared variable of another embedding dimension or key
        dtype (names the column and both values; nothing is created).
    """
        if self.shared_name:
            existing = tf.compat.v1.get_collection(self.shared_name)
            if existing:
                return self._check_shared(existing)
        collections_ = _with_global_variables(weight_collections)
        variable = embedding_variable.get_embedding_variable("embedding_weights",
                                                             embedding_dim=self.dimension,
                                                             key_dtype=self.source.key_dtype,
                                                             initializer=self.initializer,
                                                             trainable=self.trainable and
                                                             trainable is not False,
                                                             collections=collections_,
                                                             ev_option=self.source.ev_option,
                                                             partitioner=self.partitioner)
        if self.shared_name:
            tf.compat.v1.add_to_collection(self.shared_name, variable)
        return variable

    def adaptive_variables(self, weight_collections=None, trainable=True):
        """An adaptive column's two variables, made in the current variable
    scope: the static `hash_embedding_weights` (`[hash_bucket_size,
    dimension]`, a tf.Variable drawn from the column's initializer), then the
    Embedding Variable `embedding_weights`, whose new keys start from the
    static variable's initial rows. Returns (Embedding Variable, static)."""
        source = self.source
        trainable = self.trainable and trainable is not False
        collections_ = _with_global_variables(weight_collections)
        hash_variable = tf.compat.v1.get_variable("hash_embedding_weights",
                                                  [source.hash_bucket_size, self.dimension],
                                                  tf.float32,
                                                  initializer=self.initializer,
                                                  trainable=trainable,
                                                  collections=collections_)
        init = source.ev_option.init_option
        ev_option = dataclasses.replace(
            source.ev_option,
            init_option=options.InitializerOption(
                initializer=_HashRows(hash_variable),
                default_value_dim=source.hash_bucket_size,
                default_value_no_permission=init.default_value_no_permission))
        variable = embedding_variable.get_embedding_variable("embedding_weights",
                                                             embedding_dim=self.dimension,
                                                             key_dtype=source.key_dtype,
                                                             trainable=trainable,
                                                             collections=collections_,
                                                             ev_option=ev_option)
        return variable, hash_variable

    def adaptive_dense_tensor(self, inputs, masks, weight_collections=None, trainable=None):
        """`[batch, dimension]` of an adaptive column: each sample's ids read
    from the Embedding Variable where `masks[key]` is 1 and from the static
    variable (row `key mod hash_bucket_size`) where it is 0, combined
    together by the column's combiner (ids < 0 dropped, as the safe lookup
    drops them; an empty row gives zeros).

    Raises:
      ValueError: no mask for the column, a mask that is not integer, or a
        weighted column (DeepRec's adaptive lookup takes no weights); each
        names the column. At run time, InvalidArgumentError: a mask whose
        size is not the number of ids, or an entry other than 0 and 1.
    """
        source = self.source
        where = f"input_layer: adaptive embedding column '{self.name}'"
        if self.categorical_column is not source:
            raise ValueError(f"{where} is weighted ({self.categorical_column.name}); DeepRec's "
                             "adaptive embedding takes no weights.")
        if masks is None or source.key not in masks:
            raise ValueError(f"{where} needs adaptive_mask_tensors['{source.key}']: one int "
                             "per id, 1 to read it from the Embedding Variable, 0 from the "
                             "static hash-bucket variable.")
        mask = tf.reshape(tf.convert_to_tensor(masks[source.key]), [-1])
        if not (mask.dtype.is_integer or mask.dtype == tf.bool):
            raise ValueError(f"{where}: adaptive_mask_tensors['{source.key}'] must be integer "
                             f"(0 or 1 per id), got {mask.dtype.name}.")
        mask = tf.cast(mask, tf.int32)
        # One entry per value as fed: a dense feature's every entry (its ""
        # and -1 are dropped with their mask entries), a SparseTensor's values.
        fed = inputs.get(source.key)
        fed_values = fed.values if isinstance(fed, tf.SparseTensor) else tf.reshape(fed, [-1])
        checks = [
            tf.debugging.assert_equal(
                tf.size(mask),
                tf.size(fed_values),
                message=f"{where}: adaptive_mask_tensors['{source.key}'] must hold one entry "
                "per id of the feature"),
            tf.debugging.assert_equal(tf.reduce_all(
                tf.logical_or(tf.equal(mask, 0), tf.equal(mask, 1))),
                                      True,
                                      message=f"{where}: adaptive_mask_tensors['{source.key}'] "
                                      "must hold only 0 and 1"),
        ]
        with tf.control_dependencies(checks):
            mask = tf.identity(mask)
        if not isinstance(fed, tf.SparseTensor):
            mask = tf.boolean_mask(
                mask, tf.not_equal(fed_values, "" if fed_values.dtype == tf.string else -1))
        ids = self.categorical_column._get_sparse_tensors(inputs).id_tensor  # pylint: disable=protected-access
        variable, hash_variable = self.adaptive_variables(weight_collections, trainable)
        kept = tf.greater_equal(ids.values, 0)
        from_table = tf.sparse.retain(ids, tf.logical_and(kept, tf.equal(mask, 1)))
        from_hash = tf.sparse.retain(ids, tf.logical_and(kept, tf.equal(mask, 0)))
        from_hash = tf.SparseTensor(
            from_hash.indices,
            tf.math.floormod(tf.cast(from_hash.values, tf.int64), source.hash_bucket_size),
            from_hash.dense_shape)
        total = tf.add(
            tf.nn.safe_embedding_lookup_sparse(variable,
                                               from_table,
                                               None,
                                               combiner="sum",
                                               max_norm=self.max_norm),
            tf.nn.safe_embedding_lookup_sparse(hash_variable,
                                               from_hash,
                                               None,
                                               combiner="sum",
                                               max_norm=self.max_norm))
        if self.combiner == "sum":
            return total
        counts = tf.math.unsorted_segment_sum(tf.cast(kept, tf.float32), ids.indices[:, 0],
                                              ids.dense_shape[0])
        if self.combiner == "sqrtn":
            counts = tf.sqrt(counts)
        return tf.math.divide_no_nan(total, counts[:, None])

    def _check_shared(self, existing):
        if len(existing) > 1:
            raise ValueError(f"shared_embedding_columns: collection '{self.shared_name}' holds "
                             f"{len(existing)} variables; it must hold only the shared one.")
        variable = existing[0]
        if not isinstance(variable,
                          (embedding_variable.EmbeddingVariable, PartitionedEmbeddingVariable)):
            raise ValueError(f"shared embedding column '{self.name}': collection "
                             f"'{self.shared_name}' holds {variable.name}, which is not an "
                             "Embedding Variable.")
        parts = len(variable) if isinstance(variable, PartitionedEmbeddingVariable) else 1
        if parts != (self.source.partition_num or 1):
            raise ValueError(f"shared embedding column '{self.name}': partition_num "
                             f"{self.source.partition_num} differs from the shared Embedding "
                             f"Variable {variable.name}'s {parts} part(s) (collection "
                             f"'{self.shared_name}').")
        if variable.embedding_dim != self.dimension:
            raise ValueError(f"shared embedding column '{self.name}': dimension {self.dimension} "
                             f"differs from the shared Embedding Variable {variable.name}'s "
                             f"{variable.embedding_dim} (collection '{self.shared_name}').")
        if variable.key_dtype != self.source.key_dtype:
            raise ValueError(f"shared embedding column '{self.name}': its keys are "
                             f"{self.source.key_dtype.name} but the shared Embedding "
                             f"Variable {variable.name} has {variable.key_dtype.name} keys.")
        return variable

    def sparse_keys(self, inputs):
        """The keys of this column's feature in `inputs` (a v1 _LazyBuilder),
    ids < 0 and weights <= 0 dropped as tf.nn.safe_embedding_lookup_sparse
    drops them, rows in order: (SparseTensor of keys, SparseTensor of
    weights or None)."""
        pair = self.categorical_column._get_sparse_tensors(inputs)  # pylint: disable=protected-access
        ids, weights = pair.id_tensor, pair.weight_tensor
        keep = tf.greater_equal(ids.values, 0)
        if weights is not None:
            keep = tf.logical_and(keep, tf.greater(weights.values, 0))
        ids = tf.sparse.reorder(tf.sparse.retain(ids, keep))
        if weights is not None:
            weights = tf.sparse.reorder(tf.sparse.retain(weights, keep))
        return ids, weights

    def _lookup(self, variable, pair):
        """`[batch, dimension]`: the combined rows of each sample's keys
    (`pair`, the categorical column's IdWeightPair), for `input_layer` and
    `DenseFeatures` alike."""
        return tf.nn.safe_embedding_lookup_sparse(variable,
                                                  pair.id_tensor,
                                                  pair.weight_tensor,
                                                  combiner=self.combiner,
                                                  max_norm=self.max_norm)

    def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
        """`[batch, dimension]`: the combined rows of each sample's keys."""
        if self.adaptive:
            raise ValueError(f"embedding column '{self.name}' is an adaptive embedding column: "
                             "read it with tf.feature_column.input_layer(..., "
                             "adaptive_mask_tensors=...) once sok_ev.install_deeprec_api() "
                             "has run.")
        # The ids first: ids of the wrong kind raise before a variable exists.
        pair = self.categorical_column._get_sparse_tensors(inputs)  # pylint: disable=protected-access
        variable = self.embedding_variable(weight_collections, trainable)
        return self._lookup(variable, pair)

    def create_state(self, state_manager):
        """Makes the column's Embedding Variable for a feature layer
    (`DenseFeatures`) and tracks it in the layer; a shared column finds the
    one an earlier column of its `shared_name` made for the same layer.

    Raises:
      ValueError: a state manager without a layer, a shared Embedding
        Variable of another dimension or key dtype (names both).
    """
        if self.adaptive:
            raise ValueError(f"embedding column '{self.name}': adaptive embedding columns are "
                             "read by input_layer (with adaptive_mask_tensors), not by a Keras "
                             "feature layer.")
        layer = getattr(state_manager, "_layer", None)
        if layer is None:
            raise ValueError(f"embedding column '{self.name}': its Embedding Variable is made "
                             "for a Keras feature layer (DenseFeatures); this state manager "
                             "has none.")
        tables = _layer_tables(layer)
        if self.shared_name and self.shared_name in tables:
            variable = self._check_shared([tables[self.shared_name]])
        else:
            trainable = self.trainable and bool(getattr(state_manager, "_trainable", True))
            # `<layer>/<column>/` (the scope the layer builds its columns in).
            scope = tf.compat.v1.get_variable_scope().name or tf.get_current_name_scope()
            named = tf.name_scope(scope + "/") if scope else contextlib.nullcontext()
            # Eager, whatever graph the layer is built in: the table outlives
            # traces (as sok_ev.keras.Embedding's).
            with tf.init_scope(), named:
                variable = embedding_variable.get_embedding_variable(
                    "embedding_weights",
                    embedding_dim=self.dimension,
                    key_dtype=self.source.key_dtype,
                    initializer=self.initializer,
                    trainable=trainable,
                    ev_option=self.source.ev_option,
                    partitioner=self.partitioner)
            parts = list(variable) if isinstance(variable,
                                                 PartitionedEmbeddingVariable) else [variable]
            # A table has no regularizer (Keras reads it of every weight).
            for part in parts:
                part.regularizer = None
            # tf_keras tracks a tf.Variable attribute (a list of them: a
            # partitioned variable's parts) in the layer's
            # (non_)trainable_weights and checkpoints.
            setattr(layer, _table_attribute(self._var_scope_name),
                    parts if len(parts) > 1 else variable)
            tables[self._var_scope_name] = variable
        state_manager.add_resource(self, "embedding_weights", variable)
        keras_optimizers.install_keras_optimizer_hook()

    def get_dense_tensor(self, transformation_cache, state_manager):
        """`[batch, dimension]`: the combined rows of each sample's keys, looked
    up in the Embedding Variable `create_state` made."""
        column = self.categorical_column
        if isinstance(column, EmbeddingCategoricalColumn):
            pair = _fc_v2.CategoricalColumn.IdWeightPair(
                transformation_cache.get(column, state_manager), None)
        else:  # a weighted_categorical_column of one: its (ids, weights)
            pair = column.get_sparse_tensors(transformation_cache, state_manager)
        variable = state_manager.get_resource(self, "embedding_weights")
        return self._lookup(variable, pair)

    def get_config(self):
        raise NotImplementedError(
            f"embedding column '{self.name}' over an Embedding Variable has no config (a "
            "feature layer holding it cannot be saved as a Keras config); save the model's "
            "weights with tf.train.Checkpoint or model.save_weights (TensorFlow format).")

    @classmethod
    def from_config(cls, config, custom_objects=None, columns_by_name=None):
        raise NotImplementedError("Embedding Variable columns are not made from a config.")

    @property
    def parents(self):
        return [self.categorical_column]


def _layer_tables(layer) -> Dict[str, object]:
    """{variable scope name: Embedding Variable} made for `layer`'s columns."""
    tables = layer.__dict__.get("_sok_ev_column_tables")
    if tables is None:
        tables = {}
        # Plain dict in __dict__: not a Keras-tracked attribute.
        object.__setattr__(layer, "_sok_ev_column_tables", tables)
    return tables


def _table_attribute(scope_name: str) -> str:
    return "sok_ev_" + "".join(c if c.isalnum() or c == "_" else "_" for c in scope_name)


# Optimisation flags of DeepRec's embedding columns: accepted, change nothing.
_OPTIMISATION_FLAGS = ("do_fusion", "use_safe_embedding_lookup", "coalesced_scope")


def _default_initializer(dimension):
    # TensorFlow's and DeepRec's embedding_column default.
    return tf.compat.v1.truncated_normal_initializer(mean=0.0, stddev=1 / math.sqrt(dimension))


def _check_dense_arguments(where, dimension, combiner, initializer, ckpt_to_load_from):
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        raise ValueError(f"{where}: dimension must be a positive integer, got {dimension!r}.")
    if combiner not in _COMBINERS:
        raise ValueError(f"{where}: combiner {combiner!r} is not one of {_COMBINERS}.")
    if initializer is not None and not callable(initializer):
        raise ValueError(f"{where}: initializer {initializer!r} is not callable.")
    if ckpt_to_load_from is not None:
        raise ValueError(f"{where}: ckpt_to_load_from={ckpt_to_load_from!r} is not built for "
                         "Embedding Variable columns; use tf.compat.v1.train.init_from_checkpoint "
                         "(sok_ev.warm_start) on the Embedding Variable.")


def _check_flags(where, flags):
    unknown = sorted(set(flags) - set(_OPTIMISATION_FLAGS))
    if unknown:
        raise ValueError(f"{where}: argument {unknown[0]}={flags[unknown[0]]!r} is not built by "
                         "sok-ev.")


def embedding_column(categorical_column,
                     dimension,
                     combiner="mean",
                     initializer=None,
                     ckpt_to_load_from=None,
                     tensor_name_in_ckpt=None,
                     max_norm=None,
                     trainable=True,
                     **flags):
    """DeepRec's `tf.feature_column.embedding_column`.

  Over a `categorical_column_with_embedding` column (or a
  weighted_categorical_column of one: its weights weigh the combination): an
  EmbeddingVariableColumn (see the module docstring), in the current
  `group_embedding_column_scope` if any. Over any other categorical column:
  TensorFlow's own embedding_column, unchanged.

  Args:
    categorical_column: the column whose ids are looked up.
    dimension: the embedding dimension, a positive int.
    combiner: "mean" (default), "sum" or "sqrtn".
    initializer: initializer of new rows; default truncated normal with
      stddev 1/sqrt(dimension), as TensorFlow's.
    ckpt_to_load_from, tensor_name_in_ckpt: TensorFlow's; not built for an
      Embedding Variable column (ValueError).
    max_norm: None, or clip each row to this L2 norm before combining.
    trainable: whether optimizers update the Embedding Variable.
    **flags: DeepRec's optimisation flags (do_fusion,
      use_safe_embedding_lookup, coalesced_scope): accepted, change nothing.

  Returns:
    A _DenseColumn for `input_layer`.

  Raises:
    ValueError: a bad dimension, combiner or initializer, ckpt_to_load_from
      on an Embedding Variable column, an unknown argument, or another
      column built on a categorical_column_with_embedding one (each names
      the column and the value).
  """
    if _ev_source(categorical_column) is None:
        # Only TensorFlow's own arguments reach TensorFlow's function.
        stock_flags = {k: v for k, v in flags.items() if k == "use_safe_embedding_lookup"}
        _check_flags("embedding_column", flags)
        return STOCK["embedding_column"](categorical_column,
                                         dimension,
                                         combiner=combiner,
                                         initializer=initializer,
                                         ckpt_to_load_from=ckpt_to_load_from,
                                         tensor_name_in_ckpt=tensor_name_in_ckpt,
                                         max_norm=max_norm,
                                         trainable=trainable,
                                         **stock_flags)
    where = f"embedding_column('{categorical_column.name}')"
    _check_flags(where, flags)
    _check_dense_arguments(where, dimension, combiner, initializer, ckpt_to_load_from)
    return EmbeddingVariableColumn(categorical_column, dimension, combiner, initializer or
                                   _default_initializer(dimension), max_norm, trainable, None,
                                   _current_group())


def shared_embedding_columns(categorical_columns,
                             dimension,
                             combiner="mean",
                             initializer=None,
                             shared_embedding_collection_name=None,
                             ckpt_to_load_from=None,
                             tensor_name_in_ckpt=None,
                             max_norm=None,
                             trainable=True,
                             **flags):
    """DeepRec's `tf.feature_column.shared_embedding_columns` (v1).

  Over `categorical_column_with_embedding` columns: one
  EmbeddingVariableColumn per column, all sharing one Embedding Variable
  (see the module docstring). Over other columns: TensorFlow's own.

  Raises:
    ValueError: Embedding Variable columns mixed with other columns, columns
      whose keys differ in dtype, or the errors of `embedding_column`; each
      names the columns and values. A shared variable that already exists
      with another dimension raises at `input_layer`, before anything is
      created.
  """
    categorical_columns = list(categorical_columns)
    ev_columns = [c for c in categorical_columns if _ev_source(c) is not None]
    if not ev_columns:
        _check_flags("shared_embedding_columns", flags)
        return STOCK["shared_embedding_columns"](
            categorical_columns,
            dimension,
            combiner=combiner,
            initializer=initializer,
            shared_embedding_collection_name=shared_embedding_collection_name,
            ckpt_to_load_from=ckpt_to_load_from,
            tensor_name_in_ckpt=tensor_name_in_ckpt,
            max_norm=max_norm,
            trainable=trainable,
            **{
                k: v for k, v in flags.items() if k == "use_safe_embedding_lookup"
            })
    names = [c.name for c in categorical_columns]
    where = f"shared_embedding_columns({names})"
    if len(ev_columns) != len(categorical_columns):
        other = [c.name for c in categorical_columns if c not in ev_columns]
        raise ValueError(f"{where}: {other} are not categorical_column_with_embedding columns; "
                         "an Embedding Variable can only be shared by such columns.")
    adaptive = [
        c.name for c in ev_columns if isinstance(_ev_source(c), AdaptiveEmbeddingCategoricalColumn)
    ]
    if adaptive:
        raise ValueError(f"{where}: {adaptive} are adaptive embedding columns, which are not "
                         "shared (use embedding_column).")
    key_dtypes = sorted({_ev_source(c).key_dtype.name for c in ev_columns})
    if len(key_dtypes) > 1:
        raise ValueError(f"{where}: the columns' keys differ in dtype ({key_dtypes}); one "
                         "Embedding Variable has one key dtype.")
    partitions = sorted({_ev_source(c).partition_num or 1 for c in ev_columns})
    if len(partitions) > 1:
        raise ValueError(f"{where}: the columns' partition_num differ ({partitions}); one "
                         "Embedding Variable has one number of parts.")
    _check_flags(where, flags)
    _check_dense_arguments(where, dimension, combiner, initializer, ckpt_to_load_from)
    shared_name = shared_embedding_collection_name or "_".join(sorted(names)) + "_shared_embedding"
    initializer = initializer or _default_initializer(dimension)
    return [
        EmbeddingVariableColumn(c, dimension, combiner, initializer, max_norm, trainable,
                                shared_name, _current_group()) for c in ev_columns
    ]


# --------------------------------------------------------------------------- input layer


def _grouped_lookups(columns, prepared):
    """One lookup_sparse call per group: {column: [batch, dim] tensor}.

  `prepared` maps each grouped column to (variable, keys, weights)."""
    by_group = collections.defaultdict(list)
    for column in columns:
        if column in prepared:
            by_group[column.group].append(column)
    results = {}
    for group, members in by_group.items():
        with tf.name_scope(group):
            outputs = lookup_sparse([prepared[c][0] for c in members],
                                    [prepared[c][1] for c in members],
                                    [c.combiner for c in members],
                                    sp_weights=[prepared[c][2] for c in members])
        results.update(zip(members, outputs))
    return results


def input_layer(features,
                feature_columns,
                weight_collections=None,
                trainable=True,
                cols_to_vars=None,
                cols_to_output_tensors=None,
                adaptive_mask_tensors=None):
    """TensorFlow's v1 `input_layer`, with the Embedding Variable columns of
  each `group_embedding_column_scope` looked up in one lookup_sparse call.

  Args:
    features: dict of feature name -> Tensor or SparseTensor.
    feature_columns: _DenseColumns (embedding_column's, numeric, stock).
    weight_collections: collections the variables are added to, beside
      GLOBAL_VARIABLES and MODEL_VARIABLES.
    trainable: whether the variables are trainable.
    cols_to_vars: if a dict, filled with column -> its variables.
    cols_to_output_tensors: if a dict, filled with column -> its
      `[batch, width]` output.
    adaptive_mask_tensors: DeepRec's: a dict of feature key -> int mask, one
      entry per id, for the adaptive embedding columns (1: the Embedding
      Variable, 0: the static variable; see
      `categorical_column_with_adaptive_embedding`). Masks of other
      columns are not read. Adaptive and partitioned columns are looked up on their own,
      also inside a group_embedding_column_scope.

  Returns:
    `[batch, sum of widths]` float32, the columns in name order.

  Raises:
    ValueError: a column that is not a _DenseColumn, one built on a
      categorical_column_with_embedding column other than by embedding_column
      (e.g. indicator_column), a grouped column with max_norm (grouped
      lookups do not clip), or the errors of the columns.
  """
    columns = _fc_v1._normalize_feature_columns(feature_columns)  # pylint: disable=protected-access
    for column in columns:
        if not isinstance(column, _fc_v1._DenseColumn):  # pylint: disable=protected-access
            raise ValueError("Items of feature_columns must be a _DenseColumn (wrap a categorical "
                             f"column with embedding_column). Given: {column}")
        if not isinstance(column, EmbeddingVariableColumn):
            _ev_source(column)  # raises for e.g. an indicator_column over one
        if (isinstance(column, EmbeddingVariableColumn) and column.group and column.max_norm and
                column.partitioner is None):
            raise ValueError(f"input_layer: column '{column.name}' in group_embedding_column_scope "
                             f"'{column.group}' has max_norm={column.max_norm!r}: grouped lookups "
                             "do not clip rows; make the column outside the scope.")
    weight_collections = list(weight_collections or [])
    for key in (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.MODEL_VARIABLES):
        if key not in weight_collections:
            weight_collections.append(key)
    ordered = sorted(columns, key=lambda c: c.name)
    with tf.compat.v1.variable_scope(None,
                                     default_name="input_layer",
                                     values=list(features.values())):
        builder = _fc_v1._LazyBuilder(features)  # pylint: disable=protected-access
        tensors: Dict[object, tf.Tensor] = {}
        prepared = {}
        scopes = {}
        # Each column's variables are made in its own scope, in name order,
        # as TensorFlow's input_layer makes them; grouped columns are looked
        # up once all of them are made.
        for column in ordered:
            with tf.compat.v1.variable_scope(None, default_name=column._var_scope_name):  # pylint: disable=protected-access
                scopes[column] = tf.compat.v1.get_variable_scope().name
                if isinstance(column, EmbeddingVariableColumn) and column.adaptive:
                    tensors[column] = column.adaptive_dense_tensor(builder, adaptive_mask_tensors,
                                                                   weight_collections, trainable)
                elif (isinstance(column, EmbeddingVariableColumn) and column.group and
                      column.partitioner is None):
                    keys = column.sparse_keys(builder)  # checked before any variable
                    prepared[column] = (column.embedding_variable(weight_collections,
                                                                  trainable),) + keys
                else:
                    tensors[column] = column._get_dense_tensor(  # pylint: disable=protected-access
                        builder,
                        weight_collections=weight_collections,
                        trainable=trainable)
        tensors.update(_grouped_lookups(ordered, prepared))
        outputs = []
        for column in ordered:
            width = column._variable_shape.num_elements()  # pylint: disable=protected-access
            output = tf.reshape(tensors[column], (tf.shape(tensors[column])[0], width))
            outputs.append(output)
            if cols_to_vars is not None:
                cols_to_vars[column] = tf.compat.v1.get_collection(
                    tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, scope=scopes[column])
            if cols_to_output_tensors is not None:
                cols_to_output_tensors[column] = output
        _fc_v1._verify_static_batch_size_equality(outputs, ordered)  # pylint: disable=protected-access
        return tf.concat(outputs, 1)


def linear_model(features,
                 feature_columns,
                 units=1,
                 sparse_combiner="sum",
                 weight_collections=None,
                 trainable=True,
                 cols_to_vars=None,
                 **flags):
    """DeepRec's `tf.feature_column.linear_model`: TensorFlow's v1
  linear_model (the wide part of DeepRec's WDL), taking DeepRec's
  optimisation flags (do_fusion, ...), which change nothing.

  Args:
    features, feature_columns, units, sparse_combiner, weight_collections,
      trainable, cols_to_vars: TensorFlow's.
    **flags: DeepRec's optimisation flags, as embedding_column's.

  Returns:
    TensorFlow's `[batch, units]` logits.

  Raises:
    ValueError: an unknown argument, or a column that reads a
      categorical_column_with_embedding column (a linear part over an
      Embedding Variable is not built), naming it; before any variable is
      made.
  """
    _check_flags("linear_model", flags)
    columns = _fc_v1._normalize_feature_columns(feature_columns)  # pylint: disable=protected-access
    for column in columns:
        if _ev_source(column) is not None:
            raise ValueError(f"linear_model: column '{column.name}' reads a "
                             "categorical_column_with_embedding column; a linear part over an "
                             "Embedding Variable is not built by sok-ev (give linear_model "
                             "TensorFlow's categorical columns).")
    return STOCK["linear_model"](features,
                                 columns,
                                 units=units,
                                 sparse_combiner=sparse_combiner,
                                 weight_collections=weight_collections,
                                 trainable=trainable,
                                 cols_to_vars=cols_to_vars)


# --------------------------------------------------------------------------- tf.nn


def group_embedding_lookup_sparse(params,
                                  sp_ids,
                                  combiners,
                                  sp_weights=None,
                                  partition_strategy="mod",
                                  is_sequence=False,
                                  params_num_per_group=sys.maxsize,
                                  name=None):
    """DeepRec's `tf.nn.group_embedding_lookup_sparse` on Embedding Variables:
  one `sok_ev.lookup_sparse` call for all of them.

  Args:
    params: list of N Embedding Variables.
    sp_ids: list of N SparseTensors (`[batch, max_hotness]`, keys of the
      variable's key dtype; reordered here) or rank-2 RaggedTensors.
    combiners: list of N of "sum", "mean", "sqrtn".
    sp_weights: None, or a list of N (None or float weights with the ids'
      indices).
    partition_strategy, params_num_per_group: DeepRec's optimisation
      settings: accepted, change nothing.
    is_sequence: must be False (`[batch, T, dim]` outputs are not built).
    name: name scope of the lookup.

  Returns:
    A list of N `[batch, dim]` float32 tensors.

  Raises:
    ValueError: lengths that differ, is_sequence=True, or a param that is
      not an Embedding Variable (names it).
  """
    del partition_strategy, params_num_per_group
    params, sp_ids, combiners = list(params), list(sp_ids), list(combiners)
    if is_sequence:
        raise ValueError("group_embedding_lookup_sparse: is_sequence=True ([batch, T, dim] "
                         "outputs) is not built by sok-ev.")
    if not len(params) == len(sp_ids) == len(combiners):
        raise ValueError(f"group_embedding_lookup_sparse: {len(params)} params, {len(sp_ids)} "
                         f"sp_ids and {len(combiners)} combiners; they must be as many.")
    for param in params:
        if not isinstance(param, embedding_variable.EmbeddingVariable):
            raise ValueError(f"group_embedding_lookup_sparse: param {param.name} is not an "
                             "Embedding Variable; sok-ev groups Embedding Variables only.")
    weights = [None] * len(params) if sp_weights is None else list(sp_weights)

    def ordered(tensor):
        return tf.sparse.reorder(tensor) if isinstance(tensor, tf.SparseTensor) else tensor

    with tf.name_scope(name or "group_embedding_lookup_sparse"):
        return lookup_sparse(params, [ordered(t) for t in sp_ids],
                             combiners,
                             sp_weights=[None if w is None else ordered(w) for w in weights])


# Name on tf.feature_column / tf.compat.v1.feature_column -> sok-ev's.
FEATURE_COLUMN_NAMES = {
    "categorical_column_with_embedding": categorical_column_with_embedding,
    "categorical_column_with_adaptive_embedding": categorical_column_with_adaptive_embedding,
    "embedding_column": embedding_column,
    "shared_embedding_columns": shared_embedding_columns,
    "input_layer": input_layer,
    "linear_model": linear_model,
    "group_embedding_column_scope": group_embedding_column_scope,
    **REFUSED,
}
# Name on tf.nn / tf.compat.v1.nn -> sok-ev's.
NN_NAMES = {"group_embedding_lookup_sparse": group_embedding_lookup_sparse}
