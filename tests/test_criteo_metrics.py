"""The benchmark's metrics (benchmarks/criteo/metrics.py) equal sklearn's.

The NumPy fallback (used where scikit-learn is missing) must give
roc_auc_score and log_loss, ties and clipping included.
"""
import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from benchmarks.criteo import metrics


@pytest.mark.parametrize("distinct_scores", [1000, 7])  # 7: many ties
def test_numpy_auc_and_logloss_equal_sklearn(rng, distinct_scores):
    labels = (rng.random(1000) < 0.3).astype(np.int64)
    p = np.round(rng.random(1000) * (distinct_scores - 1)) / (distinct_scores - 1)
    p = np.clip(p + 0.2 * labels * rng.random(1000), 0, 1)  # some signal, exact 0 and 1
    assert metrics.numpy_auc(labels, p) == pytest.approx(roc_auc_score(labels, p), abs=1e-12)
    clipped = np.clip(p, metrics.EPSILON, 1 - metrics.EPSILON)
    assert metrics.numpy_logloss(labels, p) == pytest.approx(log_loss(labels, clipped), rel=1e-9)
    auc, logloss = metrics.auc_and_logloss(labels, p)
    assert (auc, logloss) == pytest.approx(
        (metrics.numpy_auc(labels, clipped), metrics.numpy_logloss(labels, p)), rel=1e-9)


def test_auc_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        metrics.numpy_auc(np.ones(4), np.arange(4.0))
