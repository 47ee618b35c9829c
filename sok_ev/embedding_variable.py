"""The Embedding Variable: a hash table from raw int32/int64 ids to rows.

`get_embedding_variable` follows DeepRec's `tf.get_embedding_variable`. The
variable behaves like a `tf.Variable` where TensorFlow needs one (variable
scopes and collections, initializers, tapes, stock optimizers, `tf.train.Saver`
and `tf.train.Checkpoint`, tf.function arguments), but has no dense value:
read it with `sok_ev.lookup_sparse` or the `tf.nn` embedding lookups
(`sok_ev.dispatch`), or `export()` it whole.
"""

import numbers
import re
import weakref
from typing import Any, Iterable, Optional

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.eager import context
from tensorflow.python.framework import ops as framework_ops
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.ops import variable_scope
from tensorflow.python.ops import variables
from tensorflow.python.saved_model.registration import registration
from tensorflow.python.training.saving import saveable_object
from tensorflow.python.trackable import base as trackable
from tensorflow.python.types import core

from sok_ev import initializers
from sok_ev import options as options_lib
from sok_ev import partitioned_variable
from sok_ev._ops import ops

# Every Embedding Variable built in graph mode, so that lookups and tools
# can find them (like DeepRec's EMBEDDING_VARIABLES collection).
EMBEDDING_VARIABLES = "sok_ev_embedding_variables"
# The initializer op of every Embedding Variable built in graph mode
# (DeepRec's GraphKeys.EV_INIT_VAR_OPS).
EV_INIT_VAR_OPS = "ev_init_var_ops"

_SUPPORTED_KEY_DTYPES = (tf.int32, tf.int64)

# The largest embedding_dim (a row of 256 KiB), as kMaxEmbeddingDim in
# sok_ev/cc/kernels/embedding_variable.h: larger rows are no embedding anyone
# trains, and would only surface as an allocation failure at the first lookup.
MAX_EMBEDDING_DIM = 1 << 16


# core.Tensor as for tf.Variable's resource variables: tapes check it to decide
# that a watched variable is trainable.
def _handle_op(shared_name, key_dtype, embedding_dim, name=None):
    """The handle of the table `shared_name` (a scalar resource tensor). Its
  `shape` attr, [?, embedding_dim], is what TensorFlow reads of a
  VarHandleOp to carry an IndexedSlices gradient out of a v1 while loop."""
    return ops().sok_ev_embedding_variable_handle(shared_name=shared_name,
                                                  key_dtype=key_dtype,
                                                  embedding_dim=embedding_dim,
                                                  shape=[None, embedding_dim],
                                                  name=name)


# A table whose rows all live in its device's memory.
_NO_TIERS = {"hbm_bytes": 0, "cache_strategy": 1}

# The fields of SokEv>EmbeddingVariableTierCounters, in order.
TIER_COUNTER_NAMES = ("hits", "misses", "rows_to_hbm", "rows_to_host", "pcie_bytes", "calls",
                      "hbm_rows", "host_rows", "choose_us", "write_back_us", "bring_in_us",
                      "host_tier_us", "wait_us")


def _check_gpu_placement(handle, name):
    """HBM_DRAM storage keeps rows in a GPU's memory: a table whose handle is
  on the CPU (placed there, or no GPU to place it on) is refused here,
  before its initializer exists. A graph handle without a device that a
  GPU is visible for is left to the initializer's kernel, which refuses a
  CPU table the same way at run time.

  Raises:
    ValueError: naming the table, the storage type and the device.
  """
    device = handle.device or ""
    on_cpu = "CPU" in device.upper()
    if not device and not tf.config.list_physical_devices("GPU"):
        on_cpu, device = True, "the CPU (no GPU is visible)"
    if on_cpu:
        raise ValueError(f"get_embedding_variable('{name}'): ev_option.storage_option."
                         "storage_type=HBM_DRAM keeps rows in a GPU's memory (HBM), but the "
                         f"table is on {device}; place it on a GPU (tf.device('/GPU:0')) "
                         "or use StorageType.DRAM")


def _install_training_hooks():
    """Without sok_ev.init() (one worker), the optimizer hooks it would have
  installed: a stock tf.compat.v1.train or tf.keras optimizer would otherwise
  hand the table to TensorFlow's dense sparse-apply ops, which fail with
  "Invalid variable reference". After init() nothing is done, so hooks a
  script uninstalled on purpose stay uninstalled. Several workers without
  init() are refused at the first lookup (communication._check_initialized).
  """
    # pylint: disable=import-outside-toplevel,cyclic-import
    from sok_ev import communication
    if communication.initialized():
        return
    from sok_ev import keras_jit
    from sok_ev import keras_optimizers
    from sok_ev import optimizers
    optimizers.install_optimizer_hook()
    keras_optimizers.install_keras_optimizer_hook()
    keras_jit.install_keras_jit_guard()


