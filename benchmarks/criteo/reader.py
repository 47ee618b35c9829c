"""The Criteo text format as a tf.data pipeline.

One line of Kaggle's `train.txt` or of the Terabyte `day_N` files (plain or
gzip) holds 40 tab-separated fields:

  label   I1 ... I13   C1 ... C26

label is 0 or 1; I1..I13 are integers, possibly negative; C1..C26 are
hexadecimal hashes (8 digits in Criteo's files). Any I or C may be empty.

The pipeline: `TextLineDataset(files)` -> batches of `batch_size` lines (the
global batch) -> this worker's contiguous slice of each batch -> parsing, in
parallel (hashing the C fields there too, so the training step gets integer
keys and no string work) -> prefetch. Every worker reads every line but parses only its own
slice, so W workers train on exactly the global batches one worker sees, and
all take the same number of steps (the collectives in a step need that).

Parsed batch (a dict; n = the rows of this worker's slice that are well formed):
  label        [n] float32, 0 or 1
  dense        [n, 13] float32, log(1 + max(I, 0)); an empty I gives 0
  categorical  [n, 26] string, the C fields as written ('' when empty)
  keys         [n, 26] int64, to_hash_bucket_fast(categorical, KEY_SPACE): one
               id per C value (Fingerprint64 mod 2^63 - 1, '' included), what
               both of the benchmark's embeddings look up
  malformed    int64 scalar, lines of the slice that were not well formed

A line is malformed when it does not have exactly 40 fields, its label is
not 0 or 1, an I is not an integer of at most 18 digits, or a C is not
hexadecimal (this includes empty lines). `on_malformed='skip'` drops such
lines and counts them; `on_malformed='raise'` makes iteration fail, and
`malformed_line_error` turns that failure into a MalformedLineError that
names the file and the line. Nothing else about a line can stop the pipeline.
"""
import gzip
import os
import re
from typing import Optional, Sequence

import tensorflow as tf

NUM_DENSE = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_CATEGORICAL
ON_MALFORMED = ("skip", "raise")

# to_hash_bucket_fast(s, 2^63 - 1): a collision-free id in practice, as
# DeepRec's SOK example feeds its Embedding Variables.
KEY_SPACE = 2**63 - 1

_INTEGER = r"-?[0-9]{1,18}"
_HEX = r"[0-9a-fA-F]*"
# One regular expression checks a whole line (RE2: linear time, no backtracking).
LINE_PATTERN = rf"[01](\t({_INTEGER})?){{{NUM_DENSE}}}(\t{_HEX}){{{NUM_CATEGORICAL}}}"
# The tag of the assertion that `on_malformed='raise'` fails with.
_MALFORMED_TAG = "criteo_malformed_line_at_index"


class MalformedLineError(ValueError):
    """A Criteo line that is not well formed, with its file and 1-based line."""

    def __init__(self, path: str, line_number: int, reason: str, text: str):
        super().__init__(f"{path}:{line_number}: malformed Criteo line ({reason}): {text[:200]!r}")
        self.path = path
        self.line_number = line_number
        self.reason = reason


def _compression(files):
    kinds = {"GZIP" if f.endswith(".gz") else "" for f in files}
    if len(kinds) > 1:
        raise ValueError(f"criteo_dataset: files mixes gzip and plain text: {list(files)}")
    return kinds.pop()


def parse_lines(lines: tf.Tensor, first_index: tf.Tensor, on_malformed: str = "skip") -> dict:
    """Parses a [n] string tensor of Criteo lines into a batch dict.

  Args:
    lines: [n] string, one line each, without the newline.
    first_index: int64 scalar, the index of lines[0] in the whole stream
      (what a 'raise' failure reports).
    on_malformed: 'skip' or 'raise' (see the module docstring).

  Returns:
    The dict described in the module docstring.
  """
    valid = tf.strings.regex_full_match(lines, LINE_PATTERN)
    malformed = tf.reduce_sum(tf.cast(tf.logical_not(valid), tf.int64))
    if on_malformed == "raise":
        first_bad = tf.argmin(tf.cast(valid, tf.int32), output_type=tf.int64)
        check = tf.debugging.Assert(tf.reduce_all(valid), [_MALFORMED_TAG, first_index + first_bad])
        with tf.control_dependencies([check]):
            lines = tf.identity(lines)
    else:
        lines = tf.boolean_mask(lines, valid)
    fields = tf.strings.split(lines, "\t").to_tensor(shape=[None, NUM_FIELDS])
    integers = fields[:, 1:1 + NUM_DENSE]
    integers = tf.strings.to_number(tf.where(tf.equal(integers, ""), "0", integers), tf.float32)
    categorical = fields[:, 1 + NUM_DENSE:]
    return {
        "label": tf.strings.to_number(fields[:, 0], tf.float32),
        "dense": tf.math.log1p(tf.maximum(integers, 0.0)),
        "categorical": categorical,
        "keys": tf.strings.to_hash_bucket_fast(categorical, KEY_SPACE),
        "malformed": malformed,
    }


