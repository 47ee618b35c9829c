"""DeepRec's Embedding Variable options, with DeepRec's names, arguments and
defaults.

Every option class can be created exactly as in DeepRec, so a DeepRec script
gets past its option set-up. What sok-ev does not implement yet
(storage other than DRAM and HBM_DRAM, loading from another checkpoint) is
refused by `check_supported`, which `get_embedding_variable` runs: a
ValueError naming the feature, before anything is created. Feature filters
and HBM_DRAM storage become attributes of the table's initializer op
(`filter_attributes`, `storage_attributes`).
"""

import dataclasses
import enum
import math
import numbers
from typing import Any, List, Optional, Union

import tensorflow as tf


class StorageType(enum.IntEnum):
    """DeepRec's `config_pb2.StorageType`: where a table's rows live (same
  names and numbers). sok-ev stores a table in DRAM (or the GPU's memory
  when the table is on a GPU): `DRAM` or no storage type; a GPU table may
  also take `HBM_DRAM` (the rows beyond an HBM budget in host memory). Any
  other type is refused by get_embedding_variable."""
    INVALID = 0
    DRAM = 1
    PMEM_MEMKIND = 2
    PMEM_LIBPMEM = 3
    SSDHASH = 4
    LEVELDB = 5
    DRAM_PMEM = 11
    DRAM_SSDHASH = 12
    HBM_DRAM = 13
    DRAM_LEVELDB = 14
    DRAM_PMEM_SSDHASH = 101
    HBM_DRAM_SSDHASH = 102


class CacheType(enum.IntEnum):
    """DeepRec's `config_pb2.CacheType`: the cache policy of multi-tier storage.
  With HBM_DRAM storage, LFU keeps in HBM the rows looked up most often
  (their frequency), LRU those updated most recently (their version)."""
    LRU = 0
    LFU = 1


# DeepRec's `config_pb2.CacheStrategy`: the same policy under the name
# StorageOption's `cache_strategy` argument is documented with.
CacheStrategy = CacheType


class SlotType(enum.IntEnum):
    """DeepRec's `config_pb2.SlotType` (kept for scripts that name it)."""
    EMBEDDING_VARIABLE = 0
    VARIABLE = 1


# DeepRec: storage types that keep rows on disk need a storage_path.
_DISK_STORAGE_TYPES = (StorageType.LEVELDB, StorageType.SSDHASH, StorageType.DRAM_SSDHASH,
                       StorageType.DRAM_LEVELDB)
_GIB = 1024 * 1024 * 1024


@dataclasses.dataclass
class InitializerOption:
    """How new keys get their first value.

  Args:
    initializer: overrides `get_embedding_variable`'s `initializer` when set
      (an initializer instance, or its class, as in DeepRec).
    default_value_dim: DeepRec's rule when set: an `[default_value_dim, dim]`
      matrix is drawn once from the initializer, and a new key takes row
      `key mod default_value_dim` (the non-negative remainder). When None,
      each new key draws its own value from the initializer, reproducibly
      (the draw depends only on the seed and the key).
    default_value_no_permission: what a lookup of a key a feature filter has
      not admitted yet reads (every element); without a filter no key is
      refused, so it has no effect (as in DeepRec).

  Raises:
    ValueError: default_value_dim is not a positive integer (Python's or
      NumPy's; a bool is not taken for one), or default_value_no_permission
      is not a number.
  """
    initializer: Any = None
    default_value_dim: Optional[int] = None
    default_value_no_permission: float = 0.0

    def __post_init__(self):
        dim = self.default_value_dim
        # Any integer (NumPy's too, as embedding_dim), but not a bool.
        if dim is not None and (not isinstance(dim, numbers.Integral) or isinstance(dim, bool) or
                                dim <= 0):
            raise ValueError("InitializerOption: default_value_dim must be a positive "
                             f"integer, got {dim!r}")
        if dim is not None:
            self.default_value_dim = int(dim)
        value = self.default_value_no_permission
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise ValueError("InitializerOption: default_value_no_permission must be a number, "
                             f"got {value!r}")


@dataclasses.dataclass
class GlobalStepEvict:
    """Evicts keys not updated for `steps_to_live` global steps (at save)."""
    steps_to_live: Optional[int] = None


@dataclasses.dataclass
class L2WeightEvict:
    """DeepRec's eviction of keys whose value v has an L2 weight
  0.5 * sum(v * v) below `l2_weight_threshold`, run when the table is saved;
  a threshold <= 0 (the default -1.0) disables it."""
    l2_weight_threshold: float = -1.0


