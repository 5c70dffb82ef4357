"""Preparing the files of a declared schema: Avazu's layout, CSV/TSV/gzip/Parquet read alike,
statistics from the training rows only, bounded chunks, bad input as one line naming file:line and
column with nothing left behind, skipped rows counted, the cache keyed on the schema, separate
inputs, synthetic data read back, and Criteo's store unchanged."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from des.data import ColumnStore, DataError, open_dataset, open_inputs, prepare
from des.data.__main__ import main
from des.data.build import cache_entry_name, file_digest
from des.data.features import string_keys
from des.data.schema import Schema, load_schema
from des.data.split import DEFAULT_SPLIT, assign_splits, check_fractions
from des.data.synth_schema import synthesize_schema

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
AVAZU_HEADER = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
                "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21")
AVAZU_ROWS = [
    "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,"
    "ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79",
    "10000169349117863715,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,"
    "96809ac8,711ee120,1,0,15704,320,50,1722,0,35,100084,79",
    "10000371904215119486,1,14102223,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,"
    "b3cf8def,8a4875bd,1,0,15704,320,50,1722,0,35,100084,79",
    "10000640724480838376,0,14102601,1002,0,84c7ba46,c4e18dd6,50e219e0,ecad2386,7801e8d9,07d7df22,c357dbff,"
    "f1ac7184,373ecbe6,0,0,21689,320,50,2496,3,167,100191,23",
]
TABLE = """\
[format]
type = "csv"
{format}
[label]
column = "y"
rule = "in [4, 5]"
[[columns]]
name = "user"
kind = "categorical"
[[columns]]
name = "tags"
kind = "multi_valued"
separator = "|"
pooling = "mean"
[[columns]]
name = "price"
kind = "numeric"
as = "bucketize"
count = 4
[[columns]]
name = "age"
kind = "numeric"
as = "dense"
standardize = true
fill = 30.0
[[columns]]
name = "note"
kind = "ignored"
"""


def _table_rows(n: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        tags = "|".join(f"t{k}" for k in rng.integers(0, 20, rng.integers(0, 4)))
        age = "" if i % 17 == 0 else str(int(rng.integers(18, 80)))
        rows.append([str(int(rng.integers(1, 6))), f"u{rng.integers(0, 50)}", tags, f"{rng.normal(100, 30):.3f}",
                     age, f"note {i}, with a comma"])
    return rows


def _csv(path: Path, rows: list[list[str]], delimiter: str = ",", header: bool = True) -> Path:
    def quoted(value: str) -> str:
        return f'"{value}"' if delimiter in value else value

    lines = ([delimiter.join(["y", "user", "tags", "price", "age", "note"])] if header else []) + [
        delimiter.join(quoted(v) for v in row) for row in rows]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


def _schema(tmp_path: Path, format_lines: str = "", name: str = "table.toml") -> Path:
    path = tmp_path / name
    path.write_text(TABLE.format(format=format_lines))
    return path


def _keys(store: ColumnStore) -> list[np.ndarray]:
    return [np.asarray(store.field(f)[1]) for f in range(store.num_fields)]


def test_avazu_rows_in_the_kaggle_layout(tmp_path):
    raw = tmp_path / "train.csv"
    raw.write_text(AVAZU_HEADER + "\n" + "\n".join(AVAZU_ROWS) + "\n")
    store = prepare(raw, tmp_path / "store", schema="avazu", split=(1.0, 0.0, 0.0))
    assert store.num_rows == 4 and store.labels.tolist() == [0, 0, 1, 0]
    assert store.manifest["key_scheme"]["version"] == 2 and store.schema["name"] == "avazu"
    assert store.field_names[-2:] == ("hour_of_day", "weekday") and "id" not in store.field_names
    assert np.asarray(store.field("hour_of_day")[1]).tolist() == [1, 1, 24, 2]  # hours 0, 0, 23, 1 (+1)
    assert np.asarray(store.field("weekday")[1]).tolist() == [2, 2, 3, 7]  # Tue 21, Wed 22, Sun 26 Oct 2014
    sites = ["1fbe01fe", "1fbe01fe", "1fbe01fe", "84c7ba46"]
    assert np.asarray(store.field("site_id")[1]).tolist() == string_keys(pa.array(sites)).tolist()
    assert store.manifest["sources"][0]["lines"] == 4 and store.num_dense == 0


def test_csv_tsv_gzip_and_parquet_give_the_same_store(tmp_path, monkeypatch):
    rows = _table_rows(300)
    for row in rows[::29]:
        row[1] = ""  # a missing user
    csv_store = prepare(_csv(tmp_path / "t.csv", rows), tmp_path / "csv", schema=_schema(tmp_path))
    tsv = _csv(tmp_path / "t.tsv.gz", rows, delimiter="\t", header=False)
    names = 'delimiter = "\\t"\nheader = false\nnames = ["y", "user", "tags", "price", "age", "note"]'
    tsv_store = prepare(tsv, tmp_path / "tsv", schema=_schema(tmp_path, names, "tsv.toml"))
    table = pa.table({name: pa.array([r[i] or None for r in rows]) for i, name in
                      enumerate(["y", "user", "tags", "price", "age", "note"])})
    for i, name in ((0, "y"), (3, "price"), (4, "age")):  # Parquet columns hold numbers, not text
        table = table.set_column(i, name, table[name].cast(pa.float64()))
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=100)  # three dictionaries, keyed one by one
    from des.data import features

    through: list[int] = []  # the dictionaries keyed as such (text read as one: its pages hold one)
    keyed = features.by_indices
    monkeypatch.setattr(features, "by_indices", lambda array, keys: through.append(len(keys)) or keyed(array, keys))
    parquet_store = prepare(tmp_path / "t.parquet", tmp_path / "parquet",
                            schema=_schema(tmp_path, "", "p.toml").read_text().replace('type = "csv"',
                                                                                     'type = "parquet"')
                            and _parquet_schema(tmp_path))
    assert through and max(through) <= 50
    through.clear()
    coded = table  # text as dictionaries (a pandas categorical's): a categorical's stays so, the list's is decoded
    for name in ("user", "tags", "note"):
        coded = coded.set_column(coded.schema.get_field_index(name), name, coded[name].dictionary_encode())
    assert coded["user"].null_count
    pq.write_table(coded, tmp_path / "coded.parquet")
    coded_store = prepare(tmp_path / "coded.parquet", tmp_path / "coded", schema=_parquet_schema(tmp_path))
    assert through and max(through) <= 50  # the users' (u0..u49) keyed as a dictionary, not the notes' (300)
    for other in (tsv_store, parquet_store, coded_store):
        for a, b in zip(_keys(csv_store), _keys(other)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(csv_store.take_dense(np.arange(300)), other.take_dense(np.arange(300)))
        np.testing.assert_array_equal(csv_store.labels, other.labels)
    assert csv_store.layout()[1] == ("tags", "multi_valued", "multi-hot", True)
    assert csv_store.labels.tolist() == [int(r[0] in ("4", "5")) for r in rows]
    tags = csv_store.field("tags")
    lengths = np.diff(tags[0])
    np.testing.assert_array_equal(tags[2], (1.0 / np.repeat(lengths, lengths)).astype(np.float32))


def test_ascii_pieces_are_read_as_bytes_and_give_the_text_store(tmp_path, monkeypatch):
    """A piece of ASCII lines is parsed as bytes and viewed as text (no UTF-8 check of each value);
    a piece holding other text is parsed as text: either way the store is the one the text path
    makes, file for file."""
    from des.data import tabular

    monkeypatch.setenv("DES_DATA_THREADS", "2")  # a block cut into two pieces, the second not ASCII
    raw = tmp_path / "train.csv"
    lines = [AVAZU_ROWS[i % 4].replace("1fbe01fe", f"s{i % 7}") for i in range(400)]
    lines = [line.replace(",07d7df22,", ",,") if i % 3 == 0 else line for i, line in enumerate(lines)]  # missing
    lines[-1] = lines[-1].replace("ecad2386", "café")
    raw.write_text(AVAZU_HEADER + "\n" + "\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(tabular, "plain_lines", lambda *a: None)  # pyarrow parses plain pieces too
    viewed: list[int] = []
    as_text = tabular._as_text
    monkeypatch.setattr(tabular, "_as_text", lambda table: viewed.append(table.num_rows) or as_text(table))
    store = prepare(raw, tmp_path / "bytes", schema="avazu")
    assert 0 < sum(viewed) < 400  # the first piece read as bytes, the last (with "café") as text
    monkeypatch.setattr(tabular, "_ascii_only", lambda piece: False)  # every piece parsed as text
    viewed.clear()
    reference = prepare(raw, tmp_path / "text", schema="avazu")
    assert not viewed
    files = sorted(p.name for p in (tmp_path / "text").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "bytes").iterdir())
    for name in files:
        assert (tmp_path / "bytes" / name).read_bytes() == (tmp_path / "text" / name).read_bytes(), name
    cafe = string_keys(pa.array(["café"]))[0]
    assert cafe in np.asarray(store.field("app_id")[1])
    assert reference.num_rows == store.num_rows == 400


def test_a_value_that_is_not_utf8_fails_with_its_line_and_column(tmp_path, monkeypatch):
    """A column read that holds bytes that are not UTF-8 fails naming the file's line and the column
    (the bytes of the ignored ``id`` column earlier are not read, so not named), nothing left."""
    monkeypatch.setenv("DES_DATA_THREADS", "2")
    lines = [AVAZU_ROWS[i % 4] for i in range(2000)]
    lines[1200] = "1\udcfe" + lines[1200]  # the ignored id
    lines[1500] = lines[1500].replace("ecad2386", "ecad\udcff386")
    raw = tmp_path / "train.csv"
    raw.write_bytes((AVAZU_HEADER + "\n" + "\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    with pytest.raises(DataError) as error:
        prepare(raw, tmp_path / "store", schema="avazu")
    assert str(error.value) == f"{raw}:1502: column app_id: byte 0xff is not UTF-8 text"
    assert not (tmp_path / "store").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_each_row_groups_dictionary_is_keyed_before_the_row_groups_are_joined():
    """``_keyed_dictionaries``: a dictionary column of several row groups (each its own dictionary)
    becomes the keys of its text (int64, marked as the tokenizer marks keys; null and "" key 0),
    without Arrow unifying the dictionaries first; other columns stay as they are."""
    from des.data.tabular import _keyed_dictionaries
    from des.data.tokenizer import KEYED, keyed_columns

    text = [["b", "a", None, "b"], ["c", "", "a"]]
    table = pa.Table.from_batches([pa.record_batch([pa.array(t).dictionary_encode(), pa.array(range(len(t)))],
                                                   names=["user", "n"]) for t in text])
    keyed = _keyed_dictionaries(table, ["user"]).combine_chunks().to_batches()[0]
    assert keyed.schema.field("user").type == pa.int64() and keyed.schema.field("user").metadata == KEYED
    assert keyed_columns(keyed) == {"user"} and keyed.column("n").to_pylist() == [0, 1, 2, 3, 0, 1, 2]
    expected = string_keys(pa.array(text[0] + text[1]))
    np.testing.assert_array_equal(keyed.column("user").to_numpy(), expected)
    assert expected[2] == expected[5] == 0


def test_parquet_text_is_read_as_a_dictionary_only_where_its_pages_hold_one(tmp_path):
    """A Parquet column is read as a dictionary where its first row group's dictionary page is
    small (the writer kept it: 2x faster than text), not where the writer gave up on it for plain
    pages (many distinct values: 4x slower as a dictionary) nor where it wrote none."""
    from des.data.tabular import _small_dictionary

    many = [f"id{v}" for v in np.random.default_rng(0).permutation(150_000)]
    few = [f"u{v % 50}" for v in range(150_000)]
    pq.write_table(pa.table({"many": many, "few": few}), tmp_path / "d.parquet")
    pq.write_table(pa.table({"few": few}), tmp_path / "plain.parquet", use_dictionary=False)
    metadata = pq.ParquetFile(tmp_path / "d.parquet").metadata
    assert not _small_dictionary(metadata, "many") and _small_dictionary(metadata, "few")
    assert not _small_dictionary(pq.ParquetFile(tmp_path / "plain.parquet").metadata, "few")
    assert not _small_dictionary(metadata, "absent")


def _parquet_schema(tmp_path: Path) -> Path:
    path = tmp_path / "parquet.toml"
    path.write_text(TABLE.format(format="").replace('type = "csv"', 'type = "parquet"'))
    return path


def test_statistics_come_from_the_training_rows_only(tmp_path):
    rows = _table_rows(400, seed=1)
    split = (0.6, 0.2, 0.2)
    store = prepare(_csv(tmp_path / "t.csv", rows), tmp_path / "store", schema=_schema(tmp_path), split=split, seed=3)
    train = assign_splits(3, split, 0, 400) == 0
    ages = np.array([float(r[4]) if r[4] else 30.0 for r in rows])[train]
    prices = np.array([float(r[3]) for r in rows])[train]
    age = next(c for c in store.schema["columns"] if c["name"] == "age")
    price = next(c for c in store.schema["columns"] if c["name"] == "price")
    assert age["mean"] == pytest.approx(ages.mean(), rel=1e-12) and age["std"] == pytest.approx(ages.std(), rel=1e-12)
    assert price["boundaries"] == pytest.approx(np.quantile(prices, [0.25, 0.5, 0.75]).tolist(), rel=1e-15)
    # other values in the validation and test rows change nothing
    changed = [r if t else [r[0], r[1], r[2], "1e9", "99", r[5]] for r, t in
               zip(rows, assign_splits(3, split, 0, 400) == 0)]
    other = prepare(_csv(tmp_path / "c.csv", changed), tmp_path / "other", schema=_schema(tmp_path), split=split,
                    seed=3)
    assert other.schema == store.schema
    assert store.take_dense(np.flatnonzero(train))[:, 0].mean() == pytest.approx(0.0, abs=1e-6)


def test_a_file_ten_times_the_chunk_prepares_chunk_by_chunk(tmp_path, monkeypatch):
    import des.data.tabular as tabular

    rows = _table_rows(2000, seed=2)
    raw = _csv(tmp_path / "t.csv.gz", rows)
    whole = prepare(raw, tmp_path / "whole", schema=_schema(tmp_path))
    sizes = []
    original = tabular.encode_rows

    def spy(schema, columns, num_rows, **options):
        sizes.append(num_rows)
        return original(schema, columns, num_rows, **options)

    monkeypatch.setattr(tabular, "encode_rows", spy)
    chunked = prepare(raw, tmp_path / "chunked", schema=_schema(tmp_path), chunk_rows=200)
    assert len(sizes) >= 10 and max(sizes) <= 200 and sum(sizes) == 2000
    assert chunked.fingerprint == whole.fingerprint


BAD_CASES = [
    ("wrong width", lambda rows: rows[:5] + [rows[5][:4]] + rows[6:], "t.csv:7: expected 6 columns, found 4"),
    ("not a number", lambda rows: _set(rows, 9, 3, "12,5"), "t.csv:11: column price: '12,5' is not a number"),
    ("label", lambda rows: _set(rows, 2, 0, "x"), "t.csv:4: column y: 'x' is not a number"),
    ("no label", lambda rows: _set(rows, 3, 0, ""), "t.csv:5: column y: the label is missing"),
    ("blank line", lambda rows: rows[:7] + [[""]] + rows[7:], "t.csv:9: "),
]


def _set(rows: list[list[str]], row: int, column: int, value: str) -> list[list[str]]:
    rows = [list(r) for r in rows]
    rows[row][column] = value
    return rows


@pytest.mark.parametrize("name, corrupt, expected", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_rows_fail_with_one_line_and_leave_nothing(tmp_path, name, corrupt, expected):
    raw = _csv(tmp_path / "t.csv", corrupt(_table_rows(30)))
    with pytest.raises(DataError) as error:
        prepare(raw, tmp_path / "store", schema=_schema(tmp_path), chunk_rows=4)
    message = str(error.value)
    assert "\n" not in message and message.startswith(str(raw)[:-len("t.csv")]) and expected in message, message
    assert not (tmp_path / "store").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("content, expected", [
    (b"", "file is empty (no rows)"),
    (b"y,user\x00\x01\xff\xfe,tags\n", "line 1 is not text (binary data?)"),
    (gzip.compress(b"y,user,tags,price,age,note\n" + b"".join(b"1,u%d,a|b,%d.5,30,x\n" % (i, i * 7919 % 10007)
                                                              for i in range(20000)))[:20000],
     "truncated or corrupt gzip data"),
])
def test_unreadable_files(tmp_path, content, expected):
    raw = tmp_path / "f.csv.gz"
    raw.write_bytes(content)
    with pytest.raises(DataError) as error:
        prepare(raw, tmp_path / "store", schema=_schema(tmp_path))
    assert str(error.value).startswith(f"{raw}: {expected}") and "\n" not in str(error.value)
    assert not (tmp_path / "store").exists()


def test_a_label_must_be_0_or_1_without_a_rule(tmp_path):
    raw = tmp_path / "a.csv"
    raw.write_text(AVAZU_HEADER + "\n" + AVAZU_ROWS[0] + "\n" + AVAZU_ROWS[1].replace(",0,14102100", ",2,14102100")
                   + "\n")
    with pytest.raises(DataError, match=r"a.csv:3: column click: '2' is not 0 or 1"):
        prepare(raw, tmp_path / "store", schema="avazu")
    raw.write_text(AVAZU_HEADER + "\n" + AVAZU_ROWS[0].replace("14102100", "1410210") + "\n")
    with pytest.raises(DataError, match=r"a.csv:2: column hour: '1410210' cannot be read by hour_of_day"):
        prepare(raw, tmp_path / "store", schema="avazu")


@pytest.mark.parametrize("header, expected", [
    ("y,user,tags,price,note", "has no column 'age', which schema table declares"),
    ("y,user,tags,price,age,note,extra", "has column 'extra', which schema table does not declare (declare it with "
                                         "kind = \"ignored\" to drop it)"),
])
def test_the_header_must_name_the_declared_columns(tmp_path, header, expected):
    raw = tmp_path / "h.csv"
    raw.write_text(header + "\n" + ",".join(["1"] * len(header.split(","))) + "\n")
    with pytest.raises(DataError) as error:
        prepare(raw, tmp_path / "store", schema=_schema(tmp_path))
    assert str(error.value) == f"{raw}: the header {expected}"


def test_parquet_errors_name_the_row(tmp_path):
    pq.write_table(pa.table({"y": [1, None, 4], "user": ["a", "b", "c"], "tags": ["", "x", "y"],
                             "price": [1.0, 2.0, 3.0], "age": [3, 4, 5], "note": ["", "", ""]}), tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t.parquet:row 2: column y: the label is missing"):
        prepare(tmp_path / "t.parquet", tmp_path / "store", schema=_parquet_schema(tmp_path))


@pytest.mark.parametrize("column, values, declared", [
    ("age", ["3", "4", "5"], "numbers"),  # digit strings
    ("y", ["1", "4", "5"], "numbers (the label)"),
    ("user", [1, 2, 3], "text"),
    ("n", [1.0, 2.0, 3.0], "integers"),  # a float64 column declared int
])
def test_parquet_column_types_are_the_declared_ones(tmp_path, column, values, declared):
    """A Parquet column holds what the schema declares; integers in a float column are cast (each
    value checked to be exact), nothing else is converted."""
    schema = _parquet_schema(tmp_path)
    schema.write_text(schema.read_text() + '[[columns]]\nname = "n"\nkind = "categorical"\ndtype = "int"\n')
    table = {"y": [1, 4, 5], "user": ["a", "b", "c"], "tags": ["", "x", "y"], "price": [1, 2, 2**53],
             "age": [3.5, 4.0, 5.0], "note": ["", "", ""], "n": [7, 8, 9]}
    pq.write_table(pa.table(table), tmp_path / "good.parquet")
    store = prepare(tmp_path / "good.parquet", tmp_path / "good", schema=schema, split=(1.0, 0.0, 0.0))
    assert store.num_rows == 3
    pq.write_table(pa.table({**table, "price": [1, 2, 2**53 + 1]}), tmp_path / "inexact.parquet")
    with pytest.raises(DataError, match=r"inexact.parquet:row 3: column price: '9007199254740993' is an integer a float64 cannot hold exactly"):
        prepare(tmp_path / "inexact.parquet", tmp_path / "inexact", schema=schema)
    pq.write_table(pa.table({**table, column: values}), tmp_path / "t.parquet")
    with pytest.raises(DataError) as error:
        prepare(tmp_path / "t.parquet", tmp_path / "store", schema=schema)
    assert str(error.value).startswith(f"{tmp_path / 't.parquet'}: column {column} is ")
    assert f"in the Parquet file, but schema parquet declares {declared}" in str(error.value)
    assert not (tmp_path / "store").exists()


def test_skipped_rows_are_counted(tmp_path):
    rows = _table_rows(50)
    rows = _set(rows, 9, 3, "abc")
    rows = rows[:20] + [["1", "2"]] + rows[20:]
    raw = _csv(tmp_path / "t.csv", rows)
    store = prepare(raw, tmp_path / "store", schema=_schema(tmp_path), bad_rows="skip", chunk_rows=8)
    bad = store.manifest["bad_rows"]
    assert store.num_rows == 49 and bad["skipped"] == 2
    assert bad["first_skipped"] == ["t.csv:11", "t.csv:22"] and bad["first_error"].startswith("t.csv:11: column price")
    assert store.manifest["sources"][0] == {"name": "t.csv", "sha256": file_digest(raw), "lines": 51, "rows": 49,
                                           "skipped": 2}


def test_the_cache_is_keyed_on_the_schema(tmp_path):
    raw = _csv(tmp_path / "t.csv", _table_rows(60))
    first = open_dataset(raw, cache_dir=tmp_path / "cache", schema=_schema(tmp_path))
    text = TABLE.format(format="").replace("count = 4", "count = 3")
    (tmp_path / "three.toml").write_text(text)
    second = open_dataset(raw, cache_dir=tmp_path / "cache", schema=tmp_path / "three.toml")
    assert first.path != second.path and first.path.parent == second.path.parent
    assert open_dataset(raw, cache_dir=tmp_path / "cache", schema=_schema(tmp_path)).path == first.path
    # Criteo's entries keep their names
    assert cache_entry_name("x.txt", "ab" * 32, (0.9, 0.05, 0.05), 0, "fail", load_schema()) == \
        cache_entry_name("x.txt", "ab" * 32, (0.9, 0.05, 0.05), 0, "fail")


def test_a_first_preparation_into_the_cache_reads_the_file_once(tmp_path, monkeypatch):
    import des.data.build as build

    hashed = []
    monkeypatch.setattr(build, "file_digest",
                        lambda path, stop=None, like=None: hashed.append(path) or file_digest(path))
    raw = _csv(tmp_path / "t.csv", _table_rows(60))
    cache, schema = tmp_path / "cache", _schema(tmp_path)
    # nothing cached of this name and options: prepared at once (the file hashed while it is read,
    # not in a pass before), the entry named after the sha256 its manifest records, as ever
    first = open_dataset(raw, cache_dir=cache, schema=schema)
    assert hashed == []
    assert first.path.name == cache_entry_name("t.csv", file_digest(raw), check_fractions(DEFAULT_SPLIT), 0, "fail",
                                               load_schema(schema))
    assert [p.name for p in cache.iterdir()] == [first.path.name]  # no temporary folder left
    # found again: the file hashed to look
    assert open_dataset(raw, cache_dir=cache, schema=schema).path == first.path and hashed == [raw]
    # changed: hashed to look, then prepared under that sha256's name
    _csv(raw, _table_rows(61))
    changed = open_dataset(raw, cache_dir=cache, schema=schema)
    assert len(hashed) == 2 and changed.path != first.path and changed.num_rows == 61
    assert changed.path.name == cache_entry_name("t.csv", file_digest(raw), check_fractions(DEFAULT_SPLIT), 0, "fail",
                                                 load_schema(schema))


def test_separate_inputs_use_the_training_files_statistics(tmp_path):
    train = _csv(tmp_path / "train.csv", _table_rows(120, seed=4))
    valid = _csv(tmp_path / "valid.csv", [[r[0], r[1], r[2], str(float(r[3]) * 10), r[4], r[5]]
                                          for r in _table_rows(50, seed=5)])
    store = open_inputs({"train": str(train), "validation": str(valid)}, cache_dir=tmp_path / "cache",
                        schema=_schema(tmp_path))
    train_schema, valid_schema = (part.store.schema for part in store.parts)
    assert train_schema == valid_schema
    prices = np.array([float(r[3]) for r in _table_rows(120, seed=4)])
    price = next(c for c in train_schema["columns"] if c["name"] == "price")
    assert price["boundaries"] == pytest.approx(np.quantile(prices, [0.25, 0.5, 0.75]).tolist(), rel=1e-15)
    assert store.num_dense == 1 and store.split_rows("validation").shape == (50,)


def test_synthetic_raw_data_prepares_into_the_synthetic_store(tmp_path):
    schema = _schema(tmp_path)
    info = synthesize_schema(tmp_path / "s.csv.gz", 3000, schema, seed=2, file_format="raw")
    synthesize_schema(tmp_path / "store", 3000, schema, seed=2)
    direct = ColumnStore.open(tmp_path / "store")
    prepared = prepare(tmp_path / "s.csv.gz", tmp_path / "prepared", schema=schema, seed=2)
    for a, b in zip(_keys(direct), _keys(prepared)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(direct.labels, prepared.labels)
    np.testing.assert_array_equal(direct.take_dense(np.arange(3000)), prepared.take_dense(np.arange(3000)))
    assert 0.15 < info["positive_rate"] < 0.35 and direct.manifest["synthetic"]["oracle"]["auc"] > 0.55


def test_the_command_line(tmp_path, capsys):
    raw = _csv(tmp_path / "t.csv", _set(_table_rows(20), 4, 3, "?"))
    args = ["prepare", "--schema", str(_schema(tmp_path)), "--input", str(raw), "--output", str(tmp_path / "s")]
    assert main(args) == 2
    assert capsys.readouterr().err == f"des.data: error: {raw}:6: column price: '?' is not a number\n"
    assert main(args + ["--bad-rows", "skip"]) == 0
    out = capsys.readouterr()
    assert "prepared 19 rows" in out.out and "skipped 1 bad rows (first at t.csv:6)" in out.err
    assert main(["inspect", str(tmp_path / "s")]) == 0
    text = capsys.readouterr().out
    assert "schema       table (key scheme 2" in text and "tags             multi_valued  multi-hot mean" in text
    assert "standardized: mean" in text and "quantiles: " in text
    bad = tmp_path / "bad.toml"
    bad.write_text(TABLE.format(format="").replace('pooling = "mean"', 'pooling = "max"'))
    assert main(["prepare", "--schema", str(bad), "--input", str(raw), "--output", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err == ('des.data: error: schema bad.toml: columns[1].pooling: "max" is not one of '
                                       'sum, mean\n')
    assert main(["synth", "--schema", "avazu", "--rows", "100", "--format", "raw", "--output",
                 str(tmp_path / "a.csv")]) == 0
    assert (tmp_path / "a.csv").read_text().startswith("click,id,hour,C1,")


def test_the_criteo_sample_keeps_its_store():
    sample = REPO / "datasets" / "criteo_sample.txt.gz"
    cache = Path(os.environ.get("TMPDIR", "/tmp"))
    store = prepare(sample, cache / f"criteo-schema-{os.getpid()}", schema="criteo", overwrite=True)
    try:
        assert store.fingerprint == "914ee92b639b2fdf" and "schema" not in store.manifest
        assert store.manifest["key_scheme"]["version"] == 1
    finally:
        import shutil

        shutil.rmtree(store.path)


@pytest.mark.skipif(not (SHARED / "movielens-100k").is_dir(), reason="needs ../shared/data/movielens-100k")
def test_movielens_ratings(tmp_path):
    int_column = {"kind": "categorical", "dtype": "int"}
    schema = Schema.from_dict({
        "name": "ml", "format": {"delimiter": "\t", "header": False,
                                 "names": ["user_id", "item_id", "rating", "timestamp"]},
        "label": {"column": "rating", "rule": ">= 4"},
        "columns": [{"name": "user_id", **int_column}, {"name": "item_id", **int_column},
                    {"name": "timestamp", "kind": "input", "dtype": "int"}],
        "derived": [{"name": "weekday", "transform": "weekday", "inputs": ["timestamp"]}]})
    store = prepare(SHARED / "movielens-100k" / "raw" / "u.data", tmp_path / "ml", schema=schema)
    assert store.num_rows == 100_000 and store.manifest["num_positives"] == 55_375
    assert [store.distinct_count(f) for f in ("user_id", "item_id", "weekday")] == [943, 1682, 7]


def test_distinct_counts_count_the_missing_key_once() -> None:
    """Key 0 (a missing value of key scheme 2) is the counter's empty-slot marker: counted apart,
    once, however often it occurs (the placement and the tables' sizes read these counts)."""
    from des.data.counting import KeyCounter

    counter = KeyCounter(initial_bits=2)
    counter.add(np.array([0, 5, 0, 7, 0, 5], dtype=np.int64))
    counter.add(np.zeros(100, dtype=np.int64))
    counter.add(np.arange(1, 50, dtype=np.int64))
    assert counter.distinct == 50 and counter.total == 155
    assert counter.top_share(1) == pytest.approx(103 / 155)


def test_top_share_is_the_share_of_the_largest_counts() -> None:
    """``top_share(k)``: the k largest counts (key 0's among them) over all occurrences, as a sort
    of every distinct key's count gives it, ties and fewer than k keys included."""
    from des.data.counting import KeyCounter

    rng = np.random.default_rng(3)
    keys = rng.zipf(1.3, size=20_000) % 3_000
    counter = KeyCounter(initial_bits=4)
    counter.add(keys.astype(np.int64))
    counts = np.sort(np.unique(keys, return_counts=True)[1])[::-1]
    for k in (1, 2, 10, 100, 5_000):
        assert counter.top_share(k) == pytest.approx(counts[:k].sum() / keys.shape[0], abs=1e-12)
    ties = KeyCounter()
    ties.add(np.array([4, 4, 9, 9, 3], dtype=np.int64))
    assert ties.top_share(1) == pytest.approx(2 / 5) and ties.top_share(2) == pytest.approx(4 / 5)
