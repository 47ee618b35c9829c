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

import importlib
import sys
import types

import numpy as np
import tensorflow as tf

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
      them known when the dataset is made.
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
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"ParquetDataset: batch_size must be an integer >= 1, got {batch_size!r}")
    if not 0 <= partition_index < partition_count:
        raise ValueError(f"ParquetDataset: partition_index must be in [0, partition_count), got "
                         f"{partition_index!r} of {partition_count!r}")
    files = filenames[partition_index::partition_count]
    names = _field_names(fields)
    schema = pq.read_schema(filenames[0])
    if names is None:
        names = list(schema.names)
    signature = {}
    for name in names:
        if name not in schema.names:
            raise ValueError(f"ParquetDataset: fields names column {name!r}, which "
                             f"{filenames[0]!r} lacks (it has {list(schema.names)})")
        dtype = _dtype_of(pa, schema.field(name), filenames[0])
        signature[name] = tf.TensorSpec([None], dtype, name=name)

    def batches():
        pending, size = [], 0
        for path in files:
            table = pq.read_table(path, columns=names)
            start = 0
            while start < table.num_rows:
                take = min(batch_size - size, table.num_rows - start)
                pending.append(table.slice(start, take))
                size += take
                start += take
                if size == batch_size:
                    yield _to_numpy(pa.concat_tables(pending), names)
                    pending, size = [], 0
        if size and not drop_remainder:
            yield _to_numpy(pa.concat_tables(pending), names)

    return tf.data.Dataset.from_generator(batches, output_signature=signature)


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
    if _MODULE not in sys.modules:
        module = types.ModuleType(_MODULE, "DeepRec's ParquetDataset (sok_ev.parquet_dataset).")
        module.ParquetDataset = ParquetDataset
        sys.modules[_MODULE] = module
    package_name, _, child = _MODULE.rpartition(".")
    setattr(importlib.import_module(package_name), child, sys.modules[_MODULE])
