"""Checkpoints of Embedding Variables, on one worker or many.

Every table is saved with its keys, values, optimizer slots, frequencies and
versions, under its own name, and written straight from the table in
batches (no copy of the table is made); the layout is
sok_ev/cc/kernels/checkpoint_format.h. Two ways in, both through stock APIs:

* `tf.compat.v1.train.Saver` (and what builds one: MonitoredTrainingSession's
  Scaffold, SavedModel builders): `install_saver_hook()`, which
  `sok_ev.init()` runs, makes new Savers save Embedding Variables with
  `SokEv>SaveEmbeddingVariables` and restore them with
  `SokEv>RestoreEmbeddingVariables`; every other variable is saved and
  restored by TensorFlow's own ops, as before. A restore needs no
  initializer run first.
* `tf.train.Checkpoint` (and SavedModel): a saver registered with TensorFlow
  (`tf.saved_model.experimental` registration), at import.

With several workers, each worker holds a shard of each table. Saving:
every worker saves at the same step; each writes its shard as a part next to
the checkpoint (a file system all workers share), then, once every part is
written, worker 0 merges the parts with the dense variables into the
checkpoint. Until that merge nothing at the checkpoint's path has changed,
so an interrupted save leaves the previous checkpoint as it was. A save
run on some workers only, or failing on some, fails on every worker, never
waits (`_started_on_every_worker`, `_registered_save`). With a Saver every
worker passes the same path (worker 0 writes the dense variables, the
others only their shards); with tf.train.Checkpoint the
workers other than 0 save to a path of their own (TensorFlow's
multi-worker convention: their copy of the dense variables is not needed).
Restoring: every worker restores the same checkpoint, on any number of
workers; each keeps exactly the keys it owns (`owner_of`, cc/partition.h),
or the whole table if `target_gpu` names it. Restores read the worker
topology when they run, so a graph exported on N workers restores on M.
"""

import collections
import functools
import os

import tensorflow as tf
from tensorflow.python.framework import errors_impl
from tensorflow.python.framework import ops as framework_ops
from tensorflow.python.ops import gen_io_ops
from tensorflow.python.saved_model.registration import registration
from tensorflow.python.training import saver as saver_module

from sok_ev import agreement
from sok_ev import communication
from sok_ev import options as options_lib
from sok_ev import partitioned_variable
from sok_ev import serving
from sok_ev._ops import ops
from sok_ev.embedding_variable import EmbeddingVariable
from sok_ev.embedding_variable import EmbeddingVariableSaveable

# The name TensorFlow records for tables saved by the registered saver.
_REGISTERED_PACKAGE = "sok_ev"
_REGISTERED_NAME = "EmbeddingVariables"


def part_prefix(prefix, worker, num_workers):
    """Where `worker` writes its part of a checkpoint being saved at `prefix`
  (as checkpoint::PartPrefix in checkpoint_format.h)."""
    return f"{prefix}_worker_{worker:05d}_of_{num_workers:05d}"


# --- The ops, for a group of tables ------------------------------------------


def on_table_device(variable):
    """A scope for ops that take `variable`'s handle: they run where the table
  is, whatever device scope encloses them. A graph table with no device of
  its own is placed by TensorFlow with every op that takes its handle, so
  one such op under an enclosing /cpu:0 scope (the checkpoint merge's) would
  pin a GPU table to the CPU. The scope clears the enclosing devices instead
  of colocating with the handle: colocation would also tie the helper ops
  built inside it (a string join, its constants; CPU kernels only) to the
  table, and on a GPU TensorFlow then cannot place the table's group."""
    if variable.device or tf.executing_eagerly():
        return tf.device(variable.device)
    return tf.compat.v1.device(None)


def _by_device(tables):
    """[(name, variable)] grouped by the variable's device, in first-seen order."""
    groups = collections.OrderedDict()
    for name, variable in tables:
        groups.setdefault(variable.device, []).append((name, variable))
    return list(groups.values())


