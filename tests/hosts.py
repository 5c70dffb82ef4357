"""Several hosts on one machine, for tests of jobs that span machines (docs/multi-host.md).

Each emulated host is a network namespace with its own address (``10.77.0.1``, ``10.77.0.2``, ...
on an ``eth0`` plugged into a bridge that lives in a namespace of its own), and each process
started on it runs in its own UTS and mount namespaces: its own hostname (``hosta``, ``hostb``,
...) and its own empty ``/dev/shm``, so MPI and des see separate machines (``MPI_COMM_TYPE_SHARED``
groups the ranks by host, nothing in one host's shared memory is visible from another). Every host
sees the same file system otherwise: the run folders and data go to :attr:`Hosts.shared`, a
folder outside ``/dev/shm`` (conftest puts TMPDIR there, which each host replaces by its own).

A job is the venv's hydra ``mpiexec`` started on the first host, as on a cluster, told to reach
the others through a small launcher written next to the folder (``-launcher ssh -launcher-exec
LAUNCHER``): it is called as ``LAUNCHER [-x] ADDRESS COMMAND...`` like ssh, and runs the command in
that host's namespaces (``ip netns exec`` + ``unshare --uts --mount``). Needs root and iproute2:
:func:`emulated_hosts` skips the test with the reason otherwise. Every namespace, and every process
left in one (a job killed by a timeout), is removed on exit, also when the test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import MPIEXEC, REPO, mpi_env

SUBNET = "10.77.0"
_SETUP_TIMEOUT = 30

_LAUNCHER = """#!/bin/bash
# hydra's ssh launcher, for the emulated hosts: LAUNCHER [-x] ADDRESS COMMAND... (ssh's arguments)
[ "$1" = "-x" ] && shift
address=$1
shift
case "$address" in
{cases}
  *) echo "emulated hosts: no host $address" >&2; exit 255;;
esac
# like ssh, the command's words are joined and read by a shell on the host
exec ip netns exec "$ns" unshare --uts --mount bash -c "hostname $name && mount -t tmpfs tmpfs /dev/shm && $*"
"""


class Hosts:
    """``count`` emulated hosts (see the module docstring); use through :func:`emulated_hosts`."""

    def __init__(self, count: int) -> None:
        tag = f"des-hosts-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        self.names = [f"host{chr(ord('a') + i)}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self.namespaces = [f"{tag}-{name[-1]}" for name in self.names]
        self.switch = f"{tag}-net"
        self._made: list[str] = []  # namespaces created so far (removed by close)
        self.shared = Path(tempfile.mkdtemp(prefix="des-hosts-", dir=_shared_parent()))
        self.launcher = self.shared / "netns-launcher"

    # ----------------------------------------------------------------------------- set-up
    def create(self) -> None:
        """The namespaces, their links and addresses, and the launcher (raises CalledProcessError)."""
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"port{i}", "netns", self.switch)
            _ip("-n", self.switch, "link", "set", f"port{i}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"port{i}", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        cases = "\n".join(f'  {a}) ns={ns}; name={name};;'
                          for a, ns, name in zip(self.addresses, self.namespaces, self.names))
        self.launcher.write_text(_LAUNCHER.format(cases=cases))
        self.launcher.chmod(0o755)

    def close(self) -> None:
        """Kill whatever still runs on the hosts (by pid), then remove the namespaces and the folder."""
        for _ in range(50):
            pids = [pid for ns in self._made for pid in _netns_pids(ns)]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=_SETUP_TIMEOUT)
        self._made.clear()
        shutil.rmtree(self.shared, ignore_errors=True)

    # ----------------------------------------------------------------------------- jobs
    def command(self, ranks_per_host: Sequence[int], args: Sequence[str], mpiexec_flags: Sequence[str] = ()
                ) -> list[str]:
        """``mpiexec`` on the first host running ``python args...`` with ``ranks_per_host[i]`` ranks
        on host i (ranks numbered host by host)."""
        if not 0 < len(ranks_per_host) <= len(self.names):
            raise ValueError(f"{len(ranks_per_host)} hosts asked, {len(self.names)} made")
        hosts = ",".join(f"{a}:{n}" for a, n in zip(self.addresses, ranks_per_host))
        mpiexec = [str(MPIEXEC), "-hosts", hosts, "-launcher", "ssh", "-launcher-exec", str(self.launcher),
                   *mpiexec_flags, "-n", str(sum(ranks_per_host)), sys.executable, *args]
        return ["ip", "netns", "exec", self.namespaces[0], "unshare", "--uts", "--mount", "bash", "-c",
                f'hostname {self.names[0]} && mount -t tmpfs tmpfs /dev/shm && exec "$@"', self.names[0], *mpiexec]

    def run(self, ranks_per_host: Sequence[int], args: Sequence[str], *, timeout: float = 120, check: bool = True
            ) -> subprocess.CompletedProcess:
        """Run a job to its end; fails the test on a timeout (after killing the job) or, with
        ``check``, a non-zero exit."""
        cmd = self.command(ranks_per_host, args)
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=mpi_env(sum(ranks_per_host)), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self.kill_jobs()
            pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n{exc.stdout}\n{exc.stderr}")
        if check and proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def start(self, ranks_per_host: Sequence[int], args: Sequence[str]) -> subprocess.Popen:
        """A job in the background (stdout and stderr piped); :meth:`kill_jobs` ends what is left."""
        return subprocess.Popen(self.command(ranks_per_host, args), cwd=REPO, env=mpi_env(sum(ranks_per_host)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def pids(self, host: int) -> list[int]:
        """The processes running on host ``host`` (its network namespace)."""
        return _netns_pids(self.namespaces[host])

    def kill_jobs(self) -> None:
        """SIGKILL every process on every host (not the namespaces)."""
        for host in range(len(self.names)):
            for pid in self.pids(host):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=_SETUP_TIMEOUT)


def _netns_pids(ns: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=_SETUP_TIMEOUT)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def _shared_parent() -> str:
    """A folder every emulated host sees: the temporary folder unless it is in /dev/shm (each host
    has its own), else /tmp."""
    tmp = os.path.realpath(tempfile.gettempdir())
    return "/tmp" if tmp == "/dev/shm" or tmp.startswith("/dev/shm/") else tmp


def unavailable() -> str | None:
    """Why hosts cannot be emulated here (None: they can, as far as can be told without trying)."""
    if sys.platform != "linux":
        return "emulated hosts need Linux namespaces"
    if os.geteuid() != 0:
        return "emulated hosts need root (network, UTS and mount namespaces)"
    missing = [tool for tool in ("ip", "unshare", "bash") if shutil.which(tool) is None]
    if missing:
        return f"emulated hosts need {', '.join(missing)} (iproute2, util-linux)"
    return None


@contextmanager
def emulated_hosts(count: int) -> Iterator[Hosts]:
    """``count`` hosts, removed on exit; skips the test where they cannot be made."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    hosts = Hosts(count)
    try:
        try:
            hosts.create()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            pytest.skip(f"emulated hosts: cannot make namespaces ({' '.join(str(detail).split())})")
        yield hosts
    finally:
        hosts.close()
