"""DeepRec's partitioned Embedding Variables: `get_embedding_variable(...,
partitioner=p)`.

DeepRec (variable_scope's get_embedding_variable) asks the partitioner for
the partitions of a `[sys.maxsize, embedding_dim]` variable and makes that
many Embedding Variables `<name>/part_<i>`, and its `tf.nn.embedding_lookup`
sends key k, as it is, to part `(k mod 1000) mod N` (modulo as Python's,
so negative keys too; 1000 is the number of save partitions of DeepRec's
checkpoint layout). A PartitionedEmbeddingVariable holds such parts, each a
whole sok-ev Embedding Variable (its own slots, filters, checkpoint entry
under the part's name, as DeepRec saves them); `sok_ev.dispatch` gives the
tf.nn lookups their partitioned form. Since each part stores its keys
unchanged, every lookup, gradient and update equals that of one table
holding every key (with an initializer drawing per key, the same draws).

sok-ev's own sharding is target_gpu: a partitioner only changes how many
tables a variable is, not where they live. A partitioned variable restores
from a checkpoint of the same number of parts: tf.compat.v1.train.Saver
refuses a checkpoint holding it in more parts (`check_restored_parts`),
whose extra parts it would otherwise leave unread.
"""

import numbers
import sys
from typing import Iterator, List

import tensorflow as tf

# Parts beyond this are refused: each is a table of its own.
MAX_PARTITIONS = 1024


def num_partitions(partitioner, embedding_dim: int, where: str) -> int:
    """The number of parts DeepRec makes for `partitioner`: its answer for a
  `[sys.maxsize, embedding_dim]` float32 variable, along axis 0.

  Raises:
    ValueError: an answer that is not [n, 1] with 1 <= n <= MAX_PARTITIONS,
      naming `where`, the partitioner and the answer.
  """
    if not callable(partitioner):
        raise ValueError(f"{where}: partitioner must be callable (e.g. "
                         f"tf.compat.v1.fixed_size_partitioner(4)), got {partitioner!r}")
    shape = tf.TensorShape([sys.maxsize, embedding_dim])
    partitions = list(partitioner(shape=shape, dtype=tf.float32))
    valid = (len(partitions) == 2 and all(
        isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in partitions) and
             1 <= partitions[0] <= MAX_PARTITIONS and partitions[1] == 1)
    if not valid:
        raise ValueError(f"{where}: partitioner={partitioner!r} gave partitions {partitions} for "
                         f"the shape [sys.maxsize, {embedding_dim}]; an Embedding Variable is "
                         f"partitioned along axis 0 only, into 1 to {MAX_PARTITIONS} parts")
    return int(partitions[0])


def part_of_keys(keys: tf.Tensor, num_parts: int) -> tf.Tensor:
    """DeepRec's part for each of `keys` (any shape, int32/int64):
  (keys mod 1000) mod num_parts, int32 of keys' shape."""
    thousand = tf.cast(1000, keys.dtype)
    return tf.cast(tf.math.floormod(tf.math.floormod(keys, thousand), num_parts), tf.int32)


class PartitionedEmbeddingVariable:
    """The parts of a partitioned Embedding Variable, as DeepRec returns them:
  iterable, indexable, sized (`[p.total_count() for p in var]`), passed whole
  to tf.nn.embedding_lookup, embedding_lookup_sparse and
  safe_embedding_lookup_sparse (sok_ev.dispatch). sok_ev.lookup_sparse takes
  unpartitioned Embedding Variables only."""

    def __init__(self, name: str, parts: List):
        self._name = name
        self._parts = list(parts)

    def __iter__(self) -> Iterator:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __getitem__(self, index):
        return self._parts[index]

    def __repr__(self) -> str:
        return (f"<sok_ev.PartitionedEmbeddingVariable '{self._name}' {len(self._parts)} parts, "
                f"embedding_dim={self.embedding_dim}, key_dtype={self.key_dtype.name}>")

    @property
    def name(self) -> str:
        """The name the parts share: part i is `<name>/part_<i>`."""
        return self._name

    @property
    def parts(self) -> List:
        return list(self._parts)

    @property
    def embedding_dim(self) -> int:
        return self._parts[0].embedding_dim

    @property
    def key_dtype(self) -> tf.DType:
        return self._parts[0].key_dtype

    @property
    def target_gpu(self) -> int:
        """Every part's target_gpu (set on all of them at once)."""
        return self._parts[0].target_gpu

    @target_gpu.setter
    def target_gpu(self, value):
        for part in self._parts:
            part.target_gpu = value  # checks value, naming the part, before any changes

    def total_count(self) -> tf.Tensor:
        """The keys of every part: int64 scalar."""
        return tf.add_n([tf.cast(part.total_count(), tf.int64) for part in self._parts])


def check_restored_parts(variables, checkpoint_names, checkpoint: str) -> None:
    """Raises ValueError, naming the variable, when `checkpoint` (whose
  tensors are `checkpoint_names`) holds one of the partitioned Embedding
  Variables among `variables` in more parts than it has: restoring would
  leave the keys of the extra parts out."""
    families = {}
    for variable in variables:
        info = getattr(variable, "partition", None)
        if info is not None:
            families[info[0]] = info[2]
    for shared, count in sorted(families.items()):
        extra = f"{shared}/part_{count}"
        if any(name == extra or name.startswith((extra + "/", extra + "-"))
               for name in checkpoint_names):
            raise ValueError(f"Saver.restore: checkpoint {checkpoint!r} holds the partitioned "
                             f"Embedding Variable '{shared}' in more than its {count} parts "
                             f"({extra} is there); restoring would leave those parts' keys out. "
                             "Build it with the partitioner it was saved with.")
