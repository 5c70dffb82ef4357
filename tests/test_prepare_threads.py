"""``des.data prepare`` works on the pieces of its inputs side by side (``des.data.parallel``); a
store never depends on how many threads made it: the same bytes, file for file, with one thread
(every task in the calling thread) and with three, for each reader and what makes it take its other
ways (bad rows skipped and named, a quoted value spanning lines, CRLF line ends, gzip, several
Parquet row groups, many chunks)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from des.data import DataError, prepare
from des.data.parallel import THREADS_VARIABLE
from des.data.schema import Schema, load_schema
from des.data.synth import default_config, synthesize_tsv
from des.data.synth_schema import synthesize_schema

REPO = Path(__file__).resolve().parents[1]
EVERY_KIND = REPO / "tests" / "data" / "every_kind.toml"


def _files(store: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(store.iterdir())}


def _both_ways(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, inputs: list[Path], **options: object) -> dict:
    """Prepare ``inputs`` with 1 and 3 threads; the stores' files (or the error) must be the same."""
    made = []
    for threads in ("1", "3"):
        monkeypatch.setenv(THREADS_VARIABLE, threads)
        try:
            made.append(_files(prepare(inputs, tmp_path / f"store-{threads}", progress=False, **options).path))
        except DataError as error:
            made.append(str(error))
    assert made[0] == made[1]
    return made[0]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_csv_pieces_quoted_crlf_gzip_and_bad_rows(monkeypatch, tmp_path):
    raw = tmp_path / "rows.csv"
    synthesize_schema(raw, 1500, "avazu", seed=1, file_format="raw")
    lines = _lines(raw)
    lines[40] = "1,2,3\n"  # a row of a wrong width, skipped and named
    lines[300] = "7" + lines[300][1:]  # a bad label
    quoted = lines[:]
    fields = quoted[1000].split(",")
    fields[5] = '"a\nb"'  # from this block on, one serial reader
    quoted[1000] = ",".join(fields)
    (tmp_path / "quoted.csv").write_text("".join(quoted))
    (tmp_path / "crlf.csv").write_bytes("".join(lines).replace("\n", "\r\n").encode())
    (tmp_path / "rows.csv.gz").write_bytes(gzip.compress("".join(lines).encode(), mtime=0))
    inputs = [tmp_path / "quoted.csv", tmp_path / "crlf.csv", tmp_path / "rows.csv.gz"]
    store = _both_ways(monkeypatch, tmp_path, inputs, schema="avazu", bad_rows="skip", chunk_rows=97)
    assert b'"skipped": 6' in store["manifest.json"]
    message = _both_ways(monkeypatch, tmp_path / "fail", inputs, schema="avazu", chunk_rows=97)
    assert message.endswith("quoted.csv:41: expected 24 columns, found 3")



def test_csv_blocks_are_a_few_megabytes_a_thread(monkeypatch, tmp_path):
    """A CSV is read in blocks of at most ``_BLOCK_BYTES_PER_THREAD`` a thread (below the chunk's
    bound): the store is the one of a single block, whatever the threads."""
    import des.data.tabular as tabular

    raw = tmp_path / "rows.csv"
    synthesize_schema(raw, 1500, "avazu", seed=5, file_format="raw")
    whole = _files(prepare(raw, tmp_path / "whole", schema="avazu", progress=False).path)
    sizes = []
    blocks = tabular.LineBlocks

    def spy(path, block_bytes, *args, **options):
        sizes.append(block_bytes)
        return blocks(path, block_bytes, *args, **options)

    monkeypatch.setattr(tabular, "LineBlocks", spy)
    monkeypatch.setattr(tabular, "_BLOCK_BYTES_PER_THREAD", 4096)  # 28 blocks of this 115 kB file on 1 thread
    assert _both_ways(monkeypatch, tmp_path, [raw], schema="avazu") == whole
    assert sizes == [4096, 3 * 4096] and raw.stat().st_size > 25 * 4096


def test_a_reader_keys_the_good_rows_where_it_checks_them(monkeypatch, tmp_path):
    """``TableReader(encode=True)``: a chunk's store columns made by the pool thread that parsed
    it (CSV pieces, the serial reader after a quoted line break, Parquet runs) are the keys of its
    good rows, as keying them afterwards gives them."""
    from des.data import tabular
    from des.data.features import encode_rows
    from des.data.tabular import TableReader

    monkeypatch.setattr(tabular, "_BLOCK_BYTES_PER_THREAD", 4096)  # blocks in pieces before the quoted line
    raw = tmp_path / "rows.csv"
    synthesize_schema(raw, 900, "avazu", seed=4, file_format="raw")
    lines = _lines(raw)
    lines[50] = "7" + lines[50][1:]  # a bad label: its chunk's other rows are kept
    fields = lines[600].split(",")
    fields[5] = '"a\nb"'
    lines[600] = ",".join(fields)
    raw.write_text("".join(lines))
    pq.write_table(pcsv.read_csv(raw, convert_options=pcsv.ConvertOptions(
        column_types={name: pa.string() for name in lines[0].strip().split(",")[1:]})), tmp_path / "rows.parquet",
        row_group_size=100)
    monkeypatch.setenv(THREADS_VARIABLE, "3")
    schema = load_schema("avazu")
    parquet = Schema.from_dict({**schema.to_dict(), "name": "avazu-parquet", "format": {"type": "parquet"}})
    for path, declared in ((raw, schema), (tmp_path / "rows.parquet", parquet)):
        chunks = list(TableReader(declared, "skip", 64, encode=True).read([path]))
        assert sum(chunk.num_rows for chunk in chunks) == 899
        for chunk in chunks:
            again = encode_rows(declared, chunk.columns, chunk.num_rows)
            assert all((a == b).all() for a, b in zip(chunk.encoded.columns, again.columns))


