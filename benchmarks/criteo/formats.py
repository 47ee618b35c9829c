"""Readers for preprocessed Criteo formats, each a tf.data pipeline.

Every reader yields the batch dict of `reader.criteo_dataset` (its module
docstring), without 'categorical' (binary formats keep no strings):
  label      [n] float32, 0 or 1
  dense      [n, 13] float32
  keys       [n, 26] int64
  malformed  int64 scalar, records of this worker's slice that were dropped
and slices each global batch as it does: worker k of W keeps rows
[k * c, min(n, (k + 1) * c)) of each batch of n records, c = ceil(n / W), so W
workers train on exactly the global batches one worker sees.

Formats, and how their dense values and keys relate to the text reader's
(dense = log1p(max(I, 0)), keys = to_hash_bucket_fast(hex string)):

  parquet  NVTabular's output: columns label, I1..I13, C1..C26, read with
           pyarrow (optional: `pip install pyarrow`, or request.sh). NVTabular's
           Criteo workflows fill, clip and log/normalize I before writing it as
           float32, so float I columns are taken as stored; integer I columns
           hold raw counts and get the text reader's transform. C columns are
           Categorify's int64 ids and are the keys.
  raw      HugeCTR's one-hot Raw format: 160-byte records of int32 label, 13
           int32 dense, 26 uint32 keys, little-endian, no header. Dense values
           are raw integers (HugeCTR's reader applies log(x + 1) itself when
           float_label_dense is off), so they get the text reader's transform.
           Keys are the uint32 values (int(hex, 16) for hashes kept as is).
  numpy    TorchRec/MLPerf days: day_N_dense.npy [n, 13], day_N_sparse.npy
           [n, 26], day_N_labels.npy [n] or [n, 1], read through memory maps.
           TorchRec's tsv_to_npys stores dense as float32 log(x + 3) (missing
           -> 0), so float dense is taken as stored; integer dense holds raw
           counts and gets the text reader's transform. Sparse values (int(hex,
           16), later contiguous ids) are the keys; int32 arrays are read as
           uint32, which recovers hashes of 2^31 and above written by wrapping.
  raw_multihot, numpy_multihot  MLPerf DLRM-DCNv2's multi-hot Raw records and
           day_N_sparse_multi_hot.npz: readers with keys [n, 214] (see
           `multihot_raw_dataset`, `numpy_dataset`), for run.py --hotness mlperf.

Sources: NVTabular's "Scaling Criteo: ETL with NVTabular" example (missing I
filled with 0, then clipped and normalized; C Categorified to contiguous ids);
HugeCTR's user guide on the Raw format's float_label_dense ("otherwise, they
are read as int values while the dense features are preprocessed with
log(dense[i] + 1.f)"); TorchRec's BinaryCriteoUtils.tsv_to_npys (dense
int(I or 0), then np.log(dense + 3) as float32; sparse int(C or '0', 16) as
int32; labels [n, 1] int32) and MLPerf's materialize_synthetic_multihot_dataset.py
(np.savez of members '0'..'25').

A record is malformed when its label is not 0 or 1, a Raw file ends in a
partial record, a NumPy day's three arrays disagree in length (the rows
beyond the shortest), or a Parquet value is null or a column is missing.
on_malformed='skip' drops and counts such records; 'raise' makes iteration
fail, and `malformed_error` turns that failure into a MalformedRecordError
naming the file and the 1-based record. A Parquet file missing a column
raises ValueError at construction with 'raise'; with 'skip' its rows count
as malformed.
"""
import os
import re
import struct
import zipfile
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from benchmarks.criteo import reader

NUM_DENSE = reader.NUM_DENSE
NUM_CATEGORICAL = reader.NUM_CATEGORICAL
FORMATS = ("text", "parquet", "raw", "numpy")
# Multi-hot readers (keys [n, 214]): run.py --hotness mlperf.
MULTIHOT_FORMATS = ("raw_multihot", "numpy_multihot")
EXTENSIONS = {".parquet": "parquet", ".bin": "raw", ".raw": "raw", ".npy": "numpy"}

RAW_RECORD_BYTES = 4 * (1 + NUM_DENSE + NUM_CATEGORICAL)  # 160
# MLPerf DLRM-DCNv2: keys per feature, in feature order.
MLPERF_HOTNESS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
MULTIHOT_KEYS = sum(MLPERF_HOTNESS)  # 214


