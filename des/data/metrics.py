"""Exact AUC and log loss (used for the oracle of synthetic data)."""

from __future__ import annotations

import numpy as np


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve, ties counted as one half (equals sklearn's ``roc_auc_score``).

    Returns NaN if only one class is present.
    """
    y = np.asarray(labels).astype(bool)
    s = np.asarray(scores)
    positives = int(np.count_nonzero(y))
    negatives = y.shape[0] - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(s, kind="stable")
    sorted_scores = s[order]
    new_group = np.empty(sorted_scores.shape[0], dtype=bool)
    new_group[0] = True
    np.not_equal(sorted_scores[1:], sorted_scores[:-1], out=new_group[1:])
    group = np.cumsum(new_group) - 1
    starts = np.flatnonzero(new_group)
    ends = np.append(starts[1:], sorted_scores.shape[0])
    mean_rank = (starts + ends + 1) / 2.0  # average of 1-based ranks starts+1 .. ends
    positive_rank_sum = float(mean_rank[group][y[order]].sum())
    return (positive_rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


def log_loss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-12) -> float:
    """Mean binary cross-entropy of probabilities (clipped to [eps, 1 - eps])."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), eps, 1.0 - eps)
    y = np.asarray(labels, dtype=np.float64)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))
