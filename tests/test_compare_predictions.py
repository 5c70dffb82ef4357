"""scripts/compare_predictions.py: the paired bootstrap of two models' AUCs on the same rows, on
synthetic predictions of known quality, and its command line on a small prepared store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "compare_predictions.py"
sys.path.insert(0, str(REPO / "scripts"))

import compare_predictions as compare  # noqa: E402


def scores(labels: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities that rank the positives higher, the more so the less ``noise``."""
    return 1 / (1 + np.exp(-(labels - 0.5 + noise * rng.standard_normal(labels.size))))


def test_a_better_model_has_an_interval_above_zero_and_a_worse_one_below():
    rng = np.random.default_rng(0)
    labels = (rng.random(2000) < 0.5).astype(np.float64)
    better, worse = scores(labels, 0.5, rng), scores(labels, 1.0, rng)
    r = compare.paired_bootstrap(labels, better, worse, resamples=200, seed=1)
    assert r["rows"] == 2000 and r["auc_a"] > r["auc_b"]
    assert 0 < r["auc_low"] < r["auc_difference"] < r["auc_high"] and r["auc_a_below"] == 0
    assert r["logloss_high"] < 0  # the better model's logloss is lower
    flipped = compare.paired_bootstrap(labels, worse, better, resamples=200, seed=1)
    assert flipped["auc_difference"] == -r["auc_difference"] and flipped["auc_high"] < 0
    assert flipped["auc_low"] == pytest.approx(-r["auc_high"]) and flipped["auc_a_below"] == 1
    assert compare.paired_bootstrap(labels, better, worse, resamples=200, seed=1) == r  # seeded


def test_identical_predictions_differ_by_exactly_zero():
    rng = np.random.default_rng(2)
    labels = (rng.random(500) < 0.3).astype(np.float64)
    p = scores(labels, 1.0, rng)
    r = compare.paired_bootstrap(labels, p, p.copy(), resamples=100)
    assert (r["auc_difference"], r["auc_low"], r["auc_high"]) == (0.0, 0.0, 0.0)
    assert (r["logloss_difference"], r["logloss_low"], r["logloss_high"]) == (0.0, 0.0, 0.0)


def test_resampling_by_groups_takes_each_drawn_group_whole():
    groups = np.array([3, 1, 3, 2, 1, 3, 7])
    resampler = compare.Resampler(groups, seed=5)
    for _ in range(20):
        times = np.bincount(resampler.rows(), minlength=groups.size)
        per_group = [np.unique(times[groups == g]) for g in (1, 2, 3, 7)]
        assert all(t.size == 1 for t in per_group)  # every row of a group drawn as often as the others
        assert sum(int(t[0]) for t in per_group) == 4  # as many groups drawn as there are
    rng = np.random.default_rng(6)
    labels = (rng.random(300) < 0.5).astype(np.float64)
    a, b = scores(labels, 1.0, rng), scores(labels, 2.0, rng)
    plain = compare.paired_bootstrap(labels, a, b, resamples=30, seed=2)
    assert compare.paired_bootstrap(labels, a, b, resamples=30, seed=2, groups=np.arange(300) * 2) == plain
    assert compare.paired_bootstrap(labels, a, b, resamples=30, seed=2, groups=np.arange(300) // 10) != plain


def test_comparisons_average_the_files_then_pair_them_one_by_one():
    rng = np.random.default_rng(3)
    labels = (rng.random(300) < 0.5).astype(np.float64)
    a, b = [scores(labels, 1.0, rng) for _ in range(2)], [scores(labels, 2.0, rng) for _ in range(2)]
    out = compare.comparisons(labels, a, b, resamples=20)
    assert [what for what, _ in out] == ["mean of 2 and 2 files", "file 1 of each", "file 2 of each"]
    assert out[0][1] == compare.paired_bootstrap(labels, (a[0] + a[1]) / 2, (b[0] + b[1]) / 2, resamples=20)
    assert out[2][1] == compare.paired_bootstrap(labels, a[1], b[1], resamples=20)
    assert [what for what, _ in compare.comparisons(labels, a, b[:1], resamples=20)] == ["mean of 2 and 1 files"]


def test_command_line_reads_the_store_labels_and_refuses_a_short_file(tmp_path):
    from des.data import prepare

    rng = np.random.default_rng(4)
    rows = 200
    ratings = rng.integers(1, 6, rows)
    (tmp_path / "rows.csv").write_text("user,item,genres,age,rating\n" + "".join(
        f"u{i % 7},{i % 11},g{i % 3},{20 + i % 30},{r}\n" for i, r in enumerate(ratings)))
    store = prepare(tmp_path / "rows.csv", tmp_path / "store", schema=REPO / "tests" / "data" / "three_fields.toml",
                    split=[0.5, 0.1, 0.4], progress=False)
    labels = store.take_labels(store.split_rows("test")).astype(np.float64)
    np.savetxt(tmp_path / "a.txt", 0.2 + 0.6 * labels)  # a perfect ranking
    np.savetxt(tmp_path / "b.txt", np.full(labels.size, 0.5))
    run = lambda *args: subprocess.run([sys.executable, str(SCRIPT), "--data", str(tmp_path / "store"), *args],  # noqa: E731
                                       capture_output=True, text=True, timeout=120)
    proc = run("--a", f"perfect={tmp_path / 'a.txt'}", "--b", f"flat={tmp_path / 'b.txt'}", "--resamples", "50")
    assert proc.returncode == 0, proc.stderr
    assert f"perfect (A) - flat (B) on the {labels.size} test rows" in proc.stdout
    assert "| one file each | 1.0000 | 0.5000 | +0.5000 [+0.5000, +0.5000] | 0.000 |" in proc.stdout
    proc = run("--a", f"perfect={tmp_path / 'a.txt'}", "--b", f"flat={tmp_path / 'b.txt'}", "--resamples", "50",
               "--cluster", "user")
    assert proc.returncode == 0, proc.stderr
    users = np.unique(np.asarray(store.field("user")[1])[store.split_rows("test")]).size
    assert f"50 paired resamples of user values ({users}) with their rows" in proc.stdout
    assert "| one file each | 1.0000 | 0.5000 | +0.5000 [+0.5000, +0.5000] | 0.000 |" in proc.stdout
    proc = run("--a", f"perfect={tmp_path / 'a.txt'}", "--b", f"flat={tmp_path / 'b.txt'}", "--cluster", "genres")
    assert proc.returncode == 2 and "--cluster genres: not a one-hot field" in proc.stderr
    np.savetxt(tmp_path / "short.txt", np.full(labels.size - 1, 0.5))
    proc = run("--a", f"perfect={tmp_path / 'a.txt'}", "--b", f"flat={tmp_path / 'short.txt'}")
    assert proc.returncode == 2 and f"short.txt: {labels.size - 1} predictions, the split has {labels.size} rows" in proc.stderr