def check_hotness(caller: str, hotness: Optional[Sequence[int]]) -> Optional[List[int]]:
    """`hotness` (keys per feature, e.g. MLPERF_HOTNESS) as a list, or None.

  Raises:
    ValueError: not NUM_CATEGORICAL counts >= 1, naming `caller`.
  """
    if hotness is None:
        return None
    hotness = list(hotness)
    if len(hotness) != NUM_CATEGORICAL or min(hotness) < 1:
        raise ValueError(f"{caller}: hotness needs {NUM_CATEGORICAL} counts >= 1, got {hotness}")
    return hotness


MULTIHOT_RECORD_BYTES = 4 * (1 + NUM_DENSE + MULTIHOT_KEYS)  # 912

PARQUET_COLUMNS = (["label"] + [f"I{i + 1}" for i in range(NUM_DENSE)] +
                   [f"C{i + 1}" for i in range(NUM_CATEGORICAL)])
NUMPY_PARTS = ("dense", "sparse", "labels")
_TAG = "criteo_{}_malformed_record_at_index"


class MalformedRecordError(ValueError):
    """A malformed record of a binary Criteo format, with its file and 1-based record."""

    def __init__(self, path: str, record_number: int, reason: str):
        super().__init__(f"{path}: record {record_number}: malformed Criteo record ({reason})")
        self.path = path
        self.record_number = record_number
        self.reason = reason


def format_of(files: Sequence[str], fmt: str = "auto") -> str:
    """The format of `files`: `fmt` unless 'auto', else from their extensions
  (.parquet, .bin/.raw, .npy; anything else, .gz included, is text).

  Raises:
    ValueError: `fmt` unknown, or the extensions disagree.
  """
    if fmt != "auto":
        if fmt not in FORMATS + MULTIHOT_FORMATS:
            raise ValueError(f"format must be 'auto' or one of {FORMATS + MULTIHOT_FORMATS}, "
                             f"got {fmt!r}")
        return fmt
    kinds = {EXTENSIONS.get(os.path.splitext(f)[1].lower(), "text") for f in files}
    if len(kinds) != 1:
        raise ValueError(f"files mix formats {sorted(kinds)}: {list(files)}; pass the format")
    return kinds.pop()


def criteo_dataset(files: Sequence[str],
                   batch_size: int,
                   fmt: str = "auto",
                   **kwargs) -> tf.data.Dataset:
    """The reader of `files`' format (see `format_of`); kwargs as `reader.criteo_dataset`
  (num_workers, worker_index, on_malformed, drop_remainder, max_lines, prefetch)."""
    fmt = format_of(files, fmt)
    if fmt == "text":
        return reader.criteo_dataset(files, batch_size, **kwargs)
    make = {
        "parquet": parquet_dataset,
        "raw": raw_dataset,
        "numpy": numpy_dataset,
        "raw_multihot": multihot_raw_dataset,
        "numpy_multihot": lambda *a, **k: numpy_dataset(*a, multihot=True, **k),
    }[fmt]
    kwargs.pop("num_parallel_calls", None)
    return make(files, batch_size, **kwargs)


def _finish(fmt, label, dense, keys, valid, first_index, on_malformed, log_dense):
    """The batch dict from decoded rows: label [n] (any number), dense [n, 13]
  float32 (raw counts if log_dense), keys [n, ...] int64, valid [n] bool."""
    valid = tf.logical_and(valid, tf.logical_or(tf.equal(label, 0), tf.equal(label, 1)))
    malformed = tf.reduce_sum(tf.cast(tf.logical_not(valid), tf.int64))
    if on_malformed == "raise":
        first_bad = tf.argmin(tf.cast(valid, tf.int32), output_type=tf.int64)
        check = tf.debugging.Assert(tf.reduce_all(valid),
                                    [_TAG.format(fmt), first_index + first_bad])
        with tf.control_dependencies([check]):
            label = tf.identity(label)
    else:
        label, dense, keys = (tf.boolean_mask(t, valid) for t in (label, dense, keys))
    if log_dense:
        dense = tf.math.log1p(tf.maximum(dense, 0.0))
    return {
        "label": tf.cast(label, tf.float32),
        "dense": dense,
        "keys": keys,
        "malformed": malformed,
    }


# HugeCTR Raw -----------------------------------------------------------------

# Records read per FixedLengthRecordDataset element: one element per record
# costs TensorFlow's per-element overhead 65536 times a batch.
RAW_BLOCK_RECORDS = 4096


