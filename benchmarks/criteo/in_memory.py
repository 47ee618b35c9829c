"""Synthetic Criteo batches made in memory: the rows `synthetic.generate` writes, without the text.

On a GPU the text path cannot keep up: parsing 65536 lines a step (regex,
split, number and hash conversions) takes the host longer than the H200's
whole training step. Here the data set of a seed and sizes is generated as
arrays instead, chunk by chunk with the generator seeds of the text files
(row i here is line i there), in forked processes; a batch is then a slice
of the arrays, with no file and no parsing. What the batches hold equals
what `reader.criteo_dataset` makes of the text files:

  label  the line's label;
  dense  log1p(max(I, 0)), from the integers kept as float32 (as the reader's
         string-to-float32 conversion rounds them), transformed by the same
         TensorFlow ops;
  keys   to_hash_bucket_fast of the hex string (or of '' when empty): every
         feature's vocabulary is hashed once into one table, and each row
         keeps int32 positions into it.

Memory: 160 bytes a line (26 int32 positions, 13 float32, a float32 label),
plus 8 bytes per vocabulary key. `planted` holds the planted model's AUC,
logloss and CTR on the eval split (as `synthetic.generate`'s meta.json).

Multi-hot (`hotness`, e.g. MLPerf DLRM-DCNv2's formats.MLPERF_HOTNESS): each
feature's key is followed by hotness_f - 1 companion keys of the same
feature, as MLPerf's materialize_synthetic_multihot_dataset.py makes its
multi-hot data set from the one-hot one with its 'uniform' distribution: a
key's companions are the keys `rank + d mod V_f` for offsets d drawn once,
uniform in [1, V_f), from a cache of COMPANION_CACHE rows indexed by the
rank. So they are a fixed function of the first key, and the labels (planted
on the first keys) stay learnable. An empty feature has only empty keys.
Each feature's keys and companions are tabled once per rank (V_f x
hotness_f int64; 0.7 GB at the GPU preset's cardinalities, mostly C21's 100);
a batch is then one row gather per feature.
"""
import contextlib
import multiprocessing
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

from benchmarks.criteo import formats
from benchmarks.criteo import metrics
from benchmarks.criteo import reader
from benchmarks.criteo import synthetic

COMPANION_CACHE = 4096  # rows of companion offsets per feature (MLPerf's cache)


def companion_offsets(vocabulary, hotness, seed: int) -> np.ndarray:
    """[COMPANION_CACHE, sum(hotness)] int64: for feature f's columns (hotness[f]
  of them, in feature order), 0 for the key itself, then offsets uniform in
  [1, V_f) (0 when V_f is 1)."""
    rng = np.random.default_rng([seed, 0x6d6c70])
    columns = []
    for v, h in zip(vocabulary, hotness):
        columns.append(np.zeros((COMPANION_CACHE, 1), np.int64))
        if h > 1:
            columns.append(
                rng.integers(1, max(v, 2), (COMPANION_CACHE, h - 1), dtype=np.int64) % max(v, 1))
    return np.concatenate(columns, axis=1)


def multi_hot_key_tables(keys: np.ndarray, vocabulary, hotness, offsets: np.ndarray):
    """Per feature f, [V_f + 1, hotness[f]] int64: row r holds the keys of rank r
  and its companions (module docstring), the last row the key of '' repeated.
  keys: the key of every vocabulary position, then of '' (`key_table()`);
  offsets: companion_offsets(vocabulary, hotness, seed)."""
    tables, start, column = [], 0, 0
    for v, h in zip(vocabulary, hotness):
        rank = np.arange(v, dtype=np.int64)[:, None]
        d = offsets[np.arange(v) % COMPANION_CACHE, column:column + h]
        rows = keys[start + (rank + d) % v]
        tables.append(np.concatenate([rows, np.full((1, h), keys[-1], np.int64)]))
        start, column = start + v, column + h
    return tables


