"""Thread set-up per rank (``des.runtime.configure_threads``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a thread count other than numba's default")
def test_numba_compiles_after_threads_are_set_with_several_ranks_per_machine(tmp_path) -> None:
    """A rank that imported numba (the data reader does) and then had its threads sized for
    several ranks on the machine must still compile kernels: numba re-reads NUMBA_NUM_THREADS
    before every compilation and refuses a value other than its running pool's. Regression: every
    multi-rank job on a cold numba cache (a fresh install) died with "Cannot set
    NUMBA_NUM_THREADS to a different value once the threads have been launched"."""
    program = textwrap.dedent("""
        import os
        import numba  # imported first, as des.train's data reader does
        from des import runtime
        runtime.node_position = lambda: (0, (os.cpu_count() or 1) + 1)  # more ranks than cores: 1 thread each
        threads = runtime.configure_threads()
        assert threads.numba == 1, threads
        add_one = numba.njit(lambda x: x + 1)  # a compilation after the pool started
        assert add_one(1) == 2
        print("compiled")
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba-cache")
    proc = subprocess.run([sys.executable, "-c", program], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stdout + proc.stderr


def test_onednn_is_on_where_the_cpu_has_avx512_and_a_core_per_rank() -> None:
    """des's oneDNN default: on with AVX-512 (faster float32, bf16 kernels) unless the ranks on the
    machine outnumber its cores in float32 (slower there), off on AVX2 (slower there)."""
    from des._tensorflow_env import cpu_flags, launcher_local_ranks, onednn_default

    avx512 = {"avx2", "avx512f", "avx512_bf16"}
    assert onednn_default({"sse4_2", "avx2", "fma"}, 1, 2) == "0"
    assert onednn_default(avx512, 1, 2) == "1" and onednn_default(avx512, 2, 2) == "1"
    assert onednn_default(avx512, 4, 2, bfloat16=False) == "0"
    assert onednn_default(avx512, 4, 2, bfloat16=True) == "1"  # Eigen's bf16 was ~8x slower
    assert onednn_default({"avx2"}, 1, 2, bfloat16=True) == "0"
    assert launcher_local_ranks({"MPI_LOCALNRANKS": "4"}) == 4  # MPICH's Hydra, Intel MPI
    assert launcher_local_ranks({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}) == 3  # Open MPI
    assert launcher_local_ranks({}) == 1
    assert onednn_default(bfloat16=False) == ("1" if "avx512f" in cpu_flags() else "0")  # this process: one rank


def test_tensorflow_banner_is_dropped_and_nothing_else(capfd) -> None:
    """TensorFlow's import prints its oneDNN banner before its log level applies: des drops those
    lines from fd 2 and writes every other line back, in order."""
    from des._tensorflow_env import stderr_without

    with stderr_without():
        os.write(2, b"I0000 00:00:1 1 port.cc:153] oneDNN custom operations are on. You may see slightly ...\n")
        os.write(2, b"a real problem\n")
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"another line\n")
    assert capfd.readouterr().err == "a real problem\nanother line\n"


def test_a_process_started_by_des_decides_onednn_again_unless_the_user_chose() -> None:
    """des marks the value it put in TF_ENABLE_ONEDNN_OPTS: a child (a benchmark's 4-rank job)
    inheriting it decides again for its own rank count; a value the user set is kept."""
    from des._tensorflow_env import DEFAULT_MARK, onednn_chosen_by_user

    assert not onednn_chosen_by_user({})
    assert not onednn_chosen_by_user({"TF_ENABLE_ONEDNN_OPTS": "1", DEFAULT_MARK: "1"})
    assert onednn_chosen_by_user({"TF_ENABLE_ONEDNN_OPTS": "0", DEFAULT_MARK: "1"})
    assert onednn_chosen_by_user({"TF_ENABLE_ONEDNN_OPTS": "1"})


def test_the_start_up_report_names_the_onednn_setting_it_can_know() -> None:
    from des._tensorflow_env import onednn_setting

    assert onednn_setting({"TF_ENABLE_ONEDNN_OPTS": "1"}) == "on"
    assert onednn_setting({"TF_ENABLE_ONEDNN_OPTS": "0"}) == "off"
    assert onednn_setting({}) == "TensorFlow's default"  # TensorFlow loaded before des decided


def test_a_bfloat16_job_keeps_onednn_where_ranks_share_cores() -> None:
    """des.train tells the coming TensorFlow import that it computes in bf16 (Eigen's bf16 was ~8x
    slower than oneDNN's on AVX-512): with 4 ranks on 2 cores oneDNN then stays on. In a child
    process: the choice is per process, before TensorFlow loads."""
    code = textwrap.dedent("""
        from des import _tensorflow_env as env, train
        from des.config import load_config
        avx512 = {"avx512f", "avx512_bf16"}
        before = env.onednn_default(avx512, local_ranks=4, cores=2)
        train.before_tensorflow(load_config(["--compute-dtype", "bfloat16"]))
        print(before, env.onednn_default(avx512, local_ranks=4, cores=2))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]


_STEP_PATTERN = """
import resource, sys
import numpy as np
from des import runtime
if sys.argv[1] == "keep":
    print(runtime.keep_freed_memory())
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():  # what a step does: a few arrays of several MB allocated, filled and freed
    a = np.ones(1 << 20)
    b = np.ones(3 << 19)
    del a
    c = np.ones(1 << 21)
    del b, c
for _ in range(3):
    step()
start = faults()
for _ in range(20):
    step()
print((faults() - start) / 20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_step_reuses_the_pages_the_previous_step_freed() -> None:
    """keep_freed_memory: arrays of 8-16 MB allocated and freed every step fault ~1,500 pages per
    step back in under glibc's defaults (freed to the kernel, zero-filled again on the next
    write), and none once des keeps freed memory in the process."""
    def faults_per_step(mode: str) -> tuple[float, str]:
        out = subprocess.run([sys.executable, "-c", _STEP_PATTERN, mode], cwd=REPO, capture_output=True, text=True,
                             timeout=120, env={k: v for k, v in os.environ.items()
                                  if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"})
        assert out.returncode == 0, out.stderr
        *said, faults = out.stdout.split("\n")[:-1]
        return float(faults), " ".join(said)

    default, _ = faults_per_step("default")
    kept, said = faults_per_step("keep")
    assert default > 500, f"the pattern no longer faults under this C library's defaults ({default}/step)"
    assert "freed memory kept" in said, said
    assert kept < 20, f"{kept} page faults per step with freed memory kept"


def test_the_start_up_report_says_what_became_of_the_heap(monkeypatch) -> None:
    from des import runtime

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert runtime.keep_freed_memory() == "malloc as the environment sets it"  # the user's setting wins
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert runtime.keep_freed_memory() == "malloc as the environment sets it"


def test_cores_to_pin_gives_each_rank_its_own_run_of_cores_and_keeps_a_launchers_binding() -> None:
    """``--pin-cores on``: the i-th rank of a machine binds to the i-th run of T of the cores the
    ranks share (one rank too; a container's cores for the whole job are shared), ranks a launcher
    bound one by one keep that binding, ranks that do not fit are refused; ``off`` never binds."""
    from des.errors import ConfigError
    from des.runtime import cores_to_pin

    every = range(16)
    assert cores_to_pin("on", 2, 3, 8, every, True)[0] == [6, 7]
    assert cores_to_pin("on", 2, 0, 8, every, True)[0] == [0, 1]
    assert cores_to_pin("on", 4, 1, 4, every, True)[0] == [4, 5, 6, 7]
    assert cores_to_pin("on", 2, 0, 1, every, True)[0] == [0, 1]
    assert cores_to_pin("on", 1, 15, 16, every, True)[0] == [15]
    assert cores_to_pin("on", 2, 1, 2, [8, 9, 12, 13], True)[0] == [12, 13]  # a container's cores, in order
    mine, why = cores_to_pin("on", 2, 1, 8, [2, 3], False)
    assert mine is None and "launcher" in why and "2-3" in why
    mine, why = cores_to_pin("off", 2, 3, 8, every, True)
    assert mine is None and "off" in why
    with pytest.raises(ConfigError, match=r"--pin-cores on: 8 rank\(s\) x 4 thread\(s\) need 32 cores"):
        cores_to_pin("on", 4, 0, 8, every, True)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores this process may bind to")
def test_pinned_ranks_run_every_thread_on_cores_of_their_own() -> None:
    """Two ranks with ``--pin-cores on``: each rank's threads, those started before the binding
    too, run on its own core, and the two ranks' cores differ; the cores the job may use (what
    the planner counts) are recorded as they were before the binding."""
    from tests.conftest import run_mpi

    program = textwrap.dedent("""
        import os, threading
        from mpi4py import MPI
        from des import runtime
        seen, go = {}, threading.Event()
        def before():
            go.wait()
            seen["before"] = sorted(os.sched_getaffinity(0))
        started = threading.Thread(target=before)
        started.start()
        usable = len(os.sched_getaffinity(0))
        threads = runtime.configure_threads(1, "on")
        assert threads.usable == usable >= 2, (threads.usable, usable)  # the job's cores, before the binding
        go.set(); started.join()
        later = threading.Thread(target=lambda: seen.__setitem__("after", sorted(os.sched_getaffinity(0))))
        later.start(); later.join()
        mine = sorted(os.sched_getaffinity(0))
        assert seen["before"] == seen["after"] == mine and len(mine) == 1, (seen, mine)
        assert "bound to" in threads.pinning, threads.pinning
        cores = MPI.COMM_WORLD.allgather(mine[0])
        assert len(set(cores)) == 2, cores
        print("bound", cores)
    """)
    proc = run_mpi(2, ["-c", program], timeout=120)
    assert proc.stdout.count("bound") == 2, proc.stdout + proc.stderr


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores this process may bind to")
def test_ranks_a_launcher_bound_one_by_one_keep_their_cores() -> None:
    """Two ranks each already on a core of its own (as ``mpiexec --bind-to core`` leaves them):
    ``--pin-cores on`` sees that their cores differ and keeps them. Both on the same fewer cores
    than the machine has (a container's, a batch system's for the whole job) count as shared."""
    from tests.conftest import run_mpi

    program = textwrap.dedent("""
        import os
        from des import runtime
        index, ranks = runtime.node_position()
        every = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, every[:1])  # the job's cores, fewer than the machine's
        assert runtime.same_cores_on_the_machine(os.sched_getaffinity(0))
        os.sched_setaffinity(0, every)
        core = every[index]
        os.sched_setaffinity(0, [core])  # the launcher's binding
        what = runtime.pin_cores("on", 1, index, ranks)
        assert "bound by the launcher" in what and sorted(os.sched_getaffinity(0)) == [core], what
        print("kept", core)
    """)
    proc = run_mpi(2, ["-c", program], timeout=120)
    assert proc.stdout.count("kept") == 2, proc.stdout + proc.stderr
