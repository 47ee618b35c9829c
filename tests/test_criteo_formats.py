"""The binary Criteo readers (benchmarks/criteo/formats.py) against the text reader.

Each test draws random Criteo rows, writes them as text and in a binary
format, and checks the binary reader value for value against
reader.criteo_dataset on the text: labels equal, dense equal (the text
reader's log1p(max(I, 0)) where the format stores raw integers; the same
values, written already transformed, where it stores floats; to one ulp), keys equal
int(C, 16) of the text reader's categorical strings ('' -> 0), and each
worker's slice of each global batch equal to the text reader's.
"""
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import criteo_run

from benchmarks.criteo import formats
from benchmarks.criteo import reader

BINARY = ["raw", "numpy", "parquet"]


def random_lines(rng, n):
    """n well-formed Criteo lines with empty fields, negative counts and
  hashes of 2^31 and above."""
    lines = []
    for _ in range(n):
        label = str(rng.integers(0, 2))
        dense = ["" if rng.random() < 0.2 else str(rng.integers(-3, 100_000)) for _ in range(13)]
        cats = ["" if rng.random() < 0.1 else f"{rng.integers(0, 2**32):08x}" for _ in range(26)]
        lines.append("\t".join([label] + dense + cats))
    return lines


def columns(lines):
    """label [n] int32, I [n, 13] int64 (empty -> 0), C [n, 26] int64 (int(hex, 16), '' -> 0)."""
    fields = [line.split("\t") for line in lines]
    label = np.array([int(f[0]) for f in fields], np.int32).reshape(-1)
    ints = np.array([[int(v or 0) for v in f[1:14]] for f in fields], np.int64).reshape(-1, 13)
    keys = np.array([[int(v or "0", 16) for v in f[14:]] for f in fields], np.int64).reshape(-1, 26)
    return label, ints, keys


def text_dense(ints):
    """The text reader's dense transform, by the same TensorFlow ops."""
    return tf.math.log1p(tf.maximum(tf.constant(ints, tf.float32), 0.0)).numpy()


def write_text(path, lines):
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


def write_raw(path, lines):
    label, ints, keys = columns(lines)
    records = np.concatenate(
        [label[:, None],
         ints.astype(np.int32),
         keys.astype(np.uint32).view(np.int32)], axis=1)
    records.astype("<i4").tofile(str(path))
    return str(path)


def write_numpy(directory, day, lines, dense_kind="float", sparse_dtype=np.int32):
    """day_N_{dense,sparse,labels}.npy as TorchRec writes them (labels [n, 1])."""
    label, ints, keys = columns(lines)
    stem = os.path.join(str(directory), f"day_{day}")
    dense = text_dense(ints) if dense_kind == "float" else ints.astype(np.int32)
    np.save(f"{stem}_dense.npy", dense)
    # int32, as TorchRec: hashes of 2^31 and above wrap.
    np.save(f"{stem}_sparse.npy", keys.astype(np.uint32).view(np.int32).astype(sparse_dtype))
    np.save(f"{stem}_labels.npy", label.reshape(-1, 1))
    return f"{stem}_dense.npy"


def write_parquet(path, lines, dense_kind="float", drop=()):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    label, ints, keys = columns(lines)
    dense = text_dense(ints) if dense_kind == "float" else ints
    data = {"label": pa.array(label.astype(np.float32))}
    data.update({f"I{i + 1}": pa.array(dense[:, i]) for i in range(13)})
    data.update({f"C{i + 1}": pa.array(keys[:, i]) for i in range(26)})
    for name in drop:
        del data[name]
    pq.write_table(pa.table(data), str(path))
    return str(path)


def write(fmt, tmp_path, lines, name="part0", **kwargs):
    if fmt == "raw":
        return write_raw(tmp_path / f"{name}.bin", lines)
    if fmt == "numpy":
        return write_numpy(tmp_path, name[-1], lines, **kwargs)
    return write_parquet(tmp_path / f"{name}.parquet", lines, **kwargs)


def batches(dataset):
    return [{k: v.numpy() for k, v in b.items()} for b in dataset]


def hex_keys(categorical):
    return np.vectorize(lambda s: int(s or b"0", 16),
                        otypes=[np.int64])(categorical).reshape(-1, 26)


