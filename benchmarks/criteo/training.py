"""Training and evaluation of the Criteo models, in TF1 Session or TF2 tf.function style.

An Implementation is one model: embeddings (sok-ev or the hash-bucket
baseline), a dense tower (DLRM or DCNv2) and a stock
tf.compat.v1.train.AdagradOptimizer (sok_ev.init() makes it update Embedding
Variables).

Data parallelism of the dense part. Each worker's loss is the SUM of its
samples' log losses divided by the GLOBAL batch size, so that the gradients
summed over the workers are those of the global batch's mean loss:
  - dense gradients are summed with one grouped Horovod allreduce (which also
    sums the loss and sample count for reporting);
  - sok-ev Embedding Variable gradients are never allreduced: the owner of a
    key already receives every worker's part of its gradient;
  - the baseline's tables are replicated, so their IndexedSlices gradients
    are summed too (Horovod allgathers them), as hvd.DistributedOptimizer
    would do.
With one worker (hvd None) nothing is reduced.

Both styles run the implementations on the same batches, one after the other
(which one first alternates from step to step), each step timed on its own
(`Style.train`), so a busy machine slows both alike and the input pipeline
(which runs ahead, in parallel) is shared.
"""
import time
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from benchmarks.criteo import formats
from benchmarks.criteo import reader

# Optimizer slots each key/row carries, for the memory figures.
ADAGRAD_SLOTS = 1

BATCH_SPEC = {
    "label": tf.TensorSpec([None], tf.float32),
    "dense": tf.TensorSpec([None, reader.NUM_DENSE], tf.float32),
    "keys": tf.TensorSpec([None, reader.NUM_CATEGORICAL], tf.int64),
}


class Implementation:
    """One model: embeddings + tower + Adagrad; builds its train and eval graphs."""

    def __init__(self,
                 embeddings,
                 tower,
                 learning_rate: float,
                 global_batch: int,
                 hvd=None,
                 initial_accumulator: float = 0.1,
                 warmup_steps: int = 0):
        self.embeddings = embeddings
        self.tower = tower
        self.name = embeddings.name
        self.global_batch = global_batch
        self.hvd = hvd
        # The step counts this implementation's updates; the learning rate
        # rises linearly to `learning_rate` over the first `warmup_steps`.
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{self.name}_step")
        rate = learning_rate
        if warmup_steps:
            rate = lambda: learning_rate * tf.minimum(  # noqa: E731
                1.0,
                tf.cast(self.step + 1, tf.float32) / warmup_steps)
        self.optimizer = tf.compat.v1.train.AdagradOptimizer(
            rate, initial_accumulator_value=initial_accumulator)
        self.variables = list(embeddings.variables) + list(tower.variables)

    def logits(self, batch: Dict[str, tf.Tensor]) -> tf.Tensor:
        """[n] logits of a parsed batch."""
        return self.tower(batch["dense"], self.embeddings(batch["keys"]))

    def train(self, batch: Dict[str, tf.Tensor], use_tape: bool):
        """(train op, the global batch's mean loss). use_tape: gradients from a
    GradientTape (tf.function style) instead of optimizer.compute_gradients."""
        labels = batch["label"]
        if use_tape:
            with tf.GradientTape() as tape:
                loss_sum = self._loss_sum(batch)
                loss = loss_sum / self.global_batch
            grads = tape.gradient(loss, self.variables)
        else:
            loss_sum = self._loss_sum(batch)
            loss = loss_sum / self.global_batch
            grads = [g for g, _ in self.optimizer.compute_gradients(loss, var_list=self.variables)]
        totals = tf.stack([loss_sum, tf.cast(tf.shape(labels)[0], tf.float32)])
        grads, totals = self._allreduce(grads, totals)
        train_op = self.optimizer.apply_gradients(zip(grads, self.variables))
        with tf.control_dependencies([train_op]):
            train_op = self.step.assign_add(1)
        return train_op, totals[0] / tf.maximum(totals[1], 1.0)

    def _loss_sum(self, batch):
        return tf.reduce_sum(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"],
                                                    logits=self.logits(batch)))

    def _allreduce(self, grads, totals):
        if self.hvd is None:
            return grads, totals
        import sok_ev  # pylint: disable=import-outside-toplevel
        hvd = self.hvd
        dense = [
            i for i, (g, v) in enumerate(zip(grads, self.variables))
            if not isinstance(v, sok_ev.EmbeddingVariable) and not isinstance(g, tf.IndexedSlices)
        ]
        reduced = hvd.grouped_allreduce([grads[i] for i in dense] + [totals], op=hvd.Sum)
        out = list(grads)
        for i, g in zip(dense, reduced[:-1]):
            out[i] = g
        for i, (g, v) in enumerate(zip(grads, self.variables)):
            if isinstance(g, tf.IndexedSlices) and not isinstance(v, sok_ev.EmbeddingVariable):
                out[i] = hvd.allreduce(g, op=hvd.Sum)
        return out, reduced[-1]

    def probabilities(self, batch: Dict[str, tf.Tensor]) -> tf.Tensor:
        return tf.sigmoid(self.logits(batch))

    def keys_stored(self) -> tf.Tensor:
        """Keys stored by sok-ev's tables on all workers (int64 scalar)."""
        count = tf.add_n(self.embeddings.keys_stored())
        return count if self.hvd is None else self.hvd.allreduce(count, op=self.hvd.Sum)