def _raw_rows(files, record_bytes, batch_size, drop_remainder, max_lines):
    """Global batches ([n, record_bytes / 4] int32) of the records of `files`,
  read in blocks of RAW_BLOCK_RECORDS. A file ending in a partial record gets
  one placeholder row (label -1, so malformed) in its place, which keeps the
  record indices of later files right; max_lines counts it too."""
    words = record_bytes // 4
    block = RAW_BLOCK_RECORDS * record_bytes

    def decoded(path, record_size, header, footer):
        ds = tf.data.FixedLengthRecordDataset([path],
                                              record_size,
                                              header_bytes=header,
                                              footer_bytes=footer,
                                              buffer_size=8 << 20)
        return ds.map(lambda r: tf.reshape(tf.io.decode_raw(r, tf.int32), [-1, words]))

    parts, remaining = [], max_lines
    for path in files:
        size = os.path.getsize(path)
        full, partial = divmod(size, record_bytes)
        if remaining is not None:
            partial = partial if remaining > full else 0
            full = min(full, remaining)
            remaining -= full + (1 if partial else 0)
        blocks, tail = divmod(full * record_bytes, block)
        # Head and footer bytes skip what another part of the file reads: a
        # body that is not a multiple of the record is refused.
        if blocks:
            parts.append(decoded(path, block, 0, size - blocks * block))
        if tail:
            parts.append(decoded(path, tail, blocks * block, size - blocks * block - tail))
        if partial:
            parts.append(tf.data.Dataset.from_tensors(tf.fill([1, words], -1)))
    if not parts:
        parts = [tf.data.Dataset.from_tensors(tf.zeros([0, words], tf.int32)).take(0)]
    rows = parts[0]
    for part in parts[1:]:
        rows = rows.concatenate(part)
    return rows.rebatch(batch_size, drop_remainder=drop_remainder)


def _sliced(batches, batch_size, num_workers, worker_index, decode):
    """decode(this worker's rows of each global batch, index of its first row)."""

    def worker_slice(batch_index, batch):
        start, end = reader.worker_rows(
            tf.shape(batch, out_type=tf.int64)[0], num_workers, worker_index)
        return decode(batch[start:end], batch_index * batch_size + start)

    return batches.enumerate().map(worker_slice,
                                   num_parallel_calls=tf.data.AUTOTUNE,
                                   deterministic=True)


def raw_dataset(files: Sequence[str],
                batch_size: int,
                num_workers: int = 1,
                worker_index: int = 0,
                on_malformed: str = "skip",
                drop_remainder: bool = False,
                max_lines: Optional[int] = None,
                prefetch: int = 4) -> tf.data.Dataset:
    """HugeCTR one-hot Raw files (160-byte records) as batch dicts.

  dense = log1p(max(int32 dense, 0)); keys = the uint32 keys as int64.
  Arguments and errors as `reader.criteo_dataset`; max_lines counts records.
  """
    files = reader.check_arguments("raw_dataset", files, batch_size, num_workers, worker_index,
                                   on_malformed)

    def decode(fields, first_index):
        keys = tf.bitwise.bitwise_and(tf.cast(fields[:, 1 + NUM_DENSE:], tf.int64), 0xFFFFFFFF)
        return _finish("raw", fields[:, 0], tf.cast(fields[:, 1:1 + NUM_DENSE], tf.float32), keys,
                       tf.ones_like(fields[:, 0], tf.bool), first_index, on_malformed, True)

    rows = _raw_rows(files, RAW_RECORD_BYTES, batch_size, drop_remainder, max_lines)
    return _sliced(rows, batch_size, num_workers, worker_index, decode).prefetch(prefetch)


