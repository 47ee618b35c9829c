"""The Criteo reader (benchmarks/criteo/reader.py) parses the real format.

Reference: a plain-Python parse of the same text (str.split, int,
math.log1p), on files the synthetic generator writes and on hand-written
lines with empty fields and malformed lines.
"""
import gzip
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.criteo import reader
from benchmarks.criteo import synthetic

GOOD = "\t".join(["1", "5", "", "-3", "0"] + ["7"] * 9 + ["68fd1e64", "", "ABCDEF01"] + ["0"] * 23)
GOOD_EMPTY = "\t".join(["0"] + [""] * 13 + [""] * 26)
MALFORMED = [
    "",  # empty line
    "1\t2\t3",  # too few fields
    GOOD + "\textra",  # 41 fields
    "2" + GOOD[1:],  # label not 0/1
    GOOD.replace("\t5\t", "\tabc\t", 1),  # I1 not an integer
    GOOD.replace("\t5\t", "\t1.5\t", 1),  # I1 not an integer
    GOOD.replace("\t5\t", "\t1234567890123456789\t", 1),  # 19 digits
    GOOD.replace("68fd1e64", "68fd1e6g"),  # C1 not hex
    GOOD.replace("\t", " "),  # spaces, not tabs
]


def python_parse(line):
    """The reference: (label, [13 dense], [26 categorical]) of a well-formed line."""
    fields = line.split("\t")
    assert len(fields) == 40
    dense = [math.log1p(max(int(v), 0)) if v else 0.0 for v in fields[1:14]]
    return float(fields[0]), dense, fields[14:]


def read_all(dataset, with_keys=False):
    """Concatenates a dataset's batches: (label, dense, categorical, malformed),
  and the keys after them if with_keys."""
    labels, dense, categorical, keys, malformed = [], [], [], [], 0
    for batch in dataset:
        labels.append(batch["label"].numpy())
        dense.append(batch["dense"].numpy())
        categorical.append(batch["categorical"].numpy())
        keys.append(batch["keys"].numpy())
        malformed += int(batch["malformed"])
    out = (np.concatenate(labels), np.concatenate(dense), np.concatenate(categorical), malformed)
    return out + (np.concatenate(keys),) if with_keys else out


def write(path, lines):
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    directory = tmp_path_factory.mktemp("criteo")
    return synthetic.generate(str(directory), 2500, 300, seed=3, cardinality_scale=1e-4)


def test_reader_parses_generated_files_like_python(generated):
    path = generated["files"]["train"]
    with open(path) as f:
        expected = [python_parse(line.rstrip("\n")) for line in f]
    labels, dense, categorical, malformed, keys = read_all(reader.criteo_dataset([path], 700),
                                                           with_keys=True)
    assert malformed == 0
    assert len(labels) == len(expected) == 2500
    np.testing.assert_array_equal(labels, [e[0] for e in expected])
    np.testing.assert_allclose(dense, [e[1] for e in expected], rtol=1e-6)
    assert categorical.astype(str).tolist() == [e[2] for e in expected]
    # The generator writes empty fields too: the reader must have seen some.
    assert (categorical == b"").any() and (dense == 0).any()
    # The keys are TensorFlow's 64-bit string hash of the Python-parsed values.
    assert keys.dtype == np.int64 and keys.shape == (2500, 26)
    np.testing.assert_array_equal(
        keys,
        tf.strings.to_hash_bucket_fast([e[2] for e in expected], 2**63 - 1).numpy())


def test_empty_fields_give_zero_and_empty_string(tmp_path):
    path = write(tmp_path / "empty.txt", [GOOD, GOOD_EMPTY])
    labels, dense, categorical, _ = read_all(reader.criteo_dataset([path], 10))
    np.testing.assert_array_equal(labels, [1.0, 0.0])
    # I1 = 5, I2 empty, I3 = -3 (clipped at 0), I4 = 0, I5.. = 7.
    np.testing.assert_allclose(dense[0], [math.log1p(5), 0, 0, 0] + [math.log1p(7)] * 9, rtol=1e-6)
    np.testing.assert_array_equal(dense[1], np.zeros(13))
    assert categorical[0, :3].tolist() == [b"68fd1e64", b"", b"ABCDEF01"]
    assert categorical[1].tolist() == [b""] * 26


