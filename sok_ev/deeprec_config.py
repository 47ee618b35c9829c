"""DeepRec's `ConfigProto` fields on stock TensorFlow.

DeepRec's `OptimizerOptions` has fields stock TensorFlow's lacks
(`do_smart_stage`, `do_op_fusion`, `micro_batch_num`, ...): they turn on
graph optimisations (smart staging, op fusion, micro batches) that change no
value. TensorFlow's protobuf messages reject unknown fields and cannot be
subclassed, so `install_deeprec_api()` puts `ConfigProto` here on
`tf.compat.v1`: it makes a stock `ConfigProto` (`.proto`) and hands it out
through views whose `graph_options.optimizer_options` also keeps DeepRec's
fields, checked and then ignored. Every other field reads and writes the
stock message. `install_session_hook()` makes TensorFlow's sessions (and so
`MonitoredTrainingSession`, `ChiefSessionCreator`) take such a config: they
receive its stock `ConfigProto`.
"""

import copy
import numbers

from tensorflow.core.protobuf import config_pb2
from tensorflow.python.client import session as session_module

STOCK_CONFIG_PROTO = config_pb2.ConfigProto

# DeepRec's OptimizerOptions fields missing from TensorFlow's: name -> type.
DEEPREC_OPTIMIZER_FIELDS = {
    "do_op_fusion": bool,
    "micro_batch_num": int,
    "do_smart_stage": bool,
    "do_smart_stage_gpu": bool,
    "do_async_embedding": bool,
    "embedding_layer_device_placement_optimization": bool,
    "stage_multi_stream": bool,
}


def _checked(field, value):
    """`value` as DeepRec's proto would store it in `field`."""
    kind = DEEPREC_OPTIMIZER_FIELDS[field]
    if kind is bool:
        # Protobuf's bool fields take bools and integers; nothing else.
        if not isinstance(value, numbers.Integral):
            raise TypeError(f"OptimizerOptions.{field} must be a bool, got {value!r}")
        return bool(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"OptimizerOptions.{field} must be an integer, got {value!r}")
    if not 0 <= value < 2**31:
        raise ValueError(f"OptimizerOptions.{field} must be in [0, 2**31), got {value!r}")
    return int(value)


class _View:
    """A stock message, read and written through attributes."""

    __slots__ = ("_message", "_children")

    _CHILDREN = {}  # field name -> view class of that sub-message

    def __init__(self, message):
        object.__setattr__(self, "_message", message)
        object.__setattr__(self, "_children", {})

    def __getattr__(self, name):
        view_class = self._CHILDREN.get(name)
        if view_class is None:
            return getattr(self._message, name)
        # One view per sub-message, so DeepRec's fields set on it stay set.
        if name not in self._children:
            self._children[name] = view_class(getattr(self._message, name))
        return self._children[name]

    def __setattr__(self, name, value):
        setattr(self._message, name, value)

    def __dir__(self):
        return sorted(set(dir(self._message)) | set(self._CHILDREN))

    def __repr__(self):
        return repr(self._message)

    def __str__(self):
        return str(self._message)


class OptimizerOptionsView(_View):
    """TensorFlow's OptimizerOptions plus DeepRec's fields (stored, unused)."""

    __slots__ = ("_deeprec",)

    def __init__(self, message):
        super().__init__(message)
        object.__setattr__(self, "_deeprec", {})

    def __getattr__(self, name):
        if name in DEEPREC_OPTIMIZER_FIELDS:
            return self._deeprec.get(name, DEEPREC_OPTIMIZER_FIELDS[name]())
        return super().__getattr__(name)

    def __setattr__(self, name, value):
        if name in DEEPREC_OPTIMIZER_FIELDS:
            self._deeprec[name] = _checked(name, value)
        else:
            super().__setattr__(name, value)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(DEEPREC_OPTIMIZER_FIELDS))

    @property
    def deeprec_fields(self):
        """DeepRec's fields set so far: name -> value."""
        return dict(self._deeprec)


class GraphOptionsView(_View):
    __slots__ = ()
    _CHILDREN = {"optimizer_options": OptimizerOptionsView}


class _ConfigProtoType(type):
    """isinstance(x, ConfigProto) holds for stock ConfigProtos too; the stock
  class's attributes (DESCRIPTOR, FromString, nested types) read through."""

    def __instancecheck__(cls, instance):
        return type.__instancecheck__(cls, instance) or isinstance(instance, STOCK_CONFIG_PROTO)

    def __getattr__(cls, name):
        return getattr(STOCK_CONFIG_PROTO, name)


class ConfigProto(_View, metaclass=_ConfigProtoType):
    """`tf.compat.v1.ConfigProto(**fields)` that also takes DeepRec's
  `graph_options.optimizer_options` fields (DEEPREC_OPTIMIZER_FIELDS).

  Keyword arguments are the stock message's. `.proto` is the stock
  ConfigProto TensorFlow receives.

  Raises:
    TypeError, ValueError: a DeepRec field set to a value of the wrong kind
      (naming the field and the value); stock fields raise as TensorFlow's.
  """

    __slots__ = ()
    _CHILDREN = {"graph_options": GraphOptionsView}

    def __init__(self, *args, **kwargs):
        super().__init__(STOCK_CONFIG_PROTO(*args, **kwargs))

    @property
    def proto(self):
        """The stock ConfigProto (DeepRec's fields are not in it)."""
        return self._message

    @property
    def deeprec_fields(self):
        """DeepRec's OptimizerOptions fields set so far: name -> value."""
        return self.graph_options.optimizer_options.deeprec_fields

    def __deepcopy__(self, memo):
        result = ConfigProto()
        result.proto.CopyFrom(self.proto)
        for name, value in self.deeprec_fields.items():
            setattr(result.graph_options.optimizer_options, name, value)
        return result

    def __copy__(self):
        return copy.deepcopy(self)

    def __eq__(self, other):
        if isinstance(other, STOCK_CONFIG_PROTO):
            return not self.deeprec_fields and self.proto == other
        if type(other) is ConfigProto:
            return self.proto == other.proto and self.deeprec_fields == other.deeprec_fields
        return NotImplemented

    __hash__ = None


def to_stock(config):
    """The stock ConfigProto of `config` (a ConfigProto view), else `config`."""
    return config.proto if type(config) is ConfigProto else config


_originals = {}


def install_session_hook():
    """Makes TensorFlow's sessions take a ConfigProto view, passing on its
  stock ConfigProto (TensorFlow checks the type). Idempotent."""
    if not _originals:
        original = session_module.BaseSession.__init__
        _originals["BaseSession.__init__"] = original

        def __init__(self, target="", graph=None, config=None):
            original(self, to_stock(target), graph, to_stock(config))

        __init__.__doc__ = original.__doc__
        session_module.BaseSession.__init__ = __init__


def uninstall_session_hook():
    """Restores TensorFlow's BaseSession.__init__."""
    if _originals:
        session_module.BaseSession.__init__ = _originals.pop("BaseSession.__init__")