def multihot_raw_dataset(files: Sequence[str],
                         batch_size: int,
                         num_workers: int = 1,
                         worker_index: int = 0,
                         on_malformed: str = "skip",
                         drop_remainder: bool = False,
                         max_lines: Optional[int] = None,
                         prefetch: int = 4) -> tf.data.Dataset:
    """MLPerf DLRM-DCNv2 multi-hot Raw files (912-byte records: int32 label, 13
  float32 dense, 214 int32 keys, MLPERF_HOTNESS keys per feature in feature
  order) as batch dicts with keys [n, 214] int64 (feature f's keys at columns
  sum(MLPERF_HOTNESS[:f]) onward). Dense is float32 as stored (MLPerf's
  preprocessing already applied its log). The models do not read this shape.
  Arguments and errors as `raw_dataset`.
  """
    files = reader.check_arguments("multihot_raw_dataset", files, batch_size, num_workers,
                                   worker_index, on_malformed)

    def decode(fields, first_index):
        dense = tf.bitcast(fields[:, 1:1 + NUM_DENSE], tf.float32)
        keys = tf.bitwise.bitwise_and(tf.cast(fields[:, 1 + NUM_DENSE:], tf.int64), 0xFFFFFFFF)
        return _finish("raw_multihot", fields[:, 0], dense, keys,
                       tf.ones_like(fields[:, 0], tf.bool), first_index, on_malformed, False)

    rows = _raw_rows(files, MULTIHOT_RECORD_BYTES, batch_size, drop_remainder, max_lines)
    return _sliced(rows, batch_size, num_workers, worker_index, decode).prefetch(prefetch)


# Row sources read in Python (NumPy memory maps, Parquet) -----------------------


def _python_dataset(fmt, batches, on_malformed, log_dense, prefetch, keys=NUM_CATEGORICAL):
    """A dataset of batch dicts from a generator of (first_index, label [n]
  float32, dense [n, 13] float32, keys [n, k] int64, valid [n] bool)."""
    spec = (
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([None], tf.float32),
        tf.TensorSpec([None, NUM_DENSE], tf.float32),
        tf.TensorSpec([None, keys], tf.int64),
        tf.TensorSpec([None], tf.bool),
    )
    ds = tf.data.Dataset.from_generator(batches, output_signature=spec)
    return ds.map(lambda first, label, dense, keys, valid: _finish(
        fmt, label, dense, keys, valid, first, on_malformed, log_dense)).prefetch(prefetch)


def _global_batches(total, batch_size, num_workers, worker_index, drop_remainder):
    """(first row of this worker's slice, end) per global batch of `total` rows."""
    for begin in range(0, total, batch_size):
        n = min(batch_size, total - begin)
        if n < batch_size and drop_remainder:
            return
        start, end = reader.worker_rows(n, num_workers, worker_index)
        yield begin + start, begin + end


def numpy_days(files: Sequence[str]) -> List[str]:
    """The day stems ('path/day_3') of day_N_{dense,sparse,labels}.npy files,
  in order, each once.

  Raises:
    ValueError: a name that does not end in _dense.npy, _sparse.npy,
      _labels.npy or _sparse_multi_hot.npz.
  """
    stems = []
    for path in files:
        match = re.fullmatch(r"(.*)_(dense\.npy|sparse\.npy|labels\.npy|sparse_multi_hot\.npz)",
                             path)
        if match is None:
            raise ValueError(f"numpy_dataset: {path!r} is not day_N_dense.npy, "
                             "day_N_sparse.npy, day_N_labels.npy or day_N_sparse_multi_hot.npz")
        if match.group(1) not in stems:
            stems.append(match.group(1))
    return stems


def _npz_memmaps(path):
    """{name: read-only memmap} of the arrays of an uncompressed .npz (np.savez):
  np.load ignores mmap_mode for .npz, so each member is mapped at its offset.

  Raises:
    ValueError: a compressed member (np.savez_compressed), naming it.
  """
    out = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"numpy_dataset: {path} member {info.filename} is compressed; "
                                 "memory maps need np.savez, not np.savez_compressed")
            f.seek(info.header_offset)
            name_bytes, extra_bytes = struct.unpack("<HH", f.read(30)[26:30])
            f.seek(info.header_offset + 30 + name_bytes + extra_bytes)
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0
                           if version == (1, 0) else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            out[info.filename[:-len(".npy")]] = np.memmap(path,
                                                          dtype,
                                                          "r",
                                                          offset=f.tell(),
                                                          shape=shape,
                                                          order="F" if fortran else "C")
    return out


