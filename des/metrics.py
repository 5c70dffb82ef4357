"""Exact evaluation metrics over a whole split (not averaged over batches): the ground floor,
arrays in, numbers out (a split's predictions by a strategy are :mod:`des.predictions`).

:func:`roc_auc` is the Mann-Whitney statistic with ties counted as one half, which is exactly what
``sklearn.metrics.roc_auc_score`` computes (the trapezoid under the ROC curve), in
``O(n log n)`` and without scikit-learn at run time.
"""

from __future__ import annotations

import sys

import numpy as np

from des.errors import DesError

_EPS = 1e-7  # clip for logloss, as Keras' binary cross-entropy does


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve; raises when only one class is present."""
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if labels.shape != scores.shape:
        raise ValueError("labels and scores differ in length")
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        raise DesError(f"AUC is undefined: the evaluated rows have only one class ({labels.size} rows)")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Average ranks (1-based) of tied groups.
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [scores.size]])
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(scores.size)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    rank_sum = ranks[labels].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


_warned: set[str] = set()


def auc_or_none(labels: np.ndarray, scores: np.ndarray, what: str = "", warn: bool = True) -> float | None:
    """:func:`roc_auc`, or ``None`` (reported as n/a, ``null`` in JSON) when the rows have only
    one class (a small split): a warning once per ``what`` instead of failing a finished run."""
    labels = np.asarray(labels).ravel()
    positives = int(np.count_nonzero(labels))
    if 0 < positives < labels.size:
        return roc_auc(labels, scores)
    if warn and what not in _warned:
        _warned.add(what)
        only = "no rows" if labels.size == 0 else f"only {'positive' if positives else 'negative'} labels"
        print(f"warning: AUC is undefined on {what or 'the evaluated rows'} ({labels.size} rows, {only}); "
              "reported as n/a", file=sys.stderr, flush=True)
    return None


def logloss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean binary cross-entropy, probabilities clipped to ``[1e-7, 1 - 1e-7]``."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probabilities, dtype=np.float64).ravel(), _EPS, 1.0 - _EPS)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))
