"""A seeded generator of Criteo-format files whose labels come from a planted model.

Categorical features: feature f draws ranks from a Zipf law over its vocabulary
of V_f keys (P(rank r) ~ 1 / (r + 1)^s); rank r becomes an 8-digit hex key
through a bijective 32-bit mix, so keys are distinct and look hashed, as in
Criteo's files. V_f is Criteo Kaggle's distinct count of feature f times
`cardinality_scale`, but never below min(count, 64) (so the small features
keep their handful of values). The default scale keeps Kaggle's ratio of
distinct keys to lines (33.8M keys over 45.8M lines). Some features are
empty on a share of lines, as in Criteo.

Integer features: log-normal counts, floored, with Criteo-like shares of
empty values (and of -1 for I2).

Labels: y ~ Bernoulli(sigmoid(z)), with the planted logit

  z = bias + sum_f w_f[rank_f]   + u[rank_a, rank_b]    + sum_j a_j * log(1 + max(I_j, 0))
             (7 features, hashed  (one pairwise term      (4 integer features, as the
             per-key weights)      of C6 x C17)            reader transforms them)

where w_f and u are fixed N(0, sigma^2) draws per key (per key pair for u),
and an empty value has weight 0. The planted model's AUC on the eval split
is the best any model can reach on it, up to the sampling noise of the
split; `generate` computes it with sklearn and stores it in meta.json.

Deterministic: the same seed and sizes give byte-identical files.
"""
import json
import multiprocessing
import os
from typing import Dict, List, Optional

import numpy as np

from benchmarks.criteo import metrics
from benchmarks.criteo import reader

# Distinct values of C1..C26 in Criteo Kaggle's train.txt (45,840,617 lines).
KAGGLE_CARDINALITIES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                        3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                        142572)
KAGGLE_LINES = 45_840_617
MIN_VOCABULARY = 64
# Share of lines where C_f is empty (0-based f), roughly as in Criteo.
CATEGORICAL_EMPTY = {2: 0.03, 11: 0.03, 15: 0.03, 18: 0.44, 19: 0.44, 21: 0.76, 24: 0.44, 25: 0.44}
# Integer features: (log-normal mu, sigma, share empty).
INTEGER_SHAPE = ((0.8, 1.1, 0.45), (3.0, 1.8, 0.0), (1.9, 1.4, 0.21), (1.5, 1.0, 0.22),
                 (7.5, 1.8, 0.03), (3.8, 1.7, 0.22), (1.4, 1.3, 0.04), (2.4, 1.0, 0.0),
                 (3.8, 1.3, 0.04), (0.4, 0.6, 0.45), (1.0, 0.9, 0.04), (0.3, 0.7, 0.77), (1.6, 1.2,
                                                                                          0.22))
# The planted model: standard deviation of the per-key weights of the 0-based
# categorical features, the pairwise term, the integer coefficients, the bias.
PLANTED_CATEGORICAL = {1: 0.5, 5: 0.6, 8: 0.4, 10: 0.5, 13: 0.5, 16: 0.4, 22: 0.5}
PLANTED_PAIR = (5, 16, 0.5)
PLANTED_INTEGER = {0: 0.35, 3: -0.3, 6: 0.3, 10: 0.35}
PLANTED_BIAS = -2.7  # CTR 0.19 on the default data set (Criteo's: 0.26)
CHUNK_LINES = 100_000
FORMAT_VERSION = 2


def vocabulary_sizes(cardinality_scale: float) -> List[int]:
    """V_f for f = 0..25: max(min(K_f, 64), ceil(K_f * scale)), K = Kaggle's counts."""
    if cardinality_scale <= 0:
        raise ValueError(f"cardinality_scale must be > 0, got {cardinality_scale}")
    return [
        max(min(k, MIN_VOCABULARY), int(np.ceil(k * cardinality_scale)))
        for k in KAGGLE_CARDINALITIES
    ]


def default_cardinality_scale(lines: int) -> float:
    """Keeps Kaggle's distinct keys per line for a data set of `lines` lines."""
    return min(1.0, lines / KAGGLE_LINES)


def _mix32(x):
    """A bijection of uint32 (murmur3's finaliser)."""
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> np.uint32(13)
    x *= np.uint32(0xC2B2AE35)
    x ^= x >> np.uint32(16)
    return x


_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)