class EmbeddingVariable(variables.Variable, core.Tensor):
    """A hash-based embedding table whose keys are raw ids.

  Shape notation: `dim` = `embedding_dim`. `shape` is `[dim]` (as in DeepRec),
  because the number of rows is not fixed: the table grows as keys arrive.

  Attributes:
    target_gpu: -1 shards the table over every worker by `owner_of(key)`;
      k in [0, world size) keeps the whole table on worker k. Settable; checked
      at the first lookup.
    partition: None, or (shared name, index, number of parts) when the
      variable is a part of a partitioned one (get_embedding_variable's
      partitioner).
  """

    # Makes TF treat the variable as a resource variable (its handle is what
    # tapes watch and what colocation uses), without its dense read paths.
    _should_act_as_resource_variable = True
    partition = None

    def __init__(self,
                 name,
                 embedding_dim,
                 key_dtype,
                 initializer,
                 default_value_dim,
                 trainable,
                 steps_to_live,
                 target_gpu,
                 filter_attributes=None,
                 l2_weight_threshold=None,
                 storage_attributes=None):
        """Use get_embedding_variable(); this makes the table and its ops.

    `name` opens the name scope of the handle op: relative to the current
    name scope (an eager variable, as tf.Variable), or, ending in "/",
    absolute (get_embedding_variable in a graph passes the variable-scope
    name so: the variable is named exactly that).
    """
        # Variable.__init__ only documents arguments; state is set here.
        # pylint: disable=super-init-not-called
        _install_training_hooks()
        self._embedding_dim = embedding_dim
        self._key_dtype = tf.as_dtype(key_dtype)
        self._trainable = trainable
        self._steps_to_live = steps_to_live
        self._l2_weight_threshold = l2_weight_threshold
        self.target_gpu = target_gpu
        self._in_graph_mode = not context.executing_eagerly()
        self._save_slice_info = None
        self._restores_as_saved = False
        self._version_clock = None
        self._initializer_object = initializer
        self._slots = {}
        with framework_ops.init_scope():
            self._in_graph_mode = not context.executing_eagerly()
            with framework_ops.name_scope(name, skip_on_eager=False) as scope_name:
                self._handle_name = framework_ops.name_from_scope_name(scope_name)
                if self._in_graph_mode:
                    shared_name = self._handle_name
                else:
                    # Eager variables are private to their Python object; errors
                    # name the table without the "#<n>" (DisplayName in C++).
                    shared_name = f"{self._handle_name}#{framework_ops.uid()}"
                # An op name ending in "/" is taken as is: the handle op is named
                # exactly `var.name` without ":0", as a meta graph import needs.
                self._handle = _handle_op(shared_name, self._key_dtype, embedding_dim, scope_name)
                self._storage_attributes = dict(storage_attributes or _NO_TIERS)
                if self._storage_attributes["hbm_bytes"] > 0:
                    _check_gpu_placement(self._handle, self._handle_name)
                spec = initializers.spec_for(initializer, default_value_dim)
                with framework_ops.name_scope("Initializer"):
                    matrix = initializers.default_values(initializer, spec, embedding_dim)
                    self._initializer_op = ops().sok_ev_initialize_embedding_variable(
                        self._handle,
                        matrix,
                        key_dtype=self._key_dtype,
                        embedding_dim=embedding_dim,
                        initializer_kind=spec.kind,
                        param_a=spec.param_a,
                        param_b=spec.param_b,
                        seed=spec.seed,
                        **(filter_attributes or {}),
                        **self._storage_attributes)
                self._filter_attributes = options_lib.filter_attributes(
                    options_lib.EmbeddingVariableOption(), name)
                self._filter_attributes.update(filter_attributes or {})
                # A restore into a session that never ran the initializer
                # creates the table with these.
                self._initializer_spec = spec
                self._default_values = matrix
            self._graph_key = framework_ops.get_default_graph()._graph_key  # pylint: disable=protected-access
            if not self._in_graph_mode:
                self._unique_id = shared_name
                # Frees the table when the Python object goes away, as for tf.Variable.
                self._handle_deleter = resource_variable_ops.EagerResourceDeleter(
                    handle=self._handle, handle_device=self._handle.device)
            else:
                self._unique_id = self._handle_name

    @classmethod
    def _from_graph(cls,
                    handle,
                    initializer_op,
                    trainable,
                    steps_to_live,
                    target_gpu,
                    l2_weight_threshold=None):
        """The variable whose handle and initializer ops are already in the
    graph (an imported meta graph)."""
        _install_training_hooks()
        variable = cls.__new__(cls)
        op = handle.op
        variable._embedding_dim = op.get_attr("embedding_dim")
        variable._key_dtype = tf.as_dtype(op.get_attr("key_dtype"))
        variable._trainable = trainable
        variable._steps_to_live = steps_to_live
        variable._l2_weight_threshold = l2_weight_threshold
        variable.target_gpu = target_gpu
        variable._in_graph_mode = True
        variable._save_slice_info = None
        variable._restores_as_saved = False
        variable._version_clock = None
        variable._initializer_object = None
        variable._slots = {}
        variable._handle = handle
        variable._handle_name = op.name
        variable._unique_id = op.name
        variable._graph_key = op.graph._graph_key  # pylint: disable=protected-access
        variable._initializer_op = initializer_op
        variable._filter_attributes = {
            name: initializer_op.get_attr(name) for name in options_lib.FILTER_ATTRIBUTE_NAMES
        }
        variable._storage_attributes = {
            name: initializer_op.get_attr(name) for name in options_lib.STORAGE_ATTRIBUTE_NAMES
        }
        variable._default_values = initializer_op.inputs[1]
        variable._initializer_spec = initializers.InitializerSpec(
            kind=initializer_op.get_attr("initializer_kind"),
            param_a=initializer_op.get_attr("param_a"),
            param_b=initializer_op.get_attr("param_b"),
            seed=initializer_op.get_attr("seed"),
            default_value_dim=initializer_op.inputs[1].shape[0] or 0)
        return variable

    @property
    def storage_attributes(self):
        """Where the table's rows live: the storage attributes of its
    initializer op (sok_ev.options.storage_attributes); hbm_bytes 0 when
    every row is in the table's device memory, else the HBM budget of its
    HBM_DRAM storage."""
        return dict(self._storage_attributes)

    def tier_counters(self):
        """What the table's HBM_DRAM storage counted (cc/storage_spec.h), as a
    dict of Python ints (eagerly) or int64 scalar tensors (in a graph):
    hits and misses (a lookup's or update's distinct keys found in HBM, or
    not), rows_to_hbm and rows_to_host (rows moved each way), pcie_bytes
    (bytes the tiers copied between host and GPU), calls (lookups and
    updates that made keys resident), all since the table was made; and
    hbm_rows and host_rows (rows in each tier now); choose_us, write_back_us
    and bring_in_us (host microseconds spent choosing rows to write back,
    writing them back and bringing rows in), and two parts of that time:
    host_tier_us (the host tier's map work) and wait_us (waiting for the
    GPU's part of the moves). A table without tiers counts
    nothing: its rows are hbm_rows on a GPU, host_rows on the CPU. Read it
    twice to get a step's share (e.g. pcie_bytes per step)."""
        with tf.device(self._handle.device):
            counters = ops().sok_ev_embedding_variable_tier_counters(self._handle)
        if context.executing_eagerly():
            counters = counters.numpy().tolist()
            return dict(zip(TIER_COUNTER_NAMES, counters))
        return {name: counters[i] for i, name in enumerate(TIER_COUNTER_NAMES)}

    @property
    def filter_attributes(self):
        """The feature filter the table was made with: the filter attributes of
    its initializer op (sok_ev.options.filter_attributes); filter_freq 0
    when it has none."""
        return dict(self._filter_attributes)

    # --- What makes it an Embedding Variable --------------------------------

    @property
    def embedding_dim(self):
        """Length of each row (the `dim` of every lookup result)."""
        return self._embedding_dim

    @property
    def key_dtype(self):
        """tf.int32 or tf.int64: the dtype lookups must use for keys."""
        return self._key_dtype

    @property
    def steps_to_live(self):
        """Keys not updated for this many steps of the version clock are
    evicted at save."""
        return self._steps_to_live

    @property
    def version_clock(self):
        """What the versions of updated keys count: a callable returning an
    int64 scalar step, set by the optimizer that last built an update of
    this table (the global step for tf.compat.v1 optimizers, `iterations` for
    Keras ones); None before any (then the global step). steps_to_live
    evicts by it."""
        return self._version_clock

    @version_clock.setter
    def version_clock(self, clock):
        self._version_clock = clock

    @property
    def optimizer_slots(self):
        """{table slot name: initial value} of the optimizer slots made for
    this variable in this process (`sok_ev.optimizers`), e.g.
    {"Adagrad/accumulator": 0.1}: what a restore of a checkpoint that holds
    no initial values (DeepRec's layout) gives a slot the table lacks."""
        return self._slots

    @property
    def l2_weight_threshold(self):
        """Keys whose value v has 0.5 * sum(v * v) below this are evicted at save
    (DeepRec's L2WeightEvict); None: no L2 eviction."""
        return self._l2_weight_threshold

    def total_count(self):
        """Number of keys stored, as an int64 scalar tensor."""
        return ops().sok_ev_embedding_variable_size(self._handle)

    def sparse_read(self, keys, name=None):
        """Rows of `keys` ([n] -> [n, dim]) without inserting them; an absent key
    reads its initial value. Not differentiable: train through lookup_sparse."""
        keys = tf.convert_to_tensor(keys)
        if keys.dtype != self._key_dtype:
            raise TypeError(f"sparse_read of Embedding Variable '{self.name}': keys "
                            f"must be {self._key_dtype.name}, got {keys.dtype.name}")
        return ops().sok_ev_embedding_variable_find(self._handle,
                                                    keys,
                                                    embedding_dim=self._embedding_dim,
                                                    name=name)

    def export(self):
        """Every key and its row: `(keys [n], values [n, dim])`, in no order."""
        keys, rows, _, _, _, _ = ops().sok_ev_embedding_variable_export(self._handle,
                                                                        key_dtype=self._key_dtype)
        return keys, rows[:, :self._embedding_dim]

    def export_full(self):
        """Everything a checkpoint holds: keys, rows (value then slots),
    frequencies, versions, slot names and slot initial values."""
        return ops().sok_ev_embedding_variable_export(self._handle, key_dtype=self._key_dtype)

    def import_full(self, keys, rows, frequencies, versions, slot_names, slot_initial_values):
        """Replaces the table with `export_full()`'s tensors. Checks every shape
    first: on a bad input the table keeps its contents."""
        return ops().sok_ev_embedding_variable_import(self._handle, keys, rows, frequencies,
                                                      versions, slot_names, slot_initial_values)

    # --- What TensorFlow expects of a variable ------------------------------

    @property
    def handle(self):
        """The resource handle of the table (what tapes watch and ops take)."""
        return self._handle

    @property
    def name(self):
        """`<variable scope>/<name>:0` in graph mode, as for
    tf.compat.v1.get_variable; `<name scope>/<name>:0` eagerly, as for
    tf.Variable."""
        return f"{self._handle_name}:0"

    @property
    def dtype(self):
        """tf.float32: the dtype of the rows."""
        return tf.float32

    @property
    def shape(self):
        """`[embedding_dim]`: rows are not counted, the table grows (DeepRec)."""
        return tf.TensorShape([self._embedding_dim])

    def get_shape(self):
        """Same as `shape`."""
        return self.shape

    @property
    def op(self):
        """The op that makes the handle (named after the variable)."""
        return self._handle.op

    @property
    def graph(self):
        """The graph the handle belongs to."""
        return self._handle.graph

    @property
    def device(self):
        """The device the table lives on."""
        return self._handle.device

    @property
    def trainable(self):
        """Whether optimizers update it (and tapes watch it)."""
        return self._trainable

    @property
    def initializer(self):
        """The op that creates (or empties) the table."""
        return self._initializer_op

    @property
    def initial_value(self):
        """Raises TypeError: rows start when their key is first looked up."""
        raise TypeError(f"Embedding Variable '{self.name}' has no dense initial "
                        "value; a key's initial value is drawn when it is first "
                        "looked up.")

    @property
    def constraint(self):
        """None: Embedding Variables take no constraint."""
        return None

    @property
    def synchronization(self):
        """AUTO, as for tf.Variable."""
        return tf.VariableSynchronization.AUTO

    @property
    def aggregation(self):
        """NONE: gradients go to the owning worker, never aggregated."""
        return tf.VariableAggregation.NONE

    def is_initialized(self, name=None):
        """A bool scalar tensor: whether the table exists."""
        return ops().sok_ev_embedding_variable_is_initialized(self._handle, name=name)

    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        del dtype, name, as_ref
        raise TypeError(f"Embedding Variable '{self.name}' has no dense value to convert to a "
                        "Tensor; look rows up with sok_ev.lookup_sparse([var], [sparse_ids]) "
                        "or read them with var.sparse_read(keys) / var.export().")

    def value(self):
        """Raises TypeError: there is no dense value (see lookup_sparse)."""
        return self._dense_var_to_tensor()

    def read_value(self):
        """Raises TypeError: there is no dense value (see lookup_sparse)."""
        return self._dense_var_to_tensor()

    def _as_graph_element(self):
        return None

    def _ref(self):
        # Reached when a stock optimizer handles the variable without the hook.
        raise TypeError(f"Embedding Variable '{self.name}' can only be updated by a "
                        "tf.compat.v1.train optimizer after sok_ev.init(), or through "
                        "sok_ev.OptimizerWrapper(optimizer).")

    def to_proto(self, export_scope=None):
        """None: a MetaGraph gets no VariableDef for a hash table."""
        # The table is saved by the Saver, and rebuilt by running the script
        # that made it.
        del export_scope
        return None

    def __repr__(self):
        return (f"<sok_ev.EmbeddingVariable '{self.name}' embedding_dim="
                f"{self._embedding_dim} key_dtype={self._key_dtype.name} "
                f"target_gpu={self.target_gpu}>")

    @property
    def target_gpu(self):
        """-1: the table is sharded over every worker; k: it lives whole on
    worker k. Checked against the number of workers at the first lookup."""
        return self._target_gpu

    @target_gpu.setter
    def target_gpu(self, value):
        """Raises:
      TypeError: `value` is not an integer (bool included: True would mean 1).
      ValueError: `value` < -1.
    Both name target_gpu, the variable and the value; the setting is unchanged.
    """
        where = f"Embedding Variable '{self._handle_name}'" if hasattr(
            self, "_handle_name") else "Embedding Variable"
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{where}: target_gpu must be an integer, -1 (sharded over every "
                            f"worker) or a worker index >= 0, got {value!r}")
        if value < -1:
            raise ValueError(f"{where}: target_gpu must be -1 (sharded over every worker) or a "
                             f"worker index >= 0, got {value!r}")
        self._target_gpu = int(value)

    def _record_access(self):
        """Lets GradientTapes see that a lookup read this variable: the active
    ones, and, inside a tf.function being traced, the tapes active at each
    later call of it (the function graph remembers the variable)."""
        resource_variable_ops.variable_accessed(self)

    # --- tf.function arguments ----------------------------------------------

    def __tf_tracing_type__(self, context):
        """What tf.function keys its traces on when this variable is an
    argument: the variable itself (see EmbeddingVariableTraceType)."""
        del context
        return EmbeddingVariableTraceType(self)

    # --- Checkpoints: tf.train.Saver and tf.train.Checkpoint ----------------
    #
    # sok_ev/checkpoint.py writes and reads the tables (streamed, any worker
    # count): tf.compat.v1.train.Saver through the saver hook that
    # sok_ev.init() installs, tf.train.Checkpoint through a registered saver.

    @property
    def initializer_spec(self):
        """How a new key's row starts (sok_ev.initializers.InitializerSpec)."""
        return self._initializer_spec

    @property
    def default_values(self):
        """The `[N, dim]` default-value matrix input of the initializer (N = 0
    unless the initializer draws a matrix)."""
        return self._default_values

    @property
    def restores_as_saved(self):
        """True for a SavedModel's own tables (loaded, or traced for export):
    restoring an export for serving makes them serve. A table built to train
    keeps training, and takes an export's values only."""
        return self._restores_as_saved

    # --- SavedModel: tf.saved_model.save and tf.saved_model.load -----------
    #
    # The variable is a registered serializable: its record (what
    # get_embedding_variable made it with) goes into the SavedModel, and
    # loading recreates it, empty, before the registered saver of
    # sok_ev/checkpoint.py restores its table.

    def _export_to_saved_model_graph(self,
                                     object_map=None,
                                     tensor_map=None,
                                     options=None,
                                     **kwargs):
        del options, kwargs
        copy = EmbeddingVariable.__new__(EmbeddingVariable)
        copy.__dict__.update(self.__dict__)
        copy.__dict__.pop("_handle_deleter", None)  # the copy owns no table
        copy._restores_as_saved = True  # pylint: disable=protected-access
        copy._handle = _handle_op(self._handle_name, self._key_dtype, self._embedding_dim)  # pylint: disable=protected-access
        copy._default_values = tf.constant(  # pylint: disable=protected-access
            tf.get_static_value(self._default_values), tf.float32)
        object_map[self] = copy
        tensor_map[self._handle] = copy._handle  # pylint: disable=protected-access
        # The registered saver's functions are traced with the copy.
        for tensor in (copy._handle, copy._default_values):  # pylint: disable=protected-access
            tensor_map[tensor] = tensor
        return [self._handle]

    def _write_object_proto(self, proto, options):
        del options
        proto.user_object.identifier = "sok_ev.EmbeddingVariable"
        proto.user_object.version.producer = 1
        proto.user_object.version.min_consumer = 1

    def _serialize_to_proto(self, object_proto=None, **kwargs):
        del object_proto, kwargs
        record = attr_value_pb2.NameAttrList(name=self._handle_name)
        spec = self._initializer_spec
        for name, value in (("embedding_dim", self._embedding_dim), ("initializer_kind", spec.kind),
                            ("seed", spec.seed), ("default_value_dim", spec.default_value_dim),
                            ("steps_to_live", self._steps_to_live or
                             0), ("target_gpu", int(self.target_gpu))):
            record.attr[name].i = int(value)
        record.attr["key_dtype"].type = self._key_dtype.as_datatype_enum
        record.attr["trainable"].b = self._trainable
        record.attr["param_a"].f = spec.param_a
        record.attr["param_b"].f = spec.param_b
        if self._l2_weight_threshold is not None:
            record.attr["l2_weight_threshold"].f = self._l2_weight_threshold
        record.attr["default_values"].tensor.CopyFrom(
            tf.make_tensor_proto(tf.get_static_value(self._default_values)))
        for name, value in self._filter_attributes.items():
            if isinstance(value, float):
                record.attr[name].f = value
            else:
                record.attr[name].i = int(value)
        for name, value in self._storage_attributes.items():
            record.attr[name].i = int(value)
        return record

    @classmethod
    def _deserialize_from_proto(cls, proto=None, **kwargs):
        del kwargs
        record = attr_value_pb2.NameAttrList()
        proto.Unpack(record)
        attr = record.attr
        spec = initializers.InitializerSpec(kind=attr["initializer_kind"].i,
                                            param_a=attr["param_a"].f,
                                            param_b=attr["param_b"].f,
                                            seed=attr["seed"].i,
                                            default_value_dim=attr["default_value_dim"].i)
        filter_attributes = {
            name: (attr[name].f if name == "no_permission_value" else attr[name].i)
            for name in options_lib.FILTER_ATTRIBUTE_NAMES
        }
        storage_attributes = dict(_NO_TIERS)
        if "hbm_bytes" in attr:
            storage_attributes = {
                name: attr[name].i for name in options_lib.STORAGE_ATTRIBUTE_NAMES
            }
        variable = cls(record.name, attr["embedding_dim"].i, tf.as_dtype(attr["key_dtype"].type),
                       initializers.Drawn(spec, tf.make_ndarray(attr["default_values"].tensor)),
                       spec.default_value_dim or None, attr["trainable"].b,
                       attr["steps_to_live"].i or None, attr["target_gpu"].i, filter_attributes,
                       attr["l2_weight_threshold"].f if "l2_weight_threshold" in attr else None,
                       storage_attributes)
        variable._restores_as_saved = True  # pylint: disable=protected-access
        return variable

    def _gather_saveables_for_checkpoint(self):
        # What tf.compat.v1.train.Saver asks for; named after the variable.
        return {
            trackable.VARIABLE_VALUE_KEY:
                lambda name=None: EmbeddingVariableSaveable(self, name or self._handle_name)
        }


