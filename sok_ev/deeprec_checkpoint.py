"""Checkpoints in DeepRec's Embedding Variable layout, read and written.

DeepRec saves an Embedding Variable named N (its op name; `N/part_<i>` for
each part of a partitioned one) as these tensors of a TensorFlow checkpoint:

  N-keys                     [n]       the key dtype (int32 or int64)
  N-values                   [n, dim]  float32
  N-freqs                    [n] int64, or [0] when DeepRec kept no counts
  N-versions                 [n] int64, or [0] when it kept no versions
  N-keys_filtered            [m]       keys a feature filter has not admitted
  N-freqs_filtered           [m]       int64
  N-versions_filtered        [m] int64, or [0]
  N-partition_offset         [1001]    int32
  N-partition_filter_offset  [1001]    int32

The rows are grouped in 1000 save partitions, key % 1000, and
partition_offset[p] is where partition p starts (filtered keys likewise).
An optimizer slot is an Embedding Variable of its own, `N/<slot variable>`
(e.g. `N/Adagrad`; Adam's m and v are `N/Adam` and `N/Adam_1`, TensorFlow's
names in the order the optimizer makes its slots), saved with the same
tensors, its values being the slot's rows. Dense variables are saved as
TensorFlow saves them.

`restore_deeprec_checkpoint` reads such a checkpoint into sok-ev's variables:
every tensor is checked first, then each table's contents are written as a
sok-ev checkpoint (checkpoint_format.h) into a temporary directory and
restored by the same kernel as any sok-ev checkpoint, so a restore changes
every table or none, keeps on each worker the keys it owns and hands the
filtered keys to the table's feature filter. `export_deeprec_checkpoint`
writes the tables (and the dense variables) in DeepRec's layout, read from
the same kernel's save.
"""

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.python.training import saver as saver_module

from sok_ev import checkpoint
from sok_ev import communication
from sok_ev import partitioned_variable
from sok_ev.embedding_variable import EmbeddingVariable

SAVED_PARTITIONS = 1000  # DeepRec's kSavedPartitionNum

# Within one optimizer, the order TensorFlow (and DeepRec) make its slots
# in: the first is `<var>/<optimizer name>`, the next `<var>/<name>_1`, ...
_SLOT_ORDER = {
    name: rank
    for rank, names in enumerate((("m", "accum", "rms", "accumulator"), ("v", "linear", "mg",
                                                                         "accumulator_decay_power"),
                                  ("momentum", "beta1_power"), ("beta2_power",))) for name in names
}


def _slot_order(short_name):
    if short_name == "momentum":
        return 2  # after RMSProp's rms and mg; Momentum's only slot all the same
    return _SLOT_ORDER.get(short_name, len(_SLOT_ORDER))


def deeprec_slot_names(table_slot_names):
    """{sok-ev table slot name: DeepRec's slot variable name}, e.g.
  {"Adam/m": "Adam", "Adam/v": "Adam_1"}."""
    by_optimizer = {}
    for name in table_slot_names:
        optimizer, _, short = name.rpartition("/")
        by_optimizer.setdefault(optimizer, []).append((_slot_order(short), name))
    names = {}
    for optimizer, slots in by_optimizer.items():
        for index, (_, name) in enumerate(sorted(slots)):
            names[name] = optimizer if index == 0 else f"{optimizer}_{index}"
    return names


def _saved_name(variable):
    name = variable.name
    return name[:-2] if name.endswith(":0") else name


def _named(var_list, what):
    if var_list is None:
        if tf.executing_eagerly():
            raise ValueError(f"{what}: var_list is required when executing eagerly")
        var_list = tf.compat.v1.global_variables()
    if isinstance(var_list, dict):
        return list(var_list.items())
    return [(_saved_name(v), v) for v in var_list]


def _evaluate(build, session, what):
    """Runs the ops `build()` makes (eagerly, or in `session`); numpy results."""
    if tf.executing_eagerly() and session is None:
        return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, build())
    if session is None:
        raise ValueError(f"{what}: a tf.compat.v1.Session is needed to run it in a graph, "
                         "got session=None")
    graph = session.graph
    finalized = graph.finalized
    if finalized:
        # A MonitoredTrainingSession's graph is finalized; these few ops are
        # added once, for this call.
        graph._unsafe_unfinalize()  # pylint: disable=protected-access
    try:
        with graph.as_default():
            fetches = build()
    finally:
        if finalized:
            graph.finalize()
    return session.run(fetches)


