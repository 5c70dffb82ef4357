"""The overlap of consecutive training steps (PICASSO's pipelining), owned in one place: the
pipeline drives a step's stages (TorchRec's ``TrainPipelineSparseDist.progress``); no stage calls it.

A step is anything with the :class:`Stepped` parts (DES: ``des/strategies/stages.py``):
``prepare`` (parameter-free: the key -> row lookup and routing), ``gather`` (reads the values, and
runs the previous step's sparse update in the same pass when that update is *fusable*) and
``compute`` (TF and collectives, giving the step's loss, dense update and sparse update).
:meth:`Pipeline.progress` walks them. With ``--pipeline on`` the runner tells the strategy, before
a step, which batch the next step trains (:meth:`Pipeline.prefetch`: nothing such as a validation
or a checkpoint comes in between). Then:

* the next batch is read and prepared on the strategy's one background thread, started once the
  step has gathered its values and waited for before the step changes the tables (a lookup may
  grow them); never started, :meth:`Prefetch.batch` does the work in the caller's thread, so
  results never depend on whether a step overlapped;
* the step's updates wait: its dense optimizer step runs on the background thread until the next
  step's TF call reads the weights, its sparse update (when fusable) until the next step's gather,
  which runs both in one pass over the fields (``ShardTables.apply_then_gather``); an update that
  is not fusable goes to the step's sparse stage (``submit``: now, or Persia's delay);
* anything else that reads or replaces the weights first settles both (:meth:`Pipeline.settle`).

A deferred update carries its own step's schedule factors: the runner sets the next step's before
the update runs. Every update runs on the same values as without the pipeline (a row's update reads
only that row; the next batch's lookup inserts rows and counts ids but reads no values), so a
pipelined run is the unpipelined one bit for bit (``tests/test_pipeline.py``,
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
    """A step's update the pipeline may run later (:meth:`apply` alone, or, for a fusable sparse
    update, the next step's gather runs it)."""

    fusable: bool

    def apply(self) -> None: ...


class Stepped(Protocol):
    """What the pipeline drives: a step's parts (``des/strategies/stages.py``'s ``DESStep``)."""

    def prepare(self, batch: Any, step: int) -> Any: ...

    def gather(self, work: Any, pending: Any) -> None: ...

    def compute(self, work: Any, rates: StepRates) -> Any: ...


class Prefetch:
    """The next step's batch, read and prepared on the background thread once started."""

    def __init__(self, read: Callable[[], Any], prepare: Callable[[Any], Any]) -> None:
        def work() -> tuple[Any, Any]:
            batch = read()
            return batch, prepare(batch)

        self._work = work
        self._future: Future | None = None

    def start(self, executor: ThreadPoolExecutor) -> None:
        if self._future is None:
            self._future = executor.submit(self._work)

    def wait(self) -> None:
        """Block until the background work is done (re-raises its error here)."""
        if self._future is not None:
            self._future.result()

    def batch(self) -> Any:
        """The batch read (doing the work now if it was never started)."""
        return self.result()[0]

    def result(self) -> tuple[Any, Any]:
        """The batch and what the strategy prepared for it (doing the work now if never started)."""
        if self._future is None:
            future: Future = Future()
            future.set_result(self._work())
            self._future = future
        return self._future.result()


class Pipeline:
    """One strategy's overlap of a step with the next (see the module docstring). ``prepare(batch,
    step)`` is the strategy's parameter-free work on a batch before its step; ``background``: the
    initializer of the background thread (des's tables run it at idle priority)."""

    def __init__(self, prepare: Callable[[Any, int], Any], background: Callable[[], None] | None = None) -> None:
        self._prepare = prepare
        self._initializer = background
        self._next: Prefetch | None = None
        self._background: ThreadPoolExecutor | None = None
        self._dense: Future | None = None
        self._sparse: Deferred | None = None
        #: the next step's prepared work, once its background work is done: (step, work)
        self.prepared: tuple[int, Any] | None = None
        self.overlapped_steps = 0  # steps whose next batch was prepared in the background

    # ------------------------------------------------------------------ a step, driven
    def progress(self, stepped: Stepped, batch: Any, step: int, rates: StepRates, timer: Any,
                 sparse_stage: Any) -> float:
        """Train ``batch`` as global step ``step`` through ``stepped``'s parts; returns the loss.
        ``timer`` times the phases of the work done here (``lookup``, ``update``); ``sparse_stage``
        takes a sparse update that is not deferred (``submit``; one that ``holds_back`` updates
        takes every one)."""
        with timer("lookup"):
            work = self._work_for(stepped, batch, step)
        stepped.gather(work, self.take_sparse())  # with the previous step's fusable update
        self.overlap_next()  # the next batch is read and looked up while TF computes this step
        with timer("update"):  # TF reads the dense weights (in place): the previous step's update first
            self.dense_done()
        result = stepped.compute(work, rates)
        follows = self.follows
        with timer("update"):
            if follows:
                self.defer_dense(result.dense.apply)
            else:  # before the sparse update: the next batch's lookup may still be running
                result.dense.apply()
        with timer("lookup"):
            self.await_next()  # the next batch's lookup may grow the tables: done before they change
        if follows and result.sparse.fusable and not sparse_stage.holds_back:
            self.defer_sparse(result.sparse)
        else:
            with timer("update"):
                sparse_stage.submit(result.sparse)
        return result.loss

    def _work_for(self, stepped: Stepped, batch: Any, step: int) -> Any:
        """The work prepared in the background for this batch, or prepared now."""
        prepared, self.prepared = self.prepared, None
        if prepared is None or prepared[1].batch is not batch:
            return stepped.prepare(batch, step)
        if prepared[0] != step:
            raise RuntimeError(f"batch prepared for step {prepared[0]} trained at step {step}")
        return prepared[1]

    # ------------------------------------------------------------------ the next batch
    def prefetch(self, read: Callable[[], Any], step: int) -> Prefetch:
        """The batch of global step ``step``, trained right after the coming step."""
        self._next = Prefetch(read, lambda batch: (step, self._prepare(batch, step)))
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
            self.prepared = following.result()[1]

    def background(self) -> ThreadPoolExecutor:
        """The one background thread (des's initializer puts it at idle priority: it must not take
        TF's cores, des/hashtable/_threads.py): the next batch's work and the deferred dense step,
        one after another in submission order."""
        if self._background is None:
            self._background = ThreadPoolExecutor(1, thread_name_prefix="des-background",
                                                  initializer=self._initializer)
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
        self.prepared = None
        if self._background is not None:
            self._background.shutdown(wait=True)
            self._background = None
