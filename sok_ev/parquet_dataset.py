"""DeepRec's ParquetDataset on stock TensorFlow, read with pyarrow.

DeepRec's DLRM and DeepFM scripts read their input with

  from tensorflow.python.data.experimental.ops import parquet_dataset_ops
  dataset = parquet_dataset_ops.ParquetDataset(filenames, batch_size=512,
                                               fields=None)

which yields {column name: [batch] tensor} batches of the files' rows, in
order, file after file. `install()` (run by sok_ev.install_deeprec_api())
makes that import work. Scalar columns of integers, floats, booleans and
strings are read; a list column is refused naming it.
"""

import numpy as np
import tensorflow as tf

from sok_ev import deeprec_modules

_MODULE = "tensorflow.python.data.experimental.ops.parquet_dataset_ops"


def _pyarrow():
    try:
        import pyarrow  # pylint: disable=import-outside-toplevel
        import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError(
            "ParquetDataset reads Parquet with pyarrow: pip install pyarrow") from error
    return pyarrow, pq


def _dtype_of(pa, field, path):
    """The tf.DType of a Parquet column (pyarrow field)."""
    kind = field.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        return tf.string
    if pa.types.is_boolean(kind):
        return tf.bool
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return tf.as_dtype(kind.to_pandas_dtype())
    raise ValueError(f"ParquetDataset: column {field.name!r} of {path!r} has type {kind}; "
                     "scalar integer, float, boolean and string columns are read")


def _field_names(fields):
    if fields is None:
        return None
    if isinstance(fields, str):
        fields = [fields]
    names = []
    for field in fields:
        name = getattr(field, "name", field)
        if not isinstance(name, str):
            raise TypeError(f"ParquetDataset: fields must be column names, got {field!r}")
        names.append(name)
    return names


def ParquetDataset(  # pylint: disable=invalid-name
        filenames,
        batch_size=1,
        fields=None,
        partition_count=1,
        partition_index=0,
        drop_remainder=False,
        num_parallel_reads=None,
        num_sequential_reads=1):
    """Batches of rows of Parquet files, as DeepRec's ParquetDataset.

  Args:
    filenames: a path, a list of paths, or a string tensor / dataset of
      them known when the dataset is made; in a graph, also a dataset of
      them read as it runs (a WorkQueue's input_dataset(): then each file is
      batched on its own, as DeepRec does).
    batch_size: rows per batch (the last may be smaller unless drop_remainder).
    fields: column names (or objects with a `name`) to read; None reads all.
    partition_count, partition_index: this reader reads files
      partition_index, partition_index + partition_count, ...
    drop_remainder: drop a last batch smaller than batch_size.
    num_parallel_reads, num_sequential_reads: accepted; files are read in
      order (the rows are the same).

  Returns:
    A tf.data.Dataset of {column: [batch] tensor}.

  Raises:
    ValueError: no file, a bad batch_size or partition, a missing column
      or one of a type it cannot read (naming it).
  """
    del num_parallel_reads, num_sequential_reads  # read in order: same rows
    pa, pq = _pyarrow()
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"ParquetDataset: batch_size must be an integer >= 1, got {batch_size!r}")
    if not 0 <= partition_index < partition_count:
        raise ValueError(f"ParquetDataset: partition_index must be in [0, partition_count), got "
                         f"{partition_index!r} of {partition_count!r}")
    if isinstance(filenames, tf.data.Dataset) and not tf.executing_eagerly():
        return _lazy_files(pa, pq, filenames, batch_size, fields, partition_count, partition_index,
                           drop_remainder)
    if isinstance(filenames, tf.data.Dataset):
        filenames = [
            f.decode() if isinstance(f, bytes) else f for f in filenames.as_numpy_iterator()
        ]
    elif isinstance(filenames, tf.Tensor):
        filenames = [f.decode() for f in np.reshape(filenames.numpy(), [-1])]
    elif isinstance(filenames, (str, bytes)):
        filenames = [filenames]
    filenames = [f.decode() if isinstance(f, bytes) else str(f) for f in filenames]
    if not filenames:
        raise ValueError("ParquetDataset: filenames is empty")
    files = filenames[partition_index::partition_count]
    names, signature = _signature(pa, pq, filenames[0], fields)

    def batches():
        pending, size = [], 0
        for path in files:
            for part in _file_slices(pq, path, names, batch_size, size):
                pending.append(part)
                size += part.num_rows
                if size == batch_size:
                    yield _to_numpy(pa.concat_tables(pending), names)
                    pending, size = [], 0
        if size and not drop_remainder:
            yield _to_numpy(pa.concat_tables(pending), names)

    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def _signature(pa, pq, path, fields):
    """(column names, {name: TensorSpec}) of the columns read from `path`."""
    names = _field_names(fields)
    schema = pq.read_schema(path)
    if names is None:
        names = list(schema.names)
    signature = {}
    for name in names:
        if name not in schema.names:
            raise ValueError(f"ParquetDataset: fields names column {name!r}, which "
                             f"{path!r} lacks (it has {list(schema.names)})")
        dtype = _dtype_of(pa, schema.field(name), path)
        signature[name] = tf.TensorSpec([None], dtype, name=name)
    return names, signature


def _file_slices(pq, path, names, batch_size, pending=0):
    """The rows of one file in slices that fill batches (the first fills
  the `pending` rows' batch)."""
    table = pq.read_table(path, columns=names)
    start = 0
    while start < table.num_rows:
        take = min(batch_size - pending, table.num_rows - start)
        yield table.slice(start, take)
        start += take
        pending = 0


def _lazy_files(pa, pq, filenames, batch_size, fields, partition_count, partition_index,
                drop_remainder):
    """A graph's dataset of file names (e.g. a WorkQueue's), read as it
  yields them: each file's rows in batches, as DeepRec reads each file
  (`filenames.flat_map`); the columns are those of the first file known
  (a WorkQueue's first work)."""
    known = getattr(filenames, "sok_ev_work_queue_files", None)
    if not known:
        raise ValueError("ParquetDataset: in a graph, a dataset of file names is read as it "
                         "runs, so its columns are not known when the dataset is made; pass "
                         "the file names as a list or tensor, or a WorkQueue's input_dataset().")
    names, signature = _signature(pa, pq, known[0], fields)
    if partition_count > 1:
        filenames = filenames.shard(partition_count, partition_index)

    def one_file(path):
        path = path.decode() if isinstance(path, bytes) else str(path)
        for part in _file_slices(pq, path, names, batch_size):
            if part.num_rows == batch_size or not drop_remainder:
                yield _to_numpy(part, names)

    return filenames.flat_map(lambda path: tf.data.Dataset.from_generator(
        one_file, args=(path,), output_signature=signature))


def _to_numpy(table, names):
    columns = {}
    for name in names:
        column = table.column(name).to_numpy(zero_copy_only=False)
        if column.dtype == object:
            column = np.array([
                b"" if v is None else (v if isinstance(v, bytes) else str(v).encode())
                for v in column
            ],
                              dtype=object)
        columns[name] = column
    return columns


def install():
    """Makes `from tensorflow.python.data.experimental.ops import
  parquet_dataset_ops` give this module's ParquetDataset. Idempotent."""
    deeprec_modules.provide_module(_MODULE,
                                   "DeepRec's ParquetDataset (sok_ev.parquet_dataset).",
                                   ParquetDataset=ParquetDataset)
