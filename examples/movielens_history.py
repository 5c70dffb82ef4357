"""MovieLens 100K as one CSV with each rating's behaviour history: the movies its user rated before.

    python examples/movielens_history.py --source ../shared/data/movielens-100k/raw --output history.csv

The rows are ``examples/movielens.py``'s (each rating joined with its user and its movie, in the
order of ``u.data``) with one more column, ``history``: the movies the same user rated at an
earlier timestamp (ratings of the same second are not each other's history), oldest first,
separated by ``|``, the most recent ``--length`` of them (default 20; empty for a user's first
ratings). ``examples/movielens_history.toml`` declares it as a ``sequence`` column reading the
movies' table (``table = "item_id"``: one embedding per movie, whether rated now or before). The
history holds which movies were rated, never their ratings: the label of a row stays out of every
row's features.
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


def join(source: Path, output: Path, length: int) -> tuple[int, int]:
    """Write the CSV; returns (rows, rows with a non-empty history)."""
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
    with open(output, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(HISTORY_HEADER)
        for (user_id, item_id, _), values, past in zip(ratings, rest, history):
            writer.writerow([user_id, item_id, *values, past])
    return len(ratings), sum(1 for h in history if h)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True,
                        help="folder with the GroupLens ml-100k files (u.data, u.user, u.item, u.genre)")
    parser.add_argument("--output", type=Path, required=True, help="CSV file to write")
    parser.add_argument("--length", type=int, default=20, help="the most recent movies kept per history")
    args = parser.parse_args(argv)
    if args.length < 1:
        parser.error(f"--length must be at least 1, not {args.length}")
    missing = [name for name in FILES if not (args.source / name).is_file()]
    if missing:
        print(f"missing in {args.source}: {', '.join(missing)} "
              f"(expected the GroupLens ml-100k files {', '.join(FILES)})", file=sys.stderr)
        return 2
    rows, with_history = join(args.source, args.output, args.length)
    print(f"wrote {rows:,} rows to {args.output}; with a history: {with_history:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