def _malformed_or_raise(error, files):
    translated = formats.malformed_error(error, files)
    if translated is None:
        raise error
    raise translated from None


class FunctionStyle:
    """TF2: eager variables, one tf.function per implementation and task."""

    def __init__(self, implementations: List[Implementation], train_data: tf.data.Dataset,
                 eval_data: tf.data.Dataset, files: Dict[str, List[str]]):
        self.implementations = implementations
        self._train_data, self._eval_data, self._files = train_data, eval_data, files
        self._train, self._predict = {}, {}
        for impl in implementations:

            def train(batch, impl=impl):
                train_op, loss = impl.train(batch, use_tape=True)
                with tf.control_dependencies([train_op]):
                    return tf.identity(loss)

            self._train[impl.name] = tf.function(train, input_signature=[BATCH_SPEC])
            self._predict[impl.name] = tf.function(impl.probabilities, input_signature=[BATCH_SPEC])

    def _iterate(self, dataset, split):
        iterator = iter(dataset)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except tf.errors.InvalidArgumentError as error:
                _malformed_or_raise(error, self._files[split])
            yield batch

    def train_batches(self):
        """Yields (batch handle, lines dropped as malformed) per training step."""
        for batch in self._iterate(self._train_data, "train"):
            yield {k: batch[k] for k in BATCH_SPEC}, int(batch["malformed"])

    def train(self, name: str, batch) -> float:
        """One step of `name` on `batch`; returns the global batch's mean loss."""
        return float(self._train[name](batch))

    def evaluate(self):
        """(labels [N], {name: probabilities [N]}) over the eval split."""
        labels, probabilities = [], {impl.name: [] for impl in self.implementations}
        for batch in self._iterate(self._eval_data, "eval"):
            inputs = {k: batch[k] for k in BATCH_SPEC}
            labels.append(batch["label"].numpy())
            for impl in self.implementations:
                probabilities[impl.name].append(self._predict[impl.name](inputs).numpy())
        return np.concatenate(labels), {k: np.concatenate(v) for k, v in probabilities.items()}

    def keys_stored(self, impl: Implementation) -> int:
        return int(impl.keys_stored())


class SessionStyle:
    """TF1: one graph, one tf.compat.v1.Session, as DeepRec scripts do.

  Each training batch is staged once into non-trainable variables (untimed);
  every implementation's train op reads the staged batch."""

    def __init__(self, implementations_fn, train_data: tf.data.Dataset, eval_data: tf.data.Dataset,
                 files: Dict[str, List[str]], config: Optional[tf.compat.v1.ConfigProto]):
        """implementations_fn: builds the implementations in the default graph."""
        self._files = files
        self.implementations = implementations_fn()
        train_iterator = tf.compat.v1.data.make_one_shot_iterator(train_data)
        self._eval_iterator = tf.compat.v1.data.make_initializable_iterator(eval_data)
        nxt = train_iterator.get_next()
        staged = {
            k:
                tf.compat.v1.Variable(tf.zeros([0] + spec.shape[1:].as_list(), spec.dtype),
                                      trainable=False,
                                      use_resource=True,
                                      shape=spec.shape,
                                      name=f"staged_{k}") for k, spec in BATCH_SPEC.items()
        }
        self._stage = [tf.group([staged[k].assign(nxt[k]) for k in BATCH_SPEC]), nxt["malformed"]]
        batch = {k: v.read_value() for k, v in staged.items()}
        self._train = {}
        for impl in self.implementations:
            train_op, loss = impl.train(batch, use_tape=False)
            with tf.control_dependencies([train_op]):
                self._train[impl.name] = tf.identity(loss)
        eval_batch = self._eval_iterator.get_next()
        self._predict = [eval_batch["label"]
                        ] + [impl.probabilities(eval_batch) for impl in self.implementations]
        self._keys = {
            impl.name: impl.keys_stored()
            for impl in self.implementations
            if hasattr(impl.embeddings, "keys_stored")
        }
        self.session = tf.compat.v1.Session(config=config)
        self.session.run(tf.compat.v1.global_variables_initializer())

    def _run(self, fetches, split):
        try:
            return self.session.run(fetches)
        except tf.errors.InvalidArgumentError as error:
            _malformed_or_raise(error, self._files[split])

    def train_batches(self):
        while True:
            try:
                _, malformed = self._run(self._stage, "train")
            except tf.errors.OutOfRangeError:
                return
            yield None, int(malformed)

    def train(self, name: str, batch) -> float:
        del batch  # staged
        return float(self.session.run(self._train[name]))

    def evaluate(self):
        self.session.run(self._eval_iterator.initializer)
        out = []
        while True:
            try:
                out.append(self._run(self._predict, "eval"))
            except tf.errors.OutOfRangeError:
                break
        labels = np.concatenate([o[0] for o in out])
        return labels, {
            impl.name: np.concatenate([o[i + 1] for o in out])
            for i, impl in enumerate(self.implementations)
        }

    def keys_stored(self, impl: Implementation) -> int:
        return int(self.session.run(self._keys[impl.name]))