@dataclasses.dataclass
class CounterFilter:
    """DeepRec's counter feature filter: a key is admitted into the table once
  it has been seen `filter_freq` times (0: every key is). Until then it has
  no row: lookups read `InitializerOption.default_value_no_permission` and
  its gradients are dropped; its exact count and the global step of its last
  dropped update are kept (and checkpointed as `keys_filtered`)."""
    filter_freq: int = 0


@dataclasses.dataclass
class CBFFilter:
    """DeepRec's counting-Bloom-filter feature filter: CounterFilter's
  admission rule, counted in a counting Bloom filter of bounded memory sized
  for `max_element_size` keys at `false_positive_probability` (counters of
  `counter_type`, saturating at filter_freq). Without
  false_positive_probability the counts are exact, as CounterFilter's.

  Raises:
    ValueError: DeepRec's argument checks: false_positive_probability must be
      -1.0 (unset) or positive; max_element_size must be positive when it is
      set and 0 when it is not.
  """
    filter_freq: int = 0
    max_element_size: int = 0
    false_positive_probability: float = -1.0
    counter_type: tf.DType = tf.uint64

    def __post_init__(self):
        if self.false_positive_probability != -1.0:
            if self.false_positive_probability <= 0.0:
                raise ValueError("CBFFilter: false_positive_probability must be larger than "
                                 f"0, got {self.false_positive_probability!r}")
            if self.max_element_size <= 0:
                raise ValueError("CBFFilter: max_element_size must be larger than 0 when "
                                 "false_positive_probability is set, got "
                                 f"{self.max_element_size!r}")
        elif self.max_element_size != 0:
            raise ValueError("CBFFilter: max_element_size can only be set together with "
                             f"false_positive_probability, got {self.max_element_size!r}")


@dataclasses.dataclass
class StorageOption:
    """DeepRec's storage option: which memory tiers hold the rows.

  Args:
    storage_type: None or StorageType.DRAM (every row in the table's device
      memory), or StorageType.HBM_DRAM on a GPU table; any other StorageType
      makes get_embedding_variable raise ValueError.
    storage_path: the directory of disk tiers (DeepRec creates it; sok-ev
      has no disk tier and never touches it).
    storage_size: bytes per tier, padded to four tiers of 1 GiB (DeepRec).
      With HBM_DRAM, storage_size[0] is the HBM budget: the bytes of rows
      (values and optimizer slots, 4 * dim * (1 + slots) a row) kept in the
      GPU's memory; the other rows live in host memory, which is bounded
      only by the system.
    cache_strategy: CacheStrategy (CacheType) of multi-tier storage: which
      rows stay in HBM (LFU: most looked up; LRU: most recently updated).

  Raises:
    ValueError: DeepRec's argument checks: storage_size is not a list, a
      storage_path without a storage_type, or a disk storage type without a
      storage_path.
  """
    storage_type: Optional[Union[StorageType, int]] = None
    storage_path: Optional[str] = None
    storage_size: List[int] = dataclasses.field(default_factory=lambda: [_GIB])
    cache_strategy: Union[CacheType, int] = CacheType.LFU

    def __post_init__(self):
        if not isinstance(self.storage_size, list):
            raise ValueError("StorageOption: storage_size must be a list of bytes per tier, "
                             f"got {self.storage_size!r}")
        self.storage_size = self.storage_size + [_GIB] * (4 - len(self.storage_size))
        if self.storage_path is not None and self.storage_type is None:
            raise ValueError("StorageOption: storage_type must be set when storage_path is "
                             f"set (storage_path={self.storage_path!r})")
        if self.storage_path is None and self.storage_type in _DISK_STORAGE_TYPES:
            raise ValueError("StorageOption: storage_path must be set for storage_type="
                             f"{StorageType(self.storage_type).name}")


@dataclasses.dataclass
class CheckpointOption:
    """DeepRec's option to initialise a table from another checkpoint. Not
  implemented by sok-ev yet: any field set makes get_embedding_variable
  raise ValueError."""
    ckpt_to_load_from: Optional[str] = None
    tensor_name_in_ckpt: Optional[str] = None
    always_load_from_specific_ckpt: bool = False
    init_data_source: Any = None


