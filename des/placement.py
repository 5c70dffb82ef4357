"""Which rank holds which field, or which share of a field.

A DES rank owns whole fields: their hash tables, optimizer slots and the field slices of any weight
(the DES paper, section 5). A field may also be **split by key** over a group of ranks: each member
holds the ids whose key falls in its share (:func:`share_of`, a hash of the key, so every process
agrees without talking), with their rows and optimizer slots. A placement is one list of fields per
rank; a field listed by several ranks is split over them, in that order. Three policies, pure
functions of their inputs, so every rank computes the same placement:

* ``"mod"`` -- field ``f`` goes whole to rank ``f mod N`` (the paper's choice);
* ``"balanced"`` -- whole fields by greedy longest-processing-time on per-field distinct-id counts
  (the biggest first, each to the rank with the fewest ids so far; ties to the lower field / rank);
  given each field's work per step (:func:`field_work`, counted on a batch of the data), on both at
  once: each field, largest share first, to the rank whose larger share (of all the memory, of all
  the work) stays smallest with it. A step waits for its slowest rank, and a field's work is not its
  table's size: a field of a few hundred ids with 25 ids in every row costs a rank more per step
  than one of 300,000 ids with one id a row, and holding many such fields made one rank of 8 twice
  as slow as the others (docs/benchmarks.md, "Scaling");
* ``"split"`` -- the fewest of the largest fields split over every rank (each rank then holds
  ``1/N`` of each, TorchRec's row-wise sharding), the rest placed whole as ``balanced`` does, so
  that the predicted table memory of the largest rank is within :data:`SPLIT_TARGET` of the mean.
  N may exceed the number of fields.

Table memory is proportional to distinct ids (every field's table has the same row layout), the
counts the data's preparation records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numba
import numpy as np

from des.errors import ConfigError, PlacementError
from des.splitmix import mix64

PLACEMENTS = ("mod", "balanced", "split")
#: ``split``: the largest rank's predicted table memory over the mean it settles for
SPLIT_TARGET = 1.05
#: A field's work per step (:func:`field_work`) in units of one id of a row (looked up, pooled, its
#: gradient added to its id's): each distinct id of the batch costs :data:`ID_WORK` more (its row
#: read, its optimizer step) and each row of the batch :data:`ROW_WORK` (the field's slices of the
#: substituted operators, forward and backward). Fitted to one job's per-rank phases (multi-hot
#: data, 8 ranks of a 16-core host: 17 ns per id of a row, 270 per distinct id, about 2 ids' worth
#: per row and field; docs/benchmarks.md, "Scaling").
ID_WORK = 16.0
ROW_WORK = 2.0
# Shares hash the key with a salt: the tables place a key by the top bits of splitmix64(key), so a
# share chosen by the same hash would fill one slice of every member's index.
_SHARE_SALT = np.uint64(0xD1B54A32D192ED03)


def place_fields(
    num_fields: int,
    num_ranks: int,
    policy: str = "mod",
    distinct_counts: Sequence[int] | None = None,
    split: str | Sequence[int] = "auto",
    work: Sequence[float] | None = None,
    shared: Mapping[int, int] | None = None,
) -> list[list[int]]:
    """Fields of each rank (sorted), for ``num_ranks`` ranks; a field listed by every rank is split.
    ``split`` (policy ``split`` only): ``"auto"`` (the policy's choice), ``"all"``, or the fields to
    split (the others placed whole, largest first). ``work`` (policy ``balanced``): each field's
    work per step (:func:`field_work`), balanced with the memory. ``shared`` (field -> the field
    whose table it uses): a table's fields are placed together, as one field."""
    if shared:
        return _place_shared(num_fields, num_ranks, policy, distinct_counts, split, shared, work)
    if num_ranks < 1:
        raise PlacementError(f"need at least one rank, got {num_ranks}")
    if policy not in PLACEMENTS:
        raise ConfigError(f"unknown placement {policy!r} (choose one of: {', '.join(PLACEMENTS)})")
    if split != "auto" and policy != "split":
        raise ConfigError("--split-fields needs --placement split")
    if num_ranks > num_fields and policy != "split":
        raise PlacementError(
            f"{num_ranks} ranks but the data has only {num_fields} fields: every rank must own at "
            f"least one field, so run with at most {num_fields} ranks, or split fields by key "
            f"(--placement split)"
        )
    if policy == "mod":
        return [[f for f in range(num_fields) if f % num_ranks == r] for r in range(num_ranks)]
    if distinct_counts is None or len(distinct_counts) != num_fields:
        raise ConfigError(f"the {policy} placement needs the distinct-id count of every field")
    cost = [max(int(c), 1) for c in distinct_counts]
    if policy == "balanced":
        if work is not None and num_ranks > 1:
            if len(work) != num_fields:
                raise ConfigError(f"the balanced placement got the work of {len(work)} fields, not {num_fields}")
            return _longest_first_by_both(num_fields, cost, work, num_ranks)
        return _longest_first(range(num_fields), cost, num_ranks)
    if split == "auto":
        return _split(cost, num_ranks)
    chosen = sorted(range(num_fields) if split == "all" else {int(f) for f in split})
    if any(not 0 <= f < num_fields for f in chosen):
        raise ConfigError(f"--split-fields: field numbers must be in 0..{num_fields - 1}, got {list(split)}")
    whole = [f for f in range(num_fields) if f not in chosen]
    owned = _longest_first(whole, cost, num_ranks, sum(cost[f] for f in chosen) / num_ranks)
    if num_ranks > 1 and not chosen and any(not fields for fields in owned):
        raise PlacementError(f"{num_ranks} ranks and {num_fields} fields, none split: split some (--split-fields)")
    if num_ranks == 1:
        return [list(range(num_fields))]
    return [sorted(fields + chosen) for fields in owned]


def _longest_first(fields: Sequence[int], cost: Sequence[int], num_ranks: int,
                   base: float = 0.0) -> list[list[int]]:
    """Whole fields by greedy longest-processing-time, each rank starting at load ``base``."""
    load = [base] * num_ranks
    owned: list[list[int]] = [[] for _ in range(num_ranks)]
    for field in sorted(fields, key=lambda f: (-cost[f], f)):
        # with no base load the first num_ranks fields land on distinct (empty) ranks
        rank = min(range(num_ranks), key=lambda r: (load[r], len(owned[r]), r))
        owned[rank].append(field)
        load[rank] += cost[field]
    return [sorted(fields) for fields in owned]


def _longest_first_by_both(num_fields: int, memory: Sequence[int], work: Sequence[float],
                           num_ranks: int) -> list[list[int]]:
    """Whole fields by greedy longest-processing-time on two loads at once (vector scheduling): each
    field's shares of all the memory and of all the work, the field of the largest share first, to
    the rank whose larger load is smallest with it (ties: the smaller sum, fewer fields, lower
    rank). The first ``num_ranks`` fields land on distinct ranks; no rank stays empty."""
    shares = np.stack([np.asarray(memory, np.float64) / max(float(np.sum(memory)), 1.0),
                       np.maximum(np.asarray(work, np.float64), 0.0) / max(float(np.sum(work)), 1e-300)], axis=1)
    load = np.zeros((num_ranks, 2))
    owned: list[list[int]] = [[] for _ in range(num_ranks)]
    for field in sorted(range(num_fields), key=lambda f: (-float(shares[f].max()), f)):
        empty = [r for r in range(num_ranks) if not owned[r]]
        remaining = num_fields - sum(map(len, owned))
        candidates = empty if len(empty) >= remaining else range(num_ranks)  # keep a field for every rank
        after = load + shares[field]
        rank = min(candidates, key=lambda r: (float(after[r].max()), float(after[r].sum()), len(owned[r]), r))
        owned[rank].append(field)
        load[rank] = after[rank]
    return [sorted(fields) for fields in owned]


def field_work(batch, num_fields: int) -> list[float]:
    """Each field's work per step, counted on one global batch of the data (``des.data`` Batch):
    its ids, ``ID_WORK`` x its distinct ids and ``ROW_WORK`` x the rows, in units of one id of a
    row (:data:`ID_WORK`). Distinct ids are those of the whole batch, as its owner updates them."""
    import pandas as pd  # its hash-based unique counts a batch's ids a few times faster than np.unique

    out = []
    for f in range(num_fields):
        keys = np.asarray(batch.fields[f].keys)
        out.append(float(keys.size + ID_WORK * pd.unique(keys).size + ROW_WORK * batch.size))
    return out


def _split(cost: Sequence[int], num_ranks: int) -> list[list[int]]:
    """The ``split`` policy: split the k largest fields over every rank for the smallest k whose
    predicted max/mean table memory is within :data:`SPLIT_TARGET` (k = every field gives 1)."""
    if num_ranks == 1:
        return [list(range(len(cost)))]
    order = sorted(range(len(cost)), key=lambda f: (-cost[f], f))
    mean = sum(cost) / num_ranks
    for k in range(len(cost) + 1):
        split, whole = sorted(order[:k]), order[k:]
        base = sum(cost[f] for f in split) / num_ranks
        owned = _longest_first(whole, cost, num_ranks, base)
        if not split and any(not fields for fields in owned):
            continue  # a rank would hold nothing
        load = [base + sum(cost[f] for f in fields) for fields in owned]
        if max(load) <= SPLIT_TARGET * mean or k == len(cost):
            return [sorted(fields + split) for fields in owned]
    raise AssertionError("unreachable: splitting every field balances")


def check_placement(placement: Sequence[Sequence[int]], num_fields: int, num_ranks: int) -> None:
    """Every field held by at least one of ``num_ranks`` ranks, no rank without a field."""
    held = sorted({int(f) for fields in placement for f in fields})
    if len(placement) != num_ranks or held != list(range(num_fields)) or any(not p for p in placement) \
            or any(len(set(p)) != len(p) for p in placement):
        raise PlacementError(f"placement {[list(p) for p in placement]} does not give each of the {num_fields} fields "
                             f"to one or more of the {num_ranks} ranks, each rank at least one")


def split_groups(placement: Sequence[Sequence[int]]) -> dict[int, list[int]]:
    """The split fields and their groups: ``{field: [ranks holding a share, in share order]}``."""
    groups: dict[int, list[int]] = {}
    for rank, fields in enumerate(placement):
        for f in fields:
            groups.setdefault(int(f), []).append(rank)
    return {f: ranks for f, ranks in sorted(groups.items()) if len(ranks) > 1}


def predicted_table_bytes(placement: Sequence[Sequence[int]], distinct: Sequence[int], layout, tables) -> list[int]:
    """Each rank's table memory at the data's distinct ids: per field (a share of a split field:
    its part of the ids) the bytes of ``layout`` (an empty table of the run's row layout: every
    field's table has the same) holding them (rows for those the training split admits, where
    ``tables`` knows them: ``TableOptions.rows_held``), with the initial sizes ``tables``
    (``TableOptions``) gives, or none (``footprint.estimated_bytes``: no growth slack)."""
    groups = {f: len(ranks) for f, ranks in split_groups(placement).items()}

    def estimate(f: int) -> int:
        parts = groups.get(f, 1)
        if tables is None:
            return layout.estimated_bytes(-(-int(distinct[f]) // parts))
        capacity, rows = tables.initial_size(f, parts)
        held = tables.rows_held(f, parts) - 1 if tables.distinct else -(-int(distinct[f]) // parts)
        return layout.estimated_bytes(held, capacity, rows)

    return [sum(estimate(f) for f in fields) for fields in placement]


def whole_fields(placement: Sequence[Sequence[int]], rank: int) -> list[int]:
    """The fields ``rank`` holds whole."""
    split = split_groups(placement)
    return sorted(int(f) for f in placement[rank] if int(f) not in split)


def shares(placement: Sequence[Sequence[int]], rank: int) -> dict[int, tuple[int, int]]:
    """The split fields ``rank`` holds a share of: ``{field: (share, group size)}``."""
    return {f: (ranks.index(rank), len(ranks)) for f, ranks in split_groups(placement).items() if rank in ranks}


@numba.njit(cache=True, nogil=True)
def share_of(keys, group_size):  # pragma: no cover - numba
    """The share (0 .. group_size-1) each key falls in: a salted SplitMix64 of the key, fast-ranged."""
    out = np.empty(keys.shape[0], dtype=np.int64)
    n = np.uint64(group_size)
    for i in range(keys.shape[0]):
        h = mix64(np.uint64(keys[i]) ^ _SHARE_SALT) >> np.uint64(32)
        out[i] = np.int64((h * n) >> np.uint64(32))
    return out


@numba.njit(cache=True, nogil=True)
def _keep(keys, offsets, share, group_size, mask_out, offsets_out):  # pragma: no cover - numba
    """``mask_out[t]``: key t is in ``share``; ``offsets_out``: the rows' CSR pointers of those kept."""
    shares = share_of(keys, group_size)
    offsets_out[0] = 0
    kept = 0
    for r in range(offsets.shape[0] - 1):
        for t in range(offsets[r], offsets[r + 1]):
            mask_out[t] = shares[t] == share
            kept += mask_out[t]
        offsets_out[r + 1] = kept


def keep_share(ids, share: int, group_size: int):
    """The ids of one field (a CSR ``FieldBatch``) whose keys fall in ``share``: every row keeps its
    weights (mean pooling's ``1/n`` of the row's full count), a row without such ids is empty."""
    from des.data.batch import FieldBatch

    keys = np.ascontiguousarray(ids.keys, dtype=np.int64)
    mask = np.empty(keys.shape[0], dtype=np.bool_)
    offsets = np.empty(ids.offsets.shape[0], dtype=np.int64)
    _keep(keys, np.asarray(ids.offsets, dtype=np.int64), int(share), int(group_size), mask, offsets)
    return FieldBatch(offsets, keys[mask], None if ids.weights is None else np.asarray(ids.weights)[mask])


def parse_shared_tables(text: str, names: Sequence[str]) -> dict[int, int]:
    """``--shared-tables``: ``FIELD:OWNER,...`` by field names or numbers (``none`` or empty: no
    sharing) -> {field: owner}; an owner shares no table itself, a field names one owner."""
    def number(item: str) -> int:
        if item in names:
            return list(names).index(item)
        if item.isdigit() and int(item) < len(names):
            return int(item)
        raise ConfigError(f"--shared-tables: {item!r} is not a field of the data (fields: {', '.join(names)})")

    out: dict[int, int] = {}
    for pair in (t.strip() for t in text.split(",") if t.strip() and text.strip() != "none"):
        field, sep, owner = (x.strip() for x in pair.partition(":"))
        if not sep:
            raise ConfigError(f"--shared-tables: {pair!r} is not FIELD:OWNER")
        f, o = number(field), number(owner)
        if f == o or f in out:
            raise ConfigError(f"--shared-tables: {pair!r}: a field uses one other field's table")
        out[f] = o
    chained = sorted(o for o in out.values() if o in out)
    if chained:
        raise ConfigError(f"--shared-tables: field {names[chained[0]]} uses another's table and cannot own one")
    return out


def shared_tables(text: str) -> dict[int, int]:
    """A run's resolved ``--shared-tables`` (``FIELD:OWNER`` field numbers, as start-up writes it;
    ``auto`` before start-up resolves it: none) as {field: owner}."""
    if text in ("auto", "none", ""):
        return {}
    pairs = [pair.split(":") for pair in text.split(",")]
    return parse_shared_tables(text, [str(f) for f in range(1 + max(int(x) for pair in pairs for x in pair))])


def format_shared_tables(shared: Mapping[int, int]) -> str:
    """:func:`parse_shared_tables`'s inverse, by numbers (``none`` for no sharing)."""
    return ",".join(f"{f}:{o}" for f, o in sorted(shared.items())) or "none"


def _place_shared(num_fields: int, num_ranks: int, policy: str, distinct_counts: Sequence[int] | None,
                  split: str | Sequence[int], shared: Mapping[int, int],
                  work: Sequence[float] | None = None) -> list[list[int]]:
    """:func:`place_fields` of the tables (a field and those sharing its table: one unit, costing
    their distinct ids and their work together), each unit's fields on the same rank; none of them
    split."""
    grouped = set(shared) | set(shared.values())
    if policy == "split" and (split in ("auto", "all") or grouped & {int(f) for f in split}):
        raise ConfigError("--placement split cannot split fields that share a table: name the fields to split "
                          f"with --split-fields, none of fields {', '.join(map(str, sorted(grouped)))}")
    units = [f for f in range(num_fields) if f not in shared]
    members = {u: [u, *sorted(f for f, o in shared.items() if o == u)] for u in units}
    cost = None if distinct_counts is None else [sum(int(distinct_counts[f]) for f in members[u]) for u in units]
    chosen = split if split in ("auto", "all") else [units.index(int(f)) for f in split]
    unit_work = None if work is None else [sum(float(work[f]) for f in members[u]) for u in units]
    placed = place_fields(len(units), num_ranks, policy, cost, chosen, unit_work)
    return [sorted(f for u in fields for f in members[units[u]]) for fields in placed]


def parse_split_fields(text: str, names: Sequence[str]) -> str | list[int]:
    """``--split-fields``: ``auto``, ``all`` or field names/numbers ``A,B,...`` -> field numbers."""
    if text in ("auto", "all"):
        return text
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        if item in names:
            out.append(list(names).index(item))
        elif item.isdigit() and int(item) < len(names):
            out.append(int(item))
        else:
            raise ConfigError(f"--split-fields: {item!r} is not a field of the data (fields: {', '.join(names)})")
    return sorted(set(out))