class _MultiHot:
    """The 26 members '0'..'25' of a day_N_sparse_multi_hot.npz ([n, hotness_f]
  each) read as one [n, sum(hotness)] array, feature by feature."""

    def __init__(self, path):
        members = _npz_memmaps(path)
        names = [str(f) for f in range(NUM_CATEGORICAL)]
        if sorted(members) != sorted(names):
            raise ValueError(f"numpy_dataset: {path} holds {sorted(members)}, expected "
                             f"the members '0'..'{NUM_CATEGORICAL - 1}'")
        self.members = [members[name] for name in names]
        hotness = tuple(m.shape[1] if m.ndim == 2 else -1 for m in self.members)
        if hotness != MLPERF_HOTNESS:
            raise ValueError(f"numpy_dataset: {path} has hotness {hotness}, expected "
                             f"MLPerf's {MLPERF_HOTNESS}")
        self.ndim, self.dtype = 2, self.members[0].dtype
        self.shape = (len(self), MULTIHOT_KEYS)

    def __len__(self):
        return min(len(m) for m in self.members)

    def __getitem__(self, rows):
        return np.concatenate([np.asarray(m[rows]) for m in self.members], axis=1)


class _NumpyDay:
    """One day's three arrays, memory-mapped, checked for shape."""

    def __init__(self, stem, multihot=False):
        self.paths = {part: f"{stem}_{part}.npy" for part in NUMPY_PARTS}
        if multihot:
            self.paths["sparse"] = f"{stem}_sparse_multi_hot.npz"
        self.arrays = {}
        for part, path in self.paths.items():
            if not os.path.isfile(path):
                raise FileNotFoundError(f"numpy_dataset: no such file: {path}")
            self.arrays[part] = (_MultiHot(path)
                                 if path.endswith(".npz") else np.load(path, mmap_mode="r"))
        self.keys = MULTIHOT_KEYS if multihot else NUM_CATEGORICAL
        shapes = {
            "dense": (2, NUM_DENSE),
            "sparse": (2, self.keys),
        }
        for part, (ndim, width) in shapes.items():
            a = self.arrays[part]
            if a.ndim != ndim or a.shape[1] != width:
                raise ValueError(f"numpy_dataset: {self.paths[part]} has shape {a.shape}, "
                                 f"expected [n, {width}]")
        labels = self.arrays["labels"]
        if labels.ndim == 2 and labels.shape[1] == 1:
            self.arrays["labels"] = labels.reshape(-1)
        elif labels.ndim != 1:
            raise ValueError(f"numpy_dataset: {self.paths['labels']} has shape {labels.shape}, "
                             "expected [n] or [n, 1]")
        lengths = [len(a) for a in self.arrays.values()]
        self.rows, self.complete = max(lengths), min(lengths)

    def read(self, begin, end):
        """Rows [begin, end): label, dense, keys, valid (rows some array lacks
    are zeros, not valid)."""
        n = end - begin
        out = []
        for part, width, dtype in (("labels", None, np.float32), ("dense", NUM_DENSE, np.float32),
                                   ("sparse", self.keys, np.int64)):
            a = self.arrays[part]
            x = np.zeros((n,) if width is None else (n, width), dtype)
            have = max(0, min(end, len(a)) - begin)
            chunk = np.asarray(a[begin:begin + have])
            if part == "sparse" and chunk.dtype == np.int32:
                chunk = chunk.view(np.uint32)  # hashes >= 2^31 stored by wrapping
            x[:have] = chunk
            out.append(x)
        valid = np.arange(begin, end) < self.complete
        return out + [valid]


