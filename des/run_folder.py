"""The run folder (``--output``): one job at a time, one run per folder.

* **Lock.** Rank 0 holds an ``fcntl.flock`` on ``<folder>/.lock`` for the job's lifetime; the file
  says who holds it (host, pid, start time). The OS drops the lock when the process ends, however
  it ends, so a lock file left by a killed job is stale and simply taken over. A second job on the
  same folder is refused with one line naming the holder.
* **One run per folder.** A folder that already holds something is refused unless ``--resume``
  continues the run in it (a checkpoint inside the folder) or ``--overwrite`` replaces it.
  ``--resume`` without ``--output`` continues in the run folder holding the checkpoint (a
  checkpoint outside any run folder starts a new ``runs/<model>-<time>``).
* **Atomic overwrite.** With ``--overwrite`` the job writes into a sibling staging folder
  (``.<name>.overwrite``) and only a job that finished swaps it in (two renames, then the old run
  is deleted): a job that fails or is killed leaves the previous run untouched.

Nothing is created before every rank finished its set-up (:meth:`RunFolder.create`), so a job that
fails early leaves nothing behind. Only rank 0 touches the file system here.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from des.errors import ConfigError

LOCK_NAME = ".lock"
# Files a des run leaves; a folder with config.json is a run folder (--overwrite replaces only those).
RUN_MARKER = "config.json"


class RunFolderError(ConfigError):
    """The run folder is in use by another job, holds another run, or cannot be written."""


def _contents(folder: Path) -> list[str]:
    """What the folder holds, apart from our lock file (a stale one does not make a run)."""
    try:
        return sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME)
    except FileNotFoundError:
        return []


def _is_inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder)
        return True
    except ValueError:
        return False


def read_holder(folder: Path) -> str:
    """Who holds the lock of ``folder``, as written by the holder (best effort)."""
    try:
        info = json.loads((folder / LOCK_NAME).read_text())
        return f"host {info['host']}, pid {info['pid']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def is_locked(folder: Path) -> bool:
    """Does a live job hold ``folder``'s lock? (Read-only probe: creates nothing.)"""
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def run_folder_of(checkpoint: str | Path) -> Path | None:
    """The run folder a checkpoint path belongs to: the path itself when it is a run folder, or
    the run folder whose ``checkpoints/`` holds it (``checkpoints/``, ``checkpoints/step-N``,
    ``checkpoints/best/step-N``); None for a checkpoint outside any run folder."""
    path = Path(checkpoint).resolve()
    for folder in (path, *path.parents):
        if (folder / RUN_MARKER).is_file():
            return folder if folder == path or path.is_relative_to(folder / "checkpoints") else None
    return None


@dataclass
class RunFolder:
    """Where a job keeps its results. ``path`` is the folder the user named; ``work`` is where the
    job writes (``path`` itself, or the staging sibling with ``--overwrite``)."""

    path: Path
    work: Path
    overwrite: bool = False
    resuming: bool = False
    _lock_fd: int | None = field(default=None, repr=False)

    @classmethod
    def plan(cls, output: str, *, model: str, resume: str = "", overwrite: bool = False) -> RunFolder:
        """Rank 0, before the set-up: decide and check everything, create nothing yet, so user
        errors are reported before TensorFlow is loaded."""
        # --resume DIR without --output: continue in the run folder that holds DIR
        continued = run_folder_of(resume) if resume and not output else None
        path = continued or Path(output or f"runs/{model}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise RunFolderError(f"output directory {path} is not writable: {existing} is not a writable directory")
        folder = cls(path, path)
        folder._check_contents(resume, overwrite)
        if folder.overwrite:
            folder.work = path.with_name(f".{path.name}.overwrite")
        return folder

    def _check_contents(self, resume: str, overwrite: bool) -> None:
        """Refuse a folder in use or holding another run; note whether it is to be replaced."""
        if is_locked(self.path):
            raise self._in_use()
        held = _contents(self.path)
        if not held:
            self.overwrite = False
            return
        if resume and _is_inside(Path(resume), self.path):
            if overwrite:
                raise RunFolderError(f"--overwrite would delete the checkpoint --resume {resume} continues from")
            self.resuming = True  # continue the run in it
            return
        if overwrite:
            if RUN_MARKER not in held:  # never delete a folder des did not make
                raise RunFolderError(f"--overwrite: {self.path} is not a des run folder (no {RUN_MARKER}); "
                                     "not replacing it")
            self.overwrite = True
            return
        hint = "; --resume DIR continues only a checkpoint inside it" if resume else ""
        raise RunFolderError(f"run folder {self.path} already holds a run ({', '.join(held[:4])}"
                             f"{', ...' if len(held) > 4 else ''}); pass --resume {self.path} to continue it, "
                             f"--overwrite to replace it, or choose another --output{hint}")

    def _in_use(self) -> RunFolderError:
        return RunFolderError(f"run folder {self.path} is in use by another job ({read_holder(self.path)}); "
                              "wait for it to finish or choose another --output")

    def create(self) -> None:
        """Rank 0, after every rank finished its set-up: create the folder, take the lock (held
        until :meth:`finish` or the process ends) and check again under it (another job may have
        come and gone since :meth:`plan`)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock()
            if self.overwrite:
                shutil.rmtree(self.work, ignore_errors=True)  # a staging folder of a job that died
                self.work.mkdir()
            probe = self.work / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise RunFolderError(f"output directory {self.path} is not writable: {exc.strerror or exc}") from None

    def _lock(self) -> None:
        lock_path = self.path / LOCK_NAME
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise self._in_use() from None
            # A finishing job unlinks its lock file: make sure ours is still the one in the folder.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        # Another job may have come and gone since plan(): only a run we continue or replace is fine.
        if not (self.overwrite or self.resuming) and _contents(self.path):
            self.release()
            raise RunFolderError(f"run folder {self.path} was filled by another job meanwhile; "
                                 "pass --overwrite to replace it or choose another --output")

    def public(self, path: Path | str) -> Path:
        """``path`` inside :attr:`work` as it will be named once the run is in place."""
        path = Path(path)
        try:
            return self.path / path.relative_to(self.work)
        except ValueError:
            return path

    def finish(self) -> None:
        """Rank 0, after the job succeeded: swap an overwritten run in place, release the lock."""
        if self.overwrite:
            old = self.path.with_name(f".{self.path.name}.replaced")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.path, old)
            os.replace(self.work, self.path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                os.unlink(self.path / LOCK_NAME)  # while still holding it (see the check in _lock)
            except OSError:
                pass
        self.release()

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "work": str(self.work), "overwrite": self.overwrite, "resuming": self.resuming}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunFolder:
        return cls(Path(data["path"]), Path(data["work"]), bool(data["overwrite"]), bool(data["resuming"]))
