"""Eval metrics of the Criteo benchmark: ROC AUC and log loss.

sklearn's roc_auc_score and log_loss when scikit-learn is installed (request.sh
installs it); otherwise the same quantities in NumPy, so that a machine without
it (the GPU machines have no network) still reports them. The test suite
checks that both agree.
"""
from typing import Tuple

import numpy as np

EPSILON = 1e-7  # probabilities are clipped to [EPSILON, 1 - EPSILON]


def numpy_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic: the chance that a positive
  scores above a negative, ties counting one half (average ranks)."""
    labels = np.asarray(labels).astype(bool)
    scores = np.asarray(scores, np.float64)
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs both classes in labels")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Average 1-based rank of each run of tied scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def numpy_logloss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean binary cross-entropy, probabilities clipped to [EPSILON, 1 - EPSILON]."""
    y = np.asarray(labels, np.float64)
    p = np.clip(np.asarray(probabilities, np.float64), EPSILON, 1 - EPSILON)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def auc_and_logloss(labels: np.ndarray, probabilities: np.ndarray) -> Tuple[float, float]:
    """(ROC AUC, log loss) of probabilities [n] against 0/1 labels [n]."""
    p = np.clip(np.asarray(probabilities, np.float64), EPSILON, 1 - EPSILON)
    try:
        from sklearn.metrics import log_loss, roc_auc_score  # pylint: disable=import-outside-toplevel
    except ImportError:
        return numpy_auc(labels, p), numpy_logloss(labels, p)
    return float(roc_auc_score(labels, p)), float(log_loss(labels, p, labels=[0, 1]))


def auc_of_scores(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of any real-valued scores (logits), unclipped."""
    try:
        from sklearn.metrics import roc_auc_score  # pylint: disable=import-outside-toplevel
    except ImportError:
        return numpy_auc(labels, scores)
    return float(roc_auc_score(labels, scores))
