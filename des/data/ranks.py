"""Preparing on every rank of a job: ``mpiexec -n N python -m des.data prepare ...`` and ``des.train``
on raw inputs share the inputs among the ranks; each prepares its part and the parts form ONE
store, the same bytes, file for file, as one process writes (the same fingerprint).

**Sharing** (:func:`plan`, every rank computes the same plan): the inputs' bytes are laid end to
end and rank ``r`` takes the ``r``-th run of them: ``1/N`` of the total, except that a rank which
hashes more of the cut files than others (below) takes fewer, by what hashing those bytes costs
against preparing them (:data:`HASH_COST`, measured), so that every rank's work is the same
(:func:`share_weights`). A plain text file (CSV, TSV, Criteo's TSV) is cut
there, after the first newline at or after the cut; a Parquet file between row groups; a gzip
file, or a text file with a quote character or a ``\\r`` that does not end a line (where a line
break may be something else) is read whole by one rank. Along the inputs the ranks only grow, so
each rank's parts are a run of the rows in order. Before reading, each rank counts the lines of
its cut parts (every part then names its bad rows by their line in the file, as one process does).

**Writing**: each rank writes its rows as a store of its own (:class:`StoreWriter`, bounded
memory as one process), in the store's folder, except the one-hot keys, most of the bytes, which
go straight into the joined store's file where they would be if every line were a row
(:class:`OneHotInPlace`); then every rank knows from the others' row and key counts where its rows
go, writes them into the files of the joined store (which rank 0 made at their sizes, after moving
one-hot keys down where some lines were not rows): the split codes of its rows as a function of
their numbers in the whole store (``split.py``), a multi-hot field's row pointers shifted by the
keys before them. The ranks write into shared mappings of the files, side by side. The fields' key
counters (distinct ids, top-10 share) are merged by ranges of keys, every rank one range of every
field (the entries sent to their ranks in a few collectives, :meth:`Group.alltoallv`), and rank 0
writes the manifest. Each cut file's digest (``blocks.file_digest``) is taken on a thread of its
own from the plan on, beside the rank's share (:class:`FileDigests`): a file over 64 MiB by every
rank, a run of its 64 MiB blocks each; a smaller one whole by the rank that reads its first part.
How the bytes are shared only balances the work: any plan gives the same store.

**Statistics** (quantiles, standardize): rank 0 computes them from the training rows, as one
process does (each row's split is a function of its number, known only in order), and every rank
gets them before preparing.

**Failure**: every step ends with the ranks' outcomes gathered; the first failure in the order of
the inputs (the one a single process meets first: a bad row, an empty file) is raised on every
rank, the same one line, so a job reports it once and no rank waits for another.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ContextManager, TypeVar

import numpy as np

from .blocks import Share, block_count, blocks_bytes, block_digests, combine_digests, file_digest, in_blocks
from .errors import DataError
from .parallel import each, share_cores
from .schema import Schema, manifest_sections
from .split import SPLIT_NAMES, assign_splits
from .store import (ONE_HOT_KEYS_FILE, StoreWriter, joined_manifest, key_figures, make_files, move_rows, one_hot_width,
                    place_part, write_manifest)
from .tsv import FIRST_BAD_LINES_KEPT, SourceReport

T = TypeVar("T")
_SCAN_BYTES = 1 << 20
_POLL_SECONDS = 0.001
#: most int64 values a rank sends and receives in one exchange of the key counters (128 MiB)
_EXCHANGE_VALUES = 1 << 24
_NEWLINE = b"\n"
_RETURN = ord("\r")
#: CPU seconds of sha256 over a file's bytes per CPU second of preparing them, by the input's
#: kind (one process, one thread, 2-core AMD EPYC with SHA extensions, docs/benchmarks.md: sha256
#: ~1.3 GB/s; an Avazu-like CSV ~53 MB/s, a Criteo TSV ~100 MB/s); other kinds as CSV
HASH_COST = {"csv": 0.04, "criteo": 0.08}


class Group:
    """The ranks of a job (an mpi4py communicator) as prepare uses them: JSON gathered and
    broadcast over buffers (never pickled), int64 arrays exchanged all to all."""

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()

    def local_size(self) -> int:
        node = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED)
        try:
            return node.Get_size()
        finally:
            node.Free()

    @staticmethod
    def _wait(request: Any) -> None:
        """Complete a non-blocking call, sleeping between polls: a rank waiting for the others
        (which read more, or write the manifest) leaves them the cores."""
        while not request.Test():
            time.sleep(_POLL_SECONDS)

    def allgather(self, obj: Any) -> list[Any]:
        payload = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
        lengths = np.zeros(self.size, dtype=np.int64)
        self._wait(self.comm.Iallgather(np.array([payload.shape[0]], dtype=np.int64), lengths))
        data = np.empty(int(lengths.sum()), dtype=np.uint8)
        self._wait(self.comm.Iallgatherv(payload, (data, lengths)))
        ends = np.cumsum(lengths)
        return [json.loads(data[end - n:end].tobytes().decode()) for n, end in zip(lengths, ends)]

    def bcast(self, obj: Any) -> Any:
        return self.allgather(obj if self.rank == 0 else None)[0]

    def alltoallv(self, pieces: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Collective: ``pieces[d]`` (int64, fewer than 2^31 values) sent to rank ``d``; the pieces
        every rank sent this one, by source (its own included: kept here, not sent through MPI,
        whose non-blocking send to oneself of a megabyte took 140 ms, polled), in two non-blocking
        collectives (the lengths, then the data)."""
        pieces = [np.ascontiguousarray(piece, dtype=np.int64) for piece in pieces]
        own = pieces[self.rank]
        pieces[self.rank] = own[:0]
        lengths = np.array([piece.shape[0] for piece in pieces], dtype=np.int64)
        found = np.zeros(self.size, dtype=np.int64)
        self._wait(self.comm.Ialltoall(lengths, found))
        data = np.concatenate(pieces)
        received = np.empty(int(found.sum()), dtype=np.int64)

        def layout(counts: np.ndarray) -> tuple[list[int], list[int]]:
            return counts.tolist(), (np.cumsum(counts) - counts).tolist()

        self._wait(self.comm.Ialltoallv([data, layout(lengths), self.MPI.INT64_T],
                                        [received, layout(found), self.MPI.INT64_T]))
        out = np.split(received, np.cumsum(found)[:-1].tolist())
        out[self.rank] = own
        return out


