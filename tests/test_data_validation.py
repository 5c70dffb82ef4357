"""Validation of raw Criteo input: every kind of bad input gives one clear error, nothing is left."""

import gzip
import os
import re

import numpy as np
import pytest

from des.data import DataError, prepare
from des.data.__main__ import main
from des.data.testing import criteo_line, random_criteo_lines, write_lines

GOOD = random_criteo_lines(20, seed=1, missing_rate=0.0)


def replace_column(line: str, column: int, value: str) -> str:
    parts = line.split("\t")
    parts[column] = value
    return "\t".join(parts)


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def assert_fails_cleanly(tmp_path, inputs, pattern, **options):
    """prepare() raises DataError matching ``pattern``, and leaves nothing next to the inputs."""
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(DataError, match=pattern) as info:
        prepare(inputs, tmp_path / "out", **options)
    assert "\n" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temporary directory
    return str(info.value)


def test_wrong_column_count(tmp_path):
    lines = list(GOOD)
    lines[16] = lines[16].rsplit("\t", 1)[0]  # 39 columns on line 17
    path = write_lines(tmp_path / "data.tsv", lines)
    expected = f"{path}:17: expected 40 tab-separated columns, found 39"
    assert_fails_cleanly(tmp_path, path, exactly(expected), chunk_rows=4)


def test_too_many_columns(tmp_path):
    lines = list(GOOD)
    lines[0] += "\tdeadbeef"
    path = write_lines(tmp_path / "data.tsv", lines)
    assert_fails_cleanly(tmp_path, path, r"data.tsv:1: expected 40 tab-separated columns, found 41$")


@pytest.mark.parametrize("label", ["2", "", "-1", "01", "1.0", "x"])
def test_bad_label(tmp_path, label):
    lines = list(GOOD)
    lines[4] = replace_column(lines[4], 0, label)
    path = write_lines(tmp_path / "data.tsv", lines)
    assert_fails_cleanly(tmp_path, path, exactly(f"{path}:5: column label: {label!r} is not 0 or 1"))


@pytest.mark.parametrize("value", ["abc", "1.5", "1e3", "-", "+", " 7", "7 ", "0x10", "1,000"])
def test_non_integer_int_column(tmp_path, value):
    lines = list(GOOD)
    lines[16] = replace_column(lines[16], 3, value)  # column I3
    path = write_lines(tmp_path / "data.tsv", lines)
    assert_fails_cleanly(tmp_path, path, exactly(f"{path}:17: column I3: {value!r} is not an integer"))


@pytest.mark.parametrize("value", ["xyz", "1234567", "123456789", "abcdefgh", "68fd1e6 ", "-8fd1e64"])
def test_bad_hex(tmp_path, value):
    lines = list(GOOD)
    lines[9] = replace_column(lines[9], 18, value)  # column C5
    path = write_lines(tmp_path / "data.tsv", lines)
    assert_fails_cleanly(tmp_path, path, exactly(f"{path}:10: column C5: {value!r} is not 8 hex digits"))


def test_error_in_second_file_names_that_file(tmp_path):
    first = write_lines(tmp_path / "a.tsv", GOOD)
    lines = list(GOOD)
    lines[2] = replace_column(lines[2], 1, "x")
    second = write_lines(tmp_path / "b.tsv.gz", lines)
    expected = f"{second}:3: column I1: 'x' is not an integer"
    assert_fails_cleanly(tmp_path, [first, second], exactly(expected), chunk_rows=7)


def test_blank_line_is_a_bad_row(tmp_path):
    path = write_lines(tmp_path / "data.tsv", GOOD[:5] + [""] + GOOD[5:])
    assert_fails_cleanly(tmp_path, path, r"data.tsv:6: expected 40 tab-separated columns, found 1$")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.tsv"
    path.write_bytes(b"")
    assert_fails_cleanly(tmp_path, path, exactly(f"{path}: file is empty (no rows)"))


def test_empty_gzip_file(tmp_path):
    path = tmp_path / "empty.tsv.gz"
    path.write_bytes(gzip.compress(b""))
    assert_fails_cleanly(tmp_path, path, r"empty.tsv.gz: file is empty")


def test_missing_file(tmp_path):
    assert_fails_cleanly(tmp_path, tmp_path / "nope.tsv", r"nope.tsv: no such file$")


def test_binary_garbage(tmp_path):
    path = tmp_path / "garbage.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    message = assert_fails_cleanly(tmp_path, path, r"garbage.bin:1: ")
    assert "binary" in message