class EmbeddingVariableSaveable(saveable_object.SaveableObject):
    """How tf.compat.v1.train.Saver sees an Embedding Variable: a table to
  save and restore under `name`, done by the saver hook of sok_ev.init()
  (sok_ev/checkpoint.py), which writes it straight from the table."""

    def __init__(self, variable, name):
        self.variable = variable

        def refuse():
            raise ValueError(self._needs_hook_message())

        # The stock save path would call this; the hook never does.
        spec = saveable_object.SaveSpec(refuse,
                                        "",
                                        f"{name}/sok_ev",
                                        dtype=tf.string,
                                        device=variable.device)
        super().__init__(variable.handle, [spec], name)

    def _needs_hook_message(self):
        return (f"Embedding Variable '{self.variable.name}' is saved and restored by the "
                "tf.compat.v1.train.Saver hook that sok_ev.init() (or, on one worker, "
                "sok_ev.install_deeprec_api()) installs: call it before building the Saver, and "
                "do not pass the Saver a builder=.")

    def restore(self, restored_tensors, restored_shapes):
        del restored_tensors, restored_shapes
        raise ValueError(self._needs_hook_message())


# --- Meta graphs: import_meta_graph and SavedModel loaders -------------------
#
# The EMBEDDING_VARIABLES collection is exported as one record per variable;
# importing it rebuilds the Python EmbeddingVariable around the imported ops
# and puts it back into the global (and trainable) variables, so lookups,
# optimizers and new Savers work on an imported graph.


