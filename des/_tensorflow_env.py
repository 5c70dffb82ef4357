"""How TensorFlow loads in a des process: quiet, and with oneDNN where it pays.

TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` and ``TF_ENABLE_ONEDNN_OPTS`` once, when it loads, so
:func:`configure` (run by ``des/__init__.py``, before any des module imports TensorFlow) sets
what the user has not set:

* ``TF_ENABLE_ONEDNN_OPTS``: on where the CPU has AVX-512 and every rank on the machine has a
  core of its own, off elsewhere (:func:`onednn_default`). Measured (docs/design.md §3): on a
  2-core AVX512-BF16 CPU oneDNN runs a [4096, 400] x [400, 400] float32 matmul 1.23x and a bfloat16
  one 2.2x faster than Eigen; des's DeepFM at B=4096 ran 1.06-1.18x at N=1 and 1.01-1.11x at N=2,
  but 0.92x at N=4 (4 ranks time-sharing 2 cores). On an AVX2-only CPU it ran the same top network
  1.5x slower and has no bf16 kernels. float64, the exactness mode, never goes through oneDNN.
  ``TF_ENABLE_ONEDNN_OPTS=0`` or ``=1`` in the environment decides instead.
* With oneDNN on, TensorFlow prints "oneDNN custom operations are on ..." (and absl's "All log
  messages before absl::InitializeLog() ..." header) to stderr at import, before its log level
  applies: once or twice per rank. :func:`quiet_tensorflow_import` puts a one-shot finder first on
  ``sys.meta_path``: the first ``import tensorflow`` runs with file descriptor 2 sent to a
  temporary file, and everything written there except those lines is written back to stderr when
  the import ends (or fails). Nothing else is filtered, nothing is lost.
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


def onednn_default(flags: set[str] | None = None, local_ranks: int | None = None, cores: int | None = None) -> str:
    """``"1"`` (oneDNN on) on a CPU with AVX-512 where every rank has a core of its own, else ``"0"``."""
    flags = cpu_flags() if flags is None else flags
    local_ranks = launcher_local_ranks() if local_ranks is None else local_ranks
    cores = (os.cpu_count() or 1) if cores is None else cores
    return "1" if "avx512f" in flags and local_ranks <= cores else "0"


def onednn_enabled() -> bool:
    """Whether TensorFlow in this process runs oneDNN's kernels (after :func:`configure`)."""
    return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() in ("1", "true")


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


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Finds nothing itself: at the first lookup of ``tensorflow`` it steps aside, lets the other
    finders find it, and wraps that loader's ``exec_module`` in :func:`stderr_without`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            def exec_module(module: Any) -> None:
                with stderr_without():
                    run(module)

            loader.exec_module = exec_module
        return spec


def quiet_tensorflow_import() -> None:
    """The next ``import tensorflow`` without the banner (no-op once TensorFlow is loaded)."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())


#: holds the value des put in ``TF_ENABLE_ONEDNN_OPTS``: a process started by a des process (a
#: benchmark's jobs, a test's ranks) inherits both and decides again for itself (its own rank count)
DEFAULT_MARK = "DES_ONEDNN_DEFAULT"


def onednn_chosen_by_user(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TF_ENABLE_ONEDNN_OPTS`` was set by the user (not by des's :func:`configure`)."""
    environ = os.environ if environ is None else environ
    value = environ.get("TF_ENABLE_ONEDNN_OPTS")
    return value is not None and value != environ.get(DEFAULT_MARK)


def configure() -> None:
    """Set TensorFlow's load-time variables the user has not set, and quiet its import."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not onednn_chosen_by_user():
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = os.environ[DEFAULT_MARK] = onednn_default()
    quiet_tensorflow_import()
