"""How TensorFlow loads in a des process: quiet, and with oneDNN where it pays.

TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` and ``TF_ENABLE_ONEDNN_OPTS`` once, when it loads.
:func:`configure` (run by ``des/__init__.py``) sets the log level and puts a one-shot finder first
on ``sys.meta_path``; the first ``import tensorflow`` then

* decides ``TF_ENABLE_ONEDNN_OPTS`` unless the user set it (:func:`onednn_default`): on where the
  CPU has AVX-512 and either every rank on the machine has a core of its own or the job computes
  in bf16 (:func:`will_compute_in_bfloat16`, called by ``des.train`` after parsing its options and
  before TensorFlow loads); off elsewhere. Why (``docs/design.md``, "Processes, threads and
  memory"; the measurements in ``docs/benchmarks.md``): with AVX-512 oneDNN's float32 and bfloat16
  matmuls beat Eigen's, but with more ranks than cores its threads fight the time-sharing ranks,
  and bf16 without oneDNN falls back to Eigen's bf16, far slower; on AVX2 oneDNN is slower and has
  no bf16 kernels. float64, the exactness mode, never goes through oneDNN.
* runs with file descriptor 2 sent to a temporary file: with oneDNN on, TensorFlow prints "oneDNN
  custom operations are on ..." (and absl's "All log messages before absl::InitializeLog() ..."
  header) at import, before its log level applies, once or twice per rank. Everything written
  there except those lines is written back to stderr when the import ends (or fails). Nothing else
  is filtered, nothing is lost.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

#: substrings of the stderr lines TensorFlow's import prints that tell a des user nothing
BANNER = ("oneDNN custom operations are on", "All log messages before absl::InitializeLog() is called")


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The first CPU's feature flags (Linux; empty elsewhere)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def launcher_local_ranks(environ: Mapping[str, str] | None = None) -> int:
    """Ranks of this job on this machine, as the MPI launcher tells them before MPI starts
    (MPICH/Hydra and Intel MPI: ``MPI_LOCALNRANKS``; Open MPI: ``OMPI_COMM_WORLD_LOCAL_SIZE``); 1
    outside a launcher."""
    environ = os.environ if environ is None else environ
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        try:
            return max(1, int(environ[name]))
        except (KeyError, ValueError):
            continue
    return 1


_bfloat16 = False  # set by will_compute_in_bfloat16


def will_compute_in_bfloat16() -> None:
    """Tell the coming TensorFlow import that this process computes in bf16: oneDNN then stays on
    with AVX-512 even where ranks share cores (bf16 has no fast kernel without it)."""
    global _bfloat16
    _bfloat16 = True


def onednn_default(flags: set[str] | None = None, local_ranks: int | None = None, cores: int | None = None,
                   bfloat16: bool | None = None) -> str:
    """``"1"`` (oneDNN on) on a CPU with AVX-512 where every rank has a core of its own or the
    job computes in bf16, else ``"0"``."""
    flags = cpu_flags() if flags is None else flags
    local_ranks = launcher_local_ranks() if local_ranks is None else local_ranks
    cores = (os.cpu_count() or 1) if cores is None else cores
    bfloat16 = _bfloat16 if bfloat16 is None else bfloat16
    return "1" if "avx512f" in flags and (local_ranks <= cores or bfloat16) else "0"


def onednn_setting(environ: Mapping[str, str] | None = None) -> str:
    """``"on"``/``"off"`` as ``TF_ENABLE_ONEDNN_OPTS`` says, or ``"TensorFlow's default"`` when it
    is unset (TensorFlow was imported before des could decide: on, on x86 Linux)."""
    value = (os.environ if environ is None else environ).get("TF_ENABLE_ONEDNN_OPTS")
    if value is None:
        return "TensorFlow's default"
    return "on" if value.strip().lower() in ("1", "true") else "off"


@contextmanager
def stderr_without(noise: tuple[str, ...] = BANNER) -> Iterator[None]:
    """Run the body with fd 2 captured; then write its lines back to fd 2, except those containing
    one of ``noise``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().splitlines(keepends=True)
                    if not any(n.encode() in line for n in noise)]
            if kept:
                os.write(2, b"".join(kept))


class _BeforeTensorFlow(importlib.abc.MetaPathFinder):
    """Finds nothing itself: at the first lookup of ``tensorflow`` it steps aside, decides oneDNN,
    lets the other finders find TensorFlow, and wraps that loader's ``exec_module`` in
    :func:`stderr_without`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        choose_onednn()
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            def exec_module(module: Any) -> None:
                with stderr_without():
                    run(module)

            loader.exec_module = exec_module
        return spec


def before_tensorflow_import() -> None:
    """Hook the next ``import tensorflow`` (no-op once TensorFlow is loaded)."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _BeforeTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTensorFlow())


#: holds the value des put in ``TF_ENABLE_ONEDNN_OPTS``: a process started by a des process (a
#: benchmark's jobs, a test's ranks) inherits both and decides again for itself (its own rank count)
DEFAULT_MARK = "DES_ONEDNN_DEFAULT"


def onednn_chosen_by_user(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TF_ENABLE_ONEDNN_OPTS`` was set by the user (not by des's :func:`configure`)."""
    environ = os.environ if environ is None else environ
    value = environ.get("TF_ENABLE_ONEDNN_OPTS")
    return value is not None and value != environ.get(DEFAULT_MARK)


def choose_onednn() -> None:
    """Set ``TF_ENABLE_ONEDNN_OPTS`` to :func:`onednn_default` unless the user set it."""
    if not onednn_chosen_by_user():
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = os.environ[DEFAULT_MARK] = onednn_default()


def configure() -> None:
    """TensorFlow's log level unless the user set it; oneDNN and a quiet import when it loads."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    before_tensorflow_import()