def _evictions(tables):
    """DeepRec evicts keys older than steps_to_live, and keys of an L2 weight
  below l2_weight_threshold, when saving. A key's age is counted by the clock
  its version was written with (EmbeddingVariable.version_clock)."""
    evictions = []
    for _, variable in tables:
        if variable.l2_weight_threshold is not None:
            evictions.append(ops().sok_ev_embedding_variable_evict_by_l2_weight(
                variable.handle,
                key_dtype=variable.key_dtype,
                l2_weight_threshold=variable.l2_weight_threshold))
        if not variable.steps_to_live:
            continue
        clock = variable.version_clock
        step = clock() if clock is not None else tf.compat.v1.train.get_global_step()
        if step is not None:
            evictions.append(ops().sok_ev_embedding_variable_evict(
                variable.handle,
                tf.cast(step, tf.int64),
                key_dtype=variable.key_dtype,
                steps_to_live=variable.steps_to_live))
    return evictions


def _save_tables(prefix, tables, num_workers, kind="full", record_changes=False):
    """Writes this worker's shard of `tables` ([(name, variable)], one device)
  at part_prefix(prefix, worker, num_workers); returns that prefix. kind:
  'full', or 'incremental' (the keys changed since the tables' last
  committed checkpoint); record_changes: the tables record their changes
  for incremental saves from then on (checkpoint_format.h)."""
    return ops().sok_ev_save_embedding_variables(
        prefix, [v.handle for _, v in tables],
        table_names=[name for name, _ in tables],
        key_dtypes=[v.key_dtype for _, v in tables],
        target_workers=[int(v.target_gpu) for _, v in tables],
        num_workers=num_workers,
        kind=kind,
        record_changes=record_changes)


def _mark_saved(prefix, tables):
    """Makes the complete checkpoint at `prefix` the base of the tables' next
  incremental save (every device group)."""
    marks = []
    for group in _by_device(tables):
        with on_table_device(group[0][1]):
            marks.append(ops().sok_ev_mark_embedding_variables_saved(prefix,
                                                                     [v.handle for _, v in group]))
    return marks


# SokEv>RestoreEmbeddingVariables' serving_modes.
_MODE_OF_CHECKPOINT, _TRAINING = -1, 0


def restore_tables(prefix, tables, record_changes=False):
    """Restores `tables` ([(name, variable)], one device) from the checkpoint
  at `prefix` (a full or an incremental one, with the chain it builds on);
  all of them or, on an error, none. record_changes: the checkpoint is the
  base of the tables' next incremental save.

  A table built for training keeps training whatever it restores (an
  export for serving gives it values only: a warm start); a SavedModel's
  own tables, and those of a restore built inside serving_export(), serve
  when the checkpoint is an export for serving."""
    as_saved = serving.save_kind() != "full"
    specs = [v.initializer_spec for _, v in tables]
    filters = [v.filter_attributes for _, v in tables]
    return ops().sok_ev_restore_embedding_variables(
        prefix,
        [v.handle for _, v in tables],
        [v.default_values for _, v in tables],
        table_names=[name for name, _ in tables],
        key_dtypes=[v.key_dtype for _, v in tables],
        embedding_dims=[int(v.embedding_dim) for _, v in tables],
        initializer_kinds=[int(s.kind) for s in specs],
        initializer_params_a=[float(s.param_a) for s in specs],
        initializer_params_b=[float(s.param_b) for s in specs],
        initializer_seeds=[int(s.seed) for s in specs],
        target_workers=[int(v.target_gpu) for _, v in tables],
        filter_specs=[
            int(f[name])
            for f in filters
            for name in ("filter_freq", "filter_counters", "filter_hashes", "filter_counter_bytes")
        ],
        no_permission_values=[float(f["no_permission_value"]) for f in filters],
        serving_modes=[
            _MODE_OF_CHECKPOINT if as_saved or v.restores_as_saved else _TRAINING for _, v in tables
        ],
        # Each table's own tiers: a checkpoint's layout is the same whatever
        # the storage it was saved from, so it restores into any.
        storage_specs=[
            int(v.storage_attributes[name])
            for _, v in tables
            for name in options_lib.STORAGE_ATTRIBUTE_NAMES
        ],
        record_changes=record_changes)


# Ordering the save across workers. Horovod's ops are not stateful, so
# Grappler may fold a gather of constants or drop a control dependency on a
# gather; every step below therefore takes what it waits for as data.


def _after(tensor, gate):
    """`tensor` (a string), computed from `gate` as well: a data dependency."""
    nothing = tf.strings.substr(tf.strings.as_string(tf.reshape(gate, [-1])[:1]), 0, 0)
    return tf.strings.join([tensor, tf.strings.reduce_join(nothing)])