def assert_like_text(got, text):
    assert len(got) == len(text)
    for g, t in zip(got, text):
        np.testing.assert_array_equal(g["label"], t["label"])
        # Both apply TensorFlow's log1p to the same floats, but it takes a
        # vectorized or a scalar path by position in the tensor, and the two
        # differ in the last bit, in the last two on an AVX-512 Xeon.
        np.testing.assert_array_max_ulp(g["dense"], t["dense"], maxulp=2)
        np.testing.assert_array_equal(g["keys"], hex_keys(t["categorical"]))
        assert g["keys"].dtype == np.int64 and g["dense"].dtype == np.float32
        assert g["malformed"] == t["malformed"]


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("fmt", BINARY)
def test_reader_equals_the_text_reader_on_each_worker(tmp_path, rng, fmt, workers):
    lines = random_lines(rng, 47)
    # Two files: global batches cross the boundary between them.
    text = [write_text(tmp_path / "a.txt", lines[:20]), write_text(tmp_path / "b.txt", lines[20:])]
    files = [write(fmt, tmp_path, lines[:20], "part0"), write(fmt, tmp_path, lines[20:], "part1")]
    assert formats.format_of(files) == fmt
    for k in range(workers):
        expected = batches(reader.criteo_dataset(text, 10, num_workers=workers, worker_index=k))
        got = batches(formats.criteo_dataset(files, 10, num_workers=workers, worker_index=k))
        assert_like_text(got, expected)


@pytest.mark.parametrize("fmt", ["numpy", "parquet"])
def test_integer_dense_gets_the_text_transform(tmp_path, rng, fmt):
    lines = random_lines(rng, 23)
    text = write_text(tmp_path / "a.txt", lines)
    files = [write(fmt, tmp_path, lines, dense_kind="int")]
    assert_like_text(batches(formats.criteo_dataset(files, 8)),
                     batches(reader.criteo_dataset([text], 8)))


@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize("fmt", BINARY)
def test_max_lines_and_drop_remainder_as_the_text_reader(tmp_path, rng, fmt, drop_remainder):
    lines = random_lines(rng, 31)
    text = write_text(tmp_path / "a.txt", lines)
    files = [write(fmt, tmp_path, lines)]
    kwargs = dict(drop_remainder=drop_remainder, max_lines=27, num_workers=2, worker_index=1)
    assert_like_text(batches(formats.criteo_dataset(files, 6, **kwargs)),
                     batches(reader.criteo_dataset([text], 6, **kwargs)))


@pytest.mark.parametrize("rows", [0, 1])
@pytest.mark.parametrize("fmt", BINARY)
def test_empty_and_single_row_files(tmp_path, rng, fmt, rows):
    lines = random_lines(rng, rows)
    text = write_text(tmp_path / "a.txt", lines)
    files = [write(fmt, tmp_path, lines)]
    for workers, k in [(1, 0), (2, 0), (2, 1)]:
        kwargs = dict(num_workers=workers, worker_index=k)
        assert_like_text(batches(formats.criteo_dataset(files, 4, **kwargs)),
                         batches(reader.criteo_dataset([text], 4, **kwargs)))


def test_numpy_int32_keys_of_2_pow_31_and_above_come_back(tmp_path, rng):
    lines = random_lines(rng, 40)
    _, _, keys = columns(lines)
    assert (keys >= 2**31).any()
    got = batches(formats.criteo_dataset([write_numpy(tmp_path, 0, lines)], 100))
    np.testing.assert_array_equal(got[0]["keys"], keys)


# Malformed and truncated files ----------------------------------------------------


def read_error(dataset, files):
    with pytest.raises(tf.errors.InvalidArgumentError) as failure:
        batches(dataset)
    error = formats.malformed_error(failure.value, files)
    assert isinstance(error, formats.MalformedRecordError)
    return error