def _hex8(keys):
    """uint32 [n] -> 'S8' [n] of 8 lowercase hex digits."""
    shifts = np.arange(28, -4, -4, dtype=np.uint32)
    nibbles = (keys[:, None] >> shifts) & np.uint32(15)
    return np.ascontiguousarray(_HEX_DIGITS[nibbles]).view("S8")[:, 0]


class PlantedModel:
    """The generator's fixed parts for one seed: vocabularies, Zipf CDFs, keys, weights."""

    def __init__(self, seed: int, cardinality_scale: float, zipf: float):
        if zipf <= 0:
            raise ValueError(f"zipf must be > 0, got {zipf}")
        self.seed = seed
        self.vocabulary = vocabulary_sizes(cardinality_scale)
        rng = np.random.default_rng([seed, 0])
        self.cdf, self.keys, self.weights = [], [], {}
        for f, size in enumerate(self.vocabulary):
            p = np.arange(1, size + 1, dtype=np.float64)**-zipf
            self.cdf.append(np.cumsum(p / p.sum()))
            salt = np.uint32(rng.integers(0, 2**32))
            self.keys.append(_mix32(np.arange(size, dtype=np.uint32) + salt))
        for f, sigma in PLANTED_CATEGORICAL.items():
            self.weights[f] = sigma * rng.standard_normal(self.vocabulary[f])
        a, b, sigma = PLANTED_PAIR
        self.pair = sigma * rng.standard_normal((self.vocabulary[a], self.vocabulary[b]))

    def sample(self, rng: np.random.Generator, n: int):
        """n lines: (label [n] int, integers [n, 13] int64, empty_integer [n, 13] bool,
    ranks [n, 26] int64 with -1 for an empty value, logit [n])."""
        integers = np.empty((n, reader.NUM_DENSE), np.int64)
        empty_integer = np.empty((n, reader.NUM_DENSE), bool)
        for j, (mu, sigma, empty) in enumerate(INTEGER_SHAPE):
            integers[:, j] = np.floor(np.exp(rng.normal(mu, sigma, n))).astype(np.int64)
            empty_integer[:, j] = rng.random(n) < empty
        integers[:, 1] -= rng.random(n) < 0.02  # I2 holds a few -1 and -2 in Criteo
        ranks = np.empty((n, reader.NUM_CATEGORICAL), np.int64)
        for f, cdf in enumerate(self.cdf):
            ranks[:, f] = np.minimum(np.searchsorted(cdf, rng.random(n)), len(cdf) - 1)
            if f in CATEGORICAL_EMPTY:
                ranks[rng.random(n) < CATEGORICAL_EMPTY[f], f] = -1
        logit = self.logit(integers, empty_integer, ranks)
        label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
        return label, integers, empty_integer, ranks, logit

    def logit(self, integers, empty_integer, ranks):
        """The planted z of each line (the reader's view: empty integer = 0)."""
        z = np.full(len(ranks), PLANTED_BIAS)
        dense = np.log1p(np.maximum(np.where(empty_integer, 0, integers), 0))
        for j, coefficient in PLANTED_INTEGER.items():
            z += coefficient * dense[:, j]
        for f, weights in self.weights.items():
            present = ranks[:, f] >= 0
            z[present] += weights[ranks[present, f]]
        a, b, _ = PLANTED_PAIR
        present = (ranks[:, a] >= 0) & (ranks[:, b] >= 0)
        z[present] += self.pair[ranks[present, a], ranks[present, b]]
        return z

    def format_lines(self, label, integers, empty_integer, ranks) -> bytes:
        """The lines as Criteo text, each ending with a newline."""
        columns = [label.astype("S1")]
        for j in range(reader.NUM_DENSE):
            columns.append(np.where(empty_integer[:, j], b"", integers[:, j].astype("S20")))
        for f, keys in enumerate(self.keys):
            hexes = _hex8(keys[np.maximum(ranks[:, f], 0)])
            columns.append(np.where(ranks[:, f] >= 0, hexes, b""))
        return _join_lines(columns)


def _join_lines(columns) -> bytes:
    """Joins [n] bytes columns with tabs into newline-ended lines, vectorised:
  every field is laid out at its full width in one [n, width] byte matrix and
  a mask keeps its real bytes."""
    n = len(columns[0])
    blocks, masks = [], []
    for i, column in enumerate(columns):
        width = column.dtype.itemsize
        blocks.append(column.view(np.uint8).reshape(n, width))
        masks.append(np.arange(width) < np.strings.str_len(column)[:, None])
        separator = b"\n" if i == len(columns) - 1 else b"\t"
        blocks.append(np.full((n, 1), separator[0], np.uint8))
        masks.append(np.ones((n, 1), bool))
    return np.concatenate(blocks, axis=1)[np.concatenate(masks, axis=1)].tobytes()


