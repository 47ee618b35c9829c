"""DeepRec's `MonitoredTrainingSession(save_incremental_checkpoint_secs=...)`.

`sok_ev.install_deeprec_api()` puts `MonitoredTrainingSession` here on
`tf.compat.v1.train`. Without `save_incremental_checkpoint_secs` it is
TensorFlow's, unchanged. With it (a number of seconds), as in DeepRec:

* the scaffold's saver becomes an incremental one
  (`sok_ev.Saver(incremental_save_restore=True)`, keeping the `max_to_keep`
  and `sharded` of the scaffold's own saver, if it has one): its full saves
  (TensorFlow's CheckpointSaverHook, every `save_checkpoint_secs` /
  `_steps` and at the end) start each table's record of changed keys;
* on the chief, every that many seconds, an incremental checkpoint of the
  keys changed since the last save goes to
  `<checkpoint_dir>/.incremental_checkpoint/model.ckpt-<global step>`;
* at start, the session restores the latest full checkpoint and, when
  incremental checkpoints were written on top of it, the latest of those
  (so a job that stopped between full saves resumes from its last
  incremental save).
"""

import os

import tensorflow as tf
from tensorflow.python.training import basic_session_run_hooks
from tensorflow.python.training import training_util

from sok_ev import incremental_saver

INCREMENTAL_DIRECTORY = ".incremental_checkpoint"
INCREMENTAL_BASENAME = "model.ckpt"
# TensorFlow's own, before install_deeprec_api() replaces it.
STOCK_MONITORED_TRAINING_SESSION = tf.compat.v1.train.MonitoredTrainingSession


class ResumingSaver(incremental_saver.Saver):
    """An incremental Saver whose restore of a full checkpoint restores the
  latest incremental checkpoint of `incremental_dir` built on it instead
  (which restores the full one and the increments after it).

  Args:
    incremental_dir: where the incremental checkpoints are written.
    var_list, **kwargs: as for sok_ev.Saver (incremental_save_restore is
      True).
  """

    def __init__(self, incremental_dir, var_list=None, **kwargs):
        self._incremental_dir = incremental_dir
        super().__init__(var_list, incremental_save_restore=True, **kwargs)

    @property
    def incremental_dir(self) -> str:
        return self._incremental_dir

    def latest_on(self, save_path):
        """The latest incremental checkpoint whose chain starts at the full
    checkpoint `save_path`, or None."""
        latest = tf.train.latest_checkpoint(self._incremental_dir)
        if latest is None:
            return None
        base = incremental_saver.checkpoint_chain(latest)[-1]
        return latest if os.path.normpath(base) == os.path.normpath(save_path) else None

    def restore(self, sess, save_path):
        return super().restore(sess, self.latest_on(save_path) or save_path)


class IncrementalCheckpointHook(tf.compat.v1.train.SessionRunHook):
    """Writes an incremental checkpoint every `save_secs` seconds (checked
  after each step), with the global step in its name.

  Args:
    saver: a Saver built with incremental_save_restore=True.
    save_path: the checkpoints' prefix (`<dir>/model.ckpt`).
    save_secs: seconds between incremental checkpoints, > 0.

  Raises:
    ValueError: save_secs not a positive number.
  """

    def __init__(self, saver, save_path, save_secs):
        if isinstance(save_secs, bool) or not isinstance(save_secs, (int, float)) or save_secs <= 0:
            raise ValueError(f"save_incremental_checkpoint_secs must be a positive number of "
                             f"seconds, got {save_secs!r}")
        self._saver = saver
        self._save_path = save_path
        self._timer = basic_session_run_hooks.SecondOrStepTimer(every_secs=save_secs)
        self._global_step = None

    def begin(self):
        self._global_step = training_util._get_or_create_global_step_read()  # pylint: disable=protected-access
        if self._global_step is None:
            raise RuntimeError("save_incremental_checkpoint_secs needs a global step "
                               "(tf.compat.v1.train.get_or_create_global_step()).")

    def after_create_session(self, session, coord):
        del coord
        # The session starts from a full save or restore: the increments
        # start here.
        self._timer.update_last_triggered_step(session.run(self._global_step))

    def before_run(self, run_context):
        del run_context
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        step = run_context.session.run(self._global_step)
        del run_values
        if self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            self._saver.incremental_save(run_context.session, self._save_path, global_step=step)


def _incremental_saver(scaffold, incremental_dir):
    """The saver the scaffold will use: its own if incremental, else one
  keeping its max_to_keep and sharded."""
    own = scaffold.saver
    if isinstance(own, ResumingSaver):
        return own
    kwargs = {"sharded": True, "max_to_keep": 5}  # Scaffold's default Saver's
    if own is not None:
        kwargs = {"sharded": own._sharded, "max_to_keep": own._max_to_keep}  # pylint: disable=protected-access
        var_list = own._var_list  # pylint: disable=protected-access
    else:
        var_list = None
    return ResumingSaver(incremental_dir, var_list, **kwargs)


def MonitoredTrainingSession(*args, save_incremental_checkpoint_secs=None, **kwargs):  # pylint: disable=invalid-name
    """TensorFlow's `tf.compat.v1.train.MonitoredTrainingSession`, with
  DeepRec's `save_incremental_checkpoint_secs` (see the module docstring).

  Args:
    *args, **kwargs: TensorFlow's arguments.
    save_incremental_checkpoint_secs: None (default: TensorFlow's session,
      unchanged), or seconds between incremental checkpoints.

  Returns:
    A MonitoredSession.

  Raises:
    ValueError: save_incremental_checkpoint_secs without checkpoint_dir, or
      not a positive number.
  """
    if save_incremental_checkpoint_secs is None:
        return STOCK_MONITORED_TRAINING_SESSION(*args, **kwargs)
    names = ("master", "is_chief", "checkpoint_dir", "scaffold", "hooks", "chief_only_hooks")
    kwargs.update(zip(names, args))
    args = ()
    checkpoint_dir = kwargs.get("checkpoint_dir")
    if not checkpoint_dir:
        raise ValueError(f"save_incremental_checkpoint_secs={save_incremental_checkpoint_secs!r} "
                         "needs a checkpoint_dir (incremental checkpoints build on its full "
                         "ones).")
    incremental_dir = os.path.join(checkpoint_dir, INCREMENTAL_DIRECTORY)
    scaffold = kwargs.get("scaffold") or tf.compat.v1.train.Scaffold()
    saver = _incremental_saver(scaffold, incremental_dir)
    # Scaffold has no setter; it is not finalized yet, so its saver is free
    # to change (finalize() would otherwise build the default Saver).
    scaffold._saver = saver  # pylint: disable=protected-access
    hook = IncrementalCheckpointHook(saver, os.path.join(incremental_dir, INCREMENTAL_BASENAME),
                                     save_incremental_checkpoint_secs)
    kwargs["scaffold"] = scaffold
    kwargs["chief_only_hooks"] = list(kwargs.get("chief_only_hooks") or []) + [hook]
    return STOCK_MONITORED_TRAINING_SESSION(**kwargs)