def test_raw_file_with_a_partial_record(tmp_path, rng):
    lines = random_lines(rng, 7)
    first = write_raw(tmp_path / "part0.bin", lines[:4])
    second = write_raw(tmp_path / "part1.bin", lines[4:])
    with open(second, "ab") as f:
        f.write(b"\x01" * 70)
    files = [first, second]
    error = read_error(formats.criteo_dataset(files, 3, on_malformed="raise"), files)
    assert (error.path, error.record_number) == (second, 4)
    assert "truncated: 70 of 160 bytes" in str(error) and second in str(error)
    got = batches(formats.criteo_dataset(files, 3))
    assert sum(int(b["malformed"]) for b in got) == 1
    text = write_text(tmp_path / "a.txt", lines)
    np.testing.assert_array_equal(np.concatenate([b["keys"] for b in got]), columns(lines)[2])
    np.testing.assert_array_max_ulp(
        np.concatenate([b["dense"] for b in got]),
        np.concatenate([b["dense"] for b in reader.criteo_dataset([text], 3)]))


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("max_lines", [None, 9, 21, 26])
def test_raw_blocks_across_files_and_batches(tmp_path, rng, monkeypatch, workers, max_lines):
    # Blocks of 4 records: whole blocks, a tail and a partial record per file.
    monkeypatch.setattr(formats, "RAW_BLOCK_RECORDS", 4)
    lines = random_lines(rng, 25)
    first = write_raw(tmp_path / "part0.bin", lines[:10])
    with open(first, "ab") as f:
        f.write(b"\x00" * 100)
    second = write_raw(tmp_path / "part1.bin", lines[10:])
    # The text reader on the same rows, the partial record as a malformed line.
    text = write_text(tmp_path / "a.txt", lines[:10] + ["partial"] + lines[10:])
    for k in range(workers):
        kwargs = dict(num_workers=workers, worker_index=k, max_lines=max_lines)
        assert_like_text(batches(formats.raw_dataset([first, second], 6, **kwargs)),
                         batches(reader.criteo_dataset([text], 6, **kwargs)))


def test_raw_file_shorter_than_one_record(tmp_path):
    path = str(tmp_path / "short.bin")
    with open(path, "wb") as f:
        f.write(b"\x00" * 159)
    error = read_error(formats.raw_dataset([path], 4, on_malformed="raise"), [path])
    assert (error.path, error.record_number) == (path, 1) and "159 of 160 bytes" in str(error)
    got = batches(formats.raw_dataset([path], 4))
    assert len(got) == 1 and len(got[0]["label"]) == 0 and got[0]["malformed"] == 1


def test_multihot_npz_member_shorter_than_the_day(tmp_path, rng):
    files, label, _, keys = write_multihot_day(tmp_path, 0, rng, 6)
    npz = files[0].replace("_labels.npy", "_sparse_multi_hot.npz")
    members = dict(np.load(npz))
    members["20"] = members["20"][:4]
    np.savez(npz, **members)
    error = read_error(formats.numpy_dataset(files, 4, on_malformed="raise", multihot=True), files)
    assert error.record_number == 5 and "disagree in length" in str(error)
    got = batches(formats.numpy_dataset(files, 4, multihot=True))
    assert sum(int(b["malformed"]) for b in got) == 2
    np.testing.assert_array_equal(np.concatenate([b["keys"] for b in got]), keys[:4])


def test_raw_record_with_a_bad_label(tmp_path, rng):
    lines = random_lines(rng, 6)
    lines[4] = "7" + lines[4][1:]
    first = write_raw(tmp_path / "part0.bin", lines[:2])
    second = write_raw(tmp_path / "part1.bin", lines[2:])
    files = [first, second]
    error = read_error(formats.criteo_dataset(files, 4, on_malformed="raise"), files)
    assert (error.path, error.record_number) == (second, 3)
    assert "label 7 is not 0 or 1" in str(error)
    got = batches(formats.criteo_dataset(files, 4, num_workers=2, worker_index=1))
    text = batches(
        reader.criteo_dataset([write_text(tmp_path / "a.txt", lines)],
                              4,
                              num_workers=2,
                              worker_index=1))
    assert_like_text(got, text)  # the text reader skips label 7 too


def test_numpy_day_whose_arrays_disagree_in_length(tmp_path, rng):
    lines = random_lines(rng, 9)
    write_numpy(tmp_path, 0, lines[:4])
    dense = write_numpy(tmp_path, 1, lines[4:])
    sparse = dense.replace("_dense", "_sparse")
    np.save(sparse, np.load(sparse)[:3])
    files = [str(tmp_path / "day_0_labels.npy"), dense]
    error = read_error(formats.criteo_dataset(files, 4, on_malformed="raise"), files)
    assert error.record_number == 4 and "day_1_{dense,sparse,labels}" in error.path
    assert "disagree in length" in str(error) and "'sparse': 3" in str(error)
    got = batches(formats.criteo_dataset(files, 4))
    assert sum(int(b["malformed"]) for b in got) == 2
    np.testing.assert_array_equal(np.concatenate([b["keys"] for b in got]), columns(lines[:7])[2])