def _write_bundle(prefix, tensors):
    """Writes {name: numpy array} as a TensorFlow checkpoint at `prefix`."""
    names = sorted(tensors)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        sess.run(
            tf.raw_ops.SaveV2(prefix=prefix,
                              tensor_names=names,
                              shape_and_slices=[""] * len(names),
                              tensors=[tf.constant(tensors[n]) for n in names]))


# --- Reading DeepRec's layout ------------------------------------------------


class _Reader:
    """The tensors of one checkpoint, with checked reads."""

    def __init__(self, prefix):
        self.prefix = prefix
        try:
            self._reader = tf.train.load_checkpoint(prefix)
        except (tf.errors.OpError, ValueError) as error:
            raise ValueError(f"restore_deeprec_checkpoint: cannot read checkpoint {prefix!r}: "
                             f"{error}") from None
        self.dtypes = self._reader.get_variable_to_dtype_map()
        self.shapes = self._reader.get_variable_to_shape_map()

    def has(self, name):
        return name in self.dtypes

    def read(self, name, dtypes, rank, where):
        """The tensor `name`, which must have one of `dtypes` and `rank`."""
        if name not in self.dtypes:
            raise ValueError(f"{where}: checkpoint {self.prefix!r} lacks tensor {name!r}")
        dtype, shape = self.dtypes[name], self.shapes[name]
        if dtype not in dtypes or len(shape) != rank:
            expected = " or ".join(d.name for d in dtypes)
            raise ValueError(f"{where}: tensor {name!r} of checkpoint {self.prefix!r} must be "
                             f"{expected} of rank {rank}, got {dtype.name} {shape}")
        return self._reader.get_tensor(name)


def _check_offsets(reader, base, suffix, count, where):
    """DeepRec's partition offsets, when present: [1001] int32, from 0 to
  `count`, never decreasing."""
    name = f"{base}-{suffix}"
    if not reader.has(name):
        return
    offsets = reader.read(name, (tf.int32,), 1, where)
    if (offsets.shape[0] != SAVED_PARTITIONS + 1 or offsets[0] != 0 or offsets[-1] != count or
            np.any(np.diff(offsets) < 0)):
        raise ValueError(f"{where}: tensor {name!r} of checkpoint {reader.prefix!r} must be "
                         f"{SAVED_PARTITIONS + 1} int32 offsets rising from 0 to {count}, got "
                         f"{offsets.shape[0]} from {offsets[0] if offsets.size else None} to "
                         f"{offsets[-1] if offsets.size else None}")


def _counts(reader, name, n, fill, where):
    """freqs or versions: [n], or [0] / absent (every key gets `fill`)."""
    if not reader.has(name):
        return np.full([n], fill, np.int64)
    values = reader.read(name, (tf.int64,), 1, where)
    if values.shape[0] == 0:
        return np.full([n], fill, np.int64)
    if values.shape[0] != n:
        raise ValueError(f"{where}: tensor {name!r} of checkpoint {reader.prefix!r} has "
                         f"{values.shape[0]} entries for {n} keys")
    return values


def _read_part(reader, base, variable, where, default_freq):
    """One saved Embedding Variable (a table, a part or a slot) at `base`."""
    key_dtypes = (tf.int32, tf.int64) if variable.key_dtype == tf.int64 else (tf.int32,)
    keys = reader.read(f"{base}-keys", key_dtypes, 1, where)
    n = keys.shape[0]
    values = reader.read(f"{base}-values", (tf.float32,), 2, where)
    dim = variable.embedding_dim
    if values.shape != (n, dim):
        raise ValueError(f"{where}: tensor {base + '-values'!r} of checkpoint {reader.prefix!r} "
                         f"has shape {list(values.shape)}; {n} keys of embedding_dim {dim} "
                         f"need [{n}, {dim}]")
    part = {
        "keys": keys.astype(variable.key_dtype.as_numpy_dtype),
        "values": values,
        # DeepRec restores a key without a saved count as seen filter_freq
        # times (once without a filter), and without a version as -1.
        "freqs": _counts(reader, f"{base}-freqs", n, default_freq, where),
        "versions": _counts(reader, f"{base}-versions", n, -1, where),
    }
    _check_offsets(reader, base, "partition_offset", n, where)
    filtered = f"{base}-keys_filtered"
    if reader.has(filtered):
        keys_filtered = reader.read(filtered, key_dtypes, 1, where)
        m = keys_filtered.shape[0]
        part["keys_filtered"] = keys_filtered.astype(variable.key_dtype.as_numpy_dtype)
        freqs = reader.read(f"{base}-freqs_filtered", (tf.int64,), 1, where)
        if freqs.shape[0] != m:
            raise ValueError(f"{where}: tensor {base + '-freqs_filtered'!r} of checkpoint "
                             f"{reader.prefix!r} has {freqs.shape[0]} entries for {m} filtered "
                             "keys")
        part["freqs_filtered"] = freqs
        part["versions_filtered"] = _counts(reader, f"{base}-versions_filtered", m, -1, where)
        _check_offsets(reader, base, "partition_filter_offset", m, where)
    if len(np.unique(part["keys"])) != n:
        raise ValueError(f"{where}: tensor {base + '-keys'!r} of checkpoint {reader.prefix!r} "
                         "holds a key twice; the checkpoint is corrupt")
    return part