def _failure(order: float, error: BaseException) -> list[Any]:
    kind = "data" if isinstance(error, (DataError, OSError)) else "internal"
    text = str(error).replace("\n", " ") if kind == "data" else f"{type(error).__name__}: {error}"
    return [order, kind, text]


def agree(group: Group, failure: list[Any] | None, extra: Sequence[list[Any]] = ()) -> None:
    """Raise on every rank the first (in the inputs' order) of the ranks' failures and ``extra``
    (failures every rank found alike); nothing when there is none."""
    failures = [f for f in group.allgather(failure) if f is not None] + list(extra)
    if failures:
        _, kind, text = min(failures, key=lambda f: f[0])
        raise DataError(text) if kind == "data" else RuntimeError(text)


def together(group: Group, work: Callable[[], T], order: float = 0.0) -> T:
    """``work()`` on every rank, then :func:`agree`."""
    try:
        result, failure = work(), None
    except Exception as error:  # noqa: BLE001 - every rank must learn of it, or the others wait
        result, failure = None, _failure(order, error)
    agree(group, failure)
    return result  # type: ignore[return-value]


def in_shared_directory(group: Group, atomic: Callable[[], ContextManager[Path]], work: Callable[[Path], None]
                        ) -> None:
    """``work(directory)`` on every rank, in the new folder of rank 0's ``atomic()``
    (``build.atomic_directory``: renamed into place when every rank is done); the outcome agreed."""
    if group.rank != 0:
        start = group.bcast(None)
        if "error" in start:
            raise DataError(start["error"])
        work(Path(start["directory"]))
        end = group.bcast(None)
        if end is not None:
            raise DataError(end)
        return
    stage = "opening"
    try:
        with atomic() as directory:
            stage = "working"
            group.bcast({"directory": str(directory)})
            work(directory)
            stage = "renaming"
    except Exception as error:  # noqa: BLE001 - told to the others, who wait for it
        if stage == "opening":
            group.bcast({"error": str(error)})
        elif stage == "renaming":
            group.bcast(str(error))
        raise
    group.bcast(None)


