"""examples/movielens.py: the ratings joined with users and movies, and examples/movielens_history.py:
with each rating's history, on a small excerpt in the GroupLens formats written here, and on the
real MovieLens 100K when ../shared has it."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "movielens.py"
REAL = REPO.parent / "shared" / "data" / "movielens-100k" / "raw"
if not REAL.is_dir():
    REAL = Path("/work/shared/data/movielens-100k/raw")

GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance",
          "Sci-Fi", "Thriller", "War", "Western"]


def flags(*names: str) -> str:
    return "|".join("1" if g in names else "0" for g in GENRES)


def write_excerpt(folder: Path) -> None:
    folder.mkdir()
    (folder / "u.genre").write_text("".join(f"{g}|{i}\n" for i, g in enumerate(GENRES)) + "\n")
    (folder / "u.user").write_text("1|24|M|technician|85711\n"
                                   "2|53|F|other|94043\n"
                                   "5|33|F|other|15213\n")
    url = "http://us.imdb.com/M/title-exact?"
    toy_story = flags("Animation", "Children's", "Comedy")
    (folder / "u.item").write_bytes(
        f"1|Toy Story (1995)|01-Jan-1995||{url}Toy%20Story%20(1995)|{toy_story}\n"
        f"267|unknown||||{flags('unknown')}\n"
        f"1311|Walk in the Sun, A (1945)|01-Jan-1945||{url}x|{flags('War')}\n".encode("latin-1")
        + b"1633|\xc1 k\xf6ldum klaka (Cold Fever) (1994)|08-Mar-1996||x|" + flags("Comedy", "Drama").encode() + b"\n")
    (folder / "u.data").write_text("2\t1311\t5\t888551196\n"
                                   "1\t1\t3\t874965758\n"
                                   "5\t267\t4\t875635064\n"
                                   "1\t1633\t1\t878542420\n")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120)


def test_excerpt_joined_in_u_data_order(tmp_path):
    write_excerpt(tmp_path / "ml")
    out = tmp_path / "joined.csv"
    proc = run("--source", str(tmp_path / "ml"), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "wrote 4 rows" in proc.stdout and "rating >= 4: 2 (50.0%)" in proc.stdout
    assert out.read_text().splitlines() == [
        "user_id,item_id,rating,timestamp,age,gender,occupation,zip_code,release_year,genres",
        "2,1311,5,888551196,53,F,other,94043,1945,War",
        "1,1,3,874965758,24,M,technician,85711,1995,Animation|Children's|Comedy",
        "5,267,4,875635064,33,F,other,15213,,unknown",
        "1,1633,1,878542420,24,M,technician,85711,1996,Comedy|Drama",
    ]


def test_missing_files_are_named(tmp_path):
    write_excerpt(tmp_path / "ml")
    (tmp_path / "ml" / "u.user").unlink()
    (tmp_path / "ml" / "u.genre").unlink()
    proc = run("--source", str(tmp_path / "ml"), "--output", str(tmp_path / "x.csv"))
    assert proc.returncode == 2
    assert "missing" in proc.stderr and "u.user" in proc.stderr and "u.genre" in proc.stderr
    assert "u.data" not in proc.stderr.split("(")[0]
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.skipif(not REAL.is_dir(), reason="MovieLens 100K is not in ../shared/data")
def test_real_movielens_100k(tmp_path):
    out = tmp_path / "movielens.csv"
    proc = run("--source", str(REAL), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "wrote 100,000 rows" in proc.stdout and "55,375 (55.4%)" in proc.stdout
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 100_000
    assert rows[0] == {"user_id": "196", "item_id": "242", "rating": "3", "timestamp": "881250949",
                       "age": "49", "gender": "M", "occupation": "writer", "zip_code": "55105",
                       "release_year": "1997", "genres": "Comedy"}
    assert sum(int(r["rating"]) >= 4 for r in rows) == 55_375
    assert len({r["user_id"] for r in rows}) == 943 and len({r["item_id"] for r in rows}) == 1682
    assert all(r["genres"] for r in rows)
    assert {r["release_year"] for r in rows if r["item_id"] == "267"} == {""}


HISTORY_SCRIPT = REPO / "examples" / "movielens_history.py"


def test_history_holds_the_movies_rated_earlier_most_recent_last(tmp_path):
    write_excerpt(tmp_path / "ml")
    with open(tmp_path / "ml" / "u.data", "a") as f:  # user 1 again: one rating later, two in one second
        f.write("1\t267\t5\t879000000\n1\t1311\t2\t880000000\n1\t1\t4\t880000000\n")
    out = tmp_path / "history.csv"
    proc = subprocess.run([sys.executable, str(HISTORY_SCRIPT), "--source", str(tmp_path / "ml"), "--output", str(out),
                           "--length", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "wrote 7 rows" in proc.stdout and "with a history: 4" in proc.stdout
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    # user 1 rated 1 (874965758), 1633 (878542420), 267 (879000000), then 1311 and 1 in one second
    assert [(r["user_id"], r["item_id"], r["history"]) for r in rows] == [
        ("2", "1311", ""), ("1", "1", ""), ("5", "267", ""), ("1", "1633", "1"), ("1", "267", "1|1633"),
        ("1", "1311", "1633|267"), ("1", "1", "1633|267")]
    assert rows[1]["genres"] == "Animation|Children's|Comedy" and rows[0]["rating"] == "5"


@pytest.mark.skipif(not REAL.is_dir(), reason="MovieLens 100K is not in ../shared/data")
def test_real_movielens_100k_with_histories_prepares_with_its_schema(tmp_path):
    import numpy as np

    from des.data import prepare

    out = tmp_path / "history.csv"
    proc = subprocess.run([sys.executable, str(HISTORY_SCRIPT), "--source", str(REAL), "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    store = prepare(out, tmp_path / "store", schema=REPO / "examples" / "movielens_history.toml")
    assert store.num_rows == 100_000 and "history" in store.field_names
    lengths = np.diff(store.field(store.field_names.index("history"))[0])
    assert lengths.max() == 20 and (lengths == 0).sum() == 100_000 - 97_865


def test_split_by_time_partitions_the_ratings_and_keeps_every_history_in_the_past(tmp_path):
    """--split-by-time: the earliest ratings in the training file, the latest in the test file (ties
    by u.data's order), every rating in exactly one; each history still reads all of the user's
    earlier ratings, across the files, and never a later one or one of the same second."""
    write_excerpt(tmp_path / "ml")
    ratings = [("1", "267", 876000000), ("5", "1", 876000000), ("2", "1", 888551196), ("5", "1633", 876000000),
               ("2", "267", 870000000), ("1", "1311", 880000000), ("5", "1311", 880000000), ("2", "1633", 880000000)]
    with open(tmp_path / "ml" / "u.data", "a") as f:  # the excerpt's 4 ratings, then these 8: 12 in all
        f.writelines(f"{u}\t{m}\t4\t{t}\n" for u, m, t in ratings)
    out = tmp_path / "history.csv"
    proc = subprocess.run([sys.executable, str(HISTORY_SCRIPT), "--source", str(tmp_path / "ml"), "--output", str(out),
                           "--split-by-time", "0.5,0.25,0.25"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not out.exists() and "6 rows to" in proc.stdout and "3 rows to" in proc.stdout
    parts = {}
    for split in ("train", "validation", "test"):
        with open(tmp_path / f"history.{split}.csv", newline="") as f:
            parts[split] = list(csv.DictReader(f))
    # u.data order: 2/1311 888551196, 1/1 874965758, 5/267 875635064, 1/1633 878542420, then `ratings`
    assert [(r["user_id"], r["item_id"]) for r in parts["train"]] == [
        ("2", "267"), ("1", "1"), ("5", "267"), ("1", "267"), ("5", "1"), ("5", "1633")]
    assert [(r["user_id"], r["item_id"]) for r in parts["validation"]] == [("1", "1633"), ("1", "1311"), ("5", "1311")]
    assert [(r["user_id"], r["item_id"]) for r in parts["test"]] == [("2", "1633"), ("2", "1311"), ("2", "1")]
    rows = [r for split in ("train", "validation", "test") for r in parts[split]]
    time = {(r["user_id"], r["item_id"]): int(r["timestamp"]) for r in rows}
    assert len(rows) == len(time) == 12  # a partition: each rating once
    for earlier, later in (("train", "validation"), ("validation", "test")):
        assert max(int(r["timestamp"]) for r in parts[earlier]) <= min(int(r["timestamp"]) for r in parts[later])
    for r in rows:
        past = [m for (u, m), t in time.items() if u == r["user_id"] and t < int(r["timestamp"])]
        assert sorted(r["history"].split("|") if r["history"] else []) == sorted(past)
    # user 2's 1311 and 1 in one second: neither in the other's past; 267 from the training file
    assert [r["history"] for r in parts["test"]] == ["267", "267|1633", "267|1633"]
    assert parts["validation"][1]["history"] == "1|267|1633"  # user 1's past, all in the training file


def test_split_by_time_refuses_bad_fractions(tmp_path):
    write_excerpt(tmp_path / "ml")
    for bad in ("0.8,0.2", "0.8,0.1,0.2", "0.9,0.1,0", "a,b,c"):
        proc = subprocess.run([sys.executable, str(HISTORY_SCRIPT), "--source", str(tmp_path / "ml"),
                               "--output", str(tmp_path / "h.csv"), "--split-by-time", bad],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "--split-by-time" in proc.stderr and bad in proc.stderr
    assert not list(tmp_path.glob("h*.csv"))


def test_split_last_puts_each_users_latest_ratings_in_test(tmp_path):
    """--split-last 1,1: each user's latest rating in the test file, the one before in the
    validation file, the rest in training; histories as in one file."""
    write_excerpt(tmp_path / "ml")
    ratings = [("1", "267", 876000000), ("5", "1", 876000000), ("2", "1", 888551196), ("5", "1633", 876000000),
               ("2", "267", 870000000), ("1", "1311", 880000000), ("5", "1311", 880000000), ("2", "1633", 880000000)]
    with open(tmp_path / "ml" / "u.data", "a") as f:
        f.writelines(f"{u}\t{m}\t4\t{t}\n" for u, m, t in ratings)
    out = tmp_path / "history.csv"
    proc = subprocess.run([sys.executable, str(HISTORY_SCRIPT), "--source", str(tmp_path / "ml"), "--output", str(out),
                           "--split-last", "1,1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    parts = {}
    for split in ("train", "validation", "test"):
        with open(tmp_path / f"history.{split}.csv", newline="") as f:
            parts[split] = [(r["user_id"], r["item_id"], r["history"]) for r in csv.DictReader(f)]
    # by user, in time (ties by u.data's order): 1: 1, 267, 1633, 1311; 2: 267, 1633, 1311, 1; 5: 267, 1, 1633, 1311
    assert [r[:2] for r in parts["test"]] == [("1", "1311"), ("5", "1311"), ("2", "1")]
    assert [r[:2] for r in parts["validation"]] == [("5", "1633"), ("1", "1633"), ("2", "1311")]
    assert sorted(r[:2] for r in parts["train"]) == [("1", "1"), ("1", "267"), ("2", "1633"), ("2", "267"),
                                                      ("5", "1"), ("5", "267")]
    assert parts["test"][0][2] == "1|267|1633"  # user 1's past, across the other two files
    for bad in ("1", "0,1", "a,b"):
        proc = subprocess.run([sys.executable, str(HISTORY_SCRIPT), "--source", str(tmp_path / "ml"),
                               "--output", str(tmp_path / "h.csv"), "--split-last", bad],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "--split-last" in proc.stderr
