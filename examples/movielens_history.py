"""MovieLens 100K as a CSV (or three, split by time) with each rating's history: the movies its user rated before.

    python examples/movielens_history.py --source ../shared/data/movielens-100k/raw --output history.csv

The rows are ``examples/movielens.py``'s (each rating joined with its user and its movie, in the
order of ``u.data``) with one more column, ``history``: the movies the same user rated at an
earlier timestamp (ratings of the same second are not each other's history), oldest first,
separated by ``|``, the most recent ``--length`` of them (default 20; empty for a user's first
ratings). ``examples/movielens_history.toml`` declares it as a ``sequence`` column reading the
movies' table (``table = "item_id"``: one embedding per movie, whether rated now or before). The
history holds which movies were rated, never their ratings: the label of a row stays out of every
row's features.

``--split-by-time TRAIN,VALIDATION,TEST`` (fractions, e.g. ``0.8,0.1,0.1``) writes three CSVs
instead of one, ``OUTPUT`` with ``.train``, ``.validation`` and ``.test`` before its suffix
(``history.train.csv``, ...): the ratings ordered by timestamp (ties by their order in
``u.data``), the earliest ``TRAIN`` of them in the first, the next ``VALIDATION`` in the second, the
latest in the third, each in that order. The histories are the same as in one file: all of the
user's earlier ratings whichever file they are in (a test row's past may be a training or a
validation row; never a later rating, nor one of the same second). Prepared as one store with the
training rows' statistics:

    python examples/movielens_history.py --source ml-100k --output history.csv --split-by-time 0.8,0.1,0.1
    python -m des.data prepare --schema examples/movielens_history.toml --train history.train.csv \
        --validation history.validation.csv --test history.test.csv --output history-time

``--split-last VALIDATION,TEST`` (ratings per user, e.g. ``10,10``) writes the same three files by
user instead: each user's latest ``TEST`` ratings in the test file, the ``VALIDATION`` before them in
the validation file, the rest in the training file (the sequential recommenders' leave-last-out:
every test user has training rows), each file in timestamp order, the histories as above.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from movielens import FILES, HEADER, read_genres, read_lines, read_movies, read_users  # noqa: E402

HISTORY_HEADER = [*HEADER, "history"]


def histories(ratings: list[tuple[str, str, int]], length: int) -> list[str]:
    """Per rating ``(user, movie, timestamp)``, the user's movies rated strictly earlier, oldest
    first (ties by their order in the file), the most recent ``length`` of them, joined by ``|``."""
    by_user: dict[str, list[int]] = defaultdict(list)
    for i, (user, _, _) in enumerate(ratings):
        by_user[user].append(i)
    out = [""] * len(ratings)
    for indices in by_user.values():
        indices.sort(key=lambda i: (ratings[i][2], i))
        start = 0  # indices[:start] are strictly earlier than the current timestamp
        for k, i in enumerate(indices):
            while ratings[indices[start]][2] < ratings[i][2]:
                start += 1
            earlier = indices[max(0, start - length):start]
            out[i] = "|".join(ratings[j][1] for j in earlier)
    return out


SPLITS = ("train", "validation", "test")


def time_split(timestamps: list[int], fractions: tuple[float, float, float]) -> list[list[int]]:
    """Row indices of the train, validation and test parts: the rows ordered by timestamp (ties by
    index), cut after the first ``round(n * train)`` and ``round(n * (train + validation))``."""
    order = sorted(range(len(timestamps)), key=lambda i: (timestamps[i], i))
    train_end = round(len(order) * fractions[0])
    validation_end = round(len(order) * (fractions[0] + fractions[1]))
    return [order[:train_end], order[train_end:validation_end], order[validation_end:]]


def per_user_split(ratings: list[tuple[str, str, int]], validation: int, test: int) -> list[list[int]]:
    """Row indices of the train, validation and test parts: each user's latest ``test`` ratings
    (by timestamp, ties by index) in the test part, the ``validation`` before them in the
    validation part, the rest in training (a user with fewer ratings fills test first); each part
    in timestamp order."""
    by_user: dict[str, list[int]] = defaultdict(list)
    for i, (user, _, _) in enumerate(ratings):
        by_user[user].append(i)
    parts: list[list[int]] = [[], [], []]
    for indices in by_user.values():
        indices.sort(key=lambda i: (ratings[i][2], i))
        cut_test, cut_validation = len(indices) - test, len(indices) - test - validation
        parts[0] += indices[:max(0, cut_validation)]
        parts[1] += indices[max(0, cut_validation):max(0, cut_test)]
        parts[2] += indices[max(0, cut_test):]
    return [sorted(part, key=lambda i: (ratings[i][2], i)) for part in parts]


def split_outputs(output: Path) -> list[Path]:
    """``history.csv`` -> ``history.train.csv``, ``history.validation.csv``, ``history.test.csv``."""
    return [output.with_name(f"{output.stem}.{split}{output.suffix}") for split in SPLITS]


def join(source: Path, output: Path, length: int, fractions: tuple[float, float, float] | None = None,
         last: tuple[int, int] | None = None) -> tuple[list[int], int]:
    """Write the CSV, or with ``fractions`` (:func:`time_split`) or ``last`` (validation and test
    ratings per user: :func:`per_user_split`) the three of :func:`split_outputs`; returns (rows per
    file written, rows with a non-empty history)."""
    users = read_users(source / "u.user")
    movies = read_movies(source / "u.item", read_genres(source / "u.genre"))
    ratings, rest = [], []
    for line in read_lines(source / "u.data"):
        user_id, item_id, rating, timestamp = line.split("\t")
        if user_id not in users or item_id not in movies:
            raise ValueError(f"u.data: rating of user {user_id} for movie {item_id}, "
                             "which u.user or u.item does not have")
        ratings.append((user_id, item_id, int(timestamp)))
        rest.append([rating, timestamp, *users[user_id], *movies[item_id]])
    history = histories(ratings, length)
    if fractions is not None:
        parts, paths = time_split([t for _, _, t in ratings], fractions), split_outputs(output)
    elif last is not None:
        parts, paths = per_user_split(ratings, *last), split_outputs(output)
    else:
        parts, paths = [list(range(len(ratings)))], [output]
    for rows, path in zip(parts, paths):
        with open(path, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(HISTORY_HEADER)
            for i in rows:
                writer.writerow([*ratings[i][:2], *rest[i], history[i]])
    return [len(rows) for rows in parts], sum(1 for h in history if h)


def parse_fractions(text: str) -> tuple[float, float, float]:
    """``"0.8,0.1,0.1"`` -> three positive fractions summing to 1; ValueError naming what is wrong."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--split-by-time {text!r}: expected three numbers TRAIN,VALIDATION,TEST") from None
    if len(values) != 3 or min(values) <= 0 or abs(sum(values) - 1) > 1e-9:
        raise ValueError(f"--split-by-time {text!r}: expected three positive fractions summing to 1")
    return values


