"""The transform as applied by the real prepare path (the numba TSV parser), on edge values, compared
with the Python helpers of des.data.keys and with the documented formula written out here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from des.data import ColumnStore, categorical_key, integer_key, prepare
from des.data.__main__ import main
from des.data.keys import NUM_CAT_FIELDS, NUM_INT_FIELDS
from des.data.testing import criteo_line, write_lines

INTEGER_TEXTS = [
    "0", "1", "2", "3", "4", "7", "8", "100", "-0", "+0", "+3", "007", "-007", "000", "00", "+2", "-1", "-2", "-5",
    "16383", "16384", "16385",  # the parser's small-value table ends at 2^14
    "-2147483647", "-2147483648", "-2147483649", "-9223372036854775807", "-9223372036854775808",
    "-99999999999999999999999", "999999999999999999", "1000000000000000000", "9223372036854775807",
    "9223372036854775808", "9999999999999999999", "10000000000000000000", "1" + "0" * 30, "9" * 25,
    "1" + "0" * 400, "0" * 30 + "1", "-" + "0" * 30 + "5", "0" * 25 + "123456", "+" + "0" * 20 + "2",
    "0" * 17 + "9" * 18, "0" * 5 + "9" * 19, "",
]
HEX_TEXTS = [
    "00000000", "00000001", "ffffffff", "FFFFFFFF", "7fffffff", "80000000", "DeadBeef", "deadbeef", "DEADBEEF",
    "0123abCD", "a0B1c2D3", "",
]


def documented_key(field: int, text: str) -> int:
    """datasets/README.md / keys.py: t = v if v <= 2 else floor(ln(v)^2), u = clip(t) + 2^31 (v above
    2^63: 2^63)."""
    if text == "":
        return ((field + 1) << 40) | (1 << 32)
    v = min(int(text), 2**63)
    t = v if v <= 2 else math.floor(math.log(v) ** 2)
    return ((field + 1) << 40) | (min(max(t, -(2**31)), 2**31 - 1) + 2**31)


def _rows(count: int, ints: list[str], cats: list[str]) -> list[list[list[str]]]:
    """``count`` rows of 13 integer and 26 categorical texts cycling through the edge values,
    shifted per row so that every field sees every value."""
    return [
        [[ints[(row + f) % len(ints)] for f in range(NUM_INT_FIELDS)],
         [cats[(row + f) % len(cats)] for f in range(NUM_CAT_FIELDS)]]
        for row in range(count)
    ]


@pytest.fixture(scope="module")
def edge_store(tmp_path_factory) -> tuple[ColumnStore, list[list[list[str]]]]:
    rows = _rows(len(INTEGER_TEXTS) * 2, INTEGER_TEXTS, HEX_TEXTS)
    directory = tmp_path_factory.mktemp("edges")
    path = write_lines(directory / "edges.tsv", [criteo_line(r % 2, ints, cats) for r, (ints, cats) in enumerate(rows)])
    return prepare(path, directory / "store", chunk_rows=7), rows


def test_parser_integer_keys_match_helper_and_formula(edge_store):
    store, rows = edge_store
    assert store.num_rows == len(rows)
    for field in range(NUM_INT_FIELDS):
        stored = np.asarray(store.field(field)[1]).tolist()
        texts = [ints[field] for ints, _ in rows]
        assert set(texts) == set(INTEGER_TEXTS)
        helper = [integer_key(field, None if t == "" else int(t)) for t in texts]
        formula = [documented_key(field, t) for t in texts]
        mismatches = [(t, s, h) for t, s, h in zip(texts, stored, helper) if s != h]
        assert not mismatches, f"field {field}: parser vs integer_key differ on {mismatches[:3]}"
        assert helper == formula


def test_integer_edge_values_map_as_documented():
    token = lambda text: (integer_key(0, int(text)) & ((1 << 40) - 1)) - 2**31  # noqa: E731
    texts = ("-5", "-1", "0", "-0", "1", "2", "+2", "3", "007", "+3")
    assert [token(t) for t in texts] == [-5, -1, 0, 0, 1, 2, 2, 1, 3, 1]
    assert token("-2147483649") == token("-" + "9" * 40) == -(2**31)  # clipped at the bottom
    assert token("1" + "0" * 400) == token("9" * 25) == math.floor((63 * math.log(2)) ** 2)  # huge: 2^63's token
    assert integer_key(0, None) != integer_key(0, 0) != integer_key(1, 0)


def test_parser_categorical_keys_match_helper_in_either_case(edge_store):
    store, rows = edge_store
    for c in range(NUM_CAT_FIELDS):
        field = NUM_INT_FIELDS + c
        stored = np.asarray(store.field(field)[1]).tolist()
        texts = [cats[c] for _, cats in rows]
        assert stored == [categorical_key(field, t or None) for t in texts]
        by_text = dict(zip(texts, stored))
        assert by_text["DeadBeef"] == by_text["deadbeef"] == by_text["DEADBEEF"]
        assert by_text["ffffffff"] == by_text["FFFFFFFF"] == ((field + 1) << 40) | 0xFFFFFFFF
        assert by_text["00000000"] == (field + 1) << 40 and by_text[""] == ((field + 1) << 40) | (1 << 32)


def test_cli_prepare_stores_the_same_keys(tmp_path, edge_store, capsys):
    store, rows = edge_store
    path = write_lines(tmp_path / "e.tsv.gz", [criteo_line(r % 2, i, c) for r, (i, c) in enumerate(rows)])
    assert main(["prepare", "--input", str(path), "--output", str(tmp_path / "s"), "--chunk-rows", "5"]) == 0
    again = ColumnStore.open(tmp_path / "s")
    for field in range(NUM_INT_FIELDS + NUM_CAT_FIELDS):
        assert (np.asarray(again.field(field)[1]) == np.asarray(store.field(field)[1])).all()
