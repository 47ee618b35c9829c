"""DeepRec's `tf.config.experimental.enable_distributed_strategy`.

In DeepRec, `enable_distributed_strategy(strategy="collective")` initialises
Horovod and SOK and switches `group_embedding_column_scope` and
`tf.nn.group_embedding_lookup_sparse` to SOK's model-parallel lookups: every
worker holds a shard of each Embedding Variable, the keys of a batch go to
their owners and the rows come back, over Horovod. Any other strategy is
refused with a ValueError.

sok-ev's grouped lookups (`sok_ev.lookup_sparse`, which those names call) are
already that model-parallel lookup once `sok_ev.init()` has read the workers
from Horovod: a table keeps its default `target_gpu=-1`, sharded over every
worker. So here, with `strategy="collective"`:

* Horovod installed: `hvd.init()` (unless already done), then `sok_ev.init()`;
  one process launched alone is one worker (Horovod's size 1), and the
  grouped lookups are the localized ones;
* Horovod not installed: `sok_ev.init()` alone, which is one worker, where the
  collective lookup is the localized one (and which raises a RuntimeError when
  a launcher started several processes: they cannot know each other without
  Horovod).

`strategy="localized"` (which some DeepRec modelzoo scripts pass) keeps one
process's grouped lookups: nothing to initialise. Any other value raises a
ValueError naming it, as in DeepRec.
"""

import logging

from sok_ev import communication
from sok_ev import initialization

STRATEGIES = ("collective", "localized")

_state = {"strategy": None}


def strategy():
    """The strategy enabled by enable_distributed_strategy, or None."""
    return _state["strategy"]


def enable_distributed_strategy(strategy="collective"):  # pylint: disable=redefined-outer-name
    """DeepRec's `tf.config.experimental.enable_distributed_strategy` (see
  the module docstring).

  Args:
    strategy: "collective" (DeepRec's default) or "localized".

  Raises:
    ValueError: another strategy (DeepRec's "parameter_server" is not built
      there either).
    RuntimeError: from sok_ev.init(): several processes were launched but
      Horovod is missing.
  """
    if strategy not in STRATEGIES:
        raise ValueError(f"tf.config.experimental.enable_distributed_strategy: strategy "
                         f"{strategy!r} is not supported; use 'collective' (Horovod's workers "
                         "share the Embedding Variables, sok_ev.lookup_sparse) or 'localized'.")
    if strategy == "collective":
        hvd = communication._horovod()  # pylint: disable=protected-access
        if hvd is not None and not hvd.is_initialized():
            hvd.init()
        initialization.init()
        logging.getLogger("sok_ev").info(
            "enable_distributed_strategy('collective'): %d worker(s)%s", communication.world_size(),
            "" if communication.world_size() > 1 else "; grouped lookups run on this one worker")
    _state["strategy"] = strategy