def _to_meta_graph_record(variable, export_scope=None):
    if export_scope is not None and not variable._handle_name.startswith(export_scope):  # pylint: disable=protected-access
        return None
    record = attr_value_pb2.NameAttrList(
        name=framework_ops.strip_name_scope(variable.handle.name, export_scope))
    record.attr["initializer"].s = framework_ops.strip_name_scope(variable.initializer.name,
                                                                  export_scope).encode()
    record.attr["trainable"].b = variable.trainable
    record.attr["steps_to_live"].i = variable.steps_to_live or 0
    record.attr["target_gpu"].i = variable.target_gpu
    if variable.l2_weight_threshold is not None:
        record.attr["l2_weight_threshold"].f = variable.l2_weight_threshold
    return record


def _from_meta_graph_record(record, import_scope=None):
    graph = framework_ops.get_default_graph()
    handle = graph.as_graph_element(framework_ops.prepend_name_scope(record.name, import_scope))
    initializer = graph.as_graph_element(
        framework_ops.prepend_name_scope(record.attr["initializer"].s.decode(), import_scope))
    variable = EmbeddingVariable._from_graph(  # pylint: disable=protected-access
        handle,
        initializer,
        trainable=record.attr["trainable"].b,
        steps_to_live=record.attr["steps_to_live"].i or None,
        target_gpu=record.attr["target_gpu"].i,
        l2_weight_threshold=(record.attr["l2_weight_threshold"].f
                             if "l2_weight_threshold" in record.attr else None))
    _graph_registry()[variable._handle_name] = variable  # pylint: disable=protected-access
    collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES]
    if variable.trainable:
        collections.append(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    for collection in collections:
        if variable not in graph.get_collection(collection):
            graph.add_to_collection(collection, variable)
    return variable


registration.register_serializable(package="sok_ev", name="EmbeddingVariable")(EmbeddingVariable)

framework_ops.register_proto_function(EMBEDDING_VARIABLES,
                                      proto_type=attr_value_pb2.NameAttrList,
                                      to_proto=_to_meta_graph_record,
                                      from_proto=_from_meta_graph_record)


class EmbeddingVariableTraceType(tf.types.experimental.TraceType):
    """The trace type of an Embedding Variable passed to a tf.function.

  A tf.function traces once per Embedding Variable it is called with, and
  inside the trace the argument is that very variable: its handle is
  captured as a closure's would be, so the table, its optimizer slots and
  any GradientTape (inside or outside the function) see the same variable.
  Calling the function again with the same variable reuses the trace;
  another variable gets its own trace (never another table's). Holds the
  variable weakly: a trace does not keep a table alive.
  """

    def __init__(self, variable):
        self._variable = weakref.ref(variable)
        self._id = id(variable)

    def is_subtype_of(self, other):
        return self == other

    def most_specific_common_supertype(self, others):
        return self if all(self == other for other in others) else None

    def placeholder_value(self, placeholder_context):
        del placeholder_context
        return self._variable()

    def to_tensors(self, value):
        del value
        return []  # the handle is captured, not passed

    def cast(self, value, cast_context):
        del cast_context
        if value is not self._variable():
            raise TypeError(f"Can not cast {value!r} to the trace type of {self._variable()!r}")
        return value

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, EmbeddingVariableTraceType) or self._id != other._id:
            return False
        variable = self._variable()
        return variable is not None and variable is other._variable()

    def __hash__(self):
        return self._id

    def __repr__(self):
        return f"EmbeddingVariableTraceType({self._variable()!r})"


