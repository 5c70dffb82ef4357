"""``des.data prepare`` on every rank of a job (``des/data/ranks.py``): N ranks share the inputs
(byte ranges of plain CSV/TSV and Criteo TSV files cut after a newline, Parquet row groups, gzip
and quoted files whole) and write ONE store, the same bytes, file for file, as one process; a bad
row is named by its line in the file, and the job says it once."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from des.data import DataError, open_dataset, prepare, prepare_splits
from des.data import ranks as ranks_module
from des.data.blocks import Share
from des.data.ranks import plan, share_weights
from des.data.schema import Schema, load_schema
from des.data.synth import default_config, synthesize_tsv
from des.data.synth_schema import synthesize_schema
from tests.conftest import run_mpi

REPO = Path(__file__).resolve().parents[1]
EVERY_KIND = str(REPO / "tests" / "data" / "every_kind.toml")


def _files(store: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(store.iterdir())}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _inputs(tmp_path: Path) -> list[dict]:
    """Each kind of input (its bad rows where a later rank reads them) and how to prepare it."""
    raw = tmp_path / "rows.csv"
    synthesize_schema(raw, 1500, "avazu", seed=1, file_format="raw")
    lines = _lines(raw)
    lines[40], lines[1400] = "1,2,3\n", "7" + lines[1400][1:]  # a wrong width; a bad label on the last rank
    (tmp_path / "plain.csv").write_text("".join(lines))
    quoted = lines[:]
    fields = quoted[1000].split(",")
    fields[5] = '"a\nb"'  # a line break in a value: the file is read whole
    quoted[1000] = ",".join(fields)
    (tmp_path / "quoted.csv").write_text("".join(quoted))
    (tmp_path / "crlf.csv").write_bytes("".join(lines).replace("\n", "\r\n").encode())
    (tmp_path / "rows.csv.gz").write_bytes(gzip.compress("".join(lines).encode(), mtime=0))
    tsv = tmp_path / "day.tsv"
    synthesize_tsv(tsv, 2000, default_config(seed=3))
    lines = _lines(tsv)
    lines[10], lines[1900] = "1\t2\n", "2" + lines[1900][1:]
    lines[-1] = lines[-1].rstrip("\n")  # no newline at the end
    tsv.write_text("".join(lines))
    names = pcsv.open_csv(raw).schema.names
    table = pcsv.read_csv(raw, convert_options=pcsv.ConvertOptions(
        column_types={n: pa.int64() if n == "click" else pa.string() for n in names}))
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=77)
    parquet = Schema.from_dict({**load_schema("avazu").to_dict(), "name": "avazu-parquet", "format": {"type": "parquet"}})
    every = tmp_path / "every.csv"
    synthesize_schema(every, 1200, EVERY_KIND, seed=2, file_format="raw")
    csvs = [str(tmp_path / name) for name in ("plain.csv", "quoted.csv", "crlf.csv", "rows.csv.gz")]
    return [
        {"name": "csv", "inputs": csvs, "options": {"schema": "avazu", "bad_rows": "skip", "chunk_rows": 97}},
        {"name": "csv-fail", "inputs": [str(tmp_path / "plain.csv")], "options": {"schema": "avazu"}},
        {"name": "criteo", "inputs": [str(tsv)], "options": {"bad_rows": "skip", "chunk_rows": 211, "seed": 5}},
        {"name": "criteo-fail", "inputs": [str(tsv)], "options": {}},
        {"name": "parquet", "inputs": [str(tmp_path / "rows.parquet")], "options": {"schema": parquet.to_dict()}},
        {"name": "splits", "splits": {"train": [str(every)], "validation": [str(every)], "test": [str(raw)]},
         "options": {"schema": EVERY_KIND, "bad_rows": "skip", "chunk_rows": 131}},
        {"name": "statistics", "inputs": [str(every)], "options": {"schema": EVERY_KIND}},
        {"name": "gzip", "inputs": [str(tmp_path / "rows.csv.gz")], "options": {"schema": "avazu", "bad_rows": "skip"}},
        {"name": "cache", "cache": str(tmp_path / "plain.csv"), "options": {"schema": "avazu", "bad_rows": "skip"}},
    ]


def _one_process(job: dict, output: Path) -> dict[str, bytes] | str:
    options = dict(job["options"])
    if isinstance(options.get("schema"), dict):
        options["schema"] = Schema.from_dict(options["schema"])
    try:
        if "cache" in job:
            return _files(open_dataset(job["cache"], cache_dir=output, **options).path)
        if "splits" in job:
            return _files(prepare_splits(job["splits"], output, progress=False, **options).path)
        return _files(prepare(job["inputs"], output, progress=False, **options).path)
    except DataError as error:
        return str(error)


def _on_ranks(ranks: int, jobs: list[dict], folder: Path) -> list[dict[str, bytes] | str]:
    listed = [{**job, "output": str(folder / job["name"])} for job in jobs]
    folder.mkdir()
    (folder / "jobs.json").write_text(json.dumps(listed))
    run_mpi(ranks, ["-m", "tests.mpi_programs.prepare_stores", str(folder / "jobs.json")], timeout=180)
    return [(folder / f"{job['name']}.error").read_text() if (folder / f"{job['name']}.error").exists()
            else _files(next((folder / job["name"]).iterdir()) if "cache" in job else folder / job["name"])
            for job in jobs]


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_write_one_process_store(tmp_path, ranks):
    jobs = _inputs(tmp_path)
    expected = [_one_process(job, tmp_path / "one" / job["name"]) for job in jobs]
    got = _on_ranks(ranks, jobs, tmp_path / f"ranks-{ranks}")
    for job, want, have in zip(jobs, expected, got):
        if isinstance(want, dict) and isinstance(have, dict):
            differing = sorted(name for name in set(want) | set(have) if want.get(name) != have.get(name))
            assert not differing, f"{job['name']}: {differing}"
        else:
            assert have == want, job["name"]
    for job in jobs[1:5]:  # each file of these cut into a part per rank
        kind = "parquet" if job["name"] == "parquet" else "csv"
        assert [rank for rank, _, share in plan(job["inputs"], kind, ranks) if not share.whole] == list(range(ranks))
    whole = [share.path for _, _, share in plan(jobs[0]["inputs"], "csv", ranks) if share.whole]
    assert whole[-1].endswith("rows.csv.gz")
    by_name = dict(zip((job["name"] for job in jobs), expected))
    assert by_name["csv-fail"].endswith("plain.csv:41: expected 24 columns, found 3")
    assert by_name["criteo-fail"].endswith("day.tsv:11: expected 40 tab-separated columns, found 2")
    assert b'"skipped": 8' in by_name["csv"]["manifest.json"] and b'"first_skipped"' in by_name["csv"]["manifest.json"]


def test_a_bad_row_is_said_once_per_job(tmp_path):
    raw = tmp_path / "day.tsv"
    synthesize_tsv(raw, 1500, default_config(seed=4))
    lines = _lines(raw)
    lines[1400] = "2" + lines[1400][1:]  # read by the last rank
    raw.write_text("".join(lines))
    proc = run_mpi(3, ["-m", "des.data", "prepare", "--input", str(raw), "--output", str(tmp_path / "store")],
                   check=False, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"des.data: error: {raw}:1401: column label: '2' is not 0 or 1"]
    assert not (tmp_path / "store").exists() and [p.name for p in tmp_path.iterdir()] == ["day.tsv"]


def test_the_ranks_that_hash_a_file_prepare_less_of_it(tmp_path):
    """The plan's parts still tile each file, cut after a newline, in rank order; a rank that
    hashes a cut file whole (the one reading its first part) gets that much less of the bytes."""
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    synthesize_schema(first, 3000, "avazu", seed=1, file_format="raw")
    synthesize_schema(second, 2000, "avazu", seed=2, file_format="raw")
    data = first.read_bytes()
    parts = plan([str(first)], "csv", 3)
    assert [rank for rank, _, _ in parts] == [0, 1, 2]
    spans = [(share.start, share.end) for _, _, share in parts]
    assert spans[0][0] == 0 and spans[-1][1] == len(data) and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(data[start - 1:start] == b"\n" for start, _ in spans[1:])
    lengths = [end - start for start, end in spans]
    line = max(len(text) for text in data.splitlines(keepends=True))
    assert lengths[0] < min(lengths[1:]) - 2 * line and abs(lengths[1] - lengths[2]) <= 2 * line
    both = plan([str(first), str(second)], "csv", 4)  # rank 2 reads the second file's first part
    got = [0] * 4
    for rank, _, share in both:
        got[rank] += share.end - share.start
    hashers = {rank for i, (rank, number, _) in enumerate(both) if i == 0 or both[i - 1][1] != number}
    assert hashers == {0, 2} and max(got[0], got[2]) < min(got[1], got[3]) - 2 * line
    assert share_weights([(0, 0, Share(str(first)))], [len(data)], "csv", 3) == [1.0, 1.0, 1.0]  # none cut


def test_the_key_counters_are_exchanged_in_bounded_runs_of_fields():
    """Each run of fields sends and receives about at most the bound on every rank (a rank sends
    its keys, and receives a rank's share of everyone's), a field over it alone is a run of its
    own, the fields in order; a field no MPI call can carry is refused."""
    bound = ranks_module._EXCHANGE_VALUES
    sizes = np.array([[bound // 8, bound // 8, 1, 3], [bound // 8, 0, bound, 3]], dtype=np.int64)
    rounds = ranks_module._exchange_rounds(sizes)
    assert rounds == [[0, 1], [2], [3]] and sum(rounds, []) == [0, 1, 2, 3]
    for fields in rounds[:1]:
        load = [sum(2 * max(int(sizes[r, f]), int(sizes[:, f].sum()) // 2) for f in fields) for r in range(2)]
        assert max(load) <= bound
    with pytest.raises(RuntimeError, match="2\\^31"):
        ranks_module._exchange_rounds(np.array([[0], [1 << 30]], dtype=np.int64))


@pytest.mark.parametrize("parts", [1, 3, 8])
def test_key_counters_merged_by_ranges_of_keys_give_one_counters_figures(parts):
    """Every rank's counter cut into the same ranges of keys, each range merged apart: the ranges
    hold every key once, and their distinct keys, occurrences and 10 largest counts give the
    figures of one counter of all the keys (key 0 and ties included)."""
    from des.data.counting import KeyCounter, by_range, top_share_of
    from des.data.store import counted, key_figures

    rng = np.random.default_rng(parts)
    batches = [rng.zipf(1.3, size=5000).astype(np.int64) * 7919 for _ in range(3)]
    batches[1][:40] = 0
    one, ranks = KeyCounter(), [KeyCounter() for _ in batches]
    for counter, keys in zip(ranks, batches):
        counter.add(keys)
        one.add(keys)
    cuts = [by_range(*counter.entries(), parts) for counter in ranks]
    merged = []
    for r in range(parts):
        counter = KeyCounter()
        for cut in cuts:
            counter.add(*cut[r])
        merged.append(counter)
    seen = np.concatenate([counter.entries()[0] for counter in merged])
    assert np.unique(seen).shape[0] == seen.shape[0] == one.distinct
    if parts > 1:
        assert all(counter.distinct for counter in merged)  # every range gets keys
    total = sum(counter.total for counter in merged)
    figures = key_figures(sum(c.distinct for c in merged), total, top_share_of([c.top_counts(10) for c in merged], total))
    assert figures == counted(one) and 0 < figures["top10_share"] < 1


def test_a_cut_files_digest_is_taken_from_the_plan_on_and_given_up_if_it_is_read_whole(tmp_path):
    """The rank reading a cut file's first part hashes the whole file (the others none) where the
    file is not over a digest block; a file the line count makes one part is given up, its hash
    stopped."""
    import hashlib
    import threading

    from des.data.blocks import file_digest, file_sha256
    from des.data.ranks import FileDigests

    path = tmp_path / "rows.csv"
    path.write_bytes(b"a,b\n" * 300_000)
    size = path.stat().st_size
    parts = [(0, 0, Share(str(path), 0, size // 2)), (1, 0, Share(str(path), size // 2, size))]
    with FileDigests(parts, 0, 2) as first, FileDigests(parts, 1, 2) as second:
        assert first.result() == {"0": hashlib.sha256(path.read_bytes()).hexdigest()} == {"0": file_digest(path)}
        assert second.result() == {}
    with FileDigests(parts, 0, 2) as given_up:
        given_up.keep([(0, 0, Share(str(path)))])
        assert given_up.result() == {}
    stop = threading.Event()
    stop.set()
    assert file_sha256(path, stop) == "" == file_digest(path, stop)


@pytest.mark.parametrize("ranks", [1, 3, 5])
def test_a_file_over_a_digest_block_is_hashed_in_blocks_every_rank_a_run(tmp_path, monkeypatch, ranks):
    """A file over ``DIGEST_BLOCK`` bytes (4 KiB here) is identified by the sha256 of its blocks'
    sha256 digests: read at once, read in pieces of any length, and taken by ``ranks`` ranks each
    hashing its run of the blocks (every block once, the runs within one block of each other in
    length, the same work to every rank in the plan) all give it; a digest recorded as the file's
    sha256 (a store prepared before digests in blocks) is compared as such."""
    import hashlib

    from des.data import blocks
    from des.data.ranks import FileDigests, digest_runs, joined_digests

    monkeypatch.setattr(blocks, "DIGEST_BLOCK", 4096)
    data = np.random.default_rng(ranks).integers(0, 256, 4096 * 6 + 1234, dtype=np.uint8).tobytes()
    path = tmp_path / "rows.csv"
    path.write_bytes(data)
    digests = [hashlib.sha256(data[i:i + 4096]).digest() for i in range(0, len(data), 4096)]
    expected = "sha256-blocks-64MiB:" + hashlib.sha256(b"".join(digests)).hexdigest()
    assert blocks.file_digest(path) == expected
    for step in (1000, 4096, 5000):
        digest = blocks.FileDigest(len(data))
        for i in range(0, len(data), step):
            digest.update(data[i:i + step])
        assert digest.hexdigest() == expected
    runs = digest_runs(len(data), ranks)
    assert [b for first, last in runs for b in range(first, last)] == list(range(len(digests)))
    assert max(b - a for a, b in runs) - min(b - a for a, b in runs) <= 1
    parts = [(r, 0, Share(str(path), len(data) * r // ranks, len(data) * (r + 1) // ranks)) for r in range(ranks)]
    results = []
    for rank in range(ranks):
        with FileDigests(parts, rank, ranks) as mine:
            results.append(mine.result())
    assert joined_digests(results) == {0: expected}
    assert blocks.file_digest(path, like=hashlib.sha256(data).hexdigest()) == hashlib.sha256(data).hexdigest()
    assert blocks.file_digest(path, like=expected) == expected
    weights = share_weights(parts, [len(data)], "csv", ranks)
    assert max(weights) - min(weights) <= 0.01 * ranks  # a block of hashing at most


def test_ranks_hash_a_large_file_in_blocks_and_write_one_process_store(tmp_path, monkeypatch):
    """With the digest block at 4 KiB, a CSV, a Criteo TSV and a Parquet file are each hashed in
    blocks by the ranks that prepare them: the store is one process's, file for file, and records
    the blocks' digest; a store that recorded the file's sha256 still counts as prepared from it."""
    import hashlib

    from des.data import blocks

    jobs = [job for job in _inputs(tmp_path) if job["name"] in ("csv-fail", "criteo", "parquet")]
    jobs[0] = {**jobs[0], "name": "csv", "options": {"schema": "avazu", "bad_rows": "skip"}}
    store = tmp_path / "sha256-store"
    prepare(jobs[0]["inputs"], store, progress=False, **jobs[0]["options"])  # the file's sha256 recorded
    monkeypatch.setattr(blocks, "DIGEST_BLOCK", 4096)
    expected = [_one_process(job, tmp_path / "one" / job["name"]) for job in jobs]
    got = _on_ranks(3, [{**job, "digest_block": 4096} for job in jobs], tmp_path / "ranks")
    for job, want, have in zip(jobs, expected, got):
        assert isinstance(want, dict) and have == want, job["name"]
        source = json.loads(want["manifest.json"])["sources"][0]
        assert source["sha256"] == blocks.file_digest(job["inputs"][0]) and source["sha256"].startswith("sha256-blocks")
    assert json.loads((store / "manifest.json").read_text())["sources"][0]["sha256"] == \
        hashlib.sha256(Path(jobs[0]["inputs"][0]).read_bytes()).hexdigest()
    assert prepare(jobs[0]["inputs"], store, progress=False, **jobs[0]["options"]).path == store  # found, not refused