def _on_worker_zero(build, gate=None):
    """Runs the ops `build()` makes on worker 0 only, after `gate`; returns a
  bool tensor to wait on."""

    def run():
        with tf.control_dependencies(build()):
            return tf.constant(True)

    worker, _ = ops().sok_ev_worker_topology()
    first = tf.equal(worker, 0)
    if gate is not None:
        first = tf.logical_and(first, tf.greater_equal(tf.size(gate), 0))
    return tf.cond(first, run, lambda: tf.constant(False))


def _barrier(name, after):
    """The gather of a signal from each of `after` (tensors), which completes
  on every worker once every worker has computed `after`."""
    signals = []
    for item in after:
        if item.dtype != tf.string:
            item = tf.strings.as_string(item)
        signals.append(tf.strings.to_hash_bucket_fast(item, 2**62))
    return communication.allgather(tf.reshape(tf.stack(signals), [-1]), name=name)


def record_worker_topology():
    """Tells the checkpoint kernels which worker this process is (the
  communication module's rank and world size)."""
    worker, num_workers = communication.rank(), communication.world_size()
    with tf.init_scope():
        if tf.executing_eagerly():
            ops().sok_ev_set_worker_topology(worker, num_workers)
            return
        with tf.Graph().as_default():
            op = ops().sok_ev_set_worker_topology(worker, num_workers)
            with tf.compat.v1.Session() as session:
                session.run(op)


# --- tf.compat.v1.train.Saver ------------------------------------------------


def _split(saveables):
    """([(name, Embedding Variable)], the other saveables)."""
    tables = [s for s in saveables if isinstance(s, EmbeddingVariableSaveable)]
    others = [s for s in saveables if not isinstance(s, EmbeddingVariableSaveable)]
    return [(s.name, s.variable) for s in tables], others


def _split_groups(per_device):
    """_split over TensorFlow's [(device, saveables)]: every table, and the
  groups of other saveables that are not empty."""
    tables, dense = [], []
    for device, saveables in per_device:
        group_tables, others = _split(saveables)
        tables.extend(group_tables)
        if others:
            dense.append((device, others))
    return tables, dense