def test_malformed_lines_are_skipped_and_counted(tmp_path):
    lines = []
    for i, bad in enumerate(MALFORMED):
        lines += [GOOD.replace("\t5\t", f"\t{i}\t", 1), bad]
    path = write(tmp_path / "mixed.txt", lines)
    labels, dense, _, malformed = read_all(reader.criteo_dataset([path], 4))
    assert malformed == len(MALFORMED)
    # Only the good lines remain, in their order: I1 = 0, 1, 2, ...
    np.testing.assert_allclose(dense[:, 0], np.log1p(np.arange(len(MALFORMED))), rtol=1e-6)
    assert len(labels) == len(MALFORMED)


@pytest.mark.parametrize("bad", MALFORMED)
def test_describe_malformed_names_the_problem(bad):
    assert reader.describe_malformed(bad)
    assert reader.describe_malformed(GOOD) == ""


def test_malformed_line_raises_naming_file_and_line(tmp_path):
    first = write(tmp_path / "part0.txt", [GOOD] * 5)
    second = write(tmp_path / "part1.txt", [GOOD, GOOD, MALFORMED[4], GOOD])
    dataset = reader.criteo_dataset([first, second], 3, on_malformed="raise")
    with pytest.raises(tf.errors.InvalidArgumentError) as failure:
        read_all(dataset)
    error = reader.malformed_line_error(failure.value, [first, second])
    assert isinstance(error, reader.MalformedLineError)
    assert (error.path, error.line_number) == (second, 3)
    assert f"{second}:3:" in str(error) and "I1 = 'abc'" in str(error)


def test_another_failure_is_not_taken_for_a_malformed_line():
    error = tf.errors.InvalidArgumentError(None, None, "something else [12]")
    assert reader.malformed_line_error(error, ["x"]) is None


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_worker_slices_split_each_global_batch(tmp_path, workers):
    lines = [GOOD.replace("\t5\t", f"\t{i}\t", 1) for i in range(25)]
    path = write(tmp_path / "slices.txt", lines)
    slices = [
        list(reader.criteo_dataset([path], 10, num_workers=workers, worker_index=k))
        for k in range(workers)
    ]
    assert all(len(s) == 3 for s in slices)  # every worker takes 3 steps
    for step in range(3):
        parts = [s[step]["dense"].numpy()[:, 0] for s in slices]
        # Contiguous slices of ceil(n / W) rows, in rank order, making up the batch.
        first, n = 10 * step, min(10, 25 - 10 * step)
        np.testing.assert_allclose(np.concatenate(parts),
                                   np.log1p(np.arange(first, first + n)),
                                   rtol=1e-6)
        chunk = -(-n // workers)
        assert [len(p) for p in parts
               ] == [min(chunk, max(0, n - k * chunk)) for k in range(workers)]


def test_drop_remainder_and_max_lines(tmp_path):
    path = write(tmp_path / "lines.txt", [GOOD] * 25)
    assert [len(b["label"]) for b in reader.criteo_dataset([path], 10, drop_remainder=True)
           ] == [10, 10]
    assert [len(b["label"]) for b in reader.criteo_dataset([path], 10, max_lines=12)] == [10, 2]


def test_gzip_files_read_like_plain_files(tmp_path, generated):
    plain = generated["files"]["eval"]
    packed = str(tmp_path / "day_0.gz")
    with open(plain, "rb") as f, gzip.open(packed, "wb") as g:
        g.write(f.read())
    a, b = (read_all(reader.criteo_dataset([p], 128)) for p in (plain, packed))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_bad_arguments_raise_naming_them(tmp_path):
    path = write(tmp_path / "ok.txt", [GOOD])
    missing = os.path.join(tmp_path, "missing.txt")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        reader.criteo_dataset([missing], 10)
    with pytest.raises(ValueError, match="on_malformed"):
        reader.criteo_dataset([path], 10, on_malformed="ignore")
    with pytest.raises(ValueError, match="worker_index"):
        reader.criteo_dataset([path], 10, num_workers=2, worker_index=2)
    with pytest.raises(ValueError, match="batch_size"):
        reader.criteo_dataset([path], 0)
    packed = str(tmp_path / "ok.txt.gz")
    with gzip.open(packed, "wb") as g:
        g.write(GOOD.encode() + b"\n")
    with pytest.raises(ValueError, match="gzip"):
        reader.criteo_dataset([path, packed], 10)
