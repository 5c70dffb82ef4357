"""Checkpoints: written synchronously by all ranks, atomically, per field, verified on load.

Layout of ``<run>/checkpoints/step-00000120/``::

    manifest.json           format, model config, dtype, seed, step / epoch / next batch, the
                            placement it was written with, and the sha256 of every file below
    manifest.sha256         the sha256 of manifest.json itself (format 2; format-1 checkpoints,
                            written before it existed, still load)
    dense.npz               the replicated top parameters and their optimizer state (rank 0)
    field-007.table         field 7's hash table: keys, values, optimizer slots, counters
    field-003.share-1-of-4.table
                            share 1 of field 3, split by key over 4 ranks (``des/placement.py``):
                            the table of the keys in that share, written by the rank holding it
    field-007.dense.npz     field 7's slices of substituted dense weights and their optimizer state
                            (of a split field: written once, by the rank holding share 0)
    field-007.evicted.npy   (an incremental checkpoint's) the keys field 7 evicted since its base

**Incremental checkpoints** (``--full-checkpoint-every K``, format 3): between full ones, a
checkpoint's table files hold only the rows looked up in training since the previous checkpoint
(its *base*, named in the manifest with its manifest's sha256), its ``.evicted.npy`` files the keys
evicted since, and the dense files are whole. A chain is a full checkpoint and its increments; the
table of a field is the full checkpoint's, then per increment: its evicted keys deleted, the
catch-ups the run made since its base replayed (``catch_ups``: Adam ``catchup=1`` moves rows no
step touched when a validation or a checkpoint catches every row up: replaying them gives the
writer's bits, where one catch-up later would not under a sparse schedule, whose rate of the moment
it applies to every skipped step, nor past the horizon, which a catch-up restarts), its rows
upserted (:func:`field_table`).

Everything is stored **per field, not per rank**, so a checkpoint written by N ranks loads on M
ranks: each rank reads the fields the new placement gives it, a field saved in shares as one table
and a share from a field saved whole or in shares of another size (:func:`field_table`, which
export and ``des.check`` read too). The data order is a pure function of (seed, epoch, batch
index) and initial values of (seed, field, key), so ``(epoch, next_batch, step)`` is all the "RNG
state" a resume needs.

Atomicity: all ranks write into ``.step-XXXXXXXX.tmp``; after a barrier, rank 0 writes the manifest
(with every file's checksum), renames the folder into place and then updates the ``latest``
pointer with ``os.replace``. A crash at any point leaves earlier checkpoints intact, and a folder
without a manifest is never taken for a checkpoint. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from des.errors import DesError
from des.hashtable import EmbeddingTable
from des.placement import share_of, shares

FORMAT = "des-checkpoint/2"
# An increment's own format: a reader that knows no chains refuses it, never taking its rows for a table.
INCREMENTAL_FORMAT = "des-checkpoint/3"
# Format 1 had no manifest.sha256; it loads unverified (a format-2 manifest without it is refused).
FORMATS = ("des-checkpoint/1", FORMAT, INCREMENTAL_FORMAT)
MANIFEST_CHECKSUM = "manifest.sha256"


@dataclass(frozen=True)
class Increment:
    """What makes a checkpoint incremental: its ``base`` (the run's previous checkpoint, a folder
    beside it), ``since`` (the base's step: rows looked up from that step on are written),
    ``depth`` (increments since the chain's full checkpoint, this one included) and the
    ``catch_ups`` (global step, sparse rate factor) the run's tables took since the base."""

    base: Path
    since: int
    depth: int
    catch_ups: tuple[tuple[int, float], ...] = ()


class CheckpointError(DesError):
    """A checkpoint that is missing, corrupt, or does not fit the model being run."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _field_stem(field: int) -> str:
    return f"field-{field:03d}"


def table_file(field: int, share: tuple[int, int] | None = None) -> str:
    """The file of ``field``'s table: whole, or its share ``(share, group size)``."""
    stem = _field_stem(field)
    return f"{stem}.table" if share is None else f"{stem}.share-{share[0]}-of-{share[1]}.table"


_TABLE_FILE = re.compile(r"field-(\d+)(?:\.share-(\d+)-of-(\d+))?\.table")


def evicted_file(table: str) -> str:
    """The file of the keys evicted since the base, beside table file ``table`` of an increment."""
    return table[:-len(".table")] + ".evicted.npy"


def _state_arrays(prefix: str, state: Any) -> dict[str, np.ndarray]:
    return {f"{prefix}__state__{k}": v for k, v in state.state_dict().items()}


def _load_state(prefix: str, arrays: Any, state: Any) -> None:
    tag = f"{prefix}__state__"
    state.load_state_dict({k[len(tag):]: arrays[k] for k in arrays.files if k.startswith(tag)})


def save_checkpoint(strategy: Any, root: Path, *, epoch: int, next_batch: int, config: dict[str, Any],
                    evicted_rows: int = 0, data_order: dict[str, Any] | None = None,
                    training_state: dict[str, Any] | None = None, schema: dict[str, Any] | None = None,
                    stream: dict[str, Any] | None = None, increment: Increment | None = None,
                    chained: bool = False) -> Path:
    """Write a checkpoint of ``strategy.state()`` under ``root``; collective (every rank calls it).
    ``evicted_rows``: rows the caller evicted right before (all ranks' sum, ``des.run.Run.evict``),
    kept in the manifest; ``data_order``: what fixes the batch order (data, batch size, seed...),
    checked on resume;
    ``training_state``: the runner's state besides the parameters (early stopping, plateau
    schedules), JSON, kept in the manifest (older checkpoints have none: a fresh state);
    ``schema``: the data's resolved schema (``des.data.schema``, with its training statistics:
    evaluation and serving read raw rows with it), None for Criteo's (no manifest entry);
    ``stream``: a ``--stream`` run's position in its files (``des.sources.StreamSource.position``);
    ``increment``: write an incremental checkpoint on that base (the tables must track evictions);
    ``chained``: the run writes increments: every table tracks its evictions from here on."""
    comm, state = strategy.comm, strategy.state()
    name = f"step-{state.step:08d}"
    tmp = root / f".{name}.tmp"
    if comm.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    comm.barrier("checkpoint")
    written = _write_files(state, tmp, rank=comm.rank, increment=increment, chained=chained)
    (tmp / f"rank-{comm.rank}.json").write_text(json.dumps(written))
    comm.barrier("checkpoint")
    if comm.rank == 0:
        manifest = {
            "format": FORMAT, "model": state.model.config(), "dtype": state.dtype.name, "seed": state.seed,
            "num_fields": state.model.num_fields, "step": state.step, "epoch": epoch, "next_batch": next_batch,
            "ranks": comm.size, "placement": state.placement, "evicted_rows": evicted_rows,
            "config": config, "data_order": data_order or {}, "training_state": training_state or {},
            "files": _gather_checksums(tmp, comm.size),
        }
        if schema is not None:
            manifest["schema"] = schema
        if stream is not None:
            manifest["stream"] = stream
        if increment is not None:
            manifest.update(format=INCREMENTAL_FORMAT, kind="incremental", base=increment.base.name,
                            base_manifest_sha256=_sha256(increment.base / "manifest.json"), depth=increment.depth,
                            catch_ups=[list(c) for c in increment.catch_ups])
        else:
            manifest.update(kind="full", depth=0)
        _publish(tmp, root, name, manifest)
    comm.barrier("checkpoint")
    return root / name


def _write_dense_slices(dense: Any, field: int, tmp: Path) -> str:
    """``field``'s slices of every field weight and their optimizer state; returns the file's name."""
    arrays: dict[str, np.ndarray] = {}
    for pname, value in dense.field_params.items():  # an owner holds every slice of its fields
        arrays[f"{pname}__value"] = value[dense.index(pname, field)]
        arrays.update(_state_arrays(pname, dense.field_state(pname, field)))
    name = f"{_field_stem(field)}.dense.npz"
    np.savez(tmp / name, **arrays)
    return name


def _write_files(state: Any, tmp: Path, *, rank: int, increment: Increment | None = None,
                 chained: bool = False) -> dict[str, str]:
    """Rank ``rank``'s files of a checkpoint (its fields' tables or shares, and dense slices; rank 0:
    the top network's weights), by name with their sha256; of an ``increment``, the tables' rows
    changed since its base and their keys evicted since."""
    dense, written, split = state.dense, [], shares(state.placement, rank)
    for field in state.fields:  # the owner writes a field's table and its dense slices
        share, table = split.get(field), state.tables[field]
        evicted = table.track_evictions() if chained or increment is not None else None
        if increment is None:
            table.save(tmp / table_file(field, share))
        else:
            table.save(tmp / table_file(field, share), since=increment.since)
        written.append(table_file(field, share))
        if increment is not None:
            if evicted is None:  # the caller starts tracking at the base (Run.save, Run.continue_chain)
                raise RuntimeError(f"field {field}: an incremental checkpoint of a table not tracking its evictions")
            np.save(tmp / evicted_file(table_file(field, share)), evicted)
            written.append(evicted_file(table_file(field, share)))
        if share is None or share[0] == 0:  # a split field's dense slices: every member holds them, share 0 writes
            written.append(_write_dense_slices(dense, field, tmp))
    for field in sorted(state.shared):  # a field using another's table: only its dense slices are its own
        written.append(_write_dense_slices(dense, field, tmp))
    if rank == 0:
        arrays = {}
        for pname, value in dense.top_params.items():
            arrays[f"{pname}__value"] = value
            arrays.update(_state_arrays(pname, dense.top_states[pname]))
        np.savez(tmp / "dense.npz", **arrays)
        written.append("dense.npz")
    return {file: _sha256(tmp / file) for file in written}


def _gather_checksums(tmp: Path, ranks: int) -> dict[str, str]:
    """Every rank's files and their sha256 (each rank left them in ``rank-R.json``)."""
    files: dict[str, str] = {}
    for r in range(ranks):
        part = tmp / f"rank-{r}.json"
        files.update(json.loads(part.read_text()))
        part.unlink()
    return dict(sorted(files.items()))


def _publish(tmp: Path, root: Path, name: str, manifest: dict[str, Any]) -> None:
    """Write the manifest and its checksum, then put the folder in place and point ``latest`` at it."""
    _write_atomically(tmp / "manifest.json", json.dumps(manifest, indent=1))
    _write_atomically(tmp / MANIFEST_CHECKSUM, _sha256(tmp / "manifest.json") + "\n")
    # A checkpoint of this step may exist (a rerun into the same folder): move it aside with
    # one rename, put the new one in place with another, and only then delete the old one.
    final, old = root / name, root / f".{name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    _write_atomically(root / "latest", name + "\n")
    shutil.rmtree(old, ignore_errors=True)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from a folder, a ``checkpoints/`` root (its ``latest``), or a run folder."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    for candidate in (path, path / "checkpoints"):
        latest = candidate / "latest"
        if latest.is_file():
            return candidate / latest.read_text().strip()
    return path


def read_manifest(path: str | Path) -> tuple[Path, dict[str, Any]]:
    folder = resolve_checkpoint(path)
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise CheckpointError(f"{folder} is not a checkpoint (no manifest.json)")
    if manifest_path.with_name(MANIFEST_CHECKSUM).is_file():
        _verify_manifest(manifest_path)
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint manifest {manifest_path} is corrupt: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS:
        raise CheckpointError(f"{manifest_path} is not a {' or '.join(FORMATS)} manifest")
    if manifest["format"] != FORMATS[0] and not manifest_path.with_name(MANIFEST_CHECKSUM).is_file():
        raise CheckpointError(f"checkpoint {folder} has no {MANIFEST_CHECKSUM} (required by its format {FORMAT})")
    if (manifest["format"] == INCREMENTAL_FORMAT) != (manifest.get("kind") == "incremental"):
        raise CheckpointError(f"checkpoint manifest {manifest_path} is corrupt: format {manifest['format']} "
                              f"with kind {manifest.get('kind')!r}")
    for key, kind in _MANIFEST_KEYS.items():
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            raise CheckpointError(f"checkpoint manifest {manifest_path} is corrupt: {key!r} is missing or not a {kind.__name__}")
    return folder, manifest


def _verify_manifest(manifest_path: Path) -> None:
    """The manifest's own checksum: an edited manifest (``next_batch``, say) would silently shift
    the data order or load other files."""
    sidecar = manifest_path.with_name(MANIFEST_CHECKSUM)
    try:
        expected = sidecar.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint file {sidecar} cannot be read: {exc}") from None
    if _sha256(manifest_path) != expected:
        raise CheckpointError(f"checkpoint manifest {manifest_path} was modified or is corrupt (sha256 mismatch "
                              f"with {MANIFEST_CHECKSUM})")


_MANIFEST_KEYS = {"model": dict, "dtype": str, "seed": int, "num_fields": int, "step": int, "epoch": int,
                  "next_batch": int, "ranks": int, "placement": list, "config": dict, "files": dict}


def check_compatible(manifest: dict[str, Any], state: Any, folder: Path) -> None:
    expected = state.model.config()
    if manifest["model"] != expected:
        saved = manifest["model"].get("model", "?")
        if saved != expected["model"]:
            raise CheckpointError(f"checkpoint {folder} holds a {saved} model, not {expected['model']}")
        diff = sorted(k for k in expected if manifest["model"].get(k) != expected[k])
        raise CheckpointError(f"checkpoint {folder} was trained with other model settings: {', '.join(diff)}")
    if manifest["dtype"] != state.dtype.name:
        raise CheckpointError(f"checkpoint {folder} is {manifest['dtype']}, the run is {state.dtype.name}")
    from des.placement import format_shared_tables, shared_tables

    held = set(state.fields) | set(state.shared)  # this rank's fields: their tables are read as they were saved
    saved = {f: o for f, o in shared_tables(manifest.get("config", {}).get("shared_tables", "auto")).items()
             if f in held}
    if saved != dict(state.shared):
        raise CheckpointError(f"checkpoint {folder} was trained with shared tables {format_shared_tables(saved)} "
                              f"of these fields, the run with {format_shared_tables(state.shared)}")


def check_schema(read: tuple[Path, dict[str, Any]], schema: dict[str, Any] | None) -> None:
    """The data of a resume or an evaluation must be of the checkpoint's schema (its training
    statistics included): ``read`` is :func:`read_manifest`'s answer, ``schema`` the data's
    (``ColumnStore.schema``: None for Criteo's)."""
    from des.data.schema import describe_schema

    folder, manifest = read
    trained = manifest.get("schema")
    if describe_schema(trained) != describe_schema(schema):
        raise CheckpointError(f"checkpoint {folder} was trained on data of schema {describe_schema(trained)}, "
                              f"this data is of schema {describe_schema(schema)}")


def check_data_order(manifest: dict[str, Any], data_order: dict[str, Any], folder: Path) -> None:
    """A resume continues at (epoch, next batch): that position only exists in the same batch order."""
    saved = manifest.get("data_order") or {}
    differ = [f"{k} {saved[k]!r} vs {v!r}" for k, v in data_order.items() if k in saved and saved[k] != v]
    if differ:
        raise CheckpointError(f"checkpoint {folder} was written with another batch order ({'; '.join(differ)}); "
                              "resume with the same data, --batch-size, --seed and --drop-last, or start a new run")


def verified_file(folder: Path, manifest: dict[str, Any], file: str) -> Path:
    path = folder / file
    expected = manifest["files"].get(file)
    if expected is None:
        raise CheckpointError(f"checkpoint {folder} has no {file}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {folder} is missing {file}")
    if _sha256(path) != expected:
        raise CheckpointError(f"checkpoint file {path} is corrupt (sha256 mismatch)")
    return path


def load_checkpoint(strategy: Any, path: str | Path, *, data_order: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load a checkpoint into ``strategy`` (written on any number of ranks, any placement); returns
    its manifest. A field split by key over ranks (``state.placement``) loads on this rank as the
    table of its share. With ``data_order`` (a resume), the checkpoint must come from the same batch order."""
    folder, manifest = read_manifest(path)
    state = strategy.state()
    check_compatible(manifest, state, folder)
    if data_order is not None:
        check_data_order(manifest, data_order, folder)
    split = shares(state.placement, strategy.comm.rank)
    for field in state.fields:  # whole, or this rank's share of a split field; stored as the run's rows are
        held = state.tables.get(field)
        state.tables[field] = field_table(folder, manifest, field, split.get(field),
                                          None if held is None else held.table_dtype,
                                          None if held is None else held.counters,
                                          None if held is None else [b.computed for b in held.blocks])
    dense = state.dense
    for field in dense.fields:  # own fields, and every field of a weight the strategy replicates
        dense_path = verified_file(folder, manifest, f"{_field_stem(field)}.dense.npz")
        with as_checkpoint_error(dense_path):
            arrays = np.load(dense_path, allow_pickle=False)
            for pname, value in dense.field_params.items():
                j = dense.index(pname, field)
                if j is None:
                    continue
                value[j] = arrays[f"{pname}__value"]
                _load_state(pname, arrays, dense.field_state(pname, field))
    dense_path = verified_file(folder, manifest, "dense.npz")
    with as_checkpoint_error(dense_path):
        arrays = np.load(dense_path, allow_pickle=False)
        for pname, value in dense.top_params.items():
            value[...] = arrays[f"{pname}__value"]
            _load_state(pname, arrays, dense.top_states[pname])
    state.step = int(manifest["step"])
    strategy.load_state(state)
    return manifest


def table_fields(manifest: dict[str, Any]) -> list[int]:
    """The fields whose tables a checkpoint holds: every field but those using another's table
    (its run's ``--shared-tables``)."""
    from des.placement import shared_tables

    shared = shared_tables(manifest.get("config", {}).get("shared_tables", "auto"))
    return [f for f in range(manifest["num_fields"]) if f not in shared]


def field_table(folder: Path, manifest: dict[str, Any], field: int,
                share: tuple[int, int] | None = None, table_dtype: str | None = None,
                counters: bool | None = None, computed: list[bool] | None = None) -> EmbeddingTable:
    """The table of ``field`` in a checkpoint (:func:`read_manifest`'s answer): whole, or cut to
    ``share`` = (share, group size), the keys :func:`des.placement.share_of` puts in it. Saved
    whole or in shares of any group size: every file it needs is verified (sha256) and merged
    (``EmbeddingTable.load_parts``); a share of the group size saved is its own file alone. Of an
    incremental checkpoint, its chain replayed (:func:`checkpoint_chain`; the module docstring).
    ``table_dtype``: its rows stored so (default: as saved; ``--table-dtype`` converts a checkpoint's
    rows on load, ``EmbeddingTable.load_parts``); ``counters``: with or without admission counts and
    last-seen steps (default: as saved; the run's options decide, ``TrainConfig.needs_counters``);
    ``computed``: per block, values computed from the optimizer's slots or stored (default: as
    saved; the run's blocks decide, ``BlockSpec.computed``)."""
    if share is not None and share[1] == 1:
        share = None
    chain = checkpoint_chain(folder, manifest)
    table, whole = _saved_table(*chain[0], field, share, table_dtype, counters, computed)
    for link, link_manifest in chain[1:]:
        for file in _table_parts(link, link_manifest, field).values():
            path = verified_file(link, link_manifest, evicted_file(file))
            with as_checkpoint_error(path):
                keys = np.load(path, allow_pickle=False)
                if keys.dtype != np.int64 or keys.ndim != 1:
                    raise ValueError(f"evicted keys are {keys.dtype}{list(keys.shape)}, not int64 [n]")
            table.delete(keys)
        for step, rate in link_manifest["catch_ups"]:  # what every row took in memory, in order
            table.catch_up(int(step), float(rate))
        rows, rows_whole = _saved_table(link, link_manifest, field, share, table_dtype, counters,
                                        [b.computed for b in table.blocks])
        with as_checkpoint_error(link):
            table.upsert(rows.to_arrays())
        whole = whole and rows_whole
        table.last_update_step = rows.last_update_step if rows.last_update_step is not None else table.last_update_step
        if rows_whole:  # the writer's counters; a cut share knows only its rows (as a cut full table)
            table.evicted_count, table.admitted_total = rows.evicted_count, rows.admitted_total
    if not whole:
        table.admitted_total = max(table.admitted_total, table.admitted_count)
    return table


def _saved_table(folder: Path, manifest: dict[str, Any], field: int, share: tuple[int, int] | None,
                 table_dtype: str | None = None, counters: bool | None = None,
                 computed: list[bool] | None = None) -> tuple[EmbeddingTable, bool]:
    """The table (or rows) of ``field`` that this one checkpoint's files hold, cut to ``share``,
    and whether every file was read whole (its counters then are the writer's)."""
    saved = _table_parts(folder, manifest, field)
    if share is None:
        plan = [(file, None) for file in saved.values()]
    elif share in saved:  # saved with this group size: that share's file is the share
        plan = [(saved[share], None)]
    else:
        index, size = share
        plan = [(file, lambda keys: share_of(keys, size) == index) for file in saved.values()]
    parts = [(verified_file(folder, manifest, file), cut) for file, cut in plan]
    if len(parts) == 1 and parts[0][1] is None:
        with as_checkpoint_error(parts[0][0]):
            table = EmbeddingTable.load(parts[0][0], table_dtype=table_dtype, counters=counters, computed=computed)
    else:
        try:
            table = EmbeddingTable.load_parts(parts, table_dtype=table_dtype, counters=counters, computed=computed)
        except (OSError, ValueError, KeyError) as exc:  # the message names the file
            raise CheckpointError(f"checkpoint table of field {field} cannot be loaded: {exc}") from None
    if table.field != field:
        raise CheckpointError(f"checkpoint file {parts[0][0]} holds field {table.field}, not {field}")
    return table, all(cut is None for _, cut in plan)


def checkpoint_chain(folder: Path, manifest: dict[str, Any]) -> list[tuple[Path, dict[str, Any]]]:
    """The chain of a checkpoint (:func:`read_manifest`'s answer), its full checkpoint first: itself
    alone if full, else its base's chain and itself. Every link's manifest is verified, and must
    be the one the next link was written on (its sha256), of the same model, at an earlier step."""
    chain = [(folder, manifest)]
    while chain[-1][1].get("kind") == "incremental":
        link, m = chain[-1]
        base, catch_ups = m.get("base"), m.get("catch_ups")
        if not isinstance(base, str) or not re.fullmatch(r"step-\d+", base) or not isinstance(catch_ups, list) \
                or not all(isinstance(c, list) and len(c) == 2 for c in catch_ups):
            raise CheckpointError(f"checkpoint manifest {link / 'manifest.json'} is corrupt: a bad base or catch_ups")
        folder_of_base = link.parent / base
        if not (folder_of_base / "manifest.json").is_file():
            raise CheckpointError(f"checkpoint {link} is an increment of {base}, which is missing")
        _, base_manifest = read_manifest(folder_of_base)
        if _sha256(folder_of_base / "manifest.json") != m.get("base_manifest_sha256"):
            raise CheckpointError(f"checkpoint {link} is an increment of {base}, which was replaced since")
        if any(base_manifest[k] != m[k] for k in ("model", "dtype", "seed", "num_fields")) or \
                base_manifest["step"] >= m["step"] or len(chain) > 1 << 16:
            raise CheckpointError(f"checkpoint {link} is an increment of {base}, which is not its base")
        chain.append((folder_of_base, base_manifest))
    return chain[::-1]


def _table_parts(folder: Path, manifest: dict[str, Any], field: int) -> dict[tuple[int, int] | None, str]:
    """The table files of ``field`` the manifest lists: ``{None: whole}`` or ``{(share, size): file}``
    for every share of one group size, in share order."""
    found: dict[tuple[int, int] | None, str] = {}
    for file in manifest["files"]:
        match = _TABLE_FILE.fullmatch(file)
        if match and int(match[1]) == field:
            found[None if match[2] is None else (int(match[2]), int(match[3]))] = file
    if not found:
        raise CheckpointError(f"checkpoint {folder} has no {table_file(field)}")
    sizes = {key[1] for key in found if key is not None}
    if None in found and len(found) > 1 or len(sizes) > 1 or \
            sizes and set(found) != {(s, size) for size in sizes for s in range(size)}:
        raise CheckpointError(f"checkpoint {folder} holds an inconsistent set of field {field}'s tables: "
                              f"{', '.join(sorted(found.values()))}")
    return dict(sorted(found.items(), key=lambda item: (-1, 0) if item[0] is None else item[0]))


@contextmanager
def as_checkpoint_error(path: Path) -> Iterator[None]:
    """Turn any failure to read a (checksum-verified) file into a one-line CheckpointError."""
    try:
        yield
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint file {path} cannot be loaded: {exc}") from None
