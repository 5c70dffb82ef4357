"""Jobs that span hosts, on emulated hosts of this machine (tests/hosts.py: network namespaces
joined by a bridge, each host with its own hostname and /dev/shm, hydra reaching them through a
launcher as it would through ssh; skipped where namespaces cannot be made).

One job on 2 hosts x 2 ranks (DeepFM, float64, every operator exchanged) trains what 1 rank trains
and writes a checkpoint midway; that checkpoint, written by ranks of two hosts, resumed on 1 rank
and on 3 hosts with 2, 1 and 1 ranks (partial sums: the reduce-scatter and all-gather between
hosts) ends where the straight 1-rank run ends. The start-up report names the hosts and each
rank's process; the row-block collectives use node memory among the ranks of one host and MPI
between hosts; a rank killed on the second host ends the whole job within seconds, with the
launcher's reason.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import criteo_head, run_here
from tests.hosts import Hosts, emulated_hosts
from tests.test_train import assert_checkpoints_equal

pytestmark = pytest.mark.mpi

SMALL = ["--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "256", "--eval-batch-size", "1024",
         "--no-progress", "--table-capacity", "256"]
DEEPFM = ["--model", "deepfm", "--dtype", "float64", "--max-steps", "6", "--checkpoint-every", "3"]


@pytest.fixture(scope="module")
def hosts() -> Hosts:
    with emulated_hosts(3) as made:
        criteo_head(made.shared / "small.tsv", 2000)
        yield made


def train_args(hosts: Hosts, output: str, *flags: str) -> list[str]:
    return ["-m", "des.train", "--data", str(hosts.shared / "small.tsv"), "--cache-dir", str(hosts.shared / "cache"),
            "--output", str(hosts.shared / output), *SMALL, *flags]


def summary(hosts: Hosts, output: str) -> dict:
    return json.loads((hosts.shared / output / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(hosts: Hosts) -> dict[str, str]:
    """The jobs' standard outputs: 2 hosts x 2 ranks straight (--plan exchange), its step-3
    checkpoint resumed on 1 rank and on 3 hosts with 2, 1 and 1 ranks (--plan partials), 1 rank straight."""
    out = {"one": run_here(train_args(hosts, "one", *DEEPFM)).stdout,
           "two_hosts": hosts.run([2, 2], train_args(hosts, "two_hosts", *DEEPFM, "--plan", "exchange")).stdout}
    midway = str(hosts.shared / "two_hosts" / "checkpoints" / "step-00000003")
    out["resumed_one"] = run_here(train_args(hosts, "resumed_one", *DEEPFM, "--resume", midway)).stdout
    out["resumed_three_hosts"] = hosts.run([2, 1, 1], train_args(hosts, "resumed_three_hosts", *DEEPFM, "--plan",
                                                                 "partials", "--resume", midway)).stdout
    return out


def test_two_hosts_train_what_one_rank_trains(hosts: Hosts, runs: dict[str, str]) -> None:
    out = runs["two_hosts"]
    assert "  hosts: 2 (hosta: 2 rank(s) 0-1, hostb: 2 rank(s) 2-3)" in out.splitlines(), out
    assert re.search(r"processes: rank 0 pid \d+ on hosta, rank 1 pid \d+ on hosta, rank 2 pid \d+ on hostb, "
                     r"rank 3 pid \d+ on hostb", out), out
    assert_checkpoints_equal(hosts.shared / "one" / "checkpoints", hosts.shared / "two_hosts" / "checkpoints")
    s = summary(hosts, "two_hosts")
    assert s["ranks"] == 4 and s["steps"] == 6 and set(s["plan"].values()) == {"exchange"}
    sent = s["bytes_per_step_by_site"]
    assert sent["exchange_values"] > 0 and sent["exchange_gradients"] > 0
    assert s["test_logloss"] == pytest.approx(summary(hosts, "one")["test_logloss"], rel=1e-9)


@pytest.mark.parametrize("name", ["resumed_one", "resumed_three_hosts"])
def test_a_checkpoint_of_two_hosts_resumes_anywhere(hosts: Hosts, runs: dict[str, str], name: str) -> None:
    assert_checkpoints_equal(hosts.shared / "one" / "checkpoints", hosts.shared / name / "checkpoints")
    s = summary(hosts, name)
    assert s["steps"] == 6 and s["steps_this_run"] == 3
    assert s["test_logloss"] == pytest.approx(summary(hosts, "one")["test_logloss"], rel=1e-9)
    if name == "resumed_three_hosts":
        assert "  hosts: 3 (hosta: 2 rank(s) 0-1, hostb: 1 rank(s) 2, hostc: 1 rank(s) 3)" in runs[name].splitlines()
        sent = s["bytes_per_step_by_site"]
        assert s["ranks"] == 4 and set(s["plan"].values()) == {"partials"}
        assert sent["partials_reduce_scatter"] > 0 and sent["gradient_allgather"] > 0 and sent["exchange_values"] == 0


def test_node_memory_within_a_host_not_across(hosts: Hosts) -> None:
    """The row-block collectives of a communicator whose ranks share one host go through node
    memory (one segment set per host, in that host's /dev/shm), those of the whole job through MPI;
    both give the same sums (tests/mpi_programs/collectives_body.py)."""
    proc = hosts.run([2, 2], ["-m", "tests.mpi_programs.node_memory_hosts"], timeout=60)
    lines = sorted(re.findall(r"rank (\d) on (\w+): job node memory (\w+) segments (\S+); host ranks 2 node "
                              r"memory (\w+) segments (\S+) end", proc.stdout))
    assert len(lines) == 4, proc.stdout
    segments = {}
    for rank, line in enumerate(lines):
        assert line[:4] == (str(rank), "hosta" if rank < 2 else "hostb", "False", "-"), line
        assert line[4] == "True" and line[5] != "-", line
        segments[rank] = set(line[5].split(","))
    assert segments[0] == segments[1] and segments[2] == segments[3]  # shared by a host's ranks
    assert not segments[0] & segments[2]  # and each host has its own


def cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:  # ended meanwhile
        return ""


def test_a_rank_killed_on_another_host_ends_the_job(hosts: Hosts) -> None:
    output = hosts.shared / "killed"
    job = hosts.start([1, 1], train_args(hosts, "killed", "--model", "lr", "--epochs", "100000", "--early-stop", "0"))
    try:
        deadline = time.monotonic() + 120
        while not (output / "config.json").exists():  # training has started
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        ranks = [p for p in hosts.pids(1) if "des.train" in cmdline(p)]
        assert len(ranks) == 1, ranks
        killed_at = time.monotonic()
        psutil.Process(ranks[0]).send_signal(signal.SIGKILL)
        job.wait(timeout=10)  # generous: it takes well under a second
        assert job.returncode != 0
        out, err = job.communicate()
        # The launcher names the killed process and its host; des's start-up line maps it to rank 1.
        assert re.search(rf"processes: rank 0 pid \d+ on hosta, rank 1 pid {ranks[0]} on hostb", out), out
        assert f"PID {ranks[0]} RUNNING AT {hosts.addresses[1]}\n=   EXIT CODE: 9" in out, out
        # nothing left on either host (the launcher's last processes end as it returns)
        while (left := [p for host in range(2) for p in hosts.pids(host)]) and time.monotonic() < killed_at + 10:
            time.sleep(0.05)
        assert not left, [cmdline(p) for p in left]
    finally:
        if job.poll() is None:
            hosts.kill_jobs()
            job.wait()
