"""Plain CSV pieces split and keyed by numba (``des/data/tokenizer.py``): the text pyarrow reads
and the keys of it, LF or CRLF, a last line without its newline; anything not plain left to
pyarrow; and every store the same, file for file, as pyarrow's parse of every piece makes it."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from des.data import prepare
from des.data.features import string_keys
from des.data.parallel import THREADS_VARIABLE
from des.data.synth_schema import synthesize_schema
from des.data.tokenizer import keyed_columns, plain_lines

REPO = Path(__file__).resolve().parents[1]
NAMES = ["id", "y", "short", "long", "number"]
READ = ["y", "short", "long", "number"]
KEYED = frozenset({"short", "long"})


def _piece(rows: int, seed: int, line_end: str = "\n", last_newline: bool = True) -> bytes:
    """Lines of NAMES: values of 0 to 20 ASCII characters (the keyed ones across the 8-byte word)."""
    pick = random.Random(seed)
    text = "abcdefghijklmnopqrstuvwxyz0123456789 _-./:;!?'"

    def value(most: int) -> str:
        return "".join(pick.choice(text) for _ in range(pick.randint(0, most)))

    lines = [",".join([str(r), pick.choice("01"), value(9), value(20), value(4)]) for r in range(rows)]
    return (line_end.join(lines) + (line_end if last_newline else "")).encode()


def _pyarrow(piece: bytes, null_values: list[str]) -> pa.Table:
    """The piece as des's pyarrow path reads it (every column read as text)."""
    return pcsv.read_csv(pa.py_buffer(piece), read_options=pcsv.ReadOptions(column_names=NAMES),
                         parse_options=pcsv.ParseOptions(quote_char='"', ignore_empty_lines=False),
                         convert_options=pcsv.ConvertOptions(
                             column_types={n: pa.string() for n in READ}, include_columns=READ,
                             null_values=null_values, strings_can_be_null=True, quoted_strings_can_be_null=True))


@pytest.mark.parametrize("line_end, last_newline, empty_is_null",
                         [("\n", True, True), ("\r\n", True, True), ("\n", False, True), ("\r\n", False, False)])
def test_a_plain_piece_gives_pyarrows_text_and_the_keys_of_it(line_end, last_newline, empty_is_null):
    piece = _piece(300, seed=len(line_end) + 2 * last_newline, line_end=line_end, last_newline=last_newline)
    batch = plain_lines(memoryview(bytearray(piece)), NAMES, READ, KEYED, ",", '"', empty_is_null)
    reference = _pyarrow(piece, [""] if empty_is_null else [])
    assert batch.schema.names == READ and batch.num_rows == reference.num_rows == 300
    assert keyed_columns(batch) == KEYED
    for name in READ:
        column = reference.column(name).combine_chunks()
        if name in KEYED:
            assert np.asarray(batch.column(name)).tolist() == string_keys(column).tolist(), name
        else:
            assert batch.column(name).equals(column), name
    assert reference.column("short").null_count > 0 or not empty_is_null  # missing values were there


@pytest.mark.parametrize("change", ["quote", "lone carriage return", "short line", "long line", "empty line"])
def test_a_piece_that_is_not_plain_is_left_to_pyarrow(change):
    lines = _piece(40, seed=7).decode().splitlines(keepends=True)
    lines[20] = {"quote": '20,1,"a",b,c\n', "lone carriage return": "20,1,a\rb,c,d\n", "short line": "20,1,a,b\n",
                 "long line": "20,1,a,b,c,d\n", "empty line": "\n"}[change]
    assert plain_lines("".join(lines).encode(), NAMES, READ, KEYED, ",", '"', True) is None
    assert plain_lines(_piece(40, seed=7), NAMES, READ, KEYED, ",", '"', True) is not None


def _store_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_stores_are_pyarrows_file_for_file(monkeypatch, tmp_path):
    """Prepared with plain pieces and with pyarrow parsing every piece: the same stores, for a
    schema of every kind of column and for Avazu's (bad rows skipped: the good rows' keys filtered;
    CRLF lines; a piece with a row of a wrong width parsed by pyarrow)."""
    from des.data import tabular

    monkeypatch.setenv(THREADS_VARIABLE, "2")
    every = REPO / "tests" / "data" / "every_kind.toml"
    synthesize_schema(tmp_path / "every.csv", 1500, every, seed=3, file_format="raw")
    synthesize_schema(tmp_path / "avazu.csv", 3000, "avazu", seed=4, file_format="raw")
    lines = (tmp_path / "avazu.csv").read_text().splitlines(keepends=True)
    lines[100] = "7" + lines[100][1:]  # a bad label
    lines[2000] = lines[2000].replace(",", ",,", 1)  # a row of a wrong width: its piece is pyarrow's
    (tmp_path / "avazu.csv").write_text("".join(lines[:1500]))
    (tmp_path / "crlf.csv").write_bytes("".join(lines[:1] + lines[1500:]).replace("\n", "\r\n").encode())
    cases = [([tmp_path / "every.csv"], every), ([tmp_path / "avazu.csv", tmp_path / "crlf.csv"], "avazu")]
    plain, pieces = tabular.plain_lines, []
    for number, (inputs, schema) in enumerate(cases):
        monkeypatch.setattr(tabular, "plain_lines", lambda *a: pieces.append(plain(*a)) or pieces[-1])
        made = prepare(inputs, tmp_path / f"plain-{number}", schema=schema, bad_rows="skip", chunk_rows=500,
                       progress=False)
        monkeypatch.setattr(tabular, "plain_lines", lambda *a: None)
        reference = prepare(inputs, tmp_path / f"arrow-{number}", schema=schema, bad_rows="skip", chunk_rows=500,
                            progress=False)
        assert _store_files(made.path) == _store_files(reference.path), schema
        assert made.num_rows == reference.num_rows > 1000
    assert sum(piece is not None for piece in pieces) >= 4 and any(piece is None for piece in pieces)