def _is_cpu(device: str) -> bool:
    return tf.DeviceSpec.from_string(device).device_type in (None, "CPU", "cpu")


def multi_hot_keys(positions: tf.Tensor, tables, vocabulary) -> tf.Tensor:
    """positions [n, 26] int32 or int64 (start_f + rank, or sum(vocabulary) when empty)
  -> keys [n, sum(hotness)] int64: one row gather per feature from
  `tables` (multi_hot_key_tables', as tensors)."""
    starts = np.cumsum([0] + [int(v) for v in vocabulary[:-1]])
    # Strided slices, not tf.unstack: Unpack has no GPU kernel for integers.
    columns = [positions[:, f] for f in range(len(vocabulary))]
    return tf.concat([
        tf.gather(table, tf.minimum(column - int(start), int(v)))
        for table, column, start, v in zip(tables, columns, starts, vocabulary)
    ],
                     axis=1)


def _chunk(task):
    """One chunk of rows as arrays: (positions [n, 26] int32, integers [n, 13]
  float32, label [n] float32, logit [n]). Runs in a worker process."""
    seed, cardinality_scale, zipf, split_index, chunk, n, offsets, empty = task
    key = (seed, cardinality_scale, zipf)
    if key not in synthetic._MODELS:  # pylint: disable=protected-access
        synthetic._MODELS[key] = synthetic.PlantedModel(seed, cardinality_scale, zipf)  # pylint: disable=protected-access
    model = synthetic._MODELS[key]  # pylint: disable=protected-access
    # The same stream of draws as synthetic._chunk, so the same rows.
    rng = np.random.default_rng([seed, 1 + split_index, chunk])
    label, integers, empty_integer, ranks, logit = model.sample(rng, n)
    positions = np.where(ranks >= 0, ranks + offsets, empty).astype(np.int32)
    integers = np.where(empty_integer, 0, integers).astype(np.float32)
    return positions, integers, label.astype(np.float32), logit


