"""Our exact AUC and logloss equal scikit-learn's on the same predictions, ties included."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from des.errors import DesError
from des.metrics import logloss, roc_auc


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 5000))
    labels = rng.random(n) < 0.25
    labels[:2] = [True, False]
    scores = rng.random(n)
    if seed % 2:  # heavy ties
        scores = np.round(scores * 7) / 7
    scores = scores + 0.3 * labels * (seed % 3)
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auc_edge_cases() -> None:
    assert roc_auc([0, 1], [0.1, 0.9]) == 1.0
    assert roc_auc([0, 1], [0.9, 0.1]) == 0.0
    assert roc_auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
    with pytest.raises(DesError, match="only one class"):
        roc_auc([1, 1, 1], [0.1, 0.2, 0.3])


def test_logloss_matches_sklearn() -> None:
    rng = np.random.default_rng(0)
    labels = rng.random(1000) < 0.3
    p = rng.random(1000)
    assert logloss(labels, p) == pytest.approx(log_loss(labels, p), rel=1e-9)
    assert np.isfinite(logloss([1, 0], [0.0, 1.0]))  # clipped, not infinite