def _full_name(name):
    scope = tf.compat.v1.get_variable_scope().name
    return f"{scope}/{name}" if scope else name


# TensorFlow's rule for op names (the handle op is named after the variable).
_VALID_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")
_VARIABLE_OP_TYPES = ("VarHandleOp", "VariableV2", "Variable")


def _check_graph_name(name, full_name):
    """Refuses, in graph mode, a full name that is no valid op name, or that
  another variable or op of the default graph already has: the handle op
  must be named exactly `full_name` (the checkpoint key), where TensorFlow
  would add a suffix."""
    if not _VALID_NAME.match(full_name) or not all(full_name.split("/")):
        raise ValueError(f"get_embedding_variable('{name}'): the variable's name {full_name!r} "
                         f"is not a valid op name (pattern {_VALID_NAME.pattern}, no empty "
                         "scope); choose another name.")
    graph = framework_ops.get_default_graph()
    try:
        op_type = graph.get_operation_by_name(full_name).type
    except KeyError:
        op_type = None
    # A partitioned tf1.get_variable has no op of its own name, only parts.
    for variable in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        slice_info = getattr(variable, "_save_slice_info", None)
        if slice_info is not None and slice_info.full_name == full_name:
            op_type = "partitioned variable"
    if op_type is None:
        return
    if op_type in _VARIABLE_OP_TYPES or op_type == "partitioned variable":
        # tf1.get_variable's message; reuse cannot return it as an Embedding Variable.
        raise ValueError(f"get_embedding_variable('{name}'): Variable {full_name} already "
                         f"exists ({op_type}), disallowed. reuse=True or reuse=tf.AUTO_REUSE "
                         "in VarScope returns only an Embedding Variable made by "
                         "get_embedding_variable; give this one another name or "
                         "variable_scope.")
    raise ValueError(f"get_embedding_variable('{name}'): the name {full_name} is taken by an op "
                     f"of type {op_type}; give the variable another name or variable_scope.")


