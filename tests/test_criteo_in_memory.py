"""Synthetic batches made in memory (benchmarks/criteo/in_memory.py) are the text files' batches.

Reference: the same seed and sizes written as Criteo text by
synthetic.generate and parsed by reader.criteo_dataset, the path real files
take.
"""
import numpy as np
import pytest

from benchmarks.criteo import in_memory
from benchmarks.criteo import reader
from benchmarks.criteo import synthetic

LINES = dict(train_lines=2500, eval_lines=700, seed=3, cardinality_scale=1e-4)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    meta = synthetic.generate(str(tmp_path_factory.mktemp("text")), **LINES)
    return meta, in_memory.InMemoryData(**LINES, processes=2)


@pytest.mark.parametrize("split", ["train", "eval"])
@pytest.mark.parametrize("workers, worker", [(1, 0), (2, 1)])
def test_batches_equal_the_text_readers_for_the_same_seed(both, split, workers, worker):
    meta, data = both
    text = list(
        reader.criteo_dataset([meta["files"][split]],
                              512,
                              num_workers=workers,
                              worker_index=worker,
                              drop_remainder=True))
    memory = list(
        data.dataset(split, 512, num_workers=workers, worker_index=worker, drop_remainder=True))
    assert len(memory) == len(text) == LINES[f"{split}_lines"] // 512
    for a, b in zip(text, memory):
        for key in ("label", "dense", "keys", "malformed"):
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)


def test_planted_model_and_vocabulary_are_the_text_data_sets(both):
    meta, data = both
    assert data.planted == {"eval": meta["planted"]["eval"]}
    assert data.vocabulary == meta["vocabulary"]
    assert data.lines == {"train": 2500, "eval": 700}


def test_max_lines_and_the_last_short_batch(both):
    _, data = both
    sizes = [len(b["label"]) for b in data.dataset("eval", 256)]
    assert sizes == [256, 256, 188]
    assert [len(b["label"]) for b in data.dataset("eval", 256, max_lines=300)] == [256, 44]


def test_bad_arguments_are_named(both):
    _, data = both
    with pytest.raises(ValueError, match="split must be one of .* got 'test'"):
        data.dataset("test", 8)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        data.dataset("train", 0)
    with pytest.raises(ValueError, match=r"worker_index must be in \[0, 2\), got 2"):
        data.dataset("train", 8, num_workers=2, worker_index=2)
    with pytest.raises(ValueError, match="train_lines and eval_lines must be >= 1, got 0, 5"):
        in_memory.InMemoryData(0, 5)


@pytest.mark.parametrize("hotness", [None, "mlperf"])
def test_a_batch_built_where_the_data_lies_is_the_datasets_batch(hotness):
    """InMemoryData.batches: what a step builds itself from the arrays (run.py
  --batches-on-gpu) equals what the tf.data pipeline yields for the same
  rows (dense within 3 ulps: log1p), on GPU:0 where TensorFlow sees a GPU (positions int64 there, cut by
  ops with GPU kernels: soft placement off), else on the CPU."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from benchmarks.criteo import formats  # pylint: disable=import-outside-toplevel
    data = in_memory.InMemoryData(**LINES,
                                  hotness=None if hotness is None else formats.MLPERF_HOTNESS)
    device = "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"
    rows, build = data.batches("train", 512, num_workers=2, worker_index=1, device=device)
    expected = list(data.dataset("train", 512, num_workers=2, worker_index=1))
    assert len(rows) == len(expected) == -(-LINES["train_lines"] // 512)
    soft = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(False)
    try:
        built = tf.function(build, input_signature=[tf.TensorSpec([2], tf.int32)])
        for row_range, batch in zip(rows, expected):
            got = built(tf.constant(row_range, tf.int32))
            assert device.split(":")[0][1:] in got["keys"].device
            for key in ("label", "keys", "malformed"):
                np.testing.assert_array_equal(got[key].numpy(), batch[key].numpy(), err_msg=key)
            # log1p on the GPU (CUDA's log1pf) and on the CPU (Eigen) may
            # differ in the last bit: within 3 ulps.
            np.testing.assert_allclose(got["dense"].numpy(),
                                       batch["dense"].numpy(),
                                       rtol=3e-7,
                                       atol=0,
                                       err_msg="dense")
    finally:
        tf.config.set_soft_device_placement(soft)
