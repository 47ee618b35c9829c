"""DeepRec's ParquetDataset, imported as DeepRec's scripts import it.

After install_deeprec_api(), parquet_dataset_ops.ParquetDataset(files,
batch_size=..., fields=...) yields batches of the files' rows, in order,
across files, equal to the columns pyarrow reads; the last smaller batch is
kept unless drop_remainder; a missing column, a list column, a bad
batch_size or partition is refused naming it.
"""
import numpy as np
import pytest
import tensorflow as tf

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def parquet_dataset_ops(sok):
    sok.install_deeprec_api()
    from tensorflow.python.data.experimental.ops import parquet_dataset_ops  # pylint: disable=import-outside-toplevel
    return parquet_dataset_ops


def _write_files(rng, directory, rows_per_file):
    files, columns = [], {"clicked": [], "I1": [], "C1": [], "id32": []}
    for i, rows in enumerate(rows_per_file):
        data = {
            "clicked": rng.integers(0, 2, rows).astype(np.int64),
            "I1": rng.standard_normal(rows).astype(np.float32),
            "C1": np.array([f"{v:x}" for v in rng.integers(0, 50, rows)], dtype=object),
            "id32": rng.integers(-100, 100, rows).astype(np.int32),
        }
        path = str(directory / f"part_{i}.parquet")
        pq.write_table(pa.table(data), path)
        files.append(path)
        for name, value in data.items():
            columns[name].append(value)
    return files, {name: np.concatenate(parts) for name, parts in columns.items()}


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batches_are_the_rows_of_the_files_in_order(parquet_dataset_ops, rng, tmp_path,
                                                    drop_remainder):
    files, expected = _write_files(rng, tmp_path, [7, 0, 12])
    dataset = parquet_dataset_ops.ParquetDataset(files,
                                                 batch_size=5,
                                                 fields=["clicked", "C1", "id32"],
                                                 drop_remainder=drop_remainder)
    batches = list(dataset.as_numpy_iterator())
    assert [len(b["clicked"]) for b in batches] == [5, 5, 5, 4][:3 if drop_remainder else 4]
    rows = len(batches) * 5 if drop_remainder else 19
    for name, dtype in (("clicked", np.int64), ("id32", np.int32)):
        got = np.concatenate([b[name] for b in batches])
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, expected[name][:rows])
    assert [v.decode() for b in batches for v in b["C1"]] == list(expected["C1"][:rows])
    assert set(batches[0]) == {"clicked", "C1", "id32"}


def test_all_columns_by_default_in_a_tf1_graph(parquet_dataset_ops, rng, tmp_path):
    files, expected = _write_files(rng, tmp_path, [9])
    with tf.Graph().as_default():
        dataset = parquet_dataset_ops.ParquetDataset(files[0], batch_size=4)
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        assert batch["I1"].dtype == tf.float32 and batch["C1"].dtype == tf.string
        with tf.compat.v1.Session() as sess:
            got = [sess.run(batch) for _ in range(3)]
    np.testing.assert_array_equal(np.concatenate([b["I1"] for b in got]), expected["I1"])


def test_bad_arguments_are_refused_naming_them(parquet_dataset_ops, rng, tmp_path):
    files, _ = _write_files(rng, tmp_path, [3])
    with pytest.raises(ValueError, match="'C99'"):
        parquet_dataset_ops.ParquetDataset(files, batch_size=2, fields=["C99"])
    with pytest.raises(ValueError, match="batch_size.*0"):
        parquet_dataset_ops.ParquetDataset(files, batch_size=0)
    with pytest.raises(ValueError, match="partition_index.*2"):
        parquet_dataset_ops.ParquetDataset(files, partition_count=2, partition_index=2)
    listed = str(tmp_path / "lists.parquet")
    pq.write_table(pa.table({"tags": [[1, 2], [3]]}), listed)
    with pytest.raises(ValueError, match="'tags'"):
        parquet_dataset_ops.ParquetDataset(listed, batch_size=2)


def test_staged_input_reads_the_same_batches(parquet_dataset_ops, sok, rng, tmp_path):
    """tf.staged and tf.make_prefetch_hook (smart staging) change no value."""
    files, expected = _write_files(rng, tmp_path, [10])
    with tf.Graph().as_default():
        dataset = parquet_dataset_ops.ParquetDataset(files, batch_size=4, fields=["I1", "C1"])
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        staged = tf.compat.v1.staged(batch, num_threads=4, capacity=40)
        assert set(staged) == {"I1", "C1"}
        with tf.compat.v1.train.MonitoredSession(hooks=[tf.compat.v1.make_prefetch_hook()]) as sess:
            got = [sess.run(staged) for _ in range(3)]
    np.testing.assert_array_equal(np.concatenate([b["I1"] for b in got]), expected["I1"])
    with pytest.raises(ValueError, match="capacity.*0"):
        tf.compat.v1.staged({"x": tf.constant([1])}, capacity=0)