class SaverBuilder(saver_module.BulkSaverBuilder):
    """TensorFlow's Saver builder, with Embedding Variables saved by
  SaveEmbeddingVariables parts merged into the checkpoint, and restored by
  RestoreEmbeddingVariables. Savers without Embedding Variables build exactly
  what TensorFlow's does.

  Args (sok_ev.Saver's incremental checkpoints; the defaults are the hook's):
    kind: 'full' saves every key; 'incremental' the keys changed since the
      tables' last checkpoint saved or restored with record_changes.
    record_changes: saves and restores make their checkpoint the base of the
      next incremental save.
  """

    def __init__(self, *args, kind="full", record_changes=False, **kwargs):
        super().__init__(*args, **kwargs)
        self._kind = kind
        self._record_changes = record_changes

    def _build_internal(self, names_to_saveables, *args, **kwargs):  # pylint: disable=arguments-differ
        # Saver({name: variable}) hands variables over as they are; TensorFlow
        # would read an Embedding Variable as a dense tensor.
        if isinstance(names_to_saveables, dict):
            names_to_saveables = {
                name: (EmbeddingVariableSaveable(value, name) if isinstance(
                    value, EmbeddingVariable) else value
                      ) for name, value in names_to_saveables.items()
            }
        return super()._build_internal(names_to_saveables, *args, **kwargs)

    def _AddSaveOps(self, filename_tensor, saveables):  # pylint: disable=invalid-name
        tables, others = _split(saveables)
        if not tables:
            return super()._AddSaveOps(filename_tensor, saveables)
        return _mark_table_save(
            self._save_with_tables(filename_tensor, [("", others)] if others else [], tables))

    def _AddShardedSaveOps(self, filename_tensor, per_device):  # pylint: disable=invalid-name
        tables, dense = _split_groups(per_device)
        if not tables:
            return super()._AddShardedSaveOps(filename_tensor, per_device)
        return _mark_table_save(self._save_with_tables(filename_tensor, dense, tables))

    def _save_with_tables(self, prefix, dense, tables):
        """The save graph, identical on every worker (which worker runs it is
    read at run time): each worker writes its tables' shards as parts;
    worker 0 writes the dense variables and merges every part into
    `prefix` once all are written. Returns `prefix`, once the checkpoint is
    complete on every worker."""
        workers = communication.world_size()
        with tf.device("/cpu:0"):
            # Nothing is written before every worker agreed on the path.
            checked = _same_prefix_on_every_worker(prefix) if workers > 1 else prefix
            temp = tf.strings.join([checked, "_temp/"])
        writes, parts = [], []
        with tf.control_dependencies(_evictions(tables)):
            for index, group in enumerate(_by_device(tables)):
                group_prefix = f"sok_ev_tables_{index}"
                with on_table_device(group[0][1]):
                    writes.append(
                        _save_tables(tf.strings.join([temp, group_prefix]), group, workers,
                                     serving.save_kind(self._kind), self._record_changes))
                parts.extend(
                    part_prefix(group_prefix, worker, workers) for worker in range(workers))
        with tf.device("/cpu:0"):
            dense_prefixes = [
                self.sharded_filename(tf.strings.join([temp, "part"]), shard, len(dense))
                for shard in range(len(dense))
            ]

        def write_dense():
            written = []
            for part, (device, saveables) in zip(dense_prefixes, dense):
                with tf.device(saver_module.saveable_object_util.set_cpu0(device)):
                    written.append(
                        saver_module.BaseSaverBuilder._AddSaveOps(  # pylint: disable=protected-access
                            self, part, saveables))
            return written

        if workers == 1:
            writes.extend(write_dense())
        elif dense:
            writes.append(_on_worker_zero(write_dense))
        with tf.device("/cpu:0"):
            inputs = dense_prefixes + [tf.strings.join([temp, part]) for part in parts]

            def merge():
                return [gen_io_ops.merge_v2_checkpoints(inputs, prefix, delete_old_dirs=True)]

            if workers == 1:
                with tf.control_dependencies(writes):
                    merged = merge()
                with tf.control_dependencies(merged):
                    if not self._record_changes:
                        return tf.identity(prefix)
                    marks = _mark_saved(prefix, tables)
                with tf.control_dependencies(marks):
                    return tf.identity(prefix)
            # Worker 0 merges once every part is written; every worker
            # returns once the checkpoint is complete (then Saver.save
            # records it as the latest).
            written = _barrier("sok_ev_checkpoint_parts_written", writes)
            merged = _on_worker_zero(merge, gate=written)
            complete = _after(prefix, _barrier("sok_ev_checkpoint_merged", [merged]))
            if not self._record_changes:
                return complete
            with tf.control_dependencies(_mark_saved(complete, tables)):
                return tf.identity(complete)

    def _AddRestoreOps(  # pylint: disable=invalid-name
            self,
            filename_tensor,
            saveables,
            restore_sequentially,
            reshape,
            preferred_shard=-1,
            name="restore_all"):
        tables, others = _split(saveables)
        if not tables:
            return super()._AddRestoreOps(filename_tensor, saveables, restore_sequentially, reshape,
                                          preferred_shard, name)
        restores = []
        if others:
            restores.append(super()._AddRestoreOps(filename_tensor, others, restore_sequentially,
                                                   reshape, preferred_shard, "restore_dense"))
        for group in _by_device(tables):
            with on_table_device(group[0][1]):
                restores.append(restore_tables(filename_tensor, group, self._record_changes))
        return tf.group(*restores, name=name)

    def _AddShardedRestoreOps(  # pylint: disable=invalid-name
            self, filename_tensor, per_device, restore_sequentially, reshape):
        tables, dense = _split_groups(per_device)
        if not tables:
            return super()._AddShardedRestoreOps(filename_tensor, per_device, restore_sequentially,
                                                 reshape)
        restores = []
        if dense:
            restores.append(super()._AddShardedRestoreOps(filename_tensor, dense,
                                                          restore_sequentially, reshape))
        for group in _by_device(tables):
            with on_table_device(group[0][1]):
                restores.append(restore_tables(filename_tensor, group, self._record_changes))
        return tf.group(*restores, name="restore_all")