_MODELS = {}


def _chunk(task):
    """One chunk of lines: (text, labels, logits). Runs in a worker process."""
    seed, cardinality_scale, zipf, split_index, chunk, n = task
    key = (seed, cardinality_scale, zipf)
    if key not in _MODELS:
        _MODELS[key] = PlantedModel(seed, cardinality_scale, zipf)
    model = _MODELS[key]
    rng = np.random.default_rng([seed, 1 + split_index, chunk])
    label, integers, empty_integer, ranks, logit = model.sample(rng, n)
    return model.format_lines(label, integers, empty_integer, ranks), label, logit


def generate(directory: str,
             train_lines: int,
             eval_lines: int,
             seed: int = 0,
             cardinality_scale: Optional[float] = None,
             zipf: float = 1.1,
             processes: int = 1,
             progress=None) -> Dict:
    """Writes train.txt, eval.txt and meta.json into `directory`, unless
  meta.json there already describes the same data; returns the metadata.

  Args:
    directory: output folder (created).
    train_lines, eval_lines: lines per split (>= 1).
    seed: the data set's seed.
    cardinality_scale: V_f = Kaggle's count times this (None: keep Kaggle's
      keys per line, `default_cardinality_scale(train_lines + eval_lines)`).
    zipf: the Zipf exponent s of every categorical feature.
    processes: chunks generated in parallel by this many forked processes
      (the files do not depend on it). Fork before TensorFlow starts its
      runtime (its threads do not survive a fork).
    progress: optional callable(lines_written) for a progress display.

  Returns:
    meta.json's dict: the arguments, `vocabulary` (V_f), `files`, and the
    planted model's `auc`, `logloss` and `ctr` on each split (`planted`).

  Raises:
    ValueError: a size or parameter out of range.
  """
    if train_lines < 1 or eval_lines < 1:
        raise ValueError(f"train_lines and eval_lines must be >= 1, got {train_lines}, "
                         f"{eval_lines}")
    if cardinality_scale is None:
        cardinality_scale = default_cardinality_scale(train_lines + eval_lines)
    arguments = dict(format_version=FORMAT_VERSION,
                     train_lines=train_lines,
                     eval_lines=eval_lines,
                     seed=seed,
                     cardinality_scale=cardinality_scale,
                     zipf=zipf)
    meta_path = os.path.join(directory, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if {
                k: meta.get(k) for k in arguments
        } == arguments and all(os.path.exists(p) for p in meta["files"].values()):
            return meta
    os.makedirs(directory, exist_ok=True)
    model = PlantedModel(seed, cardinality_scale, zipf)  # checks the arguments
    meta = dict(arguments, vocabulary=model.vocabulary, files={}, planted={})
    pool = multiprocessing.get_context("fork").Pool(processes) if processes > 1 else None
    try:
        for split_index, (split, lines) in enumerate([("train", train_lines),
                                                      ("eval", eval_lines)]):
            path = os.path.join(directory, f"{split}.txt")
            tasks = [(seed, cardinality_scale, zipf, split_index, chunk,
                      min(CHUNK_LINES, lines - start))
                     for chunk, start in enumerate(range(0, lines, CHUNK_LINES))]
            chunks = pool.imap(_chunk, tasks) if pool else map(_chunk, tasks)
            labels, logits = [], []
            with open(path + ".partial", "wb") as out:
                for text, label, logit in chunks:
                    out.write(text)
                    labels.append(label)
                    logits.append(logit)
                    if progress is not None:
                        progress(len(label))
            os.replace(path + ".partial", path)
            label, logit = np.concatenate(labels), np.concatenate(logits)
            meta["files"][split] = path
            both_classes = 0 < label.sum() < len(label)
            meta["planted"][split] = dict(
                auc=metrics.auc_of_scores(label, logit) if both_classes else None,
                logloss=metrics.numpy_logloss(label, 1.0 / (1.0 + np.exp(-logit))),
                ctr=float(label.mean()))
    finally:
        if pool:
            pool.close()
            pool.join()
    with open(meta_path + ".partial", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".partial", meta_path)
    return meta
