"""DeepRec's Embedding Variable options, with DeepRec's names and defaults.

Only what sok-ev implements is accepted; any other non-default setting raises
a ValueError naming the option, so no DeepRec behaviour is dropped silently.
"""

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass
class InitializerOption:
    """How new keys get their first value.

  Args:
    initializer: overrides `get_embedding_variable`'s `initializer` when set.
    default_value_dim: DeepRec's rule when set: an `[default_value_dim, dim]`
      matrix is drawn once from the initializer, and a new key takes row
      `key mod default_value_dim` (the non-negative remainder). When None,
      each new key draws its own value from the initializer, reproducibly
      (the draw depends only on the seed and the key).
    default_value_no_permission: DeepRec's value for keys a filter rejects;
      sok-ev has no filters, so only the default 0.0 is accepted.
  """
    initializer: Any = None
    default_value_dim: Optional[int] = None
    default_value_no_permission: float = 0.0

    def __post_init__(self):
        if self.default_value_dim is not None and (not isinstance(self.default_value_dim, int) or
                                                   self.default_value_dim <= 0):
            raise ValueError("InitializerOption: default_value_dim must be a positive "
                             f"integer, got {self.default_value_dim!r}")
        if self.default_value_no_permission != 0.0:
            raise ValueError("InitializerOption: default_value_no_permission is not "
                             "supported by sok-ev (it has no feature filters); got "
                             f"{self.default_value_no_permission!r}")


@dataclasses.dataclass
class GlobalStepEvict:
    """Evicts keys not updated for `steps_to_live` global steps (at save)."""
    steps_to_live: Optional[int] = None


@dataclasses.dataclass
class EmbeddingVariableOption:
    """DeepRec's `tf.EmbeddingVariableOption`.

  Args:
    init_option: an `InitializerOption`.
    evict_option: a `GlobalStepEvict`; same as `steps_to_live`.
    ht_type, ht_partition_num, filter_option, storage_option, ckpt: accepted
      at their DeepRec defaults only; any other value raises ValueError.
  """
    ht_type: str = ""
    ht_partition_num: int = 1000
    evict_option: Optional[GlobalStepEvict] = None
    ckpt: Any = None
    filter_option: Any = None
    storage_option: Any = None
    init_option: Optional[InitializerOption] = None

    def __post_init__(self):
        unsupported = {
            "ht_type": (self.ht_type, ""),
            "ht_partition_num": (self.ht_partition_num, 1000),
            "ckpt": (self.ckpt, None),
            "filter_option": (self.filter_option, None),
            "storage_option": (self.storage_option, None),
        }
        for option, (value, default) in unsupported.items():
            if value != default:
                raise ValueError(f"EmbeddingVariableOption: {option}={value!r} is not "
                                 f"supported by sok-ev; leave it at {default!r}")
        if self.evict_option is not None and not isinstance(self.evict_option, GlobalStepEvict):
            raise ValueError("EmbeddingVariableOption: evict_option must be a "
                             f"GlobalStepEvict, got {self.evict_option!r}")
        if self.init_option is not None and not isinstance(self.init_option, InitializerOption):
            raise ValueError("EmbeddingVariableOption: init_option must be an "
                             f"InitializerOption, got {self.init_option!r}")