def test_every_kind_of_column(monkeypatch, tmp_path):
    raw = tmp_path / "every.csv"
    synthesize_schema(raw, 2000, EVERY_KIND, seed=2, file_format="raw")
    lines = _lines(raw)
    lines[700] = lines[700][:3] + "\n"
    raw.write_text("".join(lines))
    _both_ways(monkeypatch, tmp_path, [raw], schema=EVERY_KIND, bad_rows="skip", chunk_rows=131)


@pytest.mark.parametrize("piece_bytes", [None, 4096])
def test_criteo_pieces_with_bad_rows(monkeypatch, tmp_path, piece_bytes):
    """Bad rows in pieces of a thread each, and (``piece_bytes``: pieces of 4 kB or more) in two
    pieces a thread: a piece's rows after bad ones moved down."""
    from des.data import blocks

    if piece_bytes is not None:
        monkeypatch.setattr(blocks, "_MIN_PIECE_BYTES", piece_bytes)
        monkeypatch.setenv(THREADS_VARIABLE, "3")
        assert [blocks.piece_count(n * piece_bytes) for n in (1, 4, 10)] == [3, 4, 6]
    raw = tmp_path / "day.tsv"
    synthesize_tsv(raw, 3000, default_config(seed=3))
    lines = _lines(raw)
    lines[10] = "1\t2\n"
    lines[1500] = lines[1500].replace("\t", "\tq", 1)
    lines[2999] = lines[2999].rstrip("\n")  # no newline at the end
    raw.write_text("".join(lines))
    store = _both_ways(monkeypatch, tmp_path, [raw], bad_rows="skip", chunk_rows=211)
    assert b'"skipped": 2' in store["manifest.json"]
    message = _both_ways(monkeypatch, tmp_path / "fail", [raw], chunk_rows=211)
    assert message.endswith("day.tsv:11: expected 40 tab-separated columns, found 2")


def test_parquet_row_groups(monkeypatch, tmp_path):
    raw = tmp_path / "rows.csv"
    synthesize_schema(raw, 1200, "avazu", seed=4, file_format="raw")
    names = pcsv.open_csv(raw).schema.names
    table = pcsv.read_csv(raw, convert_options=pcsv.ConvertOptions(
        column_types={n: pa.int64() if n == "click" else pa.string() for n in names}))
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=77)
    declared = load_schema("avazu").to_dict()
    schema = Schema.from_dict({**declared, "name": "avazu-parquet", "format": {"type": "parquet"}})
    _both_ways(monkeypatch, tmp_path, [tmp_path / "rows.parquet"], schema=schema, chunk_rows=200)


def test_work_given_in_a_pool_thread_runs_there():
    """A reader keys a batch in the pool's thread that parsed it, and keying spreads its fields with
    ``each``: there it runs them in that thread (waiting on tasks queued behind itself, two busy
    threads would wait for ever; so this runs in a process of its own, with a time limit)."""
    import subprocess
    import sys

    code = (
        "import threading\n"
        "from des.data.parallel import each, in_pool, submit\n"
        "def outer(_):\n"
        "    assert in_pool()\n"
        "    return each(lambda _: threading.current_thread().name, range(4))\n"
        "names = [f.result() for f in [submit(outer, k) for k in range(4)]]\n"
        "assert all(len(set(n)) == 1 and n[0].startswith('des-data_') for n in names) and not in_pool()\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, THREADS_VARIABLE: "2"})
    assert done.stdout.strip() == "ok", done.stderr


def test_each_does_not_wait_behind_the_pools_queue(monkeypatch):
    """``each`` while both pool threads are busy with work given before: its caller does every call
    (the helpers it queued are called off), in order; the first error in item order is raised once
    every call has ended."""
    import threading

    from des.data.parallel import each, submit

    monkeypatch.setenv(THREADS_VARIABLE, "2")
    release = threading.Event()
    busy = [submit(release.wait, 30) for _ in range(2)]
    done: list = []
    caller = threading.Thread(target=lambda: done.append(each(lambda x: x * x, range(5))))
    caller.start()
    caller.join(10)
    release.set()
    assert done == [[0, 1, 4, 9, 16]] and all(future.result(timeout=30) for future in busy)
    ended: list[int] = []

    def call(x: int) -> int:
        ended.append(x)
        if x in (1, 3):
            raise ValueError(f"item {x}")
        return x

    with pytest.raises(ValueError, match="item 1"):
        each(call, range(6))
    assert sorted(ended) == list(range(6))
