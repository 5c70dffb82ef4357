"""The BARS benchmark's x1 datasets as built-in schemas (``docs/bars.md``).

BARS (Zhu et al., "BARS: Towards Open Benchmarking for Recommender Systems", SIGIR 2022) publishes
each dataset as ``train.csv``, ``valid.csv`` and ``test.csv`` with a header (the reczoo/Datasets
layouts) and trains on them with FuxiCTR's preprocessing. These schemas read those files as
published: the label column ``label`` (0/1), every feature column a categorical field whose text
is hashed (key scheme 2; the x1 files hold ids already, so a value's text is the id), and
Criteo_x1's ``I1..I13`` numbers as dense features taken as they are (FuxiCTR reads them as
``numeric`` features). Their min count is 1 (every id kept, as FuxiCTR's ``min_categr_count: 1``
for these splits), so no statistics pass is needed.
"""

from __future__ import annotations

from typing import Any


def _categorical(names: list[str] | tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"name": name, "kind": "categorical"} for name in names]


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
}
