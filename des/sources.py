"""Where the training loop's batches come from (``docs/design.md``, "The runner"). A source hands
:func:`des.runner.loop` this rank's steps in segments, each consecutive batches of one reader (the
loop prefetches within a segment, never across), reads the batch of a :class:`Position` and says
where a checkpoint is.

* :class:`EpochSource`: ``--epochs`` over one prepared store (``--data`` or ``--train-data``), one
  segment: step s is batch ``s % steps_per_epoch`` of epoch ``s // steps_per_epoch``.
* :class:`StreamSource`: ``--stream``: files in name order, one pass, each prepared when it comes;
  a segment per file (or per ``--progressive-every-rows`` window) that the current model is tested
  on before training on it (progressive validation).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from des.checkpoint import CheckpointError
from des.collectives import Communicator
from des.config import TrainConfig
from des.errors import ConfigError


@dataclass(frozen=True)
class Position:
    step: int  # the global step that trains this batch (0-based)
    part: int  # its epoch, or its file's index in the stream
    index: int  # its batch within the epoch or the file


class Segment(Sequence[Position]):
    """This rank's ``steps`` as positions (``locate``: a step's part and index). ``test``: the
    predictions and labels of the rows these steps train, made before they are trained (a stream's
    progressive validation; None: no test), ``label`` what its record says about them, ``closes``
    the index of the stream file its last step ends (None: it ends none)."""

    def __init__(self, steps: range, locate: Callable[[int], tuple[int, int]],
                 test: Callable[[], Any] | None = None, label: dict[str, Any] | None = None,
                 closes: int | None = None) -> None:
        self.steps, self.locate, self.test, self.label = steps, locate, test, label or {}
        self.closes = closes

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i):  # type: ignore[override]
        step = self.steps[i]
        return Position(step, *self.locate(step))


class EpochSource:
    """``--epochs`` passes over the training split of ``store`` (at most ``--max-steps`` steps)."""

    validation = True  # the store's validation split is evaluated (--eval-every, per epoch, at the end)

    def __init__(self, config: TrainConfig, store: Any, steps_per_epoch: int, total_steps: int,
                 data_order: dict[str, Any], strategy: Any) -> None:
        self.config, self.store, self.data_order = config, store, data_order
        self.steps_per_epoch, self.total_steps = steps_per_epoch, total_steps
        self.strategy = strategy  # its reader options, its steps
        self._reader: Any = None

    def use(self, strategy: Any) -> None:
        """Read for ``strategy`` from the next batch on (its reader options: a plan switch)."""
        self.strategy, self._reader = strategy, None

    def describe(self, train_rows: int, validation_rows: int) -> tuple[str, str]:
        """What the start-up report says of the data and of the steps."""
        test_rows = len(self.store.split_rows("test"))
        return (f"{self.store.display_name} ({self.store.num_rows} rows: {train_rows} train, {validation_rows} "
                f"validation, {test_rows} test)",
                f"{self.total_steps} steps ({self.config.epochs} epoch(s) of {self.steps_per_epoch})")

    def planned_steps(self, start: int) -> int | None:
        return len(self.strategy.steps(start, self.total_steps))

    def segments(self, start: int) -> Iterator[Segment]:
        yield Segment(self.strategy.steps(start, self.total_steps), lambda step: divmod(step, self.steps_per_epoch))

    def batch(self, at: Position):
        """Global batch ``at.index`` of epoch ``at.part`` (this rank's part of it): a pure function
        of (data, seed, epoch, index), so a resumed or asynchronous run sees the same batches."""
        from des.data.batch_reader import BatchReader

        if self._reader is None or self._reader.epoch != at.part:
            self._reader = BatchReader(self.store, "train", batch_size=self.config.batch_size, seed=self.config.seed,
                                       epoch=at.part, drop_last=self.config.drop_last,
                                       **self.strategy.reader_options())
        return self._reader.batch(at.index)

    def validates(self, at: Position) -> bool:
        every = self.config.eval_every
        return (at.step + 1) % every == 0 if every else at.index + 1 == self.steps_per_epoch

    def position(self, steps_done: int) -> tuple[int, int, None]:
        """(epoch, next batch, nothing more) of a checkpoint after ``steps_done`` steps."""
        epoch, index = divmod(steps_done - 1, self.steps_per_epoch)
        return epoch, index + 1, None

    def resume(self, folder: Any, manifest: dict[str, Any], steps_done: int) -> None:
        if manifest.get("stream"):
            raise CheckpointError(f"checkpoint {folder} was written by a --stream run: resume it with --stream")
        if steps_done != manifest["epoch"] * self.steps_per_epoch + manifest["next_batch"]:
            raise ConfigError(f"checkpoint {folder}: step {steps_done} is not epoch {manifest['epoch']} batch "
                              f"{manifest['next_batch']} of {self.steps_per_epoch} per epoch")

    def running(self):
        return contextlib.nullcontext()

    def stopping(self) -> bool:
        return False


class StreamSource:
    """``--stream``: the files of :func:`des.data.stream.list_stream`, one pass in name order. Rank
    0 lists them and every rank gets its list, then each rank prepares (into the cache, shared or
    its own: a preparation is atomic) and reads the same file, its own fields. File k's batches come
    in the order ``default_rng([seed, k])`` (the batch reader's epoch k), or as stored with
    ``--stream-shuffle off``. The first file's store sets the layout every file must have, and its
    statistics (a schema that has them) are the ones every later file is prepared with."""

    validation = False  # no validation split: each segment is tested before it is trained on

    def __init__(self, config: TrainConfig, comm: Communicator, start: StreamStart, strategy: Any) -> None:
        self.config, self.comm = config, comm
        self.files, self.schema, self.store = start.files, start.schema, start.store
        self.total_steps = config.max_steps  # 0: until the files end
        self.data_order = {"stream": "files in name order", "batch_size": config.batch_size, "seed": config.seed,
                           "drop_last": config.drop_last, "stream_shuffle": config.stream_shuffle}
        self.strategy = strategy  # its reader options, its predictions
        self.next = (0, 0)  # file index and batch of the next step
        self.segment = (0, 0, 0)  # file, first batch and first step of the latest segment
        self._reader: Any = None
        self._signalled = False

    # ------------------------------------------------------------------ what the runner asks
    def describe(self, train_rows: int, validation_rows: int) -> tuple[str, str]:
        follow = f", following every {self.config.follow_interval:g} s" if self.config.follow else ""
        return (f"the stream {self.config.stream} ({len(self.files)} file(s) from {self.files[0]['name']}{follow})",
                f"one pass{f' of at most {self.total_steps} steps' if self.total_steps else ''}")

    def planned_steps(self, start: int) -> int | None:
        return None  # files may come, or change before they are prepared

    def segments(self, start: int) -> Iterator[Segment]:
        """Every file from the next position on, in segments: a window of ``--progressive-every-rows``
        rows (whole batches) or the whole file, each tested before it is trained (unless the run
        resumed inside it, after its test)."""
        step, (k, j) = start, self.next
        while not self.total_steps or step < self.total_steps:
            if k == len(self.files) and not self._more():
                return
            store, reader = self._open_file(k)
            n = len(reader)
            window = -(-self.config.progressive_every_rows // self.config.batch_size) or max(n, 1)
            ends = [end for end in [*range(window, n, window), n] if end > j or end == j == 0]
            for end in ends:
                count = min(end - j, self.total_steps - step) if self.total_steps else end - j
                test = self._test(store, reader, j, end, window < n) if j % window == 0 else None
                label = {"file": self.files[k]["name"], "index": k, **({"batch": j} if window < n else {})}
                self.segment = (k, j, step)
                self.files[k]["start"] = step - j  # the file's first step (--ttl-files counts from it)
                yield Segment(range(step, step + count), lambda s, k=k, j=j, first=step: (k, j + s - first), test,
                              label, k if j + count == n else None)
                step, j = step + count, j + count
                if j < end:  # --max-steps
                    return
            k, j = k + 1, 0

    def batch(self, at: Position):
        return self._reader.batch(at.index)

    def first_step(self, k: int) -> int | None:
        """The first step of file ``k`` (None: before the stream or unknown)."""
        return self.files[k].get("start") if 0 <= k < len(self.files) else None

    def validates(self, at: Position) -> bool:
        return False

    def position(self, steps_done: int) -> tuple[int, int, dict[str, Any]]:
        """(file index, next batch, the stream's record) of a checkpoint after ``steps_done`` steps:
        the file it is in (name, size, sha256: a resume checks them), its next batch, and the
        files done before it (name and size)."""
        k, first, step = self.segment
        at = first + steps_done - step
        done = [{key: f[key] for key in ("name", "size", "start") if key in f} for f in self.files[:k]]
        record = {key: self.files[k][key] for key in ("name", "size", "sha256", "batches")}
        return k, at, {"file": k, **record, "next_batch": at, "done": done}

    def resume(self, folder: Any, manifest: dict[str, Any], steps_done: int) -> None:
        """Continue where the checkpoint's stream record says, if the stream is the one it was
        trained on: the files done must be listed first, by name and size, and the file it stopped
        in must be the same bytes (sha256); else a one-line error."""
        from des.data.blocks import file_digest

        record = manifest.get("stream")
        if not record:
            raise CheckpointError(f"checkpoint {folder} was not written by a --stream run (resume it without --stream)")
        k = record["file"]
        for i, was in enumerate([*record["done"], record]):
            now = self.files[i] if i < len(self.files) else None
            if now is None or now["name"] != was["name"]:
                raise CheckpointError(f"checkpoint {folder}: the stream's file {i} was {was['name']}, now "
                                      f"{now['name'] if now else 'missing'} (a resume continues the same stream)")
            size = os.path.getsize(now["path"])
            if size != was["size"] or (i == k and file_digest(now["path"], like=was["sha256"]) != was["sha256"]):
                how = "other content" if size == was["size"] else f"{was['size']} bytes, now {size}"
                raise CheckpointError(f"checkpoint {folder}: the stream's file {was['name']} changed since it was "
                                      f"trained on ({how})")
            now.update({key: was[key] for key in ("size", "sha256", "batches", "start") if key in was})
        self.next = (k, record["next_batch"]) if record["next_batch"] < record["batches"] else (k + 1, 0)
        self.segment = (k, record["next_batch"], steps_done)

    @contextlib.contextmanager
    def running(self):
        """SIGTERM and SIGINT ask the stream to stop after the current step (with a final
        checkpoint); a second one ends the job at once."""
        def ask(signum, frame):
            if self._signalled:
                signal.signal(signum, previous[signum])
                signal.raise_signal(signum)
            self._signalled = True

        previous = {}
        with contextlib.suppress(ValueError):  # not the main thread: no handlers
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, ask)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stopping(self) -> bool:
        """Was a stop asked for on any rank? Collective on several ranks (one number), so that all
        stop after the same step."""
        asked = float(self._signalled)
        return (self.comm.allreduce_scalar(asked, "stream", "max") if self.comm.size > 1 else asked) > 0

    # ------------------------------------------------------------------ files
    def _open_file(self, k: int):
        from des.data.batch_reader import BatchReader

        store = self.store if k == 0 else open_stream_file(self.config, self.schema, self.files, k, self.store)
        self._reader = BatchReader(store, "train", batch_size=self.config.batch_size, seed=self.config.seed, epoch=k,
                                   shuffle=self.config.stream_shuffle == "on", drop_last=self.config.drop_last,
                                   **self.strategy.reader_options())
        self.files[k]["batches"] = len(self._reader)
        return store, self._reader

    def _test(self, store: Any, reader: Any, first: int, end: int, window: bool) -> Callable[[], Any]:
        """The predictions of the rows of batches ``first`` to ``end`` (a window: in training
        order) or of every row of the file (the last partial batch too), by the current model."""
        from des.predictions import predict_split

        if not window:
            return lambda: predict_split(self.strategy, store, "train", self.config.eval_batch_size)

        def predict():
            parts = [self.strategy.predict(reader.batch(b)) for b in range(first, end)]
            return np.concatenate([p for p, _ in parts]), np.concatenate([y for _, y in parts])
        return predict

    def _more(self) -> bool:
        """``--follow``: wait for files named after the last one (rank 0 lists the directory every
        ``--follow-interval`` seconds, every rank gets its answer); False when the stream ends (no
        ``--follow``, ``--follow-timeout``, a signal)."""
        from des.data.stream import list_stream

        if not self.config.follow:
            return False
        since, timeout = time.monotonic(), self.config.follow_timeout
        while True:
            answer = None
            if self.comm.rank == 0:
                new = [f for f in list_stream(self.config.stream, self.config.stream_glob, follow=True)
                       if f["name"] > self.files[-1]["name"]]
                answer = {"new": new, "end": not new and bool(timeout) and time.monotonic() - since >= timeout}
            answer = self.comm.bcast_json(answer, "stream")
            if self.stopping() or answer["end"]:
                return False
            if answer["new"]:
                self.files += answer["new"]
                return True
            if self.comm.rank == 0:  # the others wait in the next collective
                deadline = time.monotonic() + self.config.follow_interval
                while not self._signalled and time.monotonic() < deadline:
                    time.sleep(min(0.1, self.config.follow_interval))


@dataclass
class StreamStart:
    """``--stream``'s files as rank 0 listed them (every rank gets the list), the schema, and the
    first file's store: the layout of the stream and the statistics every later file is prepared
    with (a schema that has them). What set-up needs before the strategy exists."""

    files: list[dict[str, Any]]
    schema: Any
    store: Any

    @classmethod
    def open(cls, config: TrainConfig, comm: Communicator) -> "StreamStart":
        """Collective: rank 0 lists the files; every rank prepares (or finds) and opens the first."""
        from des.data.schema import Schema, load_schema
        from des.data.stream import first_listing

        listing = first_listing(config.stream, config.stream_glob, config.follow) if comm.rank == 0 else None
        files: list[dict[str, Any]] = comm.bcast_json(listing, "setup")
        schema = load_schema(config.schema or None)
        store = open_stream_file(config, schema, files, 0, None)
        return cls(files, Schema.from_dict(store.schema) if store.schema is not None else schema, store)


def open_stream_file(config: TrainConfig, schema: Any, files: list[dict[str, Any]], k: int, first: Any):
    """File ``k`` prepared (all rows training rows) into the cache and opened; a later file must
    have the column layout of ``first``, the first file's store. Records its sha256 and size."""
    from des.data.build import open_dataset
    from des.data.errors import DataError
    from des.data.inputs import layout_difference
    from des.data.stream import TRAIN_ALL

    file = files[k]
    try:
        store = open_dataset(file["path"], cache_dir=config.cache_dir or None, split=TRAIN_ALL, seed=0,
                             bad_rows=config.bad_rows, schema=schema)
    except DataError as error:
        raise DataError(f"--stream: {error}") from None
    if first is not None:
        difference = layout_difference(store.layout(), first.layout())
        if difference:
            raise DataError(f"--stream: {file['name']}: another column layout than {files[0]['name']}: {difference}")
    file.update(sha256=store.manifest["sources"][0]["sha256"], size=os.path.getsize(file["path"]))
    return store