def _same_prefix_on_every_worker(prefix):
    """`prefix`, once every worker checked that all save to the same path;
  fails on every worker otherwise."""
    mine = tf.reshape(tf.strings.to_hash_bucket_fast(prefix, 2**62), [1])
    everyone = communication.allgather(mine, name="sok_ev_checkpoint_paths")
    check = tf.debugging.assert_equal(
        everyone,
        tf.fill(tf.shape(everyone), everyone[0]),
        message="tf.compat.v1.train.Saver.save was given different paths on different workers: "
        "with Embedding Variables every worker must save the same checkpoint path, on a file "
        "system they share (each writes its shards, worker 0 the rest)")
    with tf.control_dependencies([check]):
        return _after(prefix, everyone)


def _mark_table_save(save_tensor):
    """Records in its graph that `save_tensor` (what a Saver's save runs)
  saves Embedding Variables; returns it. An eager Saver's save has run
  already and has no graph to record it in: it is returned as it is."""
    if tf.executing_eagerly():
        return save_tensor
    graph = save_tensor.graph
    if not hasattr(graph, "_sok_ev_table_saves"):
        graph._sok_ev_table_saves = set()  # pylint: disable=protected-access
    graph._sok_ev_table_saves.add(save_tensor.name)  # pylint: disable=protected-access
    return save_tensor


def _saves_tables(saver, session):
    """Whether `saver`'s save runs the save graph of SaverBuilder (with
  Embedding Variables) built in this process."""
    graph = getattr(session, "graph", None)
    saver_def = getattr(saver, "saver_def", None)
    return (graph is not None and saver_def is not None and
            saver_def.save_tensor_name in getattr(graph, "_sok_ev_table_saves", ()))


def _started_on_every_worker(save):
    """tf.compat.v1.train.Saver.save, which with Embedding Variables on
  several workers neither waits without limit nor lets one worker fail
  alone (the save graph's collectives would wait for it without limit):

  * it starts with a timed gather: a save run on some workers only fails on
    every worker within SOK_EV_LOOKUP_CHECK_TIMEOUT, and workers given
    different paths fail before anything is written;
  * a save that fails on some workers (a part that cannot be written) fails
    on every worker (`_end_failed_save`).
  """

    @functools.wraps(save)
    def checked_save(self, sess, save_path, *args, **kwargs):
        if communication.world_size() == 1 or not _saves_tables(self, sess):
            return save(self, sess, save_path, *args, **kwargs)
        path = os.fsdecode(save_path)
        everyone = _gather_at_start(path, "sok_ev_saver_save", "a Saver save")
        for other, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                raise ValueError(
                    "tf.compat.v1.train.Saver.save was given different paths on different "
                    f"workers: {everyone[0]!r} on worker 0, {theirs!r} on worker {other}. "
                    "With Embedding Variables every worker must save the same checkpoint "
                    "path, on a file system they share (each writes its shards, worker 0 "
                    "the rest)")
        try:
            return save(self, sess, save_path, *args, **kwargs)
        except Exception as error:  # pylint: disable=broad-except
            _end_failed_save(error)
            raise

    return checked_save


def _end_failed_save(error):
    """Called on a worker whose Saver save failed with `error`: makes sure
  no other worker waits for it. When every worker's save failed (a cause
  they share), they meet in a timed gather and each raises its own error.
  When the others do not come within the check's time limit, they may be
  waiting in the save graph's collectives for this worker: it stops the
  job (agreement.stop_everyone) so that they fail too. A worker whose save
  failed because another worker stopped the job raises an error saying
  so."""
    me = communication.rank()
    failure = f"{type(error).__name__}: {error}"
    try:
        communication.allgather_object(failure,
                                       name="sok_ev_saver_save_failed",
                                       timeout=agreement.check_timeout())
    except communication.CollectiveTimeoutError:
        agreement.stop_everyone(f"tf.compat.v1.train.Saver.save failed on worker {me} only; "
                                "stopping the job, as the other workers may wait for this one "
                                f"in the save's collectives. {failure}")
    except Exception:  # pylint: disable=broad-except
        raise RuntimeError(f"tf.compat.v1.train.Saver.save failed on worker {me} ({failure}): "
                           "another worker's save failed and stopped the job; its log names "
                           "the cause") from error


_originals = {}


