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

Schedules (`train_and_evaluate`). 'interleaved' (the CPU default): the
implementations take the same batches in turn (which one first alternates
from step to step), each step timed on its own (`Style.train`), so a busy
machine slows both alike and the input pipeline (which runs ahead, in
parallel) is shared. 'sequential' (the GPU default): each implementation
trains alone over its own pass of the input, so that its end-to-end rate
and its waits for input are its own. Either way an implementation may stop
early (`max_steps`) and is then evaluated at its last step.
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


def batch_spec(dataset: tf.data.Dataset) -> Dict[str, tf.TensorSpec]:
    """BATCH_SPEC with the keys a line of `dataset` holds (26, or 214 multi-hot)."""
    keys = dataset.element_spec["keys"].shape[-1]
    return dict(BATCH_SPEC, keys=tf.TensorSpec([None, keys], tf.int64))


class Implementation:
    """One model: embeddings + tower + Adagrad; builds its train and eval graphs."""

    def __init__(self,
                 embeddings,
                 tower,
                 learning_rate: float,
                 global_batch: int,
                 hvd=None,
                 initial_accumulator: float = 0.1,
                 warmup_steps: int = 0,
                 dense_learning_rate: Optional[float] = None,
                 dense_initial_accumulator: Optional[float] = None,
                 xla_tower: bool = False):
        """dense_*: Adagrad's settings for the tower, where they differ from
    the embeddings' (None: the same); xla_tower: the tower's forward (and so
    its backward) compiled by XLA, the embeddings' ops outside it."""
        self.embeddings = embeddings
        self.tower = tower
        self._tower_call = tf.function(tower.__call__, jit_compile=True) if xla_tower else tower
        self.name = embeddings.name
        self.global_batch = global_batch
        self.hvd = hvd
        # The step counts this implementation's updates; the learning rate
        # rises linearly to `learning_rate` over the first `warmup_steps`.
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{self.name}_step")

        def adagrad(learning_rate, initial_accumulator):
            rate = learning_rate
            if warmup_steps:
                rate = lambda: learning_rate * tf.minimum(  # noqa: E731
                    1.0,
                    tf.cast(self.step + 1, tf.float32) / warmup_steps)
            return tf.compat.v1.train.AdagradOptimizer(
                rate, initial_accumulator_value=initial_accumulator)

        self.optimizer = adagrad(learning_rate, initial_accumulator)
        self.dense_optimizer = None
        if dense_learning_rate is not None or dense_initial_accumulator is not None:
            # A wide tower takes Adagrad's first, sign-like steps of the
            # embeddings' rate badly: the loss jumps (batch 65536, width 1024).
            self.dense_optimizer = adagrad(
                learning_rate if dense_learning_rate is None else dense_learning_rate,
                initial_accumulator
                if dense_initial_accumulator is None else dense_initial_accumulator)
        self.variables = list(embeddings.variables) + list(tower.variables)

    def logits(self, batch: Dict[str, tf.Tensor]) -> tf.Tensor:
        """[n] logits of a parsed batch."""
        return self._tower_call(batch["dense"], self.embeddings(batch["keys"]))

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
        if self.dense_optimizer is None:
            train_op = self.optimizer.apply_gradients(zip(grads, self.variables))
        else:
            k = len(self.embeddings.variables)
            train_op = tf.group(
                self.optimizer.apply_gradients(zip(grads[:k], self.variables[:k])),
                self.dense_optimizer.apply_gradients(zip(grads[k:], self.variables[k:])))
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


def malformed_or_raise(error, files):
    """Raises the reader's error naming the file and record a malformed
  record's InvalidArgumentError stands for, or `error` itself."""
    translated = formats.malformed_error(error, files)
    if translated is None:
        raise error
    raise translated from None


# A batch's [start, end) lines, given to a step that builds its own batch
# (int32: TensorFlow keeps int32 in host memory, where slicing reads it).
ROW_RANGE = tf.TensorSpec([2], tf.int32)


