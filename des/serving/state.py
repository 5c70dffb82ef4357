"""What a served model holds, read from a checkpoint: every field's keys and their values per block
(as training gathers them, so admission and the unknown-id behaviour are the checkpoint's), the
field-sliced weights and the replicated ones (``docs/design.md``, section 11).

The checkpoint may come from any number of ranks and any strategy: only its per-field files are
read (a field split by key as one table, ``des.checkpoint.field_table``), one field at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from des.errors import ConfigError
from des.hashtable.layout import SHARED_KEY


def _top_names(model: Any) -> list[str]:
    """The replicated weights in ``dense.npz``: the top network's and the dense features' (named as
    :class:`des.strategies.components.DenseParams` names them)."""
    return [*model.top_params(), *(f"{i}:{sub.name}:{p}" for i, sub in enumerate(model.substitutions())
                                   for p in sub.dense_params())]


def read_checkpoint(folder: Path, manifest: dict[str, Any], model: Any) -> dict[str, Any]:
    """Every field's rows (values as training gathers them), field-sliced weights and the
    replicated weights; with ``--unadmitted shared`` only the admitted keys, and per block the
    ``[fields, dim]`` values of every field's shared row (``shared``: what an unknown or unadmitted
    key is looked up as). ``keys[f]`` are field ``f``'s keys, whose rows are ``values[block]``'s
    rows ``offsets[f]`` on; a field using another's table (``--shared-tables``) is served that
    table (``owners[f]``: the field whose table field ``f`` reads)."""
    from des.checkpoint import as_checkpoint_error, verified_file
    from des.placement import shared_tables

    blocks = [b.name for b in model.blocks()]
    keys, values, shared = [], {b: [] for b in blocks}, {b: [] for b in blocks}
    field_params: dict[str, list[np.ndarray]] = {}
    table: dict[str, Any] = {}
    owners = shared_tables(manifest.get("config", {}).get("shared_tables", "auto"))
    for field in range(model.num_fields):
        table = read_field_table(folder, manifest, owners.get(field, field), blocks)
        keys.append(table["keys"])
        for b in blocks:
            values[b].append(table["values"][b])
            if table["shared"]:
                shared[b].append(table["shared"][b])
        path = verified_file(folder, manifest, f"field-{field:03d}.dense.npz")
        with as_checkpoint_error(path), np.load(path, allow_pickle=False) as arrays:
            for name in arrays.files:
                if name.endswith("__value") and "__state__" not in name:
                    field_params.setdefault(name[: -len("__value")], []).append(arrays[name])
    path = verified_file(folder, manifest, "dense.npz")
    with as_checkpoint_error(path), np.load(path, allow_pickle=False) as arrays:
        top = {name: arrays[f"{name}__value"] for name in _top_names(model)}
    return {
        "keys": keys,
        "offsets": np.concatenate([[0], np.cumsum([k.size for k in keys])]).astype(np.int64),
        "values": {b: np.concatenate(v) if v else np.zeros((0, table["specs"][b].dim)) for b, v in values.items()},
        "field_params": {k: np.stack(v) for k, v in field_params.items()},
        "top": top, "specs": table["specs"], **table["options"],
        "shared": {b: np.stack(v) for b, v in shared.items() if v},
        "owners": [owners.get(f, f) for f in range(model.num_fields)],
    }


def read_field_table(folder: Path, manifest: dict[str, Any], field: int, blocks: list[str]) -> dict[str, Any]:
    """One field's table: the keys to serve, their values per block (as training gathers them),
    the shared row's values (``--unadmitted shared``), the blocks' specs and the table's options."""
    from des.checkpoint import field_table

    table = field_table(folder, manifest, field)  # a field split by key: its shares as one table
    if [b.name for b in table.blocks] != blocks:
        raise ConfigError(f"checkpoint {folder}: field {field}'s table has blocks {[b.name for b in table.blocks]}, "
                          f"expected {blocks}")
    field_keys = table.keys()
    rows = np.arange(field_keys.size, dtype=np.int64)
    shared = {}
    if table.unadmitted == "shared":
        # An evaluation lookup of the shared key itself: its row (made as training would make it,
        # with its initial value, if the table has none yet). Unadmitted keys are left out: served
        # as unknown, they get this row, as lookup maps them to it.
        shared_key = np.array([SHARED_KEY], dtype=np.int64)
        shared_row = table.lookup(shared_key, insert=False)
        shared = {b: table.gather(b, shared_key, shared_row)[0] for b in blocks}
        keep = (field_keys != SHARED_KEY) & table.metadata(rows)["admitted"]
        field_keys, rows = field_keys[keep], rows[keep]
    # gather applies admission: a not-yet-admitted row gives its initial value or zero
    return {"keys": field_keys, "values": {b: table.gather(b, field_keys, rows) for b in blocks}, "shared": shared,
            "specs": {b.name: b for b in table.blocks},
            "options": {"seed": table.seed, "min_count": table.min_count, "unadmitted": table.unadmitted,
                        "dtype": table.dtype}}
