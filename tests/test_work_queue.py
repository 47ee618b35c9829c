"""DeepRec's WorkQueue (sok_ev.work_queue), as DeepRec documents it: num_epochs
copies of the works, each epoch shuffled, handed out one by one, then
OutOfRangeError; saved in checkpoints. References: Python lists, NumPy and
pyarrow reading the same files."""
import os

import numpy as np
import pytest
import tensorflow as tf

import sok_ev

sok_ev.install_deeprec_api()
from tensorflow.python.ops.work_queue import WorkQueue  # pylint: disable=wrong-import-position


def _take_all(queue, session, limit=100):
    taken = []
    work = queue.take()
    for _ in range(limit):
        try:
            taken.append(session.run(work).decode())
        except tf.errors.OutOfRangeError:
            return taken
    raise AssertionError("the queue did not end")


def _read_to_the_end(make_dataset):
    """Every element of make_dataset() (built in a fresh graph, where the
  queue's variables are initialised), read in a Session until it raises
  OutOfRangeError."""
    with tf.Graph().as_default():
        iterator = tf.compat.v1.data.make_initializable_iterator(make_dataset())
        element = iterator.get_next()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(iterator.initializer)
            read = []
            with pytest.raises(tf.errors.OutOfRangeError):
                while True:
                    read.append(session.run(element))
    return read


def test_take_hands_out_every_epoch_in_order_then_out_of_range():
    with tf.Graph().as_default():
        queue = WorkQueue(["a", "b", "c"], num_epochs=2, shuffle=False, prefix="/d/")
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert _take_all(queue, session) == ["/d/a", "/d/b", "/d/c"] * 2
    assert len(queue) == 3


def test_shuffled_epochs_are_each_a_permutation_of_the_works():
    works = [f"f{i}" for i in range(8)]
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        queue = WorkQueue(works, num_epochs=3)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            taken = _take_all(queue, session)
    assert len(taken) == 24
    for epoch in range(3):
        assert sorted(taken[epoch * 8:(epoch + 1) * 8]) == sorted(works)
    assert taken != works * 3


def test_input_dataset_feeds_text_line_dataset_file_by_file(tmp_path):
    paths = []
    for i in range(3):
        path = tmp_path / f"part{i}.csv"
        path.write_text("".join(f"{i},{j}\n" for j in range(4)))
        paths.append(str(path))
    expected = [f"{i},{j}".encode() for i in range(3) for j in range(4)] * 2
    read = _read_to_the_end(lambda: tf.data.TextLineDataset(
        WorkQueue(paths, num_epochs=2, shuffle=False).input_dataset()))
    assert read == expected


def test_parquet_dataset_reads_a_work_queue_file_by_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    paths = []
    for i, rows in enumerate((5, 3)):
        table = pa.table({"x": np.arange(rows, dtype=np.int64) + 10 * i, "s": [f"k{i}"] * rows})
        path = str(tmp_path / f"p{i}.parquet")
        pq.write_table(table, path)
        paths.append(path)
    from tensorflow.python.data.experimental.ops import parquet_dataset_ops  # pylint: disable=import-outside-toplevel
    read = [
        batch["x"].tolist()
        for batch in _read_to_the_end(lambda: parquet_dataset_ops.ParquetDataset(
            WorkQueue(paths, shuffle=False).input_dataset(), batch_size=2))
    ]
    # pyarrow's rows of each file, cut into batches of 2 per file.
    expected = []
    for path in paths:
        column = pq.read_table(path)["x"].to_pylist()
        expected += [column[i:i + 2] for i in range(0, len(column), 2)]
    assert read == expected


def test_saver_restores_the_works_not_taken_yet(tmp_path):
    prefix = os.path.join(str(tmp_path), "ckpt")
    with tf.Graph().as_default():
        queue = WorkQueue(["a", "b", "c", "d"], shuffle=False)
        work = queue.take()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert session.run(work) == b"a"
            saver.save(session, prefix)
            assert session.run(work) == b"b"
        with tf.compat.v1.Session() as session:
            saver.restore(session, prefix)
            assert _take_all(queue, session) == ["b", "c", "d"]


def test_work_queue_refuses_bad_arguments():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="non-empty list"):
            WorkQueue([])
        with pytest.raises(ValueError, match="num_epochs"):
            WorkQueue(["a"], num_epochs=0)
        with pytest.raises(ValueError, match="num_slices"):
            WorkQueue(["a"], num_slices=4)