class FunctionStyle:
    """TF2: eager variables, one tf.function per implementation and task.

  With `device_batches` ({'train': (rows, build), 'eval': (rows, build)},
  in_memory.InMemoryData.batches on a GPU), each step is given its batch's
  row range and builds the batch itself where the data lies; train_data and
  eval_data are not read."""

    def __init__(self,
                 implementations: List[Implementation],
                 train_data: Optional[tf.data.Dataset],
                 eval_data: Optional[tf.data.Dataset],
                 files: Dict[str, List[str]],
                 device_batches=None):
        self.implementations = implementations
        self._train_data, self._eval_data, self._files = train_data, eval_data, files
        self._device_batches = device_batches
        self._train, self._predict = {}, {}
        for impl in implementations:

            def train(batch, impl=impl):
                train_op, loss = impl.train(batch, use_tape=True)
                with tf.control_dependencies([train_op]):
                    return tf.identity(loss)

            if device_batches:
                build_train, build_eval = device_batches["train"][1], device_batches["eval"][1]

                def predict(row_range, impl=impl, build=build_eval):
                    batch = build(row_range)
                    return batch["label"], impl.probabilities(batch)

                self._train[impl.name] = tf.function(
                    lambda row_range, train=train, build=build_train: train(build(row_range)),
                    input_signature=[ROW_RANGE])
                self._predict[impl.name] = tf.function(predict, input_signature=[ROW_RANGE])
                continue
            spec = batch_spec(train_data)
            self._train[impl.name] = tf.function(train, input_signature=[spec])
            self._predict[impl.name] = tf.function(impl.probabilities, input_signature=[spec])

    def _iterate(self, dataset, split):
        iterator = iter(dataset)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except tf.errors.InvalidArgumentError as error:
                malformed_or_raise(error, self._files[split])
            yield batch

    def train_batches(self):
        """Yields (batch handle, lines dropped as malformed) per training step."""
        if self._device_batches:
            for row_range in self._device_batches["train"][0]:
                yield tf.constant(row_range, tf.int32), 0
            return
        for batch in self._iterate(self._train_data, "train"):
            yield {k: batch[k] for k in BATCH_SPEC}, int(batch["malformed"])

    def train(self, name: str, batch) -> float:
        """One step of `name` on `batch`; returns the global batch's mean loss."""
        return float(self._train[name](batch))

    def evaluate(self, names: Optional[List[str]] = None):
        """(labels [N], {name: probabilities [N]}) over the eval split, of the
    implementations named (default: all)."""
        names = names or [impl.name for impl in self.implementations]
        labels, probabilities = [], {name: [] for name in names}
        if self._device_batches:
            for row_range in self._device_batches["eval"][0]:
                row_range = tf.constant(row_range, tf.int32)
                for i, name in enumerate(names):
                    label, predicted = self._predict[name](row_range)
                    if i == 0:
                        labels.append(label.numpy())
                    probabilities[name].append(predicted.numpy())
            return np.concatenate(labels), {k: np.concatenate(v) for k, v in probabilities.items()}
        for batch in self._iterate(self._eval_data, "eval"):
            inputs = {k: batch[k] for k in BATCH_SPEC}
            labels.append(batch["label"].numpy())
            for name in names:
                probabilities[name].append(self._predict[name](inputs).numpy())
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
        # Initializable: each call of train_batches starts a new pass.
        self._train_iterator = tf.compat.v1.data.make_initializable_iterator(train_data)
        self._eval_iterator = tf.compat.v1.data.make_initializable_iterator(eval_data)
        nxt = self._train_iterator.get_next()
        staged = {
            k:
                tf.compat.v1.Variable(tf.zeros([0] + spec.shape[1:].as_list(), spec.dtype),
                                      trainable=False,
                                      use_resource=True,
                                      shape=spec.shape,
                                      name=f"staged_{k}")
            for k, spec in batch_spec(train_data).items()
        }
        self._stage = [tf.group([staged[k].assign(nxt[k]) for k in BATCH_SPEC]), nxt["malformed"]]
        batch = {k: v.read_value() for k, v in staged.items()}
        self._train = {}
        for impl in self.implementations:
            train_op, loss = impl.train(batch, use_tape=False)
            with tf.control_dependencies([train_op]):
                self._train[impl.name] = tf.identity(loss)
        eval_batch = self._eval_iterator.get_next()
        self._predict = (eval_batch["label"], {
            impl.name: impl.probabilities(eval_batch) for impl in self.implementations
        })
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
            malformed_or_raise(error, self._files[split])

    def train_batches(self):
        self.session.run(self._train_iterator.initializer)
        while True:
            try:
                _, malformed = self._run(self._stage, "train")
            except tf.errors.OutOfRangeError:
                return
            yield None, int(malformed)

    def train(self, name: str, batch) -> float:
        del batch  # staged
        return float(self.session.run(self._train[name]))

    def evaluate(self, names: Optional[List[str]] = None):
        names = names or [impl.name for impl in self.implementations]
        self.session.run(self._eval_iterator.initializer)
        out = []
        while True:
            try:
                out.append(
                    self._run([self._predict[0]] + [self._predict[1][n] for n in names], "eval"))
            except tf.errors.OutOfRangeError:
                break
        labels = np.concatenate([o[0] for o in out])
        return labels, {
            name: np.concatenate([o[i + 1] for o in out]) for i, name in enumerate(names)
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
    """What one implementation did: losses per step, step times, eval points,
  and per step the time of the whole loop iteration that is its own (input
  wait and bookkeeping included, the other implementations' steps left out)."""

    def __init__(self):
        self.samples, self.loss, self.seconds, self.loop_seconds = [], [], [], []
        self.input_seconds = 0.0
        self.eval_samples, self.eval_auc, self.eval_logloss = [], [], []


SCHEDULES = ("interleaved", "sequential")


def train_and_evaluate(style,
                       global_batch: int,
                       eval_at: List[int],
                       metrics,
                       total_steps: Optional[int] = None,
                       progress: bool = True,
                       max_steps: Optional[Dict[str, int]] = None,
                       schedule: str = "interleaved") -> Dict:
    """Trains every implementation on the training batches; evaluates each
  after the steps listed in `eval_at` (1-based step numbers), after its last
  step, and at the end.

  Args:
    style: FunctionStyle or SessionStyle.
    global_batch: samples per step over all workers.
    eval_at: steps after which to evaluate (besides after the last).
    metrics: callable(labels, probabilities) -> (auc, logloss).
    total_steps: for the progress bar (None: unknown).
    progress: show a tqdm bar.
    max_steps: {name: steps} for implementations that stop early (the first
      batches, as the others see them); the rest train on every batch.
    schedule: 'interleaved': one pass over the input, every implementation
      training on each batch in turn (the input waits are shared);
      'sequential': each implementation alone over its own pass, so its
      end-to-end rate and input waits are its own.

  Returns:
    {'curves': {name: Curves}, 'steps': the most steps any implementation
     took, 'malformed': lines skipped (in the first pass), 'step_end_seconds':
     [steps] seconds from the start to the end of each step of the first
     pass, evaluations left out, 'eval_seconds': float, 'input_seconds': time
     spent waiting for training batches, over all passes}

  Raises:
    ValueError: an unknown schedule, or no training batch.
  """
    if schedule not in SCHEDULES:
        raise ValueError(f"train_and_evaluate: schedule must be one of {SCHEDULES}, "
                         f"got {schedule!r}")
    names = [impl.name for impl in style.implementations]
    limit = {name: (max_steps or {}).get(name) for name in names}
    curves = {name: Curves() for name in names}
    eval_seconds = 0.0
    evaluated = {name: -1 for name in names}  # the step of each one's last evaluation

    def evaluate(which, step):
        nonlocal eval_seconds
        which = [name for name in which if evaluated[name] != step]
        if not which:
            return
        start = time.perf_counter()
        labels, probabilities = style.evaluate(which)
        for name in which:
            auc, logloss = metrics(labels, probabilities[name])
            curves[name].eval_samples.append(step * global_batch)
            curves[name].eval_auc.append(auc)
            curves[name].eval_logloss.append(logloss)
            evaluated[name] = step
        eval_seconds += time.perf_counter() - start

    def one_pass(group):
        """Trains the names in `group` over one pass of the input; returns
    (steps, malformed, step end seconds)."""
        bar = progress_bar(total=max([limit[n] or total_steps or 0 for n in group]) or None,
                           unit="step",
                           disable=not progress,
                           desc=None if len(group) > 1 else group[0])
        steps = malformed = 0
        step_end = []
        start = time.perf_counter()
        evals_before = eval_seconds
        batches = style.train_batches()
        while True:
            active = [n for n in group if limit[n] is None or steps < limit[n]]
            if not active:
                break
            t_input = time.perf_counter()
            try:
                batch, dropped = next(batches)
            except StopIteration:
                break
            waited = time.perf_counter() - t_input
            malformed += dropped
            steps += 1
            others = 0.0
            # Which implementation goes first alternates: the input pipeline starts
            # parsing the next batch as this one is taken, and competes with it.
            for name in (active if steps % 2 else active[::-1]):
                t0 = time.perf_counter()
                loss = style.train(name, batch)
                took = time.perf_counter() - t0
                others += took
                c = curves[name]
                c.seconds.append(took)
                c.samples.append(steps * global_batch)
                c.loss.append(loss)
                c.input_seconds += waited
            iteration = time.perf_counter() - t_input
            for name in active:
                curves[name].loop_seconds.append(iteration - others + curves[name].seconds[-1])
            step_end.append(time.perf_counter() - start - (eval_seconds - evals_before))
            bar.update(1)
            bar.set_postfix({f"{name} loss": f"{curves[name].loss[-1]:.4f}" for name in active})
            finished = [n for n in active if limit[n] == steps]
            evaluate(active if steps in eval_at else finished, steps)
        bar.close()
        return steps, malformed, step_end

    groups = [[name] for name in names] if schedule == "sequential" else [names]
    passes = []
    for group in groups:
        passes.append(one_pass(group))
        for name in group:
            evaluate([name], len(curves[name].loss))
    steps = max(p[0] for p in passes)
    if steps == 0:
        raise ValueError("no training batch: the training data has fewer lines than one "
                         f"global batch ({global_batch})")
    return dict(curves=curves,
                steps=steps,
                malformed=passes[0][1],
                step_end_seconds=passes[0][2],
                eval_seconds=eval_seconds,
                input_seconds=sum(c.input_seconds for c in curves.values())
                if schedule == "sequential" else curves[names[0]].input_seconds)