class _NoBar:
    """What the training loop uses of a tqdm bar, doing nothing."""

    def update(self, n=1):
        pass

    def set_postfix(self, values):
        pass

    def close(self):
        pass


def progress_bar(total: Optional[int], unit: str, disable: bool = False, **kwargs):
    """A tqdm progress bar, or a silent stand-in if disabled or tqdm is missing."""
    try:
        from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    except ImportError:
        return _NoBar()
    if disable:
        return _NoBar()
    return tqdm(total=total, unit=unit, dynamic_ncols=True, **kwargs)


class Curves:
    """What one implementation did: losses per step, step times, eval points."""

    def __init__(self):
        self.samples, self.loss, self.seconds = [], [], []
        self.eval_samples, self.eval_auc, self.eval_logloss = [], [], []


def train_and_evaluate(style,
                       global_batch: int,
                       eval_at: List[int],
                       metrics,
                       total_steps: Optional[int] = None,
                       progress: bool = True) -> Dict:
    """Runs every implementation on every training batch; evaluates after the
  steps listed in `eval_at` (1-based step numbers) and after the last step.

  Args:
    style: FunctionStyle or SessionStyle.
    global_batch: samples per step over all workers.
    eval_at: steps after which to evaluate (besides after the last).
    metrics: callable(labels, probabilities) -> (auc, logloss).
    total_steps: for the progress bar (None: unknown).
    progress: show a tqdm bar.

  Returns:
    {'curves': {name: Curves}, 'steps': int, 'malformed': lines skipped,
     'step_end_seconds': [steps] seconds from the start to the end of each
     step, evaluations left out, 'eval_seconds': float,
     'input_seconds': time spent waiting for training batches}
  """
    names = [impl.name for impl in style.implementations]
    curves = {name: Curves() for name in names}
    malformed = steps = 0
    eval_seconds = 0.0

    def evaluate():
        nonlocal eval_seconds
        start = time.perf_counter()
        labels, probabilities = style.evaluate()
        for name in names:
            auc, logloss = metrics(labels, probabilities[name])
            curves[name].eval_samples.append(steps * global_batch)
            curves[name].eval_auc.append(auc)
            curves[name].eval_logloss.append(logloss)
        eval_seconds += time.perf_counter() - start

    bar = progress_bar(total=total_steps, unit="step", disable=not progress)
    start = time.perf_counter()
    input_seconds = 0.0
    step_end = []  # seconds since the start at the end of each step, evaluations left out
    batches = style.train_batches()
    while True:
        t0 = time.perf_counter()
        try:
            batch, dropped = next(batches)
        except StopIteration:
            break
        input_seconds += time.perf_counter() - t0
        malformed += dropped
        steps += 1
        # Which implementation goes first alternates: the input pipeline starts
        # parsing the next batch as this one is taken, and competes with it.
        for name in (names if steps % 2 else names[::-1]):
            t0 = time.perf_counter()
            loss = style.train(name, batch)
            curves[name].seconds.append(time.perf_counter() - t0)
            curves[name].samples.append(steps * global_batch)
            curves[name].loss.append(loss)
        step_end.append(time.perf_counter() - start - eval_seconds)
        bar.update(1)
        bar.set_postfix({f"{name} loss": f"{curves[name].loss[-1]:.4f}" for name in names})
        if steps in eval_at:
            evaluate()
    bar.close()
    if steps == 0:
        raise ValueError("no training batch: the training data has fewer lines than one "
                         f"global batch ({global_batch})")
    evaluate()
    return dict(curves=curves,
                steps=steps,
                malformed=malformed,
                step_end_seconds=step_end,
                eval_seconds=eval_seconds,
                input_seconds=input_seconds)