# ------------------------------------------------------------------------------------ sharing
def _cut_after_newline(handle: Any, position: int, size: int) -> int:
    """The position after the first newline at or after ``position - 1`` (``size`` if none)."""
    handle.seek(max(position - 1, 0))
    offset = max(position - 1, 0)
    while offset < size:
        data = handle.read(1 << 16)
        found = data.find(_NEWLINE)
        if found >= 0:
            return offset + found + 1
        offset += len(data)
        if not data:
            break
    return size


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(2) == b"\x1f\x8b"


def _file_cuts(path: str, kind: str, begin: int, size: int, bounds: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, end, rank)`` of the parts of a file at ``begin`` of the inputs' bytes, ``bounds``
    the first byte of each rank's share of them."""
    def rank_of(position: float) -> int:
        return max(r for r, bound in enumerate(bounds) if bound <= position)

    if kind == "parquet":
        import pyarrow.parquet as pq

        metadata = pq.ParquetFile(path).metadata
        rows = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
        total, parts, before = max(sum(rows), 1), [], 0
        for group, count in enumerate(rows):
            rank = rank_of(begin + size * (before + count / 2) / total)
            if parts and parts[-1][2] == rank:
                parts[-1] = (parts[-1][0], group + 1, rank)
            else:
                parts.append((group, group + 1, rank))
            before += count
        return parts
    if size == 0 or _is_gzip(path):
        return [(0, -1, rank_of(begin + size / 2))]
    cuts = [0]
    with open(path, "rb") as handle:
        for bound in bounds[1:]:
            if begin < bound < begin + size:
                cut = _cut_after_newline(handle, bound - begin, size)
                if cuts[-1] < cut < size:
                    cuts.append(cut)
    cuts.append(size)
    return [(a, b, rank_of(begin + a)) for a, b in zip(cuts, cuts[1:])]


def plan(paths: Sequence[str], kind: str, ranks: int) -> list[tuple[int, int, Share]]:
    """The parts of the inputs, in order: ``(rank, input number, share)`` (a share's first line
    still 1: :func:`count_lines` numbers them). Every rank computes the same plan: the bytes
    shared evenly, then again with the ranks that hash a cut file whole given less of them
    (:func:`share_weights`). Any plan gives the same store; this one only balances the work."""
    for path in paths:
        if not os.path.exists(path):
            raise DataError(f"{path}: no such file")
        if os.path.isdir(path):
            raise DataError(f"{path}: is a directory, not a data file")
    sizes = [os.path.getsize(path) for path in paths]
    even = [1.0] * ranks
    parts = _parts(paths, kind, sizes, even)
    relieved = share_weights(parts, sizes, kind, ranks)
    return parts if relieved == even else _parts(paths, kind, sizes, relieved)


def share_weights(parts: Sequence[tuple[int, int, Share]], sizes: Sequence[int], kind: str, ranks: int
                  ) -> list[float]:
    """The ranks' weights of the bytes such that each rank's work, preparing its share plus
    hashing (:class:`FileDigests`: its run of the blocks of each cut file in blocks, and the
    smaller cut files whose first part it reads), is the same: hashing a byte costs
    ``HASH_COST[kind]`` of preparing one, so a rank hashing ``H`` bytes prepares ``HASH_COST * H``
    fewer (clamped at none, the others then sharing the rest evenly)."""
    cost = HASH_COST.get(kind, HASH_COST["csv"])
    hashed = [0.0] * ranks
    for i, (rank, number, share) in enumerate(parts):
        if share.whole or (i > 0 and parts[i - 1][1] == number):
            continue
        if not in_blocks(sizes[number]):
            hashed[rank] += cost * sizes[number]
            continue
        for r, (first, last) in enumerate(digest_runs(sizes[number], ranks)):
            hashed[r] += cost * blocks_bytes(sizes[number], first, last)
    total = max(sum(sizes), 1)
    if not any(hashed):
        return [1.0] * ranks
    work = (total + sum(hashed)) / ranks
    return [max(work - load, 0.0) / total * ranks for load in hashed]