def parse_last(text: str) -> tuple[int, int]:
    """``"10,10"`` -> (validation, test) ratings per user, each at least 1; ValueError otherwise."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 2 or min(values) < 1:
        raise ValueError(f"--split-last {text!r}: expected two whole numbers VALIDATION,TEST, each at least 1")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True,
                        help="folder with the GroupLens ml-100k files (u.data, u.user, u.item, u.genre)")
    parser.add_argument("--output", type=Path, required=True,
                        help="CSV file to write (with --split-by-time: the three files' name before .train and so on)")
    parser.add_argument("--length", type=int, default=20, help="the most recent movies kept per history")
    parser.add_argument("--split-by-time", metavar="TRAIN,VALIDATION,TEST", default="",
                        help="write three CSVs (OUTPUT with .train, .validation, .test before its suffix): "
                        "the earliest ratings, the next, the latest, by these fractions")
    parser.add_argument("--split-last", metavar="VALIDATION,TEST", default="",
                        help="write three CSVs as --split-by-time does, by user: each user's latest TEST ratings "
                        "the test file, the VALIDATION before them the validation file, the rest training")
    args = parser.parse_args(argv)
    if args.length < 1:
        parser.error(f"--length must be at least 1, not {args.length}")
    if args.split_by_time and args.split_last:
        parser.error("--split-by-time and --split-last: give one")
    try:
        fractions = parse_fractions(args.split_by_time) if args.split_by_time else None
        last = parse_last(args.split_last) if args.split_last else None
    except ValueError as e:
        parser.error(str(e))
    missing = [name for name in FILES if not (args.source / name).is_file()]
    if missing:
        print(f"missing in {args.source}: {', '.join(missing)} "
              f"(expected the GroupLens ml-100k files {', '.join(FILES)})", file=sys.stderr)
        return 2
    rows, with_history = join(args.source, args.output, args.length, fractions, last)
    paths = [args.output] if fractions is None and last is None else split_outputs(args.output)
    print("wrote " + ", ".join(f"{n:,} rows to {path}" for n, path in zip(rows, paths))
          + f"; with a history: {with_history:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
