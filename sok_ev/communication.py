"""Who the workers are, and how they talk: the one place sok-ev asks.

sok-ev runs on one worker without Horovod. With Horovod (after `hvd.init()`),
`init()` takes the rank and the number of workers from it. Lookup code only
calls `rank()` and `world_size()` here and the collectives in
`sok_ev.distributed`, so another backend can replace Horovod in this module.
"""

import os

_state = {"rank": 0, "world_size": 1, "initialized": False}

# Variables that launchers set to the number of processes they started.
_LAUNCHER_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                            "WORLD_SIZE")


def _launched_processes():
  for variable in _LAUNCHER_SIZE_VARIABLES:
    value = os.environ.get(variable)
    if value and value.isdigit():
      return int(value), variable
  return 1, None


def init():
  """Reads rank and world size from Horovod, or sets one worker.

  Raises:
    RuntimeError: several processes were launched but Horovod is missing or
      `hvd.init()` has not run, so the workers cannot know each other.
  """
  launched, variable = _launched_processes()
  try:
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
  except ImportError:
    hvd = None
  if hvd is not None and hvd.is_initialized():
    _state.update(rank=hvd.rank(), world_size=hvd.size(), initialized=True)
    return
  if launched > 1:
    missing = ("Horovod is not installed (bash request.sh installs it)"
               if hvd is None else "hvd.init() has not been called")
    raise RuntimeError(
        f"sok_ev.init(): {launched} processes were launched ({variable}="
        f"{launched}), but {missing}. Call hvd.init() before sok_ev.init().")
  _state.update(rank=0, world_size=1, initialized=True)


def rank():
  """This worker's index in [0, world_size())."""
  return _state["rank"]


def world_size():
  """Number of workers the tables are spread over."""
  return _state["world_size"]
