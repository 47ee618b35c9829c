"""`sok_ev.init()`: the rank and workers from Horovod, and the hooks that let
TensorFlow's own APIs (optimizers, tf.nn lookups, savers, broadcasts) serve
Embedding Variables. Its own module so that sok_ev's modules that need it
(sok_ev.deeprec_distributed) import it without importing the package.
"""

from sok_ev import broadcast
from sok_ev import checkpoint
from sok_ev import communication
from sok_ev import dispatch
from sok_ev import embedding_gradients
from sok_ev import keras_jit
from sok_ev import keras_optimizers
from sok_ev import optimizers
from sok_ev import warm_start


def init() -> None:
    """Prepares sok-ev; call once, after `hvd.init()` when using Horovod.

  Takes the rank and number of workers from Horovod if it is initialised
  (one worker otherwise), and installs:
  * with several workers, the guards that keep Embedding Variable gradients
    out of Horovod's reductions (`sok_ev.embedding_gradients`);
  * the narrow optimizer hook (`sok_ev.optimizers.install_optimizer_hook`),
    so stock tf.compat.v1.train optimizers update Embedding Variables;
  * the Keras optimizer hook (`sok_ev.keras_optimizers`), the same for
    tf.keras.optimizers SGD, Adagrad, Adam, AdamW, Ftrl and RMSprop, and Keras's refusal of
    XLA for models whose layers hold Embedding Variables (`sok_ev.keras_jit`);
  * the tf.nn lookup dispatch (`sok_ev.dispatch`): tf.nn.embedding_lookup,
    embedding_lookup_sparse and safe_embedding_lookup_sparse (and their
    tf.compat.v1 forms) read Embedding Variables;
  * the saver hook (`sok_ev.checkpoint.install_saver_hook`), so
    tf.compat.v1.train.Saver saves and restores them on any number of
    workers, and tf.compat.v1.train.init_from_checkpoint warm-starts them
    (`sok_ev.warm_start`); and makes hvd.broadcast_variables check Embedding
    Variables instead of copying them (`sok_ev.broadcast`).
  Each leaves everything that is not an Embedding Variable to TensorFlow's
  own code. Idempotent.

  Raises:
    RuntimeError: several processes were launched but Horovod is missing or
      not initialised.
  """
    communication.init()
    if communication.world_size() > 1:
        embedding_gradients.install_allreduce_guards()
    checkpoint.record_worker_topology()
    checkpoint.install_saver_hook()
    warm_start.install_hook()
    broadcast.install_broadcast_guard()
    optimizers.install_optimizer_hook()
    keras_optimizers.install_keras_optimizer_hook()
    keras_jit.install_keras_jit_guard()
    dispatch.install_lookup_dispatch()