def _warn_of_scope_settings_it_ignores(name):
    """A variable scope's partitioner and regularizer apply to the dense
  variables made in it; an Embedding Variable is sharded by target_gpu and
  takes no regularizer, so it says so instead of dropping them silently
  (refusing would stop scripts whose scope sets them for dense layers)."""
    scope = tf.compat.v1.get_variable_scope()
    for setting, why in (("partitioner", "it is sharded over the workers by target_gpu"),
                         ("regularizer", "no regularization loss is added for it")):
        value = getattr(scope, setting)
        if value is not None:
            tf.get_logger().warning(
                "get_embedding_variable('%s'): the variable scope %r's %s=%r does not apply to "
                "Embedding Variables: %s.", name, scope.name, setting, value, why)


def _graph_registry():
    """Embedding Variables of the default graph by full name."""
    graph = framework_ops.get_default_graph()
    if not hasattr(graph, "_sok_ev_variables"):
        graph._sok_ev_variables = {}  # pylint: disable=protected-access
    return graph._sok_ev_variables  # pylint: disable=protected-access


def get_embedding_variable(name: str,
                           embedding_dim: int,
                           key_dtype: tf.DType = tf.int64,
                           value_dtype: Optional[tf.DType] = None,
                           initializer: Any = None,
                           regularizer: Any = None,
                           trainable: bool = True,
                           collections: Optional[Iterable[str]] = None,
                           caching_device: Any = None,
                           partitioner: Any = None,
                           validate_shape: bool = True,
                           custom_getter: Any = None,
                           constraint: Any = None,
                           steps_to_live: Optional[int] = None,
                           init_data_source: Any = None,
                           ev_option: Optional[options_lib.EmbeddingVariableOption] = None,
                           target_gpu: int = -1) -> "EmbeddingVariable":
    """Gets an existing Embedding Variable or creates a new one (DeepRec API).

  In graph mode the variable scope applies, as for tf.compat.v1.get_variable:
  the variable is named `<variable scope>/<name>:0` exactly (name scopes are
  ignored), and `reuse` (True, False or tf.compat.v1.AUTO_REUSE) decides
  whether an existing Embedding Variable is returned. In eager mode every
  call creates a new variable, named as tf.Variable is (the current name
  scope, which a variable_scope opens too, then `name`).

  Args:
    name: the variable's name (without scope), a non-empty string.
    embedding_dim: int in [1, MAX_EMBEDDING_DIM = 65536], the length of each
      row.
    key_dtype: tf.int64 (default) or tf.int32: the dtype of lookup keys.
    value_dtype: tf.float32 (default; the only value dtype).
    initializer: initializer of new rows, an instance or (as in DeepRec) its
      class; default truncated normal (mean 0, stddev 1), DeepRec's.
      Constant, uniform, normal and truncated-normal initializers draw per
      key when it is first seen.
    trainable: add to TRAINABLE_VARIABLES and let optimizers update it.
    collections: a list, tuple or set of the graph collections to add to
      (default [GLOBAL_VARIABLES]).
    steps_to_live: evict keys not updated for this many global steps (done
      when the variable is saved, as in DeepRec). Same as
      `ev_option.evict_option = GlobalStepEvict(steps_to_live)`.
    ev_option: an EmbeddingVariableOption; its `init_option` may set
      `default_value_dim` (DeepRec's key-mod-N rule) and an initializer.
      `filter_option` admits keys as DeepRec's CounterFilter / CBFFilter do;
      `evict_option=L2WeightEvict(t)` evicts keys of L2 weight below t at
      save. Options sok-ev does not implement yet (storage
      other than DRAM, CheckpointOption) raise ValueError naming the feature
      (sok_ev.options.check_supported).
    target_gpu: -1 (default) shards the table over all workers; k places it
      whole on worker k. Also settable later as `var.target_gpu`.
    partitioner: None, or a TensorFlow partitioner (e.g.
      tf.compat.v1.fixed_size_partitioner(4)): as in DeepRec, the variable
      is then N Embedding Variables `<name>/part_<i>`, N the partitioner's
      answer for a `[sys.maxsize, embedding_dim]` variable, key k living in
      part (k mod 1000) mod N (sok_ev.partitioned_variable). A variable
      scope's partitioner is not applied (a warning says so).
    regularizer, caching_device, custom_getter, constraint,
    init_data_source: DeepRec arguments sok-ev does not support; anything
      but the default raises ValueError. validate_shape is accepted and
      ignored (the shape is always [embedding_dim]).

  Returns:
    An EmbeddingVariable; with a partitioner, a
    sok_ev.PartitionedEmbeddingVariable of its parts.

  Raises:
    ValueError: an empty name, collections that is not a list, tuple or set,
      bad embedding_dim, steps_to_live or target_gpu, an unsupported
      argument or option, a scope/reuse conflict, or (graph mode) a name
      another variable or op of the graph already has.
    TypeError: key_dtype or value_dtype not supported, target_gpu or
      steps_to_live given as a bool, or an initializer that is not one.

  Example:
    with tf.compat.v1.variable_scope("user"):
      ev = sok_ev.get_embedding_variable("emb", embedding_dim=16)  # user/emb:0
  """
    if not isinstance(name, str) or not name:
        raise ValueError(f"get_embedding_variable: name must be a non-empty string, got {name!r}")
    # bool is an Integral: True would silently mean 1.
    for argument, value in (("target_gpu", target_gpu), ("steps_to_live", steps_to_live)):
        if isinstance(value, bool):
            raise TypeError(f"get_embedding_variable('{name}'): {argument} must be an integer, "
                            f"got {value!r}")
    unsupported = {
        "regularizer": regularizer,
        "caching_device": caching_device,
        "custom_getter": custom_getter,
        "constraint": constraint,
        "init_data_source": init_data_source
    }
    for argument, value in unsupported.items():
        if value is not None:
            raise ValueError(f"get_embedding_variable('{name}'): {argument}={value!r} "
                             "is not supported by sok-ev; leave it None.")
    del validate_shape
    _warn_of_scope_settings_it_ignores(name)
    # A string is iterable: it would become one collection per letter.
    if collections is not None and not isinstance(collections, (list, tuple, set, frozenset)):
        raise ValueError(f"get_embedding_variable('{name}'): collections must be a list, tuple "
                         f"or set of collection names, got {collections!r}")
    if (not isinstance(embedding_dim, numbers.Integral) or isinstance(embedding_dim, bool) or
            not 0 < embedding_dim <= MAX_EMBEDDING_DIM):
        raise ValueError(f"get_embedding_variable('{name}'): embedding_dim must be "
                         f"an integer in [1, {MAX_EMBEDDING_DIM}], got {embedding_dim!r}")
    try:
        key_dtype = tf.as_dtype(key_dtype)
    except TypeError:
        key_dtype = None
    if key_dtype not in _SUPPORTED_KEY_DTYPES:
        raise TypeError(f"get_embedding_variable('{name}'): key_dtype must be "
                        f"tf.int32 or tf.int64, got {key_dtype!r}")
    if value_dtype is not None and tf.as_dtype(value_dtype) != tf.float32:
        raise TypeError(f"get_embedding_variable('{name}'): value_dtype must be "
                        f"tf.float32, got {value_dtype!r}")
    if (not isinstance(target_gpu, numbers.Integral) or target_gpu < -1):
        raise ValueError(f"get_embedding_variable('{name}'): target_gpu must be -1 "
                         f"or a worker index >= 0, got {target_gpu!r}")
    ev_option = ev_option or options_lib.EmbeddingVariableOption()
    if not isinstance(ev_option, options_lib.EmbeddingVariableOption):
        raise TypeError(f"get_embedding_variable('{name}'): ev_option must be a "
                        f"sok_ev.EmbeddingVariableOption, got {ev_option!r}")
    options_lib.check_supported(ev_option, f"get_embedding_variable('{name}')")
    filter_attributes = options_lib.filter_attributes(ev_option,
                                                      f"get_embedding_variable('{name}')")
    storage_attributes = options_lib.storage_attributes(ev_option, embedding_dim,
                                                        f"get_embedding_variable('{name}')")
    l2_weight_threshold = None
    if isinstance(ev_option.evict_option, options_lib.L2WeightEvict):
        threshold = ev_option.evict_option.l2_weight_threshold
        if not isinstance(threshold, numbers.Real) or isinstance(threshold, bool):
            raise ValueError(f"get_embedding_variable('{name}'): evict_option.l2_weight_threshold "
                             f"must be a number, got {threshold!r}")
        # DeepRec: a threshold <= 0 disables the eviction.
        l2_weight_threshold = float(threshold) if threshold > 0 else None
    if (isinstance(ev_option.evict_option, options_lib.GlobalStepEvict) and
            ev_option.evict_option.steps_to_live):
        if steps_to_live not in (None, ev_option.evict_option.steps_to_live):
            raise ValueError(f"get_embedding_variable('{name}'): steps_to_live="
                             f"{steps_to_live} disagrees with evict_option."
                             f"steps_to_live={ev_option.evict_option.steps_to_live}")
        steps_to_live = ev_option.evict_option.steps_to_live
    if isinstance(steps_to_live, bool):  # from evict_option
        raise TypeError(f"get_embedding_variable('{name}'): evict_option.steps_to_live must be "
                        f"an integer, got {steps_to_live!r}")
    if steps_to_live is not None and (not isinstance(steps_to_live, numbers.Integral) or
                                      steps_to_live <= 0):
        raise ValueError(f"get_embedding_variable('{name}'): steps_to_live must be "
                         f"a positive integer or None, got {steps_to_live!r}")
    # NumPy integers are accepted; the attributes and records want Python ints.
    embedding_dim, target_gpu = int(embedding_dim), int(target_gpu)
    steps_to_live = None if steps_to_live is None else int(steps_to_live)
    init_option = ev_option.init_option or options_lib.InitializerOption()
    if init_option.initializer is not None:
        initializer = init_option.initializer
    if initializer is None:
        # DeepRec's default (get_embedding_variable_internal): TF1's
        # truncated_normal_initializer(), mean 0, stddev 1.
        initializer = tf.compat.v1.truncated_normal_initializer()
    initializer = initializers.as_instance(initializer, f"get_embedding_variable('{name}')")
    if partitioner is not None:
        count = partitioned_variable.num_partitions(partitioner, embedding_dim,
                                                    f"get_embedding_variable('{name}')")
        parts = [
            get_embedding_variable(f"{name}/part_{i}",
                                   embedding_dim,
                                   key_dtype,
                                   initializer=initializer,
                                   trainable=trainable,
                                   collections=collections,
                                   steps_to_live=steps_to_live,
                                   ev_option=ev_option,
                                   target_gpu=target_gpu) for i in range(count)
        ]
        shared = parts[0].name.rsplit("/part_0", 1)[0]
        for i, part in enumerate(parts):
            part.partition = (shared, i, count)
        return partitioned_variable.PartitionedEmbeddingVariable(shared, parts)

    def create(full_name):
        return EmbeddingVariable(full_name, embedding_dim, key_dtype, initializer,
                                 init_option.default_value_dim, trainable, steps_to_live,
                                 target_gpu, filter_attributes, l2_weight_threshold,
                                 storage_attributes)

    if context.executing_eagerly():
        return create(name)

    full_name = _full_name(name)
    registry = _graph_registry()
    reuse = tf.compat.v1.get_variable_scope().reuse
    if full_name in registry:
        if reuse is False or reuse is None:
            raise ValueError(f"Embedding Variable {full_name} already exists, "
                             "disallowed. Did you mean to set reuse=True or "
                             "reuse=tf.AUTO_REUSE in VarScope?")
        existing = registry[full_name]
        if (existing.embedding_dim != embedding_dim or existing.key_dtype != key_dtype):
            raise ValueError(f"Embedding Variable {full_name} exists with embedding_dim="
                             f"{existing.embedding_dim}, key_dtype={existing.key_dtype.name}; "
                             f"asked for embedding_dim={embedding_dim}, key_dtype={key_dtype.name}")
        return existing
    if reuse is True:
        raise ValueError(f"Embedding Variable {full_name} does not exist, or was "
                         "not created with get_embedding_variable(). Did you mean "
                         "to set reuse=tf.AUTO_REUSE in VarScope?")
    _check_graph_name(name, full_name)
    # From the root, with a trailing "/", the name scope is taken as is: the
    # name is the variable scope's whatever name scope is open, as for
    # tf.compat.v1.get_variable (so a checkpoint restores into the same model
    # built under a name scope).
    with framework_ops.name_scope(None, skip_on_eager=False):
        variable = create(full_name + "/")
    graph = framework_ops.get_default_graph()
    # An absolute name scope does not reserve the name: without this a later
    # op named full_name would collide with the handle op.
    if graph.unique_name(full_name, mark_as_used=False) == full_name:
        graph.unique_name(full_name)
    registry[full_name] = variable
    # In tf1.get_variable's store too, as DeepRec's are: a later
    # get_variable of this name then fails ("already exists") or, reusing,
    # returns this variable, instead of silently making `<name>_1`.
    variable_scope._get_default_variable_store()._vars[full_name] = variable  # pylint: disable=protected-access
    if collections is None:
        collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES]
    collections = list(collections)
    if trainable and tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES not in collections:
        collections.append(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    collections.append(EMBEDDING_VARIABLES)
    for collection in dict.fromkeys(collections):
        tf.compat.v1.add_to_collection(collection, variable)
    # DeepRec scripts run this collection before global_variables_initializer.
    tf.compat.v1.add_to_collection(EV_INIT_VAR_OPS, variable.initializer)
    return variable
