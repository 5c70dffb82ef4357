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
    """2 ranks (once untimed before, --first-use), then one rank under taskset on the cores each of
    the 2 has (where taskset and 2 cores are): a row each, the same store, file for file, and each
    row's ratio to both."""
    process = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_prepare.py"), "--rows", "3000", "--ranks",
                              "2", "--kinds", "csv", "--parts", "2", "--workdir", str(tmp_path / "work")],
                             capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    assert "first use: csv on 2 rank(s) once, untimed" in process.stdout  # --first-use: not a row of the table
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


def test_one_process_rounds_and_medians(tmp_path):
    """Without --ranks: the four measurements in turn for --rounds rounds, each row every round's
    seconds and their median, rows/s at the median and the ratio to pandas's; --rounds 0 refused."""
    script = str(REPO / "scripts" / "bench_prepare.py")
    refused = subprocess.run([sys.executable, script, "--rounds", "0"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--rounds 0: expected at least 1" in refused.stderr
    process = subprocess.run([sys.executable, script, "--rows", "2000", "--rounds", "2", "--workdir",
                              str(tmp_path / "work")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    assert [line.split(", ")[1].split(":")[0] for line in process.stdout.splitlines()
            if line.startswith("  round ")] == ["prepare csv", "prepare parquet", "prepare criteo", "pandas read_csv"] * 2
    header = [name.strip() for name in process.stdout.split("\n| what |")[1].split("\n")[0].split("|")[:-1]]
    header = ["what", *header]
    rows = {row[0].strip(): row for row in (line.split("|")[1:-1] for line in process.stdout.splitlines()
                                            if line.startswith("| prepare ") or line.startswith("| pandas "))}
    assert list(rows) == ["prepare csv", "prepare parquet", "prepare criteo", "pandas read_csv"]
    pandas_rate = float(rows["pandas read_csv"][header.index("rows/s")].replace(",", ""))
    for row in rows.values():
        rounds = [float(s) for s in row[header.index("rounds (s)")].split(" / ")]
        median = float(row[header.index("median s")])
        rate = float(row[header.index("rows/s")].replace(",", ""))
        assert len(rounds) == 2 and median == pytest.approx(sum(rounds) / 2, abs=0.006)
        assert 2000 / (median + 0.005) <= rate <= 2000 / max(median - 0.005, 1e-9)  # seconds printed to 0.01
        assert float(row[header.index("x pandas")]) == pytest.approx(rate / pandas_rate, abs=0.01)
    assert float(rows["pandas read_csv"][header.index("x pandas")]) == 1.0
    assert not (tmp_path / "work").exists()