def _parts(paths: Sequence[str], kind: str, sizes: Sequence[int], weights: Sequence[float]
           ) -> list[tuple[int, int, Share]]:
    """The parts of the inputs where rank ``r`` takes ``weights[r] / sum(weights)`` of their bytes."""
    total = max(sum(sizes), 1)
    ends = np.cumsum(weights) / sum(weights)
    bounds = [0] + [int(total * end) for end in ends[:-1]]
    parts, begin = [], 0
    for number, (path, size) in enumerate(zip(paths, sizes)):
        try:
            cuts = _file_cuts(path, kind, begin, size, bounds)
        except Exception:  # noqa: BLE001 - not a readable Parquet file: read whole, where it is refused
            cuts = [(0, -1, max(r for r, bound in enumerate(bounds) if bound <= begin))]
        whole = len(cuts) == 1
        parts += [(rank, number, Share(path) if whole else Share(path, start, end)) for start, end, rank in cuts]
        begin += size
    return parts


def _scan(share: Share, quote: bytes | None) -> tuple[int, bool]:
    """A text share's lines (a last line without its newline counted) and whether it may be cut
    (no quote character; every ``\\r`` before a newline). Read a megabyte at a time into one
    reused buffer (it stays in the cache: 2x faster than 16 MB reads), its newlines counted by
    numpy (a vector compare: 3x ``bytes.count``); the line breaks checked only where the share
    has a ``\\r``."""
    lines, clean, crlf_open, last = 0, True, False, -1
    with open(share.path, "rb", buffering=0) as handle:
        handle.seek(share.start)
        left = share.end - share.start
        buffer = bytearray(min(_SCAN_BYTES, max(left, 0)))
        view, codes = memoryview(buffer), np.frombuffer(buffer, dtype=np.uint8)
        while left > 0:
            read = handle.readinto(view[:min(left, len(buffer))])
            if not read:
                break
            left -= read
            lines += int(np.count_nonzero(codes[:read] == _NEWLINE[0]))
            if clean and quote is not None and buffer.find(quote, 0, read) >= 0:
                clean = False
            if clean and (crlf_open or buffer.find(b"\r", 0, read) >= 0):
                # a "\r" ending the previous read must pair with a "\n" starting this one
                if crlf_open and buffer[0] != _NEWLINE[0]:
                    clean = False
                crlf_open = buffer[read - 1] == _RETURN
                if buffer.count(b"\r", 0, read) - buffer.count(b"\r\n", 0, read) - crlf_open:
                    clean = False
            last = buffer[read - 1]
    if share.end == os.path.getsize(share.path) and last not in (-1, _NEWLINE[0]):
        lines += 1
    return lines, clean and not crlf_open


def count_lines(group: Group, parts: list[tuple[int, int, Share]], kind: str, quote: str | None
                ) -> list[tuple[int, int, Share]]:
    """The parts with each cut text share's first line, and the files that cannot be cut (a quote
    character, a lone ``\\r``) made one part of the rank of their first part."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        numbered = []
        for rank, number, share in parts:
            if not share.whole:
                metadata = pq.ParquetFile(share.path).metadata
                rows = [metadata.row_group(g).num_rows for g in range(share.end)]
                share = dataclasses.replace(share, first_line=sum(rows[:share.start]) + 1,
                                            lines=sum(rows[share.start:]))
            numbered.append((rank, number, share))
        return numbered
    mark = quote.encode() if quote and kind != "criteo" else None
    mine = {i: _scan(share, mark) for i, (rank, _, share) in enumerate(parts) if rank == group.rank and not share.whole}
    found: dict[int, tuple[int, bool]] = {}
    for scanned in group.allgather({str(i): list(v) for i, v in mine.items()}):
        found.update({int(i): (int(v[0]), bool(v[1])) for i, v in scanned.items()})
    unclean = {parts[i][1] for i, (_, clean) in found.items() if not clean and kind != "criteo"}
    result: list[tuple[int, int, Share]] = []
    next_line: dict[int, int] = {}
    for i, (rank, number, share) in enumerate(parts):
        if number in unclean:
            if not result or result[-1][1] != number:
                result.append((rank, number, Share(share.path)))
            continue
        if share.whole:
            result.append((rank, number, share))
            continue
        first = next_line.get(number, 1)
        result.append((rank, number, dataclasses.replace(share, first_line=first, lines=found[i][0])))
        next_line[number] = first + found[i][0]
    return result


def rows_if_all_valid(group: Group, parts: list[tuple[int, int, Share]], header: bool) -> list[int] | None:
    """Each rank's rows if every line of its parts is a row (a header line aside), or None where
    a part's lines were not counted (a file read whole). An upper bound of the rows it reads."""
    rows = [0] * group.size
    for rank, _, share in parts:
        if share.lines is None:
            return None
        rows[rank] += share.lines - (header and share.start == 0)
    return rows