def test_numpy_bad_shape_and_name(tmp_path, rng):
    dense = write_numpy(tmp_path, 0, random_lines(rng, 3))
    np.save(dense, np.zeros((3, 12), np.float32))
    with pytest.raises(ValueError, match=r"day_0_dense.npy has shape \(3, 12\)"):
        formats.numpy_dataset([dense], 4)
    with pytest.raises(ValueError, match="other.npy"):
        formats.numpy_dataset([str(tmp_path / "other.npy")], 4)


def test_parquet_file_missing_a_column(tmp_path, rng):
    lines = random_lines(rng, 8)
    good = write_parquet(tmp_path / "part0.parquet", lines[:3])
    bad = write_parquet(tmp_path / "part1.parquet", lines[3:], drop=["C7"])
    with pytest.raises(ValueError, match=f"{bad} has no column 'C7'"):
        formats.criteo_dataset([good, bad], 4, on_malformed="raise")
    got = batches(formats.criteo_dataset([good, bad], 4))
    assert sum(int(b["malformed"]) for b in got) == 5
    np.testing.assert_array_equal(np.concatenate([b["keys"] for b in got]), columns(lines[:3])[2])


def test_parquet_null_and_bad_label(tmp_path, rng):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    lines = random_lines(rng, 6)
    path = write_parquet(tmp_path / "part0.parquet", lines)
    table = pq.read_table(path)
    label = table.column("label").to_pylist()
    label[2] = 0.5
    keys = table.column("C3").to_pylist()
    keys[4] = None
    table = table.set_column(0, "label", pa.array(label, pa.float32()))
    table = table.set_column(table.column_names.index("C3"), "C3", pa.array(keys, pa.int64()))
    pq.write_table(table, path)
    error = read_error(formats.criteo_dataset([path], 4, on_malformed="raise"), [path])
    assert (error.path, error.record_number) == (path, 3) and "label 0.5" in str(error)
    got = batches(formats.criteo_dataset([path], 4, num_workers=2, worker_index=1))
    assert [int(b["malformed"]) for b in got] == [1, 0]  # rows 2-3, then row 5
    error = formats.malformed_error(
        tf.errors.InvalidArgumentError(None, None,
                                       "[criteo_parquet_malformed_record_at_index] [4]"), [path])
    assert error.record_number == 5 and "C3 is null" in str(error)


def test_parquet_without_pyarrow_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "x.parquet"
    path.write_bytes(b"")
    with pytest.raises(ImportError, match="pyarrow"):
        formats.criteo_dataset([str(path)], 4)


def test_format_selection():
    assert formats.format_of(["a.parquet", "b.parquet"]) == "parquet"
    assert formats.format_of(["train_data.bin"]) == "raw"
    assert formats.format_of(["day_0_dense.npy"]) == "numpy"
    assert formats.format_of(["day_0.gz", "train.txt"]) == "text"
    assert formats.format_of(["data.dat"], "raw") == "raw"
    with pytest.raises(ValueError, match="mix formats"):
        formats.format_of(["a.parquet", "b.bin"])
    with pytest.raises(ValueError, match="'csv'"):
        formats.format_of(["a.csv"], "csv")


def test_another_failure_is_not_taken_for_a_malformed_record():
    error = tf.errors.InvalidArgumentError(None, None, "something else [12]")
    assert formats.malformed_error(error, ["x.bin"]) is None


# MLPerf DLRM-DCNv2 multi-hot (readers only; the models do not take this shape) ---


def test_multihot_raw_records(tmp_path, rng):
    n = 11
    label = rng.integers(0, 2, n).astype(np.int32)
    label[5] = 3
    dense = rng.random((n, 13)).astype(np.float32)
    keys = rng.integers(0, 2**31, (n, formats.MULTIHOT_KEYS)).astype(np.int32)
    path = str(tmp_path / "train_data.bin")
    np.concatenate([label[:, None], dense.view(np.int32), keys], axis=1).astype("<i4").tofile(path)
    assert os.path.getsize(path) == n * 912
    got = batches(formats.criteo_dataset([path], 4, "raw_multihot"))
    keep = label != 3
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in got]), label[keep])
    np.testing.assert_array_equal(np.concatenate([b["dense"] for b in got]), dense[keep])
    np.testing.assert_array_equal(np.concatenate([b["keys"] for b in got]), keys[keep])
    assert sum(int(b["malformed"]) for b in got) == 1
    error = read_error(formats.multihot_raw_dataset([path], 4, on_malformed="raise"), [path])
    assert error.record_number == 6 and "label 3" in str(error)