def numpy_dataset(files: Sequence[str],
                  batch_size: int,
                  num_workers: int = 1,
                  worker_index: int = 0,
                  on_malformed: str = "skip",
                  drop_remainder: bool = False,
                  max_lines: Optional[int] = None,
                  prefetch: int = 4,
                  multihot: bool = False) -> tf.data.Dataset:
    """TorchRec/MLPerf NumPy days as batch dicts, read through memory maps.

  files: any of each day's day_N_{dense,sparse,labels}.npy (see `numpy_days`);
    days are read in the order first named. Each worker reads only its slice.
  dense: float dense as stored (TorchRec: log(x + 3)); integer dense gets
    log1p(max(x, 0)). Every day's dense must be of one kind.
  multihot: read day_N_sparse_multi_hot.npz (MLPerf DLRM-DCNv2: members '0'..
    '25', [n, MLPERF_HOTNESS[f]] each) instead of day_N_sparse.npy; keys are
    then [n, 214], feature f's at columns sum(MLPERF_HOTNESS[:f]) onward. The
    models do not read this shape.
  Raises (besides `reader.criteo_dataset`'s): ValueError for a bad name,
    array shape or hotness, a compressed .npz, or float dense mixed with
    integer dense.
  """
    stems = numpy_days(files)
    sparse = "sparse_multi_hot.npz" if multihot else "sparse.npy"
    reader.check_arguments("numpy_dataset",
                           [f"{s}_{p}" for s in stems for p in ("dense.npy", sparse, "labels.npy")],
                           batch_size, num_workers, worker_index, on_malformed)
    days = [_NumpyDay(stem, multihot) for stem in stems]
    kinds = {np.issubdtype(d.arrays["dense"].dtype, np.integer) for d in days}
    if len(kinds) > 1:
        raise ValueError(f"numpy_dataset: dense arrays mix integer and float dtypes: {files}")
    offsets = np.cumsum([0] + [d.rows for d in days])
    total = int(offsets[-1]) if max_lines is None else min(int(offsets[-1]), max_lines)

    def batches() -> Iterator[Tuple]:
        for begin, end in _global_batches(total, batch_size, num_workers, worker_index,
                                          drop_remainder):
            parts = []
            for i, day in enumerate(days):
                lo, hi = max(begin, offsets[i]), min(end, offsets[i + 1])
                if lo < hi:
                    parts.append(day.read(int(lo - offsets[i]), int(hi - offsets[i])))
            if not parts:
                parts = [days[0].read(0, 0)]
            yield (np.int64(begin),) + tuple(np.concatenate(p) for p in zip(*parts))

    fmt = "numpy_multihot" if multihot else "numpy"
    return _python_dataset(fmt, batches, on_malformed, kinds.pop(), prefetch, days[0].keys)


# NVTabular Parquet --------------------------------------------------------------


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError("the Parquet reader needs the 'pyarrow' package "
                          "(pip install pyarrow, or bash request.sh)") from error
    return pq


def _parquet_columns(table_or_batch, present, log_dense):
    """label, dense, keys, valid of a pyarrow Table/RecordBatch with the
  columns `present` (absent ones: zeros, rows not valid)."""
    n = table_or_batch.num_rows
    valid = np.full(n, len(present) == len(PARQUET_COLUMNS))

    def column(name, dtype):
        if name not in present:
            return np.zeros(n, dtype)
        c = table_or_batch.column(name)
        if c.null_count:
            valid[:] &= ~np.asarray(c.is_null())
            c = c.fill_null(0)
        return np.asarray(c.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)

    label = column("label", np.float32)
    dense = np.stack([column(f"I{i + 1}", np.float32) for i in range(NUM_DENSE)], axis=1)
    keys = np.stack([column(f"C{i + 1}", np.int64) for i in range(NUM_CATEGORICAL)], axis=1)
    return label, dense.reshape(n, NUM_DENSE), keys.reshape(n, NUM_CATEGORICAL), valid


def parquet_dataset(files: Sequence[str],
                    batch_size: int,
                    num_workers: int = 1,
                    worker_index: int = 0,
                    on_malformed: str = "skip",
                    drop_remainder: bool = False,
                    max_lines: Optional[int] = None,
                    prefetch: int = 4) -> tf.data.Dataset:
    """NVTabular Parquet files (label, I1..I13, C1..C26) as batch dicts, via pyarrow.

  dense: float I columns as stored (NVTabular already transformed them);
    integer I columns get log1p(max(I, 0)); all files must agree.
  keys: C1..C26 as int64.
  Raises (besides `reader.criteo_dataset`'s): ImportError without pyarrow;
    ValueError when, with on_malformed='raise', a file lacks a column (its
    name and the file's), or when float I columns mix with integer ones.
  """
    pq = _pyarrow_parquet()
    files = reader.check_arguments("parquet_dataset", files, batch_size, num_workers, worker_index,
                                   on_malformed)
    present, rows, integer_dense = [], [], set()
    for path in files:
        schema = pq.read_schema(path)
        names = [c for c in PARQUET_COLUMNS if c in schema.names]
        missing = [c for c in PARQUET_COLUMNS if c not in schema.names]
        if missing and on_malformed == "raise":
            raise ValueError(f"parquet_dataset: {path} has no column {missing[0]!r} "
                             f"(missing: {missing}); every record of it is malformed")
        for c in names[1:1 + NUM_DENSE]:
            if c.startswith("I"):
                integer_dense.add(_is_integer_type(schema.field(c).type))
        present.append(names)
        rows.append(pq.ParquetFile(path).metadata.num_rows)
    if len(integer_dense) > 1:
        raise ValueError(f"parquet_dataset: I columns mix integer and float types: {files}")
    log_dense = integer_dense == {True}
    total = sum(rows) if max_lines is None else min(sum(rows), max_lines)

    def chunks():
        for path, names in zip(files, present):
            for batch in pq.ParquetFile(path).iter_batches(batch_size=max(batch_size, 1 << 16),
                                                           columns=names):
                yield _parquet_columns(batch, names, log_dense)

    def batches():
        source, buffered, have, begin = chunks(), [], 0, 0
        for start, end in _global_batches(total, batch_size, num_workers, worker_index,
                                          drop_remainder):
            need = min(begin + batch_size, total)
            while have < need:
                buffered.append(next(source))
                have += len(buffered[-1][0])
            rows_before = have - sum(len(b[0]) for b in buffered)
            merged = [np.concatenate(x) for x in zip(*buffered)]
            lo, hi = start - rows_before, end - rows_before
            yield (np.int64(start),) + tuple(x[lo:hi] for x in merged)
            # Keep only rows of later global batches.
            drop = need - rows_before
            buffered = [tuple(x[drop:] for x in merged)]
            begin = need

    return _python_dataset("parquet", batches, on_malformed, log_dense, prefetch)


