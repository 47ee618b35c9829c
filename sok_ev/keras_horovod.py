"""Horovod with Keras's fit: `sok_ev.keras.DistributedOptimizer` and
`sok_ev.keras.BroadcastGlobalVariablesCallback`.

  optimizer = sok_ev.keras.DistributedOptimizer(keras.optimizers.Adagrad(0.1))
  model.compile(optimizer=optimizer, loss="mse")
  model.fit(dataset_of_this_worker,
            callbacks=[sok_ev.keras.BroadcastGlobalVariablesCallback(0)])

Horovod's own Keras wrappers do not fit: with Keras 3, `hvd.DistributedOptimizer`
(horovod.tensorflow.keras) allreduces in `get_gradients` /
`_compute_gradients`, which Keras 3's train_step never calls, so dense
gradients stay per worker without an error; under tf_keras it allreduces
every gradient, and sok-ev refuses an Embedding Variable's. Horovod's
BroadcastGlobalVariablesCallback calls `optimizer.variables()`, a list (not
callable) in both Keras 3 and tf_keras's optimizers.

These two work with either Keras (`tf.keras`), through the optimizer hook
that updates Embedding Variables (`sok_ev.keras_optimizers`): each step
averages the dense gradients over the workers (Horovod's allreduce) and
divides each table's gradient, which its lookup's backward exchange already
summed over the workers at each key's owner, by the worker count. A fit on
W workers, each on its own batch of b samples, thus takes the steps of one
worker on the global batch of W·b (Keras's losses are means over the batch).
"""

import tensorflow as tf

from sok_ev import keras_optimizers
from sok_ev.embedding_variable import EmbeddingVariable
from sok_ev.optimizers import EmbeddingVariableSlot


def DistributedOptimizer(optimizer):  # pylint: disable=invalid-name
    """Makes a Keras optimizer average its gradients over the Horovod workers
  (dense ones allreduced, tables' divided by the worker count; see the
  module docstring) at each step, in fit or in apply_gradients.

  Args:
    optimizer: a tf.keras optimizer (Keras 3's or tf_keras's). Its tables'
      updates are the fused ones of SGD, Adagrad, Adam, AdamW, Ftrl and RMSprop.

  Returns:
    `optimizer` itself, marked: its class, name, slots and checkpoints stay
    those of a single worker's optimizer. With one worker nothing changes.

  Raises:
    TypeError: `optimizer` is not a tf.keras optimizer.
  """
    if not isinstance(optimizer, tf.keras.optimizers.Optimizer):
        raise TypeError(
            "sok_ev.keras.DistributedOptimizer: optimizer must be a "
            f"tf.keras.optimizers.Optimizer ({tf.keras.optimizers.Optimizer.__module__}), "
            f"got {optimizer!r}")
    keras_optimizers.install_keras_optimizer_hook()
    keras_optimizers.make_data_parallel(optimizer)
    return optimizer


def _dense(variables):
    """The variables every worker holds a copy of: not tables, not their slots."""
    return [v for v in variables if not isinstance(v, (EmbeddingVariable, EmbeddingVariableSlot))]


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Copies worker `root_rank`'s dense weights and optimizer variables to
  every worker: when training begins (the weights built by then) and after
  the first step (what the first step built: tf_keras builds subclassed
  models and optimizer slots there). Embedding Variables are not copied:
  each worker holds its own keys.

  Args:
    root_rank: int, the worker whose values are copied.

  Raises:
    ValueError: root_rank is not an int in [0, workers).
  """

    def __init__(self, root_rank=0):
        super().__init__()
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
        workers = hvd.size() if hvd.is_initialized() else 1
        if (not isinstance(root_rank, int) or isinstance(root_rank, bool) or
                not 0 <= root_rank < workers):
            raise ValueError("sok_ev.keras.BroadcastGlobalVariablesCallback: root_rank must be "
                             f"an int in [0, {workers}), got {root_rank!r}")
        self.root_rank = root_rank
        self._hvd = hvd
        self._done = False

    def _broadcast(self):
        variables = _dense(list(self.model.variables))
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            variables += _dense(list(optimizer.variables))
        if self._hvd.size() == 1 or not variables:
            return
        # Names, not Horovod's counters, pair the workers' broadcasts.
        for i, variable in enumerate(variables):
            value = self._hvd.broadcast(tf.convert_to_tensor(variable),
                                        self.root_rank,
                                        name=f"sok_ev_keras_broadcast_{i}")
            variable.assign(value)

    def on_train_begin(self, logs=None):
        self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self._done:
            self._broadcast()
            self._done = True
