"""Fill an empty numba cache with the table kernels the suite runs, before its first test
(``tests/conftest.py`` runs this for a whole-suite run on a cold cache, in one process per core).

A table kernel compiles once per machine (``cache=True``, des/__pycache__), in whichever process
needs it first, on one core: on a fresh checkout the fused lookup, gather and update kernels cost
tens of seconds each per row dtype and index layout, paid one after the other by the first tests
that train while the other core mostly waits. Here the kinds of rows are spread over the cores:
a few steps of DeepFM on one rank per kind, with the linear, embedding and dense optimizers'
kernels and the evaluation's. Nothing here is asserted and nothing depends on it: a kernel left
out compiles in the first test that needs it, as it would without this.

    .venv/bin/python -m tests.warm_numba STORE PART PARTS   # RUNS[PART::PARTS] on a prepared store
"""

from __future__ import annotations

import sys
from pathlib import Path

#: one run per kind of table rows (float32, float64 and 16-bit values; index with counters or
#: compact)
COMPACT = ("--table-layout", "compact", "--min-count", "1", "--unadmitted", "init")
BFLOAT16 = ("--dtype", "float32", "--table-dtype", "bfloat16", "--embedding-optimizer", "adam:lr=0.01")
RUNS = (
    ("--dtype", "float32"),
    ("--dtype", "float64"),  # (the default Adam with catch-up: its catch-up kernel too)
    BFLOAT16,
    ("--dtype", "float32", *COMPACT),
    ("--dtype", "float64", *COMPACT),
    (*BFLOAT16, *COMPACT),
)


def train_args(store: Path, output: Path, flags: tuple[str, ...]) -> list[str]:
    """des.train's flags for one run of :data:`RUNS` on a prepared ``store``: 2 small steps, then
    the validation and test predictions (the evaluation's kernels too)."""
    return ["--model", "deepfm", "--data", str(store), "--output", str(output), "--embedding-dim", "4",
            "--hidden", "8", "--batch-size", "64", "--eval-batch-size", "512", "--epochs", "0", "--max-steps", "2",
            "--early-stop", "0", "--no-progress", "--threads", "1", *flags]


def prepare_store(root: Path) -> Path:
    """600 rows of the shipped Criteo sample, prepared once for every part (the data kernels
    compile here)."""
    from des.data import prepare
    from tests.conftest import criteo_head

    return prepare(criteo_head(root / "head.tsv", 600), root / "store", split=(0.9, 0.05, 0.05), seed=1).path


def main(argv: list[str]) -> int:
    from des import train

    store, part, parts = Path(argv[0]), int(argv[1]), int(argv[2])
    for i, flags in enumerate(RUNS[part::parts]):
        train.main(train_args(store, store.parent / f"run{part}-{i}", flags))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