# ------------------------------------------------------------------------------------ reading
def _report(data: dict[str, Any]) -> SourceReport:
    return SourceReport(**data)


def _joined_reports(paths: Sequence[str], parts: list[tuple[int, int, Share]], reports: dict[int, SourceReport],
                    digests: dict[int, str]) -> tuple[list[SourceReport], list[list[Any]]]:
    """Each input's report (of its parts' reports, the parts read) and the failures of the inputs
    read whole: an empty file, one without a valid row (as one process would find them)."""
    joined, failures = [], []
    for number, path in enumerate(paths):
        indices = [i for i, (_, n, _) in enumerate(parts) if n == number]
        if not all(i in reports for i in indices):
            joined.append(SourceReport(display_name=path))
            continue
        if len(indices) == 1 and parts[indices[0]][2].whole:
            joined.append(reports[indices[0]])
            continue
        mine = [reports[i] for i in indices]
        report = SourceReport(display_name=path, sha256=digests.get(number, ""), rows=sum(r.rows for r in mine),
                              lines=sum(r.lines for r in mine), skipped=sum(r.skipped for r in mine),
                              first_skipped=[n for r in mine for n in r.first_skipped][:FIRST_BAD_LINES_KEPT],
                              first_error=next((r.first_error for r in mine if r.first_error), ""))
        joined.append(report)
        order = indices[-1] + 0.5
        if report.lines == 0:
            failures.append([order, "data", f"{path}: file is empty (no rows)"])
        elif report.rows == 0:
            failures.append([order, "data", f"{path}: no valid rows ({report.skipped} bad rows skipped, first "
                                            f"{path}:{report.first_error})"])
    return joined, failures