def write_multihot_day(directory, day, rng, n, compressed=False):
    """day_N_{dense,labels}.npy and day_N_sparse_multi_hot.npz as MLPerf's
  materialize_synthetic_multihot_dataset.py writes them (np.savez, members
  '0'..'25'); returns (files, label, dense, keys [n, 214])."""
    stem = os.path.join(str(directory), f"day_{day}")
    label = rng.integers(0, 2, (n, 1)).astype(np.int32)
    dense = rng.random((n, 13)).astype(np.float32)
    members = {
        str(f): rng.integers(0, 2**31, (n, h)).astype(np.int32)
        for f, h in enumerate(formats.MLPERF_HOTNESS)
    }
    np.save(f"{stem}_labels.npy", label)
    np.save(f"{stem}_dense.npy", dense)
    (np.savez_compressed if compressed else np.savez)(f"{stem}_sparse_multi_hot.npz", **members)
    keys = np.concatenate([members[str(f)] for f in range(26)], axis=1).astype(np.int64)
    return [f"{stem}_labels.npy"], label.reshape(-1), dense, keys


@pytest.mark.parametrize("workers", [1, 2])
def test_multihot_numpy_days(tmp_path, rng, workers):
    files0, label0, dense0, keys0 = write_multihot_day(tmp_path, 0, rng, 7)
    files1, label1, dense1, keys1 = write_multihot_day(tmp_path, 1, rng, 5)
    label, dense, keys = (
        np.concatenate(x) for x in ((label0, label1), (dense0, dense1), (keys0, keys1)))
    for k in range(workers):
        got = batches(
            formats.criteo_dataset(files0 + files1,
                                   4,
                                   "numpy_multihot",
                                   num_workers=workers,
                                   worker_index=k))
        rows = np.concatenate([
            np.arange(b, min(b + 4, 12))[k * c:(k + 1) * c]
            for b in range(0, 12, 4)
            for c in [-(-min(4, 12 - b) // workers)]
        ])
        np.testing.assert_array_equal(np.concatenate([b["label"] for b in got]), label[rows])
        np.testing.assert_array_equal(np.concatenate([b["dense"] for b in got]), dense[rows])
        np.testing.assert_array_equal(np.concatenate([b["keys"] for b in got]), keys[rows])
        assert got[0]["keys"].shape[1] == formats.MULTIHOT_KEYS == 214


def test_multihot_numpy_refuses_a_compressed_npz(tmp_path, rng):
    files, *_ = write_multihot_day(tmp_path, 0, rng, 3, compressed=True)
    with pytest.raises(ValueError, match="day_0_sparse_multi_hot.npz member 0.npy is compressed"):
        formats.numpy_dataset(files, 4, multihot=True)


# run.py --------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt,style", [("raw", "session"), ("numpy", "function"),
                                       ("parquet", "function")])
def test_run_py_trains_on_the_format(tmp_path, rng, fmt, style):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    lines = random_lines(rng, 1536)
    train = write(fmt, tmp_path, lines[:1024], "part0")
    evaluation = write(fmt, tmp_path, lines[1024:], "part1")
    criteo_run.run_py_ok("--style", style, "--device", "cpu", "--impl", "sok_ev", "--format", fmt,
                         "--train-files", train, "--eval-files", evaluation, "--batch", "256",
                         "--dim", "8", "--bottom", "16", "--top", "16", "1", "--evals", "1",
                         "--no-append", "--no-progress", "--out-dir", tmp_path / "out")
    record = json.load(open(tmp_path / "out" / "run.json"))
    assert record["steps"] == 4 and record["malformed"] == 0
    assert 0 <= record["results"]["sok_ev"]["auc"] <= 1


@pytest.mark.timeout(300)
def test_run_py_stops_naming_the_file_and_record(tmp_path, rng):
    lines = random_lines(rng, 600)
    lines[300] = "7" + lines[300][1:]
    train = write_raw(tmp_path / "train_data.bin", lines[:512])
    evaluation = write_raw(tmp_path / "test_data.bin", lines[512:])
    result = criteo_run.run_py("--device", "cpu", "--impl", "sok_ev", "--train-files", train,
                               "--eval-files", evaluation, "--batch", "128", "--dim", "4",
                               "--bottom", "8", "--top", "8", "1", "--evals", "1", "--no-append",
                               "--no-progress", "--on-malformed", "raise", "--out-dir",
                               tmp_path / "out")
    assert result.returncode != 0
    assert (f"MalformedRecordError: {train}: record 301: malformed Criteo record "
            "(label 7 is not 0 or 1)") in result.stderr, result.stderr[-3000:]