def install_saver_hook():
    """Makes tf.compat.v1.train.Saver save and restore Embedding Variables
  (see the module docstring). Affects Savers built afterwards without an
  explicit builder=; anything that is not an Embedding Variable goes through
  TensorFlow's code. With several workers a Saver's save of Embedding
  Variables first checks that every worker saves, to the same path
  (`_started_on_every_worker`). Idempotent."""
    if not _originals:
        _originals["BulkSaverBuilder"] = saver_module.BulkSaverBuilder
        _originals["save"] = saver_module.Saver.save
        saver_module.BulkSaverBuilder = SaverBuilder
        saver_module.Saver.save = _started_on_every_worker(saver_module.Saver.save)
        if not _restore_checks:
            # Wrapped once and never unwrapped: other hooks (DeepRec's
            # checkpoint layout) wrap Saver.restore too, and unwrapping this
            # one would drop theirs. uninstall_saver_hook turns its check off.
            saver_module.Saver.restore = _parts_checked(saver_module.Saver.restore)
        _restore_checks[:] = [True]


# [True] while the Saver.restore check of partitioned variables is on.
_restore_checks = []


def _parts_checked(restore):
    """Saver.restore that first refuses a checkpoint holding one of its
  partitioned Embedding Variables in more parts than it has
  (partitioned_variable.check_restored_parts)."""

    @functools.wraps(restore)
    def wrapped(self, sess, save_path):
        if _restore_checks[0] and sess is not None and isinstance(save_path, str):
            variables = self._var_list  # pylint: disable=protected-access
            if variables is None:
                variables = sess.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            variables = list(variables.values()) if isinstance(variables, dict) else variables
            try:
                names = [name for name, _ in tf.train.list_variables(save_path)]
            except (tf.errors.OpError, ValueError):
                names = []  # restore itself reports the unreadable checkpoint
            partitioned_variable.check_restored_parts(variables, names, save_path)
        return restore(self, sess, save_path)

    return wrapped


def uninstall_saver_hook():
    """Restores TensorFlow's Saver builder and Saver.save, and turns the
  restore check of partitioned variables off."""
    if _originals:
        saver_module.BulkSaverBuilder = _originals.pop("BulkSaverBuilder")
        saver_module.Saver.save = _originals.pop("save")
        _restore_checks[:] = [False]


def saver_hook_installed():
    """Whether install_saver_hook() is in effect."""
    return bool(_originals)


# --- tf.train.Checkpoint (a saver registered with TensorFlow) ----------------


def _sorted_tables(trackables):
    return sorted(trackables.items(), key=lambda item: item[0])


def _in_legacy_graph():
    """Building a tf.compat.v1 graph (not eager, not a tf.function)."""
    return (not tf.executing_eagerly() and
            not isinstance(framework_ops.get_default_graph(), tf.__internal__.FuncGraph))


def _registered_save(trackables, file_prefix):
    """The registered save function: writes this worker's parts and returns
  the prefixes TensorFlow merges into the checkpoint (every worker's parts,
  on worker 0)."""
    tables = _sorted_tables(trackables)
    workers, worker = communication.world_size(), communication.rank()
    if not tf.executing_eagerly():
        if workers > 1:
            raise ValueError("tf.train.Checkpoint saves Embedding Variables of several workers "
                             "eagerly only; call save()/write() outside tf.function and graphs")
        with tf.control_dependencies(_evictions(tables)):
            return [
                _save_tables(tf.strings.join([file_prefix, f"_{index}"]), group, workers,
                             serving.save_kind()) for index, group in enumerate(_by_device(tables))
            ]
    prefix = file_prefix.numpy().decode()
    if workers > 1:
        prefix = _prefix_of_worker_zero(prefix, [name for name, _ in tables])
    parts, failure = [], None
    try:
        _evictions(tables)  # run now, eagerly
        for index, group in enumerate(_by_device(tables)):
            _save_tables(f"{prefix}_{index}", group, workers, serving.save_kind())
            parts.extend(part_prefix(f"{prefix}_{index}", w, workers) for w in range(workers))
    except tf.errors.OpError as error:
        if workers == 1:
            raise
        failure = error
    if workers > 1:
        # Every part is written before worker 0 merges them; a part that
        # could not be written fails the save on every worker.
        written = communication.allgather_object(
            None if failure is None else [failure.error_code, failure.message],
            name="sok_ev_checkpoint_parts_written")
        if failure is not None:
            raise failure
        for other, theirs in enumerate(written):
            if theirs is not None:
                code, message = theirs
                raise errors_impl.exception_type_from_error_code(code)(
                    None, None, f"tf.train.Checkpoint: worker {other} could not write its part "
                    f"of the checkpoint at {prefix!r}, so nothing was saved: {message}")
    return [tf.constant(part) for part in parts] if worker == 0 else []


