"""DeepRec's names on stock TensorFlow, so DeepRec scripts run unchanged.

`install_deeprec_api()` adds, to `tf` and `tf.compat.v1`:
  get_embedding_variable, EmbeddingVariableOption, InitializerOption,
  GlobalStepEvict, L2WeightEvict, CounterFilter, CBFFilter, StorageOption,
  CheckpointOption, StorageType, CacheType, CacheStrategy, and smart
  staging's staged and make_prefetch_hook (sok_ev.smart_stage: values
  unchanged);
to `tf.compat.v1.GraphKeys`: EMBEDDING_VARIABLES (the collection of sok-ev's
Embedding Variables), EV_INIT_VAR_OPS (their initializers) and
EV_INIT_SLOT_OPS (empty: slots live in the table); the module
`tensorflow.core.framework.embedding.config_pb2` (StorageType, CacheType,
CacheStrategy, SlotType) that DeepRec's storage examples import; to `tf.feature_column`
and `tf.compat.v1.feature_column`: categorical_column_with_embedding,
embedding_column, shared_embedding_columns, input_layer, linear_model and
group_embedding_column_scope (sok_ev.feature_column; TensorFlow's own
embedding_column, shared_embedding_columns, input_layer and linear_model
still serve every other column), and DeepRec's feature-column names sok-ev does not
build, which raise ValueError naming the feature; to `tf.nn` and
`tf.compat.v1.nn`: group_embedding_lookup_sparse; and it makes
`tf.compat.v1.train.Saver` take DeepRec's `incremental_save_restore=True`
(sok_ev.incremental_saver.StockNameSaver, a subclass of TensorFlow's
Saver) and `tf.compat.v1.train.MonitoredTrainingSession` take DeepRec's
`save_incremental_checkpoint_secs` (sok_ev.deeprec_session), and
`tf.compat.v1.train.Saver.restore` read a checkpoint in DeepRec's Embedding
Variable layout (sok_ev.deeprec_checkpoint); the module
`tensorflow.python.data.experimental.ops.parquet_dataset_ops` holds DeepRec's
ParquetDataset (sok_ev.parquet_dataset), and
`tensorflow.python.ops.work_queue` DeepRec's WorkQueue (sok_ev.work_queue);
to `tf.train` and `tf.compat.v1.train`: AdamAsyncOptimizer and AdagradDecayOptimizer
(sok_ev.deeprec_optimizers); `tf.ConfigProto` and
`tf.compat.v1.ConfigProto` take DeepRec's `graph_options.optimizer_options`
fields (do_smart_stage, do_op_fusion, micro_batch_num, ...: accepted,
without effect) and TensorFlow's sessions take such a config
(sok_ev.deeprec_config); `tf.config.experimental` and
`tf.compat.v1.config.experimental` have enable_distributed_strategy
(sok_ev.deeprec_distributed: "collective" initialises Horovod and
sok-ev's workers, so grouped lookups shard the tables);
`tf.compat.v1.variable_scope` has DeepRec's `keep_weights(dtype=tf.float32)`
(sok_ev.deeprec_bf16: variables asked for in bfloat16 are kept in float32
and read through a cast). It also
installs what
lets DeepRec's training code run on Embedding Variables, as `sok_ev.init()`
does on one worker: the dispatch of `tf.nn.embedding_lookup`,
`tf.nn.embedding_lookup_sparse` and `tf.nn.safe_embedding_lookup_sparse`
(`sok_ev.dispatch`), the optimizer hooks (`sok_ev.optimizers`,
`sok_ev.keras_optimizers`) and the saver hook
(`sok_ev.checkpoint.install_saver_hook`), so `tf.compat.v1.train.Saver`
saves and restores Embedding Variables. With several workers,
`sok_ev.init()` is still needed (after `hvd.init()`): it reads the workers
from Horovod and installs the multi-worker guards.
"""

import tensorflow as tf
from tensorflow.python.training import saver as saver_module

from sok_ev import checkpoint
from sok_ev import deeprec_checkpoint
from sok_ev import deeprec_bf16
from sok_ev import deeprec_config
from sok_ev import deeprec_distributed
from sok_ev import deeprec_modules
from sok_ev import deeprec_optimizers
from sok_ev import dispatch
from sok_ev import deeprec_session
from sok_ev import embedding_variable
from sok_ev import feature_column
from sok_ev import incremental_saver
from sok_ev import keras_optimizers
from sok_ev import optimizers
from sok_ev import options
from sok_ev import parquet_dataset
from sok_ev import smart_stage
from sok_ev import work_queue
from sok_ev import warm_start

# Name on tf / tf.compat.v1 -> sok_ev object.
_DEEPREC_NAMES = {
    "get_embedding_variable": embedding_variable.get_embedding_variable,
    "EmbeddingVariableOption": options.EmbeddingVariableOption,
    "InitializerOption": options.InitializerOption,
    "GlobalStepEvict": options.GlobalStepEvict,
    "L2WeightEvict": options.L2WeightEvict,
    "CounterFilter": options.CounterFilter,
    "CBFFilter": options.CBFFilter,
    "StorageOption": options.StorageOption,
    "CheckpointOption": options.CheckpointOption,
    "StorageType": options.StorageType,
    "CacheType": options.CacheType,
    "CacheStrategy": options.CacheStrategy,
    # Smart staging: an optimisation; the values are unchanged.
    "staged": smart_stage.staged,
    "make_prefetch_hook": smart_stage.make_prefetch_hook,
}