def _bases(reader, name):
    """Where a variable's tensors are: [name], or its saved parts."""
    if reader.has(f"{name}-keys"):
        return [name]
    parts = []
    while reader.has(f"{name}/part_{len(parts)}-keys"):
        parts.append(f"{name}/part_{len(parts)}")
    return parts or [name]


def _concatenate(parts, field):
    present = [p[field] for p in parts if field in p]
    return np.concatenate(present) if present else None


def _read_table(reader, name, variable):
    """A table's sok-ev shard tensors (checkpoint_format.h), from the DeepRec
  tensors saved for `name` and its slots; raises ValueError naming the
  tensor on any inconsistency."""
    where = f"restore_deeprec_checkpoint: Embedding Variable {name!r}"
    filter_freq = int(variable.filter_attributes["filter_freq"])
    default_freq = filter_freq if filter_freq > 0 else 1
    slot_columns = list(variable.optimizer_slots.items())
    slot_variable_names = deeprec_slot_names([s for s, _ in slot_columns])
    primary_parts, slot_values = [], {s: [] for s, _ in slot_columns}
    for base in _bases(reader, name):
        part = _read_part(reader, base, variable, where, default_freq)
        primary_parts.append(part)
        for slot, initial in slot_columns:
            slot_base = f"{base}/{slot_variable_names[slot]}"
            slot_part = _read_part(reader, slot_base, variable, f"{where}, slot {slot!r}",
                                   default_freq)
            # A slot's rows are matched to the primary's by key.
            rows = np.full(part["values"].shape, initial, np.float32)
            order = np.argsort(slot_part["keys"])
            sorted_keys = slot_part["keys"][order]
            at = np.searchsorted(sorted_keys, part["keys"])
            found = (at < len(sorted_keys)) & (sorted_keys[np.minimum(at,
                                                                      len(sorted_keys) - 1)]
                                               == part["keys"])
            rows[found] = slot_part["values"][order[at[found]]]
            slot_values[slot].append(rows)
    keys = _concatenate(primary_parts, "keys")
    if len(np.unique(keys)) != len(keys):
        raise ValueError(f"{where}: two saved parts of checkpoint {reader.prefix!r} hold the "
                         "same key; the checkpoint is corrupt")
    dim = variable.embedding_dim
    tensors = {
        "keys": keys,
        "values": _concatenate(primary_parts, "values").reshape([-1, dim]),
        "frequencies": _concatenate(primary_parts, "freqs"),
        "versions": _concatenate(primary_parts, "versions"),
        "slot_names": np.array([s.encode() for s, _ in slot_columns], dtype=object),
        "slot_initial_values": np.array([v for _, v in slot_columns], np.float32),
    }
    for index, (slot, _) in enumerate(slot_columns):
        tensors[f"slot_{index}"] = np.concatenate(slot_values[slot]).reshape([-1, dim])
    if any("keys_filtered" in p for p in primary_parts):
        tensors["keys_filtered"] = _concatenate(primary_parts, "keys_filtered")
        tensors["frequencies_filtered"] = _concatenate(primary_parts, "freqs_filtered")
        tensors["versions_filtered"] = _concatenate(primary_parts, "versions_filtered")
    if tensors["slot_names"].size == 0:
        tensors["slot_names"] = np.zeros([0], dtype=object)
    return tensors