def test_binary_garbage_without_newlines(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\x00\x01\x02" * 400_000)  # 1.2 MB, no newline at all
    assert_fails_cleanly(tmp_path, path, r"blob.bin:1: line is longer than \d+ bytes \(binary data\?\)$")


def test_truncated_gzip(tmp_path):
    text = "".join(line + "\n" for line in random_criteo_lines(16000)).encode()
    assert len(text) > 3 << 20  # the cut is past the first read (2 MiB of data)
    data = gzip.compress(text)
    path = tmp_path / "cut.tsv.gz"
    path.write_bytes(data[: len(data) * 3 // 4])
    pattern = f"^{re.escape(str(path))}: truncated or corrupt gzip data after line "
    message = assert_fails_cleanly(tmp_path, path, pattern)
    line = int(re.search(r"after line (\d+) ", message).group(1))
    assert 0 < line < 16000  # lines 1..line were read and checked


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_gzip_damaged_in_first_read(tmp_path, damage):
    data = gzip.compress("".join(line + "\n" for line in random_criteo_lines(3000)).encode())
    path = tmp_path / "bad.tsv.gz"
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 64]) + data[middle + 64:])
    prefix = re.escape(f"{path}: truncated or corrupt gzip data before line 1 could be read ")
    message = assert_fails_cleanly(tmp_path, path, f"^{prefix}\\(within the first 2,097,152 bytes of data\\) \\(.+\\)$")
    assert "after line 0" not in message


def test_valid_edge_cases_accepted(tmp_path):
    ints = [0, -1, 10**18, 10**30, -(10**30), "+5", 2, 3, None, 4, 5, 6, 7]
    cats = ["ABCDEF12", "abcdef12", None] + ["00000000"] * 23
    lines = [criteo_line(1, ints, cats), criteo_line(0, [None] * 13, [None] * 26)]
    crlf = tmp_path / "crlf.tsv"
    crlf.write_bytes(("\r\n".join(lines)).encode())  # CRLF endings, no final newline
    lf = write_lines(tmp_path / "lf.tsv", lines)
    a, b = prepare(crlf, tmp_path / "a"), prepare(lf, tmp_path / "b")
    assert a.num_rows == b.num_rows == 2
    for field in range(39):
        assert (a.field(field)[1] == b.field(field)[1]).all()
    c1, c2 = a.field("C1")[1], a.field("C2")[1]
    assert c1[0] & ((1 << 40) - 1) == c2[0] & ((1 << 40) - 1) == 0xABCDEF12


def test_skip_policy_counts_and_lines(tmp_path):
    lines = random_criteo_lines(40, seed=3)
    bad_lines = [3, 7, 8, 20, 21, 22, 23, 24, 25, 26, 27, 40]  # 1-based
    clean = [line for i, line in enumerate(lines, 1) if i not in bad_lines]
    for number in bad_lines:
        lines[number - 1] = replace_column(lines[number - 1], 2, "oops")
    path = write_lines(tmp_path / "dirty.tsv", lines)
    store = prepare(path, tmp_path / "skipped", bad_rows="skip", chunk_rows=5)
    bad = store.manifest["bad_rows"]
    assert bad["policy"] == "skip" and bad["skipped"] == len(bad_lines)
    assert bad["first_skipped"] == [f"dirty.tsv:{n}" for n in bad_lines[:10]]
    assert bad["first_error"] == "dirty.tsv:3: column I2: 'oops' is not an integer"
    assert store.manifest["sources"][0]["lines"] == 40 and store.num_rows == 40 - len(bad_lines)
    reference = prepare(write_lines(tmp_path / "clean.tsv", clean), tmp_path / "clean")
    assert (np.asarray(store.labels) == np.asarray(reference.labels)).all()
    for field in range(39):
        assert (store.field(field)[1] == reference.field(field)[1]).all()


def test_skip_policy_all_bad_is_an_error(tmp_path):
    path = write_lines(tmp_path / "all_bad.tsv", ["x\ty", "1\t2"])
    assert_fails_cleanly(tmp_path, path, r"all_bad.tsv: no valid rows \(2 bad rows skipped", bad_rows="skip")