def _gather_at_start(obj, name, what):
    """Every worker's `obj`, gathered as a save or restore starts (`what`
  names it: "a Saver save").

  Raises:
    ValueError: the other workers did not start it within the build-time
      check's timeout (a save or restore run on some workers only); they are
      stopped too (agreement.stop_everyone).
  """
    timeout = agreement.check_timeout()
    try:
        return communication.allgather_object(obj, name=name, timeout=timeout)
    except communication.CollectiveTimeoutError:
        message = (f"sok-ev: worker {communication.rank()} started {what} that the "
                   f"other workers did not start within {timeout:g} s. Embedding Variables are "
                   "sharded: every worker saves and restores them, at the same step (not "
                   "worker 0 alone; hvd.broadcast_variables does not copy them). "
                   f"{agreement.TIMEOUT_VARIABLE} sets the time limit.")
        agreement.stop_everyone(message)
        raise ValueError(message) from None


def _prefix_of_worker_zero(prefix, names):
    """Where worker 0 saves; checks that the workers save the same tables,
  and that the others save elsewhere (their dense variables would collide)."""
    everyone = _gather_at_start({
        "prefix": prefix,
        "tables": names
    }, "sok_ev_checkpoint_prefixes", "a tf.train.Checkpoint save")
    for other, theirs in enumerate(everyone):
        if theirs["tables"] != everyone[0]["tables"]:
            raise ValueError(f"tf.train.Checkpoint: worker {other} saves Embedding Variables "
                             f"{theirs['tables']} but worker 0 saves {everyone[0]['tables']}; "
                             "every worker must save the same objects")
        if other > 0 and theirs["prefix"] == everyone[0]["prefix"]:
            raise ValueError(f"tf.train.Checkpoint: worker {other} saves to the same path as "
                             "worker 0. With several workers every worker saves, but workers "
                             "other than 0 to a path of their own, e.g. "
                             "tf.train.CheckpointManager(ckpt, directory if hvd.rank() == 0 "
                             "else f'{directory}/worker-{hvd.rank()}', ...): worker 0 writes "
                             "the checkpoint, the others add their Embedding Variable shards "
                             "to it.")
    return everyone[0]["prefix"]


def _registered_restore(trackables, merged_prefix):
    """The registered restore function: every table, or none."""
    if _in_legacy_graph():
        raise ValueError("tf.train.Checkpoint restores Embedding Variables eagerly or in "
                         "tf.function only; in a tf.compat.v1 graph use "
                         "tf.compat.v1.train.Saver")
    if communication.world_size() > 1 and tf.executing_eagerly():
        _same_checkpoint_restored(merged_prefix.numpy().decode(), trackables)
    restores = []
    for group in _by_device(_sorted_tables(trackables)):
        with on_table_device(group[0][1]):
            restores.append(restore_tables(merged_prefix, group))
    # In a tf.function (a SavedModel's restore function) the stateful restore
    # ops run by automatic control dependencies; it must return no op.
    return None


def _same_checkpoint_restored(prefix, trackables):
    """Checks that every worker restores the same tables from the same
  checkpoint: each keeps the keys it owns, so workers restoring different
  checkpoints would make a model no checkpoint held."""
    names = [name for name, _ in _sorted_tables(trackables)]
    everyone = _gather_at_start({
        "prefix": prefix,
        "tables": names
    }, "sok_ev_checkpoint_restore", "a tf.train.Checkpoint restore")
    for other, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            raise ValueError(f"tf.train.Checkpoint.restore: worker {other} restores Embedding "
                             f"Variables {theirs['tables']} from {theirs['prefix']!r} but worker 0 "
                             f"restores {everyone[0]['tables']} from {everyone[0]['prefix']!r}; "
                             "every worker must restore the same checkpoint")


registration.register_checkpoint_saver(package=_REGISTERED_PACKAGE,
                                       name=_REGISTERED_NAME,
                                       predicate=lambda x: isinstance(x, EmbeddingVariable),
                                       save_fn=_registered_save,
                                       restore_fn=_registered_restore)
