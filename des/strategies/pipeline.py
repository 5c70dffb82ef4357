"""The overlap of consecutive training steps (PICASSO's pipelining), owned in one place.

With ``--pipeline on`` the runner tells a strategy, before a step, which batch the next step trains
(:meth:`Pipeline.prefetch`: nothing such as a validation or a checkpoint comes in between). Then:

* the next batch is read and prepared (parameter-free work: DES's key->row lookup and routing) on
  the strategy's one background thread, started once the step has read the tables' values
  (:meth:`Pipeline.overlap_next`) and waited for before the step changes them
  (:meth:`Pipeline.await_next`); never started, :meth:`Prefetch.batch` does the work in the
  caller's thread, so results never depend on whether a step overlapped;
* the step's updates may wait: its dense optimizer step runs on the background thread until the
  next step's TF call reads the weights (:meth:`Pipeline.defer_dense`,
  :meth:`Pipeline.dense_done`), its sparse update until the next step's gather, which runs both in
  one pass over the fields (:meth:`Pipeline.defer_sparse`, :meth:`Pipeline.take_sparse`);
* anything else that reads or replaces the weights first settles both (:meth:`Pipeline.settle`).

A deferred update carries the :class:`StepRates` of its own step: the runner sets the next step's
schedule factors before the update runs. Every update runs on the same values as without the
pipeline (a row's update reads only that row; the next batch's lookup inserts rows and counts ids
but reads no values), so a pipelined run is the unpipelined one bit for bit (``tests/test_pipeline.py``,
``tests/test_exactness.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class StepRates:
    """The learning-rate schedules' factors of one step (sparse and dense optimizers)."""

    sparse: float
    dense: float


class Deferred(Protocol):
    """A step's sparse update the next step may run with its gather (or :meth:`apply` alone)."""

    def apply(self) -> None: ...


class Prefetch:
    """The next step's batch, read and prepared on the background thread once started."""

    def __init__(self, read: Callable[[], Any], prepare: Callable[[Any], Any]) -> None:
        self._work = lambda: prepare(read())
        self._future: Future | None = None

    def start(self, executor: ThreadPoolExecutor) -> None:
        if self._future is None:
            self._future = executor.submit(self._work)

    def wait(self) -> None:
        """Block until the background work is done (re-raises its error here)."""
        if self._future is not None:
            self._future.result()

    def batch(self) -> Any:
        """The prepared batch (doing the work now if it was never started)."""
        if self._future is None:
            future: Future = Future()
            future.set_result(self._work())
            self._future = future
        return self._future.result()


class Pipeline:
    """One strategy's overlap of a step with the next (see the module docstring). ``prepare(batch,
    step)`` is the strategy's parameter-free work on a batch before its step."""

    def __init__(self, prepare: Callable[[Any, int], Any]) -> None:
        self._prepare = prepare
        self._next: Prefetch | None = None
        self._background: ThreadPoolExecutor | None = None
        self._dense: Future | None = None
        self._sparse: Deferred | None = None
        self.overlapped_steps = 0  # steps whose next batch was prepared in the background

    # ------------------------------------------------------------------ the next batch
    def prefetch(self, read: Callable[[], Any], step: int) -> Prefetch:
        """The batch of global step ``step``, trained right after the coming step."""
        self._next = Prefetch(read, lambda batch: self._prepare(batch, step))
        return self._next

    @property
    def follows(self) -> bool:
        """Does a prefetched step follow this one (so its updates may wait for it)?"""
        return self._next is not None

    def overlap_next(self) -> None:
        """Start the next batch's work on the background thread (the step no longer reads the
        tables' values)."""
        if self._next is not None:
            self._next.start(self.background())
            self.overlapped_steps += 1

    def await_next(self) -> None:
        """Wait for the next batch's work (the step is about to change the tables: a lookup may
        grow them)."""
        if self._next is not None:
            following, self._next = self._next, None
            following.wait()

    def background(self) -> ThreadPoolExecutor:
        """The one background thread, at idle priority (it must not take TF's cores:
        des/hashtable/_threads.py): the next batch's work and the deferred dense step, one after
        another in submission order."""
        if self._background is None:
            from des.hashtable import background_thread

            self._background = ThreadPoolExecutor(1, thread_name_prefix="des-background",
                                                  initializer=background_thread)
        return self._background

    # ------------------------------------------------------------------ deferred updates
    def defer_dense(self, apply: Callable[..., None], *args: Any) -> None:
        """Run a step's dense optimizer step on the background thread (after the next batch's work)."""
        self._dense = self.background().submit(apply, *args)

    def dense_done(self) -> None:
        """Wait for the deferred dense step (re-raises its error): before anything reads the dense weights."""
        if self._dense is not None:
            update, self._dense = self._dense, None
            update.result()

    def defer_sparse(self, update: Deferred) -> None:
        """Leave a step's sparse update to the next step's gather."""
        self._sparse = update

    def take_sparse(self) -> Deferred | None:
        """The deferred sparse update, now the caller's to run (None: there is none)."""
        update, self._sparse = self._sparse, None
        return update

    @property
    def pending(self) -> tuple[bool, bool]:
        """Whether a dense and a sparse update are waiting."""
        return self._dense is not None, self._sparse is not None

    def settle(self) -> None:
        """Both deferred updates done (each with its own step's factors)."""
        self.dense_done()
        update = self.take_sparse()
        if update is not None:
            update.apply()

    def close(self) -> None:
        self.settle()
        if self._background is not None:
            self._background.shutdown(wait=True)
            self._background = None
