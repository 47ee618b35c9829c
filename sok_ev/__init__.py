"""sok-ev: DeepRec's Embedding Variables and SOK's grouped sparse lookups on
stock TensorFlow.

  import sok_ev as sok
  sok.init()
  var = sok.get_embedding_variable("var_0", embedding_dim=16)
  emb, = sok.lookup_sparse([var], [sparse_ids], combiners=["sum"])

See README.md for the whole API.
"""

from sok_ev import _ops
from sok_ev import broadcast
from sok_ev import checkpoint
from sok_ev import communication
from sok_ev import dispatch
from sok_ev import embedding_gradients
from sok_ev import keras_jit
from sok_ev import keras_layers as keras  # sok_ev.keras: the Keras 3 layers
from sok_ev import keras_optimizers
from sok_ev import optimizers
from sok_ev import warm_start
from sok_ev.initialization import init
from sok_ev.deeprec_api import install_deeprec_api
from sok_ev.deeprec_checkpoint import export_deeprec_checkpoint
from sok_ev.deeprec_checkpoint import restore_deeprec_checkpoint
from sok_ev.deeprec_optimizers import AdagradDecayOptimizer
from sok_ev.deeprec_optimizers import AdamAsyncOptimizer
from sok_ev.embedding_variable import EmbeddingVariable
from sok_ev.embedding_variable import get_embedding_variable
from sok_ev.incremental_saver import Saver
from sok_ev.lookup import lookup_sparse
from sok_ev.lookup_pipeline import LookupPipeline
from sok_ev.optimizers import EmbeddingVariableSlot
from sok_ev.optimizers import OptimizerWrapper
from sok_ev.optimizers import SUPPORTED_OPTIMIZERS
from sok_ev.partitioned_variable import PartitionedEmbeddingVariable
from sok_ev.options import CacheStrategy
from sok_ev.options import CBFFilter
from sok_ev.options import CheckpointOption
from sok_ev.options import CounterFilter
from sok_ev.options import EmbeddingVariableOption
from sok_ev.options import GlobalStepEvict
from sok_ev.options import InitializerOption
from sok_ev.options import L2WeightEvict
from sok_ev.options import StorageOption
from sok_ev.options import StorageType
from sok_ev.serving import serving_export

__version__ = "0.1.0"

# Graphs that hold sok_ev ops (import_meta_graph, SavedModel loaders) need
# them registered once `import sok_ev` ran. A broken build still imports: the
# first call that needs an op raises the library's error.
try:
    _ops.ops()
except ImportError:
    pass


def rank() -> int:
    """This worker's index (0 without Horovod)."""
    return communication.rank()


def world_size() -> int:
    """Number of workers (1 without Horovod)."""
    return communication.world_size()


__all__ = [
    "AdagradDecayOptimizer",
    "AdamAsyncOptimizer",
    "CBFFilter",
    "CacheStrategy",
    "CheckpointOption",
    "CounterFilter",
    "EmbeddingVariable",
    "EmbeddingVariableOption",
    "EmbeddingVariableSlot",
    "GlobalStepEvict",
    "InitializerOption",
    "L2WeightEvict",
    "LookupPipeline",
    "Saver",
    "StorageOption",
    "StorageType",
    "OptimizerWrapper",
    "PartitionedEmbeddingVariable",
    "SUPPORTED_OPTIMIZERS",
    "export_deeprec_checkpoint",
    "get_embedding_variable",
    "init",
    "install_deeprec_api",
    "keras",
    "lookup_sparse",
    "rank",
    "restore_deeprec_checkpoint",
    "serving_export",
    "world_size",
]
