"""MovieLens 100K as one CSV: each rating joined with its user and its movie.

    python examples/movielens.py --source ../shared/data/movielens-100k/raw --output movielens.csv

``--source`` is the folder of the GroupLens files (``u.data``, ``u.user``, ``u.item``,
``u.genre``); the data is not shipped with des (GroupLens terms), download ml-100k from GroupLens.
The output has a header and one row per rating, in the order of ``u.data``:

    user_id,item_id,rating,timestamp,age,gender,occupation,zip_code,release_year,genres

``release_year`` is the year of the movie's release date (empty when unknown); ``genres`` lists
the movie's genres by their names in ``u.genre``, separated by ``|`` (e.g.
``Animation|Children's|Comedy``). A CTR-style label is usually ``rating >= 4``; the script prints
the number of rows written and that share.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

HEADER = ["user_id", "item_id", "rating", "timestamp", "age", "gender", "occupation", "zip_code",
          "release_year", "genres"]
FILES = ["u.data", "u.user", "u.item", "u.genre"]


def read_lines(path: Path) -> list[str]:
    # u.item has a few non-ASCII titles in Latin-1
    return [line for line in path.read_text(encoding="latin-1").splitlines() if line.strip()]


def read_genres(path: Path) -> list[str]:
    """Genre names by index: u.genre lines are ``name|index``."""
    names = {}
    for line in read_lines(path):
        name, index = line.rsplit("|", 1)
        names[int(index)] = name
    return [names[i] for i in range(len(names))]


def read_users(path: Path) -> dict[str, list[str]]:
    """user_id -> [age, gender, occupation, zip_code] (u.user: ``id|age|gender|occupation|zip``)."""
    users = {}
    for line in read_lines(path):
        user_id, age, gender, occupation, zip_code = line.split("|")
        users[user_id] = [age, gender, occupation, zip_code]
    return users


def read_movies(path: Path, genre_names: list[str]) -> dict[str, list[str]]:
    """movie_id -> [release_year, genres] (u.item: id, title, release date, video release date,
    IMDb URL, then one 0/1 flag per genre in u.genre's order)."""
    movies = {}
    for line in read_lines(path):
        fields = line.split("|")
        movie_id, release_date, flags = fields[0], fields[2], fields[5:]
        if len(flags) != len(genre_names):
            raise ValueError(f"{path}: movie {movie_id} has {len(flags)} genre flags, "
                             f"u.genre names {len(genre_names)}")
        year = release_date.rsplit("-", 1)[-1] if release_date else ""  # 01-Jan-1995 -> 1995
        genres = "|".join(name for name, flag in zip(genre_names, flags) if flag == "1")
        movies[movie_id] = [year, genres]
    return movies


def join(source: Path, output: Path) -> tuple[int, int]:
    """Write the joined CSV; returns (rows, ratings >= 4)."""
    genre_names = read_genres(source / "u.genre")
    users = read_users(source / "u.user")
    movies = read_movies(source / "u.item", genre_names)
    rows = positives = 0
    with open(output, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(HEADER)
        for line in read_lines(source / "u.data"):
            user_id, item_id, rating, timestamp = line.split("\t")
            if user_id not in users or item_id not in movies:
                raise ValueError(f"u.data: rating of user {user_id} for movie {item_id}, "
                                 "which u.user or u.item does not have")
            writer.writerow([user_id, item_id, rating, timestamp, *users[user_id], *movies[item_id]])
            rows += 1
            positives += int(rating) >= 4
    return rows, positives


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True,
                        help="folder with the GroupLens ml-100k files (u.data, u.user, u.item, u.genre)")
    parser.add_argument("--output", type=Path, required=True, help="CSV file to write")
    args = parser.parse_args(argv)

    missing = [name for name in FILES if not (args.source / name).is_file()]
    if missing:
        print(f"missing in {args.source}: {', '.join(missing)} "
              f"(expected the GroupLens ml-100k files {', '.join(FILES)})", file=sys.stderr)
        return 2
    rows, positives = join(args.source, args.output)
    share = positives / rows if rows else 0.0
    print(f"wrote {rows:,} rows to {args.output}; rating >= 4: {positives:,} ({share:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