def restore_deeprec_checkpoint(prefix, var_list=None, session=None):
    """Restores variables from a checkpoint DeepRec saved (or
  `export_deeprec_checkpoint` wrote).

  Each Embedding Variable N gets the keys, values, frequencies and versions
  saved under N (or under N/part_0, N/part_1, ... when DeepRec partitioned
  it), its optimizer slots (those its optimizers made in this process,
  found under N/<slot variable>), and, when it has a feature filter, the
  counts of the keys not admitted yet; each worker keeps the keys it owns.
  Dense variables are read as TensorFlow saved them.

  Args:
    prefix: the checkpoint's path prefix (e.g. tf.train.latest_checkpoint()).
    var_list: variables, or {name in the checkpoint: variable}; by default
      every global variable of the graph.
    session: the tf.compat.v1.Session to run the restore in (None eagerly).

  Raises:
    ValueError: a tensor is missing, of the wrong dtype or shape, or
      inconsistent (naming the variable and the tensor), or the checkpoint
      holds a partitioned variable in more parts than it has; nothing has
      changed.
  """
    named = _named(var_list, "restore_deeprec_checkpoint")
    reader = _Reader(prefix)
    partitioned_variable.check_restored_parts([v for _, v in named], list(reader.dtypes), prefix)
    tables, dense = [], []
    for name, variable in named:  # everything is checked before anything changes
        if isinstance(variable, EmbeddingVariable):
            tables.append((name, variable, _read_table(reader, name, variable)))
            continue
        where = f"restore_deeprec_checkpoint: variable {name!r}"
        dtype = variable.dtype.base_dtype
        value = reader.read(name, (dtype,), variable.shape.rank, where)
        if list(value.shape) != variable.shape.as_list():
            raise ValueError(f"{where}: tensor {name!r} of checkpoint {prefix!r} has shape "
                             f"{list(value.shape)}; the variable has {variable.shape.as_list()}")
        dense.append((variable, value))
    directory = tempfile.mkdtemp(prefix="sok_ev_deeprec_restore_")
    try:
        converted = os.path.join(directory, "tables")
        if tables:
            bundle = {}
            for name, variable, tensors in tables:
                bundle[f"{name}/sok_ev/header"] = np.array([1, -1, 2, 0], np.int64)
                for field, value in tensors.items():
                    bundle[f"{name}/sok_ev/shard_0_of_1/{field}"] = value
            _write_bundle(converted, bundle)

        def build():
            restores = [
                checkpoint.restore_tables(converted, group)
                for group in checkpoint._by_device([(n, v) for n, v, _ in tables])  # pylint: disable=protected-access
            ]
            with tf.control_dependencies(restores):
                assigns = [variable.assign(value) for variable, value in dense]
            return tf.group(restores + assigns)

        _evaluate(build, session, "restore_deeprec_checkpoint")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# --- Writing DeepRec's layout ------------------------------------------------


def _partitioned(keys, fields):
    """Orders rows by save partition (key % 1000), then key; returns the
  reordered fields and the [1001] int32 offsets."""
    partition = np.mod(keys.astype(np.int64), SAVED_PARTITIONS)
    order = np.lexsort((keys, partition))
    counts = np.bincount(partition, minlength=SAVED_PARTITIONS)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return [f[order] for f in fields], offsets


def _deeprec_tensors(name, shard, dim):
    """DeepRec's tensors of a table, from its sok-ev shard tensors."""
    keys = shard["keys"]
    n = keys.shape[0]
    slot_names = [s.decode() if isinstance(s, bytes) else s for s in shard["slot_names"]]
    columns = [shard["values"].reshape([n, dim])]
    columns += [shard[f"slot_{i}"].reshape([n, dim]) for i in range(len(slot_names))]
    (keys, freqs, versions,
     *columns), offsets = _partitioned(keys,
                                       [keys, shard["frequencies"], shard["versions"]] + columns)
    empty = np.zeros([0], keys.dtype)
    (keys_filtered, freqs_filtered,
     versions_filtered), filter_offsets = _partitioned(shard.get("keys_filtered", empty), [
         shard.get(f, np.zeros([0], d))
         for f, d in (("keys_filtered", keys.dtype), ("frequencies_filtered", np.int64),
                      ("versions_filtered", np.int64))
     ])
    ordered = [deeprec_slot_names(slot_names)[s] for s in slot_names]
    bases = [name] + [f"{name}/{n}" for n in ordered]
    tensors = {}
    for base, values in zip(bases, columns):
        tensors.update({
            f"{base}-keys": keys,
            f"{base}-values": values,
            f"{base}-freqs": freqs,
            f"{base}-versions": versions,
            f"{base}-keys_filtered": keys_filtered,
            f"{base}-freqs_filtered": freqs_filtered,
            f"{base}-versions_filtered": versions_filtered,
            f"{base}-partition_offset": offsets,
            f"{base}-partition_filter_offset": filter_offsets,
        })
    return tensors