# DeepRec's optimizers, on tf.train and tf.compat.v1.train.
_TRAIN_NAMES = {
    "AdamAsyncOptimizer": deeprec_optimizers.AdamAsyncOptimizer,
    "AdagradDecayOptimizer": deeprec_optimizers.AdagradDecayOptimizer,
}

# DeepRec's collection names (tf.GraphKeys) -> the collection sok-ev fills.
_GRAPH_KEYS = {
    "EMBEDDING_VARIABLES": embedding_variable.EMBEDDING_VARIABLES,
    "EV_INIT_VAR_OPS": embedding_variable.EV_INIT_VAR_OPS,
    "EV_INIT_SLOT_OPS": "ev_init_slot_ops",
}

# TensorFlow's objects install_deeprec_api() may replace: name -> object.
_REPLACEABLE = dict(feature_column.STOCK,
                    Saver=saver_module.Saver,
                    MonitoredTrainingSession=deeprec_session.STOCK_MONITORED_TRAINING_SESSION,
                    ConfigProto=deeprec_config.STOCK_CONFIG_PROTO)

# DeepRec's proto module of storage enums, as scripts import it.
_CONFIG_PB2 = "tensorflow.core.framework.embedding.config_pb2"


def _refuse_conflict(owner, name, value, where):
    existing = getattr(owner, name, None)
    # TensorFlow's own embedding_column, shared_embedding_columns and
    # input_layer are replaced: sok-ev's hand them every other column; so is
    # its Saver class, by a subclass that also takes DeepRec's argument.
    if existing is not None and existing is _REPLACEABLE.get(name):
        return
    if existing is not None and existing != value:
        raise RuntimeError(f"install_deeprec_api: {where}.{name} already exists "
                           f"({existing!r}); sok-ev will not replace it.")


def _install_config_pb2():
    """Makes `from tensorflow.core.framework.embedding import config_pb2` work."""
    deeprec_modules.provide_module(_CONFIG_PB2,
                                   "DeepRec's storage enums, provided by sok_ev.options.",
                                   StorageType=options.StorageType,
                                   CacheType=options.CacheType,
                                   CacheStrategy=options.CacheStrategy,
                                   SlotType=options.SlotType)


def install_deeprec_api() -> None:
    """Adds DeepRec's Embedding Variable API and feature columns to
  TensorFlow (see the module docstring for the names), the tf.nn lookup
  dispatch, the optimizer hooks
  and the tf.compat.v1.train.Saver hook: all a DeepRec script needs on one
  worker.

  Idempotent. Options sok-ev does not implement yet can be created, and
  get_embedding_variable refuses them with a ValueError naming the feature.

  Raises:
    RuntimeError: one of these names already exists in TensorFlow with
      another meaning (for example on a DeepRec build); nothing is replaced.
  """
    names = [(module, name, value, module.__name__)
             for module in (tf, tf.compat.v1)
             for name, value in _DEEPREC_NAMES.items()]
    names += [(tf.compat.v1.GraphKeys, name, value, "tf.compat.v1.GraphKeys")
              for name, value in _GRAPH_KEYS.items()]
    names += [(module, name, value, where)
              for module, where in ((tf.feature_column, "tf.feature_column"),
                                    (tf.compat.v1.feature_column, "tf.compat.v1.feature_column"))
              for name, value in feature_column.FEATURE_COLUMN_NAMES.items()]
    names += [(module, name, value, where)
              for module, where in ((tf.nn, "tf.nn"), (tf.compat.v1.nn, "tf.compat.v1.nn"))
              for name, value in feature_column.NN_NAMES.items()]
    names += [(module, name, value, where)
              for module, where in ((tf.train, "tf.train"), (tf.compat.v1.train,
                                                             "tf.compat.v1.train"))
              for name, value in _TRAIN_NAMES.items()]
    # DeepRec's collective group embedding: Horovod + sok_ev.init().
    names += [(module, "enable_distributed_strategy",
               deeprec_distributed.enable_distributed_strategy, where)
              for module, where in ((tf.config.experimental, "tf.config.experimental"),
                                    (tf.compat.v1.config.experimental,
                                     "tf.compat.v1.config.experimental"))]
    names.append(
        (tf.compat.v1.train, "Saver", incremental_saver.StockNameSaver, "tf.compat.v1.train"))
    names.append((tf.compat.v1.train, "MonitoredTrainingSession",
                  deeprec_session.MonitoredTrainingSession, "tf.compat.v1.train"))
    # DeepRec's optimizer_options fields (do_smart_stage, ...) are accepted.
    names += [(module, "ConfigProto", deeprec_config.ConfigProto, module.__name__)
              for module in (tf, tf.compat.v1)]
    for owner, name, value, where in names:  # all checked before any is set
        _refuse_conflict(owner, name, value, where)
    for owner, name, value, _ in names:
        setattr(owner, name, value)
    _install_config_pb2()
    # variable_scope(...).keep_weights(dtype=tf.float32): DeepRec's BF16.
    deeprec_bf16.install()
    parquet_dataset.install()
    work_queue.install()
    dispatch.install_lookup_dispatch()
    optimizers.install_optimizer_hook()
    keras_optimizers.install_keras_optimizer_hook()
    # One worker needs no topology: the checkpoint kernels assume 0 of 1
    # until sok_ev.init() records another.
    checkpoint.install_saver_hook()
    # A Saver's restore reads checkpoints DeepRec saved.
    deeprec_checkpoint.install_restore_hook()
    warm_start.install_hook()
    # Sessions take a ConfigProto with DeepRec's fields, as its stock proto.
    deeprec_config.install_session_hook()