def digest_runs(size: int, ranks: int) -> list[tuple[int, int]]:
    """Each rank's run of a cut file's blocks to hash (:func:`blocks.in_blocks`: as even as whole
    blocks go, rank 0 first); a smaller file's ``(0, 0)`` (none: one rank hashes it whole)."""
    count = block_count(size) if in_blocks(size) else 0
    return [(count * r // ranks, count * (r + 1) // ranks) for r in range(ranks)]


class FileDigests:
    """The digests (:func:`blocks.file_digest`) of the cut files, taken on a thread of this rank's
    own from the plan on, beside the line count and its share: of a file in blocks, this rank's
    run of them (:func:`digest_runs`), joined over the ranks by :func:`joined_digests`; of a
    smaller file, the whole of it, by the rank that reads its first part. One sha256 runs on one
    core (0.7-1.3 GB/s): the rank that hashed a whole 1.5 GB file set the time of 8 ranks. A file
    that the line count makes one part (read whole, hashed as it is read) is given up (:meth:`keep`)."""

    def __init__(self, parts: list[tuple[int, int, Share]], rank: int, ranks: int) -> None:
        tasks: dict[int, Callable[[threading.Event], str | list[str]]] = {}
        for i, (owner, number, share) in enumerate(parts):
            if share.whole or (i > 0 and parts[i - 1][1] == number):
                continue
            first, last = digest_runs(os.path.getsize(share.path), ranks)[rank]
            if last > first:
                tasks[number] = functools.partial(block_digests, share.path, first, last)
            elif owner == rank and not in_blocks(os.path.getsize(share.path)):
                tasks[number] = functools.partial(file_digest, share.path)
        self._stops = {number: threading.Event() for number in tasks}
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="des-data-hash") if tasks else None
        self._digests: dict[int, Future[str | list[str]]] = {
            number: self._executor.submit(task, self._stops[number])  # type: ignore[union-attr]
            for number, task in tasks.items()}

    def keep(self, parts: list[tuple[int, int, Share]]) -> None:
        """Give up the files that are one part of ``parts``."""
        for number in [n for n in self._digests if any(n == m and share.whole for _, m, share in parts)]:
            self._stops[number].set()
            del self._digests[number]

    def result(self) -> dict[str, str | list[str]]:
        """By input number: the file's digest, or this rank's run of its blocks' digests."""
        return {str(number): digest.result() for number, digest in self._digests.items()}

    def __enter__(self) -> "FileDigests":
        return self

    def __exit__(self, *_: Any) -> None:
        """Stop the hashes still running and wait for the thread."""
        for stop in self._stops.values():
            stop.set()
        if self._executor is not None:
            self._executor.shutdown(wait=True)


def joined_digests(results: Sequence[Mapping[str, str | list[str]]]) -> dict[int, str]:
    """Every rank's :meth:`FileDigests.result` (in rank order) as each cut file's digest."""
    whole = {int(n): d for each in results for n, d in each.items() if isinstance(d, str)}
    runs: dict[int, list[str]] = {}
    for each in results:
        for n, d in each.items():
            if not isinstance(d, str):
                runs.setdefault(int(n), []).extend(d)
    return {**whole, **{n: combine_digests(blocks) for n, blocks in runs.items()}}


def _read_part(group: Group, schema: Schema, parts: list[tuple[int, int, Share]], folder: Path,
               split: Sequence[float], seed: int, bad_rows: str, chunk_rows: int, codes: Sequence[int | None],
               digests: FileDigests, one_hot_into: tuple[Path, int, int] | None = None
               ) -> tuple[dict[str, Any], list[Any] | None, StoreWriter | None]:
    """This rank's parts read into a store of its own in ``folder`` (its one-hot keys into
    ``one_hot_into``, see :class:`OneHotInPlace`): what the others need to know of it (``digests``'
    among it), the failure that stopped it (None) and its writer (its key counters)."""
    from .tabular import encoded, open_reader

    mine = [(i, number, share) for i, (rank, number, share) in enumerate(parts) if rank == group.rank]
    info: dict[str, Any] = {"reports": {}, "digests": {}}
    writer, current = None, -1
    try:
        folder.mkdir()
        writer = StoreWriter(folder, schema.field_specs(), split, seed, dense_names=schema.dense_names,
                             one_hot_into=one_hot_into)
        reader = open_reader(schema, bad_rows, chunk_rows, encode=True)
        for current, number, share in mine:
            for chunk in reader.read([share]):
                rows = encoded(schema, chunk)
                writer.append(chunk.labels, rows.columns, dense=rows.dense, split_code=codes[number])
            info["reports"][str(current)] = dataclasses.asdict(reader.reports[-1])
        info["digests"] = digests.result()
        info["manifest"] = writer.finish()
        return info, None, writer
    except Exception as error:  # noqa: BLE001 - every rank must learn of it
        return info, _failure(current if current >= 0 else (mine[0][0] if mine else 0), error), writer


def _exchange_rounds(sizes: np.ndarray) -> list[list[int]]:
    """The fields in runs, in order, such that no rank sends or receives more than about
    ``_EXCHANGE_VALUES`` values in one (a field over that alone is a run of its own): ``sizes[r, f]``
    the distinct keys of field ``f`` on rank ``r``, each rank sending every other its range of
    them as keys and counts (a rank's ranges of about equal size: it sends about its own keys and
    receives about a rank's share of everyone's)."""
    ranks = sizes.shape[0]
    if int(sizes.max(initial=0)) >= 1 << 30:
        raise RuntimeError("a field's keys on a rank exceed what one MPI call carries (2^31 values)")
    rounds: list[list[int]] = []
    load = np.zeros(ranks, dtype=np.int64)
    for number in range(sizes.shape[1]):
        values = 2 * np.maximum(sizes[:, number], sizes[:, number].sum() // ranks)
        if not rounds or int((load + values).max()) > _EXCHANGE_VALUES:
            rounds.append([])
            load[:] = 0
        rounds[-1].append(number)
        load += values
    return rounds


def _merge_counters(group: Group, writer: StoreWriter) -> list[dict[str, Any]]:
    """Each field's figures (distinct ids, occurrences, top-10 share) of every rank's keys. Every
    rank merges ONE range of every field's keys (:func:`counting.by_range`: the same cut on every
    rank), so the ranks share the merge evenly however unequal the fields (merging whole fields
    on their ranks took 1.4 s of 6.6 on 8 ranks of Criteo, where one rank held the largest); a
    field's figures are then the ranges' distinct ids and occurrences summed and the 10 largest
    of the ranges' 10 largest counts, exactly one counter's. The ranges travel in a few
    collectives (:meth:`Group.alltoallv`), in runs of fields that bound the values in flight
    (:func:`_exchange_rounds`); a rank merges a run's fields side by side on its threads. A rank's
    piece for a rank: each field's entry count, then each field's keys and their counts."""
    from .counting import KeyCounter, by_range, top_share_of

    counters = writer.counters
    sizes = np.array(group.allgather([counter.distinct for counter in counters]), dtype=np.int64)
    figures: dict[str, list[int]] = {}
    for fields in _exchange_rounds(sizes.reshape(group.size, len(counters))):
        ranges = each(lambda number: by_range(*counters[number].entries(), group.size), fields)
        received = group.alltoallv([np.concatenate([np.array([len(cut[d][0]) for cut in ranges], dtype=np.int64),
                                                    *[a for cut in ranges for a in cut[d]]])
                                    for d in range(group.size)])
        pieces = []
        for data in received:  # per source: the run's fields' keys and counts in this rank's range
            lengths = data[:len(fields)]
            pieces.append(np.split(data[len(fields):], np.cumsum(np.repeat(lengths, 2))[:-1].tolist()))

        def merge(index: int) -> list[int]:
            merged = KeyCounter.sized_for(sum(piece[2 * index].shape[0] for piece in pieces))
            for piece in pieces:
                merged.add(piece[2 * index], piece[2 * index + 1])
            return [merged.distinct, merged.total, *merged.top_counts(10).tolist()]

        figures.update({str(number): merged for number, merged in zip(fields, each(merge, range(len(fields))))})
    everyone = group.allgather(figures)
    out = []
    for number in range(len(counters)):
        parts = np.array([each_rank[str(number)] for each_rank in everyone], dtype=np.int64)
        distinct, total = int(parts[:, 0].sum()), int(parts[:, 1].sum())
        out.append(key_figures(distinct, total, top_share_of(list(parts[:, 2:]), total)))
    return out


class OneHotInPlace:
    """The joined store's one-hot keys (most of its bytes) written by each rank straight into
    their file, where they would be if every line of the ranks before it were a row: the parts'
    lines are counted before reading (:func:`count_lines`). Where some were not rows (bad rows
    skipped, blank lines), rank 0 moves the blocks down in rank order before the file is cut to
    its size; the bytes are the same either way. Off (the keys copied with the rest of a part,
    :func:`place_part`) where a part was not counted (a file read whole) or there is no one-hot
    field."""

    def __init__(self, group: Group, schema: Schema, parts: list[tuple[int, int, Share]], directory: Path) -> None:
        header = schema.format.type not in ("criteo", "parquet") and schema.format.header
        self.expected = rows_if_all_valid(group, parts, header)
        self.width = one_hot_width(schema.field_specs())
        self.path = directory / ONE_HOT_KEYS_FILE
        self.on = self.expected is not None and self.width > 0
        #: the files the ranks wrote in place (:func:`place_part`'s ``placed``, :func:`make_files`'s ``keep``)
        self.files = {ONE_HOT_KEYS_FILE} if self.on else set()

    def start(self, group: Group) -> tuple[Path, int, int] | None:
        """Collective: rank 0 makes the file for every line's row; this rank's ``(file, first row,
        most rows)``."""
        if not self.on:
            return None
        assert self.expected is not None
        size = sum(self.expected) * self.width * np.dtype(np.int64).itemsize
        together(group, lambda: os.truncate(self._create(), size) if group.rank == 0 else None)
        return self.path, sum(self.expected[:group.rank]), self.expected[group.rank]

    def _create(self) -> Path:
        self.path.touch(exist_ok=False)
        return self.path

    def settle(self, manifests: Sequence[Mapping[str, Any]]) -> None:
        """On rank 0 once every rank has read: each rank's rows moved to where they belong."""
        if not self.on:
            return
        assert self.expected is not None
        rows = [int(m["num_rows"]) for m in manifests]
        move_rows(self.path, self.width, [(sum(self.expected[:r]), sum(rows[:r]), rows[r]) for r in range(len(rows))])


def write_store_on_ranks(comm: Any, schema: Schema, paths: Sequence[str], directory: Path, split: Sequence[float],
                         seed: int, bad_rows: str, chunk_rows: int, roles: Sequence[str] | None = None) -> None:
    """Collective: the rows of ``paths`` as one store in ``directory`` (every rank's the same
    folder), prepared by every rank of ``comm``; as :func:`des.data.tabular.write_store` (a
    resolved ``schema``), the same bytes."""
    from .tabular import source_sections, split_by_input

    group = Group(comm)
    share_cores(group.local_size())
    kind = schema.format.type
    parts = together(group, lambda: plan(list(paths), kind, group.size))
    with FileDigests(parts, group.rank, group.size) as hashes:
        parts = together(group, lambda: count_lines(group, parts, kind, schema.format.quote))
        hashes.keep(parts)
        codes = [None if roles is None else SPLIT_NAMES.index(role) for role in roles or paths]
        folder = directory / f".part-{group.rank}"
        in_place = OneHotInPlace(group, schema, parts, directory)
        info, failure, writer = _read_part(group, schema, parts, folder, split, seed, bad_rows, chunk_rows, codes,
                                           hashes, in_place.start(group))
    everyone = group.allgather(info)
    reports = {int(i): _report(r) for each in everyone for i, r in each["reports"].items()}
    digests = joined_digests([each["digests"] for each in everyone])
    joined, failures = _joined_reports(list(paths), parts, reports, digests)
    agree(group, failure, failures)
    manifests = [each["manifest"] for each in everyone]
    sections = {**source_sections(joined, bad_rows), **manifest_sections(schema)}
    outline = joined_manifest(manifests, [], [0, 0, 0], **sections)
    together(group, lambda: (in_place.settle(manifests), make_files(directory, outline, in_place.files))
             if group.rank == 0 else None)
    rows_before = sum(int(m["num_rows"]) for m in manifests[:group.rank])
    values_before = [sum(int(m["fields"][f]["keys"]["shape"][0]) for m in manifests[:group.rank])
                     if m0["offsets"] is not None else 0 for f, m0 in enumerate(manifests[0]["fields"])]
    split_rows = np.zeros(len(SPLIT_NAMES), dtype=np.int64)

    def split_codes(first_row: int, values: np.ndarray) -> np.ndarray:
        new = assign_splits(seed, split, first_row, values.shape[0])
        split_rows[:] += np.bincount(new, minlength=len(SPLIT_NAMES))
        return new

    rewrite = {manifests[0]["split"]["array"]["file"]: split_codes} if roles is None else {}
    # the rows are copied into place on a thread while the key counters are merged over the ranks
    with ThreadPoolExecutor(1, thread_name_prefix="des-data-place") as placing:
        placed = placing.submit(place_part, folder, manifests[group.rank], directory, rows_before, values_before,
                                rewrite, placed=in_place.files)
        counts = together(group, lambda: _merge_counters(group, writer))  # type: ignore[arg-type]
        together(group, placed.result)
    if roles is None:
        split_rows = np.sum(group.allgather(split_rows.tolist()), axis=0)
    else:
        split_rows = np.sum([[m["split"]["rows"][n] for n in SPLIT_NAMES] for m in manifests], axis=0)

    def finish() -> None:
        shutil.rmtree(folder)
        if group.rank == 0:
            inputs = split_by_input(roles, joined) if roles is not None else None
            write_manifest(directory, joined_manifest(manifests, counts, split_rows.tolist(), inputs, **sections))

    together(group, finish)


def resolved_on_ranks(comm: Any, schema: Schema, compute: Callable[[], dict[str, Any]]) -> Schema:
    """Collective: ``schema`` with the statistics rank 0 computes (``compute()``), on every rank."""
    if schema.resolved:
        return schema
    group = Group(comm)
    statistics = together(group, lambda: compute() if group.rank == 0 else None)
    return schema.with_statistics(group.bcast(statistics))
