"""``scripts/bench_prepare.py --ranks``: preparing on a job's ranks against one rank, in one run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.mpi
def test_ranks_against_one_rank_free_and_on_a_ranks_cores(tmp_path):
    """2 ranks, then one rank under taskset on the cores each of the 2 has (where taskset and 2
    cores are): a row each, the same store, file for file, and each row's ratio to both."""
    process = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_prepare.py"), "--rows", "3000", "--ranks",
                              "2", "--kinds", "csv", "--parts", "2", "--workdir", str(tmp_path / "work")],
                             capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    rows = [line.split("|")[1:-1] for line in process.stdout.splitlines() if line.startswith("| prepare csv |")]
    pinned = len(os.sched_getaffinity(0)) // 2 if shutil.which("taskset") else 0
    where = f"1 (on {pinned} core{'s' if pinned > 1 else ''})"
    assert [row[1].strip() for row in rows] == ["2"] + ([where] if pinned else [])
    assert all(row[-1].strip() == "yes" for row in rows)
    if pinned:
        header = [name.strip() for name in process.stdout.split("\n| what |")[1].split("\n")[0].split("|")[:-1]]
        header = ["what", *header]
        ratios = [float(row[header.index(f"x 1 rank on {where[6:-1]}")]) for row in rows]
        speeds = [float(row[header.index("rows/s")].replace(",", "")) for row in rows]
        assert ratios[1] == 1.0 and ratios[0] == pytest.approx(speeds[0] / speeds[1], abs=0.01)
    assert not (tmp_path / "work").exists()  # the run made it: nothing left behind