def _is_integer_type(arrow_type) -> bool:
    """Whether a pyarrow type is an integer type."""
    import pyarrow.types as pat  # pylint: disable=import-outside-toplevel
    return bool(pat.is_integer(arrow_type))


# Failures of on_malformed='raise' ------------------------------------------------


def _record_counts(fmt, files):
    """[(path, records)] in stream order, for naming a record by its index."""
    if fmt in ("raw", "raw_multihot"):
        size = RAW_RECORD_BYTES if fmt == "raw" else MULTIHOT_RECORD_BYTES
        return [(p, -(-os.path.getsize(p) // size)) for p in files]
    if fmt in ("numpy", "numpy_multihot"):
        return [(s, _NumpyDay(s, fmt == "numpy_multihot").rows) for s in numpy_days(files)]
    pq = _pyarrow_parquet()
    return [(p, pq.ParquetFile(p).metadata.num_rows) for p in files]


def _describe(fmt, path, index):
    """Why record `index` (0-based) of `path` (a NumPy day's stem) is malformed."""
    if fmt in ("raw", "raw_multihot"):
        size = RAW_RECORD_BYTES if fmt == "raw" else MULTIHOT_RECORD_BYTES
        with open(path, "rb") as f:
            f.seek(index * size)
            record = f.read(size)
        if len(record) < size:
            return f"truncated: {len(record)} of {size} bytes"
        return f"label {int(np.frombuffer(record[:4], np.int32)[0])} is not 0 or 1"
    if fmt in ("numpy", "numpy_multihot"):
        day = _NumpyDay(path, fmt == "numpy_multihot")
        if index >= day.complete:
            lengths = {p: len(a) for p, a in day.arrays.items()}
            return f"the day's arrays disagree in length {lengths}"
        return f"label {int(day.arrays['labels'][index])} is not 0 or 1"
    table = _pyarrow_parquet().read_table(path)
    row = {c: table.column(c)[index].as_py() for c in table.column_names}
    nulls = [c for c in PARQUET_COLUMNS if c in row and row[c] is None]
    missing = [c for c in PARQUET_COLUMNS if c not in row]
    if missing:
        return f"no column {missing[0]!r}"
    if nulls:
        return f"{nulls[0]} is null"
    return f"label {row['label']} is not 0 or 1"


def malformed_error(error: tf.errors.OpError, files: Sequence[str]) -> Optional[ValueError]:
    """The MalformedRecordError (binary formats) or reader.MalformedLineError
  (text) behind a failure of on_malformed='raise', or None for any other failure."""
    message = str(getattr(error, "message", error))
    match = re.search(r"criteo_(\w+?)_malformed_record_at_index\]?\s*\[(\d+)\]", message)
    if match is None:
        return reader.malformed_line_error(error, files)
    fmt, remaining = match.group(1), int(match.group(2))
    counts = _record_counts(fmt, files)
    for path, records in counts:
        if remaining < records:
            shown = path if not fmt.startswith("numpy") else f"{path}_{{dense,sparse,labels}}"
            return MalformedRecordError(shown, remaining + 1, _describe(fmt, path, remaining))
        remaining -= records
    return MalformedRecordError(counts[-1][0], -1, "record index past the end of the files")
