"""The BARS benchmark's x1 datasets as built-in schemas (``docs/bars.md``).

BARS (Zhu et al., "BARS: Towards Open Benchmarking for Recommender Systems", SIGIR 2022) publishes
each dataset as ``train.csv``, ``valid.csv`` and ``test.csv`` with a header (the reczoo/Datasets
layouts) and trains on them with FuxiCTR's preprocessing. These schemas read those files as
published: the label column ``label`` (0/1), every feature column a categorical field whose text
is hashed (key scheme 2; the x1 files hold ids already, so a value's text is the id), and
Criteo_x1's ``I1..I13`` numbers as dense features taken as they are (FuxiCTR reads them as
``numeric`` features). Their min count is 1 (every id kept, as FuxiCTR's ``min_categr_count: 1``
for these splits), so no statistics pass is needed.

KKBox_x1 (the columns of the published files, ``split_kkbox_x4.py`` of reczoo/BARS, read as
FuxiCTR's ``KKBox.yaml`` reads them): nine categorical columns, ``genre_ids`` and ``artist_name``
lists of ids separated by spaces (the first 3 kept, summed), ``bd`` bucketized as FuxiCTR's
``bucketize_age``, ``isrc``'s country code (its first 2 characters) as a field, the other columns
ignored. FuxiCTR's min count of 10 is a vocabulary of the training file; des's nearest is training
with ``--min-count 10 --unadmitted shared`` (``docs/bars.md``).
"""

from __future__ import annotations

from typing import Any

#: KKBox_x1's ``bd`` (age) buckets, FuxiCTR's ``bucketize_age``: 1-10, 11-20, ..., 51-60, 61-95 (the
#: ages are whole numbers); below 1 and above 95 a bucket each
KKBOX_AGES = [1, 11, 21, 31, 41, 51, 61, 96]


def _categorical(names: list[str] | tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"name": name, "kind": "categorical"} for name in names]


def _ignored(names: list[str]) -> list[dict[str, Any]]:
    return [{"name": name, "kind": "ignored"} for name in names]


def _csv_schema(name: str, columns: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "format": {"type": "csv", "delimiter": ",", "header": True},
            "label": {"column": "label"}, "columns": columns}


BARS_SCHEMAS: dict[str, dict[str, Any]] = {
    "criteo_x1": _csv_schema("criteo_x1", [
        *({"name": f"I{i}", "kind": "numeric", "as": "dense"} for i in range(1, 14)),
        *_categorical([f"C{i}" for i in range(1, 27)])]),
    "avazu_x1": _csv_schema("avazu_x1", _categorical([f"feat_{i}" for i in range(1, 23)])),
    "frappe_x1": _csv_schema("frappe_x1", _categorical(
        ["user", "item", "daytime", "weekday", "isweekend", "homework", "cost", "weather", "country", "city"])),
    "movielenslatest_x1": _csv_schema("movielenslatest_x1", _categorical(["user_id", "item_id", "tag_id"])),
    "kkbox_x1": {**_csv_schema("kkbox_x1", [
        *_categorical(["msno", "song_id", "source_system_tab", "source_screen_name", "source_type", "city"]),
        {"name": "bd", "kind": "numeric", "as": "bucketize", "buckets": "boundaries", "boundaries": KKBOX_AGES},
        *_categorical(["gender", "registered_via"]),
        *_ignored(["registration_init_time", "expiration_date", "song_length"]),
        *({"name": name, "kind": "multi_valued", "separator": " ", "max_length": 3} for name in ("genre_ids",
                                                                                                 "artist_name")),
        *_ignored(["composer", "lyricist"]),
        *_categorical(["language"]),
        *_ignored(["name"]),
        {"name": "isrc", "kind": "input", "dtype": "string"}]),
        "derived": [{"name": "isrc_country", "transform": "prefix", "inputs": ["isrc"], "length": 2}]},
}
