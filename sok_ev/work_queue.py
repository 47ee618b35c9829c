"""DeepRec's `tf.WorkQueue` (`from tensorflow.python.ops.work_queue import WorkQueue`).

DeepRec's WorkQueue hands out work items (input files) to the workers that
ask: it holds `num_epochs` copies of `works` (each epoch shuffled when
`shuffle`), `take()` gives the next one and raises OutOfRangeError once all
are taken, `input_dataset()` is a dataset of the items taken one by one
(ending when the queue is empty), and the queue is saved in checkpoints, so
a restored job goes on with the items not yet taken.

Here the queue is two resource variables in the graph, both global (so the
Saver saves and restores them): `<name>/works`, the items of every epoch in
order (initialised by shuffling each epoch with `tf.random.shuffle(works,
seed)`, as DeepRec does), and `<name>/taken`, how many have been handed out.
`take()` adds one to `taken` atomically and returns that item (with `prefix`
in front when given). The queue lives on the worker that builds it: with
several Horovod workers each has its own (DeepRec's is shared through its
parameter servers, which sok-ev does not have); give each its share of files.
`num_slices` (DeepRec's splitting of tables into row ranges) does not apply to
files, as in DeepRec, and is refused for anything else.
"""

import tensorflow as tf

from sok_ev import deeprec_modules

_MODULE = "tensorflow.python.ops.work_queue"


class WorkQueue:
    """A queue of work items (see the module docstring).

  Args:
    works: a non-empty list of strings (file names).
    num_epochs: how many times each item is handed out, >= 1.
    shuffle: shuffle the items of each epoch.
    seed: the shuffle's op seed (None: from the graph seed).
    prefix: a string put before every item taken.
    num_slices: None (DeepRec splits only tables, not files).
    num_clients: accepted (DeepRec's number of taking threads).
    name: the queue's name scope (default "work_queue", made unique).
    local_work_mgr: None (DeepRec's local work backup is not built).

  Raises:
    ValueError: works empty or not strings, num_epochs < 1, num_slices or
      local_work_mgr given.
  """

    def __init__(self,
                 works,
                 num_epochs=1,
                 shuffle=True,
                 seed=None,
                 prefix=None,
                 num_slices=None,
                 num_clients=1,
                 name=None,
                 local_work_mgr=None):
        if not isinstance(works, (list, tuple)) or not works:
            raise ValueError(f"WorkQueue: works must be a non-empty list of strings, got {works!r}")
        items = []
        for work in works:
            if isinstance(work, bytes):
                work = work.decode()
            if not isinstance(work, str):
                raise ValueError(f"WorkQueue: works must be strings, got {work!r}")
            items.append(work.strip())
        if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
            raise ValueError(f"WorkQueue: num_epochs must be an integer >= 1, got {num_epochs!r}")
        if num_slices is not None:
            raise ValueError(f"WorkQueue: num_slices={num_slices!r} splits tables into row ranges "
                             "in DeepRec (not files); sok-ev hands out whole files, leave it None.")
        if local_work_mgr is not None:
            raise ValueError("WorkQueue: local_work_mgr (DeepRec's local work backup) is not "
                             "supported; the queue is saved in checkpoints instead.")
        del num_clients
        self._works = items
        self._num_epochs = num_epochs
        self._prefix = prefix
        if tf.executing_eagerly():
            name = name or "work_queue"
        else:
            name = tf.compat.v1.get_default_graph().unique_name(name or "work_queue")
        self._name = name
        with tf.name_scope(name + "/"):
            works_tensor = tf.constant(items, tf.string)
            epochs = [
                tf.random.shuffle(works_tensor, seed=seed) if shuffle else works_tensor
                for _ in range(num_epochs)
            ]
            self._items = tf.compat.v1.Variable(tf.concat(epochs, 0),
                                                name="works",
                                                trainable=False,
                                                use_resource=True)
            self._taken = tf.compat.v1.Variable(tf.constant(0, tf.int64),
                                                name="taken",
                                                trainable=False,
                                                use_resource=True)
            self._end = tf.compat.v1.data.make_one_shot_iterator(
                tf.data.Dataset.from_tensors(tf.constant("", tf.string)).take(0))
        self._size = len(items) * num_epochs

    def __len__(self):
        """Number of items of one epoch (DeepRec's capacity)."""
        return len(self._works)

    @property
    def name(self):
        return self._name

    @property
    def works(self):
        """The items given, in order."""
        return list(self._works)

    @property
    def digest(self):
        return ",".join(self._works).encode()

    @property
    def num_epochs(self):
        return self._num_epochs

    def _with_prefix(self, work):
        return work if self._prefix is None else tf.strings.join([self._prefix, work])

    def _take_index(self):
        """The index of the next item (counting every item ever taken)."""
        return self._taken.assign_add(1, read_value=True) - 1

    def take(self):
        """The next item (a scalar string); OutOfRangeError once all
    num_epochs * len(works) items were taken."""
        with tf.name_scope(self._name + "/take"):
            index = self._take_index()
            if tf.executing_eagerly():
                if int(index) >= self._size:
                    raise tf.errors.OutOfRangeError(None, None, f"WorkQueue {self._name} is empty")
                return self._with_prefix(self._items[index])
            work = tf.cond(index < self._size, lambda: tf.gather(self._items, index),
                           self._end.get_next)
            return self._with_prefix(work)

    def input_dataset(self):
        """A dataset of the items, taken one by one as it is read; it ends
    when the queue is empty."""
        size = self._size
        dataset = tf.data.Dataset.from_tensors(0).repeat().map(lambda _: self._take_index())
        dataset = dataset.take_while(lambda index: index < size)
        dataset = dataset.map(lambda index: self._with_prefix(tf.gather(self._items, index)))
        # ParquetDataset reads the columns from the first file.
        dataset.sok_ev_work_queue_files = [(self._prefix or "") + work for work in self._works]
        return dataset

    def input_producer(self):
        """A FIFOQueue of capacity 1 that a QueueRunner (in the graph's
    QUEUE_RUNNERS collection) fills with the items taken, closed when the
    queue is empty: what DeepRec's readers (`reader.read(queue)`) take."""
        with tf.name_scope(self._name + "/"):
            proxy = tf.queue.FIFOQueue(capacity=1,
                                       dtypes=[tf.string],
                                       shapes=[tf.TensorShape([1])],
                                       name="proxy")
            enqueue = proxy.enqueue(tf.reshape(self.take(), [1]))
            cancel = proxy.close(cancel_pending_enqueues=True)
            tf.compat.v1.train.add_queue_runner(
                tf.compat.v1.train.QueueRunner(proxy, [enqueue], cancel_op=cancel))
        return proxy

    def add_summary(self):
        """A scalar summary of the fraction of items not taken yet."""
        with tf.name_scope(self._name + "/"):
            left = tf.maximum(tf.cast(self._size, tf.int64) - self._taken.read_value(), 0)
            tf.compat.v1.summary.scalar(f"{self._name}/fraction_of_{len(self._works)}_full",
                                        tf.cast(left, tf.float32) / float(self._size))


def install():
    """Makes `from tensorflow.python.ops.work_queue import WorkQueue` work."""
    deeprec_modules.provide_module(_MODULE,
                                   "DeepRec's WorkQueue, provided by sok_ev.work_queue.",
                                   WorkQueue=WorkQueue)