def export_deeprec_checkpoint(prefix, var_list=None, session=None):
    """Writes variables as DeepRec saves them, at `prefix`: each Embedding
  Variable's keys, values, frequencies, versions, filtered keys and
  optimizer slots in DeepRec's Embedding Variable layout (see the module
  docstring), dense variables as TensorFlow saves them, so DeepRec's
  Saver restores it (and tf.train.load_variable reads it). Keys that
  steps_to_live or an L2WeightEvict would evict at a save are evicted
  first, as DeepRec's save does. One worker (or tables whole on one).

  Args:
    prefix: the checkpoint's path prefix to write.
    var_list: variables, or {name to save under: variable}; by default
      every global variable of the graph.
    session: the tf.compat.v1.Session to read them in (None eagerly).

  Returns:
    `prefix`.

  Raises:
    ValueError: several workers hold shards of a table.
  """
    named = _named(var_list, "export_deeprec_checkpoint")
    for name, variable in named:
        if (isinstance(variable, EmbeddingVariable) and communication.world_size() > 1 and
                int(variable.target_gpu) < 0):
            raise ValueError(f"export_deeprec_checkpoint: Embedding Variable {name!r} is sharded "
                             f"over {communication.world_size()} workers; export from one "
                             "worker (or give the table a target_gpu)")
    tables = [(n, v) for n, v in named if isinstance(v, EmbeddingVariable)]
    dense = [(n, v) for n, v in named if not isinstance(v, EmbeddingVariable)]
    directory = tempfile.mkdtemp(prefix="sok_ev_deeprec_export_")
    try:
        parts = os.path.join(directory, "tables")

        def build():
            saves = []
            with tf.control_dependencies(checkpoint._evictions(tables)):  # pylint: disable=protected-access
                for index, group in enumerate(checkpoint._by_device(tables)):  # pylint: disable=protected-access
                    saves.append(checkpoint._save_tables(f"{parts}_{index}", group, 1))  # pylint: disable=protected-access
            return {"saves": saves, "dense": [tf.identity(v) for _, v in dense]}

        result = _evaluate(build, session, "export_deeprec_checkpoint")
        tensors = {}
        for index, group in enumerate(checkpoint._by_device(tables)):  # pylint: disable=protected-access
            reader = tf.train.load_checkpoint(checkpoint.part_prefix(f"{parts}_{index}", 0, 1))
            for name, variable in group:
                shard_name = f"{name}/sok_ev/shard_0_of_1/"
                shard = {
                    key[len(shard_name):]: reader.get_tensor(key)
                    for key in reader.get_variable_to_dtype_map()
                    if key.startswith(shard_name)
                }
                tensors.update(_deeprec_tensors(name, shard, variable.embedding_dim))
        for (name, _), value in zip(dense, result["dense"]):
            tensors[name] = np.asarray(value)
        _write_bundle(prefix, tensors)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return prefix


# --- tf.compat.v1.train.Saver.restore of a DeepRec checkpoint -----------------


def _saver_variables(saver):
    """{name in a checkpoint: variable} of a Saver's variables."""
    var_list = saver._var_list  # pylint: disable=protected-access
    if var_list is None:
        var_list = tf.compat.v1.global_variables() + tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
    if isinstance(var_list, dict):
        return dict(var_list)
    return {_saved_name(v): v for v in var_list if hasattr(v, "name")}


def is_deeprec_checkpoint(prefix, names):
    """Whether the checkpoint at `prefix` holds the Embedding Variables
  `names` in DeepRec's layout (and none in sok-ev's)."""
    try:
        keys = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError):
        return False
    if not names or any(f"{n}/sok_ev/header" in keys for n in names):
        return False
    return all(f"{n}-keys" in keys or f"{n}/part_0-keys" in keys for n in names)


_original_restore = []


def install_restore_hook():
    """Makes tf.compat.v1.train.Saver.restore (and so MonitoredTrainingSession
  and init_fn-less resumes) read a checkpoint DeepRec saved: when the Saver
  has Embedding Variables and the checkpoint holds them in DeepRec's layout,
  restore_deeprec_checkpoint restores its variables instead. Idempotent."""
    if _original_restore:
        return
    original = saver_module.Saver.restore
    _original_restore.append(original)

    def restore(self, sess, save_path):
        if save_path is not None and not tf.executing_eagerly():
            variables = _saver_variables(self)
            names = [n for n, v in variables.items() if isinstance(v, EmbeddingVariable)]
            if is_deeprec_checkpoint(os.fspath(save_path), names):
                return restore_deeprec_checkpoint(os.fspath(save_path), variables, session=sess)
        return original(self, sess, save_path)

    restore.__doc__ = original.__doc__
    saver_module.Saver.restore = restore