@dataclasses.dataclass
class EmbeddingVariableOption:
    """DeepRec's `tf.EmbeddingVariableOption`: every option of one table.

  Args:
    ht_type, ht_partition_num: DeepRec's hash map kind and its number of
      partitions; only the defaults ("" and 1000) are accepted by
      get_embedding_variable.
    evict_option: a `GlobalStepEvict` (same as `steps_to_live`) or an
      `L2WeightEvict`.
    ckpt: a `CheckpointOption` (not implemented yet).
    filter_option: a `CounterFilter` or `CBFFilter`.
    storage_option: a `StorageOption`; DRAM only.
    init_option: an `InitializerOption`.

  Raises:
    TypeError: an option of the wrong class (the message names it).
  """
    ht_type: str = ""
    ht_partition_num: int = 1000
    evict_option: Optional[Union[GlobalStepEvict, L2WeightEvict]] = None
    ckpt: Optional[CheckpointOption] = None
    filter_option: Optional[Union[CounterFilter, CBFFilter]] = None
    storage_option: StorageOption = dataclasses.field(default_factory=StorageOption)
    init_option: InitializerOption = dataclasses.field(default_factory=InitializerOption)

    def __post_init__(self):
        expected = {
            "evict_option": (GlobalStepEvict, L2WeightEvict),
            "ckpt": (CheckpointOption,),
            "filter_option": (CounterFilter, CBFFilter),
            "storage_option": (StorageOption,),
            "init_option": (InitializerOption,),
        }
        for option, classes in expected.items():
            value = getattr(self, option)
            if value is not None and not isinstance(value, classes):
                raise TypeError(f"EmbeddingVariableOption: {option} must be "
                                f"{' or '.join(c.__name__ for c in classes)}, got {value!r}")
        # DeepRec accepts None for these and means the defaults.
        if self.storage_option is None:
            self.storage_option = StorageOption()
        if self.init_option is None:
            self.init_option = InitializerOption()


# Bytes of a Bloom filter counter, per counter_type (DeepRec takes unsigned
# types; its documentation's example passes tf.int64).
_COUNTER_BYTES = {
    tf.uint8: 1,
    tf.uint16: 2,
    tf.uint32: 4,
    tf.uint64: 8,
    tf.int8: 1,
    tf.int16: 2,
    tf.int32: 4,
    tf.int64: 8,
}

# The largest Bloom filter a table allocates. DeepRec callocs its counters,
# so pages it never touches cost nothing (its modelzoo asks for 2**30 keys at
# p = 0.01 in int64: 82 GB a table); sok-ev allocates them up front. Above
# this a table counts exactly (CounterFilter's rule), which never admits a
# key earlier than the Bloom filter would and holds only the keys not
# admitted yet.
BLOOM_FILTER_MAX_BYTES = 1 << 30

FILTER_ATTRIBUTE_NAMES = ("filter_freq", "filter_counters", "filter_hashes", "filter_counter_bytes",
                          "no_permission_value")


def filter_attributes(ev_option: EmbeddingVariableOption, where: str) -> dict:
    """The feature-filter attributes of SokEv>InitializeEmbeddingVariable for a
  table's options: filter_freq (0: no filter), filter_counters and
  filter_hashes (0: exact counts; else a counting Bloom filter of
  m = ceil(-n ln p / ln(2)^2) counters and k = max(1, round(m / n ln 2))
  hashes for n = max_element_size, p = false_positive_probability),
  filter_counter_bytes and no_permission_value. A Bloom filter of more than
  BLOOM_FILTER_MAX_BYTES counts exactly instead (filter_counters 0), with a
  warning naming the table.

  Raises:
    ValueError: filter_freq is not a non-negative integer, or counter_type
      is not an integer dtype (naming the option and its value).
  """
    option = ev_option.filter_option
    no_permission = float((ev_option.init_option or
                           InitializerOption()).default_value_no_permission)
    attributes = {
        "filter_freq": 0,
        "filter_counters": 0,
        "filter_hashes": 0,
        "filter_counter_bytes": 8,
        "no_permission_value": no_permission,
    }
    if option is None:
        return attributes
    freq = option.filter_freq
    if not isinstance(freq, numbers.Integral) or isinstance(freq, bool) or freq < 0:
        raise ValueError(f"{where}: ev_option.filter_option.filter_freq must be an integer >= 0, "
                         f"got {freq!r}")
    attributes["filter_freq"] = int(freq)
    if isinstance(option, CBFFilter):
        try:
            counter_type = tf.as_dtype(option.counter_type)
        except TypeError:
            counter_type = option.counter_type
        if counter_type not in _COUNTER_BYTES:
            raise ValueError(f"{where}: ev_option.filter_option.counter_type must be tf.uint8, "
                             f"tf.uint16, tf.uint32 or tf.uint64, got {option.counter_type!r}")
        attributes["filter_counter_bytes"] = _COUNTER_BYTES[counter_type]
        if option.false_positive_probability != -1.0:
            n, p = option.max_element_size, option.false_positive_probability
            counters = max(1, math.ceil(-n * math.log(p) / math.log(2)**2))
            size = counters * attributes["filter_counter_bytes"]
            if size > BLOOM_FILTER_MAX_BYTES:
                tf.compat.v1.logging.warning(
                    f"{where}: CBFFilter(max_element_size={n}, false_positive_probability={p}) "
                    f"needs {size} bytes of counters, more than BLOOM_FILTER_MAX_BYTES "
                    f"({BLOOM_FILTER_MAX_BYTES}); counting exactly instead (no false positives).")
                return attributes
            attributes["filter_counters"] = counters
            attributes["filter_hashes"] = max(1, round(counters / n * math.log(2)))
    return attributes


