"""DeepRec's TensorFlow modules that stock TensorFlow lacks, made importable.

DeepRec scripts import some names from modules only DeepRec's TensorFlow has
(`tensorflow.python.ops.work_queue`,
`tensorflow.python.data.experimental.ops.parquet_dataset_ops`,
`tensorflow.core.framework.embedding.config_pb2`). `provide_module` puts a
module of that name, holding sok-ev's objects, in `sys.modules` and on its
parent package, so that both `import` forms find it.
"""

import importlib
import sys
import types


def provide_module(name: str, doc: str, **attributes) -> types.ModuleType:
    """The module `name`, made with `doc` and `attributes` unless it is
  already imported (then left as it is), and set on its parent package;
  missing parent packages are made the same way (empty). Idempotent."""
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name, doc)
        module.__dict__.update(attributes)
        sys.modules[name] = module
    parent_name, _, child = name.rpartition(".")
    try:
        parent = importlib.import_module(parent_name)
    except ModuleNotFoundError:
        parent = provide_module(parent_name,
                                "A package of DeepRec's TensorFlow (sok-ev).",
                                __path__=[])
    setattr(parent, child, module)
    return module