def test_cli_error_is_one_line(tmp_path, capsys):
    lines = list(GOOD)
    lines[1] = replace_column(lines[1], 3, "abc")
    path = write_lines(tmp_path / "data.tsv", lines)
    status = main(["prepare", "--input", str(path), "--output", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.err == f"des.data: error: {path}:2: column I3: 'abc' is not an integer\n"
    assert not (tmp_path / "out").exists()


def test_cli_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["prepare", "--input", "x", "--output", "y", "--split", "0.5,0.5"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("des.data: error: ")


def test_another_format_read_as_criteo_names_the_schema_flag_and_leaves_no_cache(tmp_path):
    """A CSV given without --schema is read as Criteo's TSV (the default): the error says so; the
    cache folder the failed preparation created is removed (one holding anything else stays)."""
    from des.data import open_dataset

    path = tmp_path / "movies.csv"
    path.write_text("rating,user,item\n5,ann,7\n")
    hint = "expected 40 tab-separated columns, found 1 (the default schema is criteo; pass --schema NAME|FILE for " \
           "other data)"
    with pytest.raises(DataError, match=exactly(f"{path}:1: {hint}")):
        open_dataset(path, cache_dir=tmp_path / "new" / "cache")
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "other").write_text("x")
    with pytest.raises(DataError):
        open_dataset(path, cache_dir=tmp_path / "kept")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["other"]


def _by_the_rules(line: bytes) -> tuple[int, int, list[float], list[int]]:
    """The module docstring's rules of one row, in Python: (status, label, integers, hex values)."""
    from des.data import tsv

    columns = (line[:-1] if line.endswith(b"\r") else line).split(b"\t")
    if len(columns) != tsv.NUM_COLUMNS:
        return tsv._COLUMNS, -1, [], []
    if columns[0] not in (b"0", b"1"):
        return tsv._LABEL, -1, [], []
    ints, hexes = [], []
    for text in columns[1:14]:
        if text and not re.fullmatch(rb"[+-]?[0-9]+", text):
            return tsv._NOT_INT, -1, [], []
        ints.append(float(int(text)) if text else float("nan"))
    for text in columns[14:]:
        if text and not re.fullmatch(rb"[0-9a-fA-F]{8}", text):
            return tsv._NOT_HEX, -1, [], []
        hexes.append(int(text, 16) if text else -1)
    return tsv._OK, int(columns[0]), ints, hexes


def test_the_parser_follows_the_rules_on_damaged_lines():
    """The numba parser (one pass: each value read as its end is found) against the rules in
    Python, on good lines damaged at random: a tab, a carriage return, a sign, a letter or digits
    put in or bytes taken out; every fifth line ends with CRLF."""
    from des.data import tsv

    rng = np.random.default_rng(7)
    lines = [line.encode() for line in random_criteo_lines(300, seed=3, missing_rate=0.2)]
    pieces = [b"\t", b"\r", b"-", b"+", b"0", b"7", b"a", b"G", b" ", b"00012", b"123456789012345678"]
    labels, ints, hexes = np.zeros(1, np.uint8), np.zeros((13, 1)), np.zeros((26, 1), np.int64)
    kinds = set()
    for trial in range(3000):
        line = bytearray(lines[trial % len(lines)])
        for _ in range(int(rng.integers(0, 3))):
            at = int(rng.integers(len(line) + 1))
            if rng.random() < 0.3:
                del line[at:at + int(rng.integers(1, 12))]
            else:
                line[at:at] = pieces[int(rng.integers(len(pieces)))]
        if trial % 5 == 0:
            line += b"\r"  # a CRLF line end
        expected = _by_the_rules(bytes(line))
        buffer = np.frombuffer(bytes(line) + b"\n", np.uint8)
        got = tsv._parse_block(buffer, 0, True, 0, labels, ints, hexes, False, np.zeros(10, np.int64),
                               np.zeros(3, np.int64))
        status = tsv._OK if got[3] == 0 else got[4]
        assert status == expected[0], bytes(line)
        if status == tsv._OK:
            assert (labels[0], hexes[:, 0].tolist()) == (expected[1], expected[3])
            exact = ~(np.abs(expected[2]) >= 2.0**63)  # beyond an int64: float64's approximation, as documented
            np.testing.assert_array_equal(ints[exact, 0], np.asarray(expected[2])[exact])
            np.testing.assert_allclose(ints[~exact, 0], np.asarray(expected[2])[~exact], rtol=1e-14)
        kinds.add(status)
    assert kinds == {tsv._OK, tsv._COLUMNS, tsv._LABEL, tsv._NOT_INT, tsv._NOT_HEX}