def check_supported(ev_option: EmbeddingVariableOption, where: str) -> None:
    """Refuses the options sok-ev does not implement yet.

  Args:
    ev_option: the table's EmbeddingVariableOption.
    where: names the caller and table in the message, e.g.
      "get_embedding_variable('emb')".

  Raises:
    ValueError: naming the option, its value and the feature: a storage
      type other than DRAM and HBM_DRAM, a CheckpointOption with a field
      set, or a non-default ht_type / ht_partition_num.
  """
    refused = []
    storage_type = ev_option.storage_option.storage_type
    if storage_type not in (None, StorageType.DRAM, StorageType.HBM_DRAM):
        name = StorageType(storage_type).name if storage_type in set(StorageType) else storage_type
        refused.append((f"storage_option.storage_type={name}",
                        "storage other than DRAM and HBM_DRAM (StorageOption)"))
    if ev_option.ckpt is not None and ev_option.ckpt != CheckpointOption():
        refused.append(
            (f"ckpt={ev_option.ckpt!r}", "initialising from another checkpoint (CheckpointOption)"))
    for option, default in (("ht_type", ""), ("ht_partition_num", 1000)):
        value = getattr(ev_option, option)
        if value != default:
            refused.append((f"{option}={value!r}", f"DeepRec's hash map setting {option} "
                            f"(leave it at {default!r})"))
    if refused:
        setting, feature = refused[0]
        raise ValueError(f"{where}: ev_option.{setting}: {feature} is not supported by "
                         "sok-ev yet.")


STORAGE_ATTRIBUTE_NAMES = ("hbm_bytes", "cache_strategy")


def storage_attributes(ev_option: EmbeddingVariableOption, embedding_dim: int, where: str) -> dict:
    """The storage attributes of SokEv>InitializeEmbeddingVariable for a
  table's options: hbm_bytes (0: every row in the table's device memory;
  > 0: HBM_DRAM storage with that HBM budget) and cache_strategy
  (CacheStrategy: 0 LRU, 1 LFU).

  Raises:
    ValueError: with HBM_DRAM, storage_size[0] that is not an integer of at
      least one row's value (4 * embedding_dim bytes), or a cache_strategy
      other than CacheStrategy.LFU / LRU (naming the argument and value).
  """
    option = ev_option.storage_option or StorageOption()
    attributes = {"hbm_bytes": 0, "cache_strategy": int(CacheType.LFU)}
    if option.storage_type != StorageType.HBM_DRAM:
        return attributes
    budget = option.storage_size[0]
    row_bytes = 4 * int(embedding_dim)
    if (not isinstance(budget, numbers.Integral) or isinstance(budget, bool) or budget < row_bytes):
        raise ValueError(f"{where}: ev_option.storage_option.storage_size[0] (the HBM budget of "
                         f"HBM_DRAM storage, bytes) must be an integer of at least one row "
                         f"(4 * embedding_dim = {row_bytes} bytes), got {budget!r}")
    strategy = option.cache_strategy
    if (isinstance(strategy, bool) or not isinstance(strategy, numbers.Integral) or
            strategy not in (CacheType.LRU, CacheType.LFU)):
        raise ValueError(f"{where}: ev_option.storage_option.cache_strategy must be "
                         f"CacheStrategy.LFU or CacheStrategy.LRU, got {strategy!r}")
    attributes["hbm_bytes"] = int(budget)
    attributes["cache_strategy"] = int(strategy)
    return attributes