class InMemoryData:
    """The train and eval splits of a synthetic data set, as arrays.

  Args: as `synthetic.generate` (seed, lines, cardinality_scale, zipf,
  processes, progress), which writes the same rows as text; hotness: keys per
  feature (None: one), the first of each feature's being the text's.
  """

    def __init__(self,
                 train_lines: int,
                 eval_lines: int,
                 seed: int = 0,
                 cardinality_scale: Optional[float] = None,
                 zipf: float = 1.1,
                 processes: int = 1,
                 progress: Optional[Callable[[int], None]] = None,
                 hotness: Optional[Sequence[int]] = None):
        hotness = formats.check_hotness("InMemoryData", hotness)
        if train_lines < 1 or eval_lines < 1:
            raise ValueError(f"train_lines and eval_lines must be >= 1, got {train_lines}, "
                             f"{eval_lines}")
        if cardinality_scale is None:
            cardinality_scale = synthetic.default_cardinality_scale(train_lines + eval_lines)
        self.model = synthetic.PlantedModel(seed, cardinality_scale, zipf)  # checks arguments
        self.vocabulary = self.model.vocabulary
        self.hotness = None if hotness is None else tuple(hotness)
        self._companions = (None if hotness is None else companion_offsets(
            self.vocabulary, self.hotness, seed))
        offsets = np.cumsum([0] + self.vocabulary[:-1]).astype(np.int64)
        self._empty = int(sum(self.vocabulary))  # the table's last slot: the key of ''
        self._key_table = None
        self._multi_hot_tables = None
        self._tensors = {}
        self._device_key_tables = {}
        self.splits: Dict[str, Dict[str, np.ndarray]] = {}
        self.planted = {}
        pool = multiprocessing.get_context("fork").Pool(processes) if processes > 1 else None
        try:
            for split_index, (split, lines) in enumerate([("train", train_lines),
                                                          ("eval", eval_lines)]):
                tasks = [(seed, cardinality_scale, zipf, split_index, chunk,
                          min(synthetic.CHUNK_LINES, lines - start), offsets, self._empty)
                         for chunk, start in enumerate(range(0, lines, synthetic.CHUNK_LINES))]
                # Filled in place, chunk by chunk: no second copy of the split.
                positions = np.empty((lines, reader.NUM_CATEGORICAL), np.int32)
                integers = np.empty((lines, reader.NUM_DENSE), np.float32)
                label = np.empty(lines, np.float32)
                logits, start = [], 0
                for part in (pool.imap(_chunk, tasks) if pool else map(_chunk, tasks)):
                    end = start + len(part[2])
                    positions[start:end], integers[start:end], label[start:end] = part[:3]
                    if split == "eval":
                        logits.append(part[3])
                    start = end
                    if progress is not None:
                        progress(len(part[2]))
                self.splits[split] = dict(positions=positions, integers=integers, label=label)
                if split == "eval":
                    # The eval split's only: sorting 134M training logits takes a while.
                    logit = np.concatenate(logits)
                    both_classes = 0 < label.sum() < len(label)
                    self.planted[split] = dict(
                        auc=metrics.auc_of_scores(label, logit) if both_classes else None,
                        logloss=metrics.numpy_logloss(label, 1.0 / (1.0 + np.exp(-logit))),
                        ctr=float(label.mean(dtype=np.float64)))
        finally:
            if pool:
                pool.close()
                pool.join()
        self.lines = {split: len(x["label"]) for split, x in self.splits.items()}
        # What `tensors` places on a device: the splits' arrays (the key
        # tables are a vocabulary's worth, small beside them).
        self.nbytes = sum(a.nbytes for split in self.splits.values() for a in split.values())

    def key_table(self) -> tf.Tensor:
        """[sum V_f + 1] int64: the reader's key of every vocabulary string,
    then of ''. Built on first use (TensorFlow ops: after its threads are set)."""
        if self._key_table is None:
            strings = [synthetic._hex8(keys) for keys in self.model.keys]  # pylint: disable=protected-access
            strings.append(np.array([b""], "S8"))
            with tf.device("/cpu:0"):
                self._key_table = tf.strings.to_hash_bucket_fast(np.concatenate(strings),
                                                                 reader.KEY_SPACE)
        return self._key_table

    def multi_hot_tables(self):
        """multi_hot_key_tables as tensors (None when one-hot), made once: a
    batch then takes one row gather per feature instead of computing its
    companions (14M keys a batch of 65536)."""
        if self.hotness is not None and self._multi_hot_tables is None:
            keys = self.key_table().numpy()
            with tf.device("/cpu:0"):
                self._multi_hot_tables = [
                    tf.constant(t) for t in multi_hot_key_tables(keys, self.vocabulary,
                                                                 self.hotness, self._companions)
                ]
        return self._multi_hot_tables

    def tensors(self, split: str, device: str = "/cpu:0"):
        """(positions, integers, label) of `split` as tensors on `device`,
    made once. On the CPU the arrays are then dropped (the tensors hold the
    only copy); elsewhere the CPU tensors are copied, with the positions as
    int64 (a GPU keeps int32 tensors in host memory, so the batches' gathers
    would read them through a copy every step)."""
        if split not in self._tensors:
            arrays = self.splits[split]
            with tf.device("/cpu:0"):  # where tf.data runs
                self._tensors[split] = tuple(
                    tf.constant(arrays.pop(name)) for name in ("positions", "integers", "label"))
        if _is_cpu(device):
            return self._tensors[split]
        if (split, device) not in self._tensors:
            positions, integers, label = self._tensors[split]
            with tf.device(device):
                self._tensors[split, device] = (tf.cast(positions, tf.int64), tf.identity(integers),
                                                tf.identity(label))
        return self._tensors[split, device]

    def _key_tables(self, device):
        """(key_table(), multi_hot_tables()) on `device`, copied once."""
        if _is_cpu(device):
            return self.key_table(), self.multi_hot_tables()
        if device not in self._device_key_tables:
            with tf.device(device):
                tables = self.multi_hot_tables()
                self._device_key_tables[device] = (tf.identity(
                    self.key_table()), None if tables is None else [tf.identity(t) for t in tables])
        return self._device_key_tables[device]

    def batches(self,
                split: str,
                batch_size: int,
                num_workers: int = 1,
                worker_index: int = 0,
                drop_remainder: bool = False,
                max_lines: Optional[int] = None,
                device: str = "/cpu:0"):
        """(rows, build): the batches of `split` as `dataset` yields them, made
    where the data lies. rows: [batches, 2] int64, each batch's [start, end)
    lines (this worker's slice of each global batch, as
    `reader.worker_rows` cuts it); build(row_range): that batch (label,
    dense, keys, malformed = 0) from TensorFlow ops on the tensors of
    `device` (`tensors`), so a step that builds its own batch on a GPU
    copies nothing from the host but the two ints of its row range.

    Raises:
      ValueError: an unknown split, or an argument out of range.
    """
        if split not in self.splits:
            raise ValueError(f"InMemoryData: split must be one of {sorted(self.splits)}, "
                             f"got {split!r}")
        if batch_size < 1:
            raise ValueError(f"InMemoryData: batch_size must be >= 1, got {batch_size}")
        if not 0 <= worker_index < num_workers:
            raise ValueError(f"InMemoryData: worker_index must be in [0, {num_workers}), "
                             f"got {worker_index}")
        total = self.lines[split] if max_lines is None else min(max_lines, self.lines[split])
        starts = np.arange(0, total, batch_size)
        if drop_remainder:
            starts = starts[starts + batch_size <= total]
        ends = np.minimum(starts + batch_size, total)
        bounds = [
            reader.worker_rows(int(e - s), num_workers, worker_index) for s, e in zip(starts, ends)
        ]
        rows = np.array([(s + a, s + b) for s, (a, b) in zip(starts, bounds)],
                        np.int64).reshape(-1, 2)
        # The arrays become tensors once; every batch is then sliced and
        # looked up by TensorFlow, in parallel, with no Python in the way.
        arrays = self.tensors(split, device)
        table, tables = self._key_tables(device)

        def build(row_range):
            # tf.data places its own functions: a device scope only for a step's.
            with contextlib.nullcontext() if _is_cpu(device) else tf.device(device):
                positions, integers, label = (x[row_range[0]:row_range[1]] for x in arrays)
                return {
                    "label": label,
                    "dense": tf.math.log1p(tf.maximum(integers, 0.0)),
                    "keys": (tf.gather(table, positions) if tables is None else multi_hot_keys(
                        positions, tables, self.vocabulary)),
                    "malformed": tf.constant(0, tf.int64),
                }

        return rows, build

    def dataset(self,
                split: str,
                batch_size: int,
                num_workers: int = 1,
                worker_index: int = 0,
                drop_remainder: bool = False,
                max_lines: Optional[int] = None,
                prefetch: int = 4) -> tf.data.Dataset:
        """Batches of `split` ('train' or 'eval') as the text reader yields them
    (label, dense, keys, malformed = 0; no 'categorical'), each worker's
    slice of each global batch as `reader.worker_rows` cuts it. keys is
    [n, 26] int64, or [n, sum(hotness)] with the companions of multi-hot.

    Raises:
      ValueError: an unknown split, or an argument out of range.
    """
        rows, batch = self.batches(split, batch_size, num_workers, worker_index, drop_remainder,
                                   max_lines)
        return (tf.data.Dataset.from_tensor_slices(rows).map(batch,
                                                             num_parallel_calls=tf.data.AUTOTUNE,
                                                             deterministic=True).prefetch(prefetch))