def check_arguments(caller, files, batch_size, num_workers, worker_index, on_malformed):
    """The arguments every reader of the benchmark shares, checked before any
  file is read; returns `files` as a list.

  Raises:
    ValueError: no files, batch_size < 1, worker_index outside [0,
      num_workers), or on_malformed not in ON_MALFORMED (each naming
      `caller` and the value).
    FileNotFoundError: a file does not exist.
  """
    files = list(files)
    if not files:
        raise ValueError(f"{caller}: files is empty")
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{caller}: no such file: {path}")
    if batch_size < 1:
        raise ValueError(f"{caller}: batch_size must be >= 1, got {batch_size}")
    if not 0 <= worker_index < num_workers:
        raise ValueError(f"{caller}: worker_index must be in [0, {num_workers}), "
                         f"got {worker_index}")
    if on_malformed not in ON_MALFORMED:
        raise ValueError(f"{caller}: on_malformed must be one of {ON_MALFORMED}, "
                         f"got {on_malformed!r}")
    return files


def worker_rows(n, num_workers, worker_index):
    """[start, end) of worker `worker_index`'s rows in a global batch of n rows
  (an int64 tensor or an int): contiguous slices of ceil(n / W), the last
  ones shorter or empty. Every reader of the benchmark slices this way."""
    chunk = (n + num_workers - 1) // num_workers
    if isinstance(n, tf.Tensor):
        start = tf.minimum(n, worker_index * chunk)
        return start, tf.minimum(n, start + chunk)
    start = min(n, worker_index * chunk)
    return start, min(n, start + chunk)


def criteo_dataset(files: Sequence[str],
                   batch_size: int,
                   num_workers: int = 1,
                   worker_index: int = 0,
                   on_malformed: str = "skip",
                   drop_remainder: bool = False,
                   max_lines: Optional[int] = None,
                   num_parallel_calls: int = tf.data.AUTOTUNE,
                   prefetch: int = 4) -> tf.data.Dataset:
    """A dataset of parsed batches of Criteo lines (see the module docstring).

  Args:
    files: paths of Criteo text files, read in this order (all plain, or all
      gzip when named *.gz).
    batch_size: lines per global batch; this worker parses rows
      [k * c, min(n, (k + 1) * c)) of each batch of n lines, c = ceil(n / W).
    num_workers, worker_index: W and k.
    on_malformed: 'skip' or 'raise'.
    drop_remainder: drop the last global batch if it has fewer lines.
    max_lines: read at most this many lines (None: all).
    num_parallel_calls: parallel parsing calls (AUTOTUNE by default).
    prefetch: parsed batches kept ready.

  Raises:
    ValueError: an argument out of range, or gzip mixed with plain files.
    FileNotFoundError: a file does not exist.
  """
    files = check_arguments("criteo_dataset", files, batch_size, num_workers, worker_index,
                            on_malformed)
    lines = tf.data.TextLineDataset(files,
                                    compression_type=_compression(files),
                                    buffer_size=8 << 20)
    if max_lines is not None:
        lines = lines.take(max_lines)

    def worker_slice(batch_index, batch):
        start, end = worker_rows(tf.shape(batch, out_type=tf.int64)[0], num_workers, worker_index)
        return parse_lines(batch[start:end], batch_index * batch_size + start, on_malformed)

    return (lines.batch(batch_size, drop_remainder=drop_remainder).enumerate().map(
        worker_slice, num_parallel_calls=num_parallel_calls, deterministic=True).prefetch(prefetch))


def _open_text(path):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def describe_malformed(text: str) -> str:
    """Why a line is not a well-formed Criteo line ('' if it is)."""
    if re.fullmatch(LINE_PATTERN, text):
        return ""
    if not text:
        return "empty line"
    fields = text.split("\t")
    if len(fields) != NUM_FIELDS:
        return f"{len(fields)} fields, expected {NUM_FIELDS}"
    if fields[0] not in ("0", "1"):
        return f"label {fields[0]!r} is not 0 or 1"
    for i, value in enumerate(fields[1:1 + NUM_DENSE]):
        if value and not re.fullmatch(_INTEGER, value):
            return f"I{i + 1} = {value!r} is not an integer of at most 18 digits"
    for i, value in enumerate(fields[1 + NUM_DENSE:]):
        if not re.fullmatch(_HEX, value):
            return f"C{i + 1} = {value!r} is not hexadecimal"
    return "does not match the Criteo format"


def malformed_line_error(error: tf.errors.OpError,
                         files: Sequence[str]) -> Optional[MalformedLineError]:
    """The MalformedLineError behind a failure of `criteo_dataset(...,
  on_malformed='raise')`, or None if `error` is another failure.

  Reads the files up to the bad line to name its file and line number.
  """
    match = re.search(_MALFORMED_TAG + r"\]?\s*\[(\d+)\]", str(getattr(error, "message", error)))
    if match is None:
        return None
    remaining = int(match.group(1))
    for path in files:
        with _open_text(path) as f:
            for line_number, raw in enumerate(f, start=1):
                if remaining == 0:
                    text = raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8", "replace")
                    return MalformedLineError(path, line_number, describe_malformed(text), text)
                remaining -= 1
    return MalformedLineError(files[-1], -1, "line index past the end of the files", "")
