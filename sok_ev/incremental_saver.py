"""DeepRec's incremental checkpoints: `sok_ev.Saver(incremental_save_restore=True)`.

A `tf.compat.v1.train.Saver` whose full saves and restores also start each
Embedding Variable's record of changed keys, and whose
`incremental_save(sess, path)` writes a checkpoint holding every dense
variable but, of each Embedding Variable, only the keys changed since the
last full or incremental save (rows with their slots, frequencies and
versions; the counts of keys its feature filter has not admitted; the keys
evicted or erased since). An incremental checkpoint names the checkpoint it
builds on (`<table>/sok_ev/base`); restoring it, with `restore` or DeepRec's
`incremental_restore`, restores that chain, to exactly the state a full save
at the same moment holds. The chain must stay readable: keep incremental
checkpoints in a directory of their own (DeepRec uses
`<checkpoint_dir>/.incremental_checkpoint`), and do not let `max_to_keep`
delete a full checkpoint an incremental one still builds on.
"""

import os

import tensorflow as tf
from tensorflow.python.training import saver as saver_module

from sok_ev import checkpoint


class Saver(saver_module.Saver):
    """`tf.compat.v1.train.Saver` with DeepRec's incremental checkpoints.

  Args:
    var_list, **kwargs: as for tf.compat.v1.train.Saver (builder= is taken:
      sok-ev builds its own).
    incremental_save_restore: DeepRec's switch. False: exactly the Saver that
      sok_ev.init()'s hook gives. True: enables incremental_save().

  Raises:
    ValueError: a builder= is passed.
  """

    def __init__(self, var_list=None, *, incremental_save_restore=False, **kwargs):
        if kwargs.get("builder") is not None:
            raise ValueError("sok_ev.Saver builds its own saver graph; do not pass builder= "
                             f"(got {kwargs['builder']!r})")
        self._incremental_save_restore = incremental_save_restore
        kwargs["builder"] = checkpoint.SaverBuilder(record_changes=incremental_save_restore)
        super().__init__(var_list, **kwargs)
        self._incremental_saver = None
        if incremental_save_restore:
            # The same variables, saved with only the changed keys of each
            # table. It never deletes a checkpoint: later ones build on it.
            incremental_kwargs = dict(kwargs, max_to_keep=None)
            incremental_kwargs["builder"] = checkpoint.SaverBuilder(kind="incremental",
                                                                    record_changes=True)
            incremental_kwargs["name"] = "sok_ev_incremental_save"
            self._incremental_saver = saver_module.Saver(var_list, **incremental_kwargs)

    @property
    def incremental_save_restore(self):
        """Whether incremental_save() is enabled."""
        return self._incremental_save_restore

    def incremental_save(self, sess, save_path, global_step=None, write_state=True):
        """Writes an incremental checkpoint (see the module docstring).

    Args:
      sess: the session holding the variables.
      save_path: the checkpoint's prefix; with global_step, `-<step>` is
        appended, as Saver.save does.
      global_step: an int or a tensor/variable holding one.
      write_state: update the `checkpoint` state file in save_path's
        directory (latest_checkpoint then names the incremental checkpoint).

    Returns:
      The path of the checkpoint written.

    Raises:
      ValueError: the Saver was built with incremental_save_restore=False.
      tf.errors.FailedPreconditionError: no full checkpoint of the tables
        was saved or restored by this Saver since they were initialized.
    """
        if self._incremental_saver is None:
            raise ValueError("incremental_save: build the Saver with "
                             "sok_ev.Saver(incremental_save_restore=True) (DeepRec's "
                             "incremental checkpoints)")
        directory = os.path.dirname(save_path)
        if directory:
            tf.io.gfile.makedirs(directory)
        return self._incremental_saver.save(sess,
                                            save_path,
                                            global_step=global_step,
                                            write_meta_graph=False,
                                            write_state=write_state)

    def incremental_restore(self, sess, save_path, incr_save_path):
        """DeepRec's restore of a full checkpoint and an incremental one: the
    incremental checkpoint names the chain it builds on, so this restores
    `incr_save_path`, whose chain must start at `save_path`.

    Raises:
      ValueError: incr_save_path does not build on save_path.
    """
        chain = checkpoint_chain(incr_save_path)
        if os.path.normpath(chain[-1]) != os.path.normpath(save_path):
            raise ValueError(f"incremental_restore: {incr_save_path} builds on {chain[-1]}, "
                             f"not on {save_path}")
        self.restore(sess, incr_save_path)


class StockNameSaver(Saver):
    """`tf.compat.v1.train.Saver` once `sok_ev.install_deeprec_api()` ran, as
  DeepRec scripts call it: `Saver(..., incremental_save_restore=True)` is
  `sok_ev.Saver`'s incremental Saver; without it, TensorFlow's Saver as the
  saver hook leaves it, a `builder=` included.

  Args:
    var_list, **kwargs: as for tf.compat.v1.train.Saver.
    incremental_save_restore: DeepRec's switch (see `Saver`).

  Raises:
    ValueError: builder= together with incremental_save_restore=True.
  """

    def __init__(self, var_list=None, *, incremental_save_restore=False, **kwargs):
        if not incremental_save_restore and kwargs.get("builder") is not None:
            # The caller's builder: TensorFlow's Saver, not sok-ev's.
            saver_module.Saver.__init__(self, var_list, **kwargs)  # pylint: disable=non-parent-init-called
            self._incremental_save_restore = False
            self._incremental_saver = None
            return
        super().__init__(var_list, incremental_save_restore=incremental_save_restore, **kwargs)


def checkpoint_chain(path):
    """The checkpoints an incremental checkpoint at `path` builds on: [path,
  its base, ..., the full checkpoint] (just [path] for a full one)."""
    chain = [path]
    seen = {os.path.normpath(path)}
    while True:
        reader = tf.train.load_checkpoint(chain[-1])
        bases = {
            reader.get_tensor(name)
            for name in reader.get_variable_to_shape_map()
            if name.endswith("/sok_ev/base")
        }
        if not bases:
            return chain
        base = bases.pop().decode()
        if not tf.io.gfile.exists(base + ".index"):
            # Moved with its chain: the base lies beside it.
            base = os.path.join(os.path.dirname(chain[-1]), os.path.basename(base))
        if os.path.normpath(base) in seen:
            raise ValueError(f"the incremental checkpoints of {path} form a loop at {base}")
        seen.add(os.path.normpath(base))
        chain.append(base)
