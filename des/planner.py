"""The per-operator communication cost model: bytes sent per training step and rank
when each substitution (operator) of a model runs as **partials** (DES) or as an **exchange** of
its pooled inputs, with the data-parallel upper network (rows split over the ranks).

Pure arithmetic on counts (no MPI, no TensorFlow): the inputs are the model's shape
(:class:`ModelShape`, from :func:`model_shape`), the batch size, the field placement, the float
size and the distinct ids per field per row block (:class:`UniqueIds`, estimated from the first
batches of the training order by :func:`estimate_unique_ids`). The counts are those the
Communicator accounts (``des/collectives/communicator.py``): ring collectives, Alltoallv bytes
addressed to other ranks, bytes SENT by each rank.

Notation (the DES paper's where it applies):

* ``B`` global batch, ``N`` ranks; rank ``r`` owns the rows ``⌊rB/N⌋ .. ⌊(r+1)B/N⌋`` of the batch
  (``b_r`` of them, the Communicator's ``row_bounds``) and the fields ``F_r`` (the placement);
* ``s`` bytes per float (4 for float32, 8 for float64);
* operator ``j``: ``S_M = w_j`` columns of the ``[B, P]`` buffer (``P = Σ_j w_j``), the block
  ``k(j)`` it reads (``d_k`` floats per id) and ``|W_j|`` field parameters over all fields (e.g. the
  first FC kernel, ``F·k·H_1``);
* ``U_{q,f}``: distinct ids of field ``f`` in row block ``q`` (mean over the sampled batches);
* ``|θ_top|``: parameters of the top network.

Bytes rank ``r`` sends per step:

**partials** (operator ``j``; the hybrid DES step, ``des/strategies/des.py``)::

    reduce-scatter of its w_j columns by rows   (B - b_r) · s · w_j
    all-gather of their gradient G              (B - b_r) · s · w_j
    mean over ranks: 2 (N-1)/N · s · B · w_j    (the paper's 2 (N-1)/N · S_M per sample, ring)

**exchange** (the set ``E`` of exchanged operators; ``K(E)`` the blocks they read, each ONCE: two
operators reading one block, FM and the first FC layer of DeepFM, exchange its rows once and
route the sum of their input gradients back once; ``des/strategies/exchange.py``)::

    rows        s · Σ_{k∈K} d_k · Σ_{q≠r} Σ_{f∈F_r} U_{q,f}  owner r sends its fields' distinct ids' values
    row grads   s · Σ_{k∈K} d_k · Σ_{f∉F_r} U_{r,f}        row owner r returns per-id gradient sums
    weights     2 (N-1)/N · s · Σ_{j∈E} |W_j|               the replicated W_j's gradients, in the top AllReduce

No keys and no counts travel: every rank reads the whole batch, so owner and row owner both know
the distinct ids of a field in a row block (in order of first occurrence) and how many there are.

**exchange by rows** (``--exchange-by rows``: the owner pools, one value per row and field travels;
``F'_r`` the fields rank ``r`` holds whole, ``F'`` all of them)::

    rows        s · Σ_{k∈K} d_k · (B - b_r) · |F'_r|
    row grads   s · Σ_{k∈K} d_k · b_r · (|F'| - |F'_r|)
    weights     as above; no (id, row block) pairs (the owner pools as the partials do)

**shared** by every plan (the data-parallel upper network)::

    top gradients  2 (N-1)/N · s · |θ_top|       ring AllReduce, one packed buffer with the loss
    loss           2 (N-1)/N · s

With ``N = 1`` every term is 0. Plans are ranked by these bytes plus two costs that are not bytes,
counted in bytes: :data:`CALL_BYTES` per collective call and :data:`ID_BYTES` per distinct id and
row block the exchange handles (its local work: distinct ids, gathers, pooling, per-id gradient
sums), calibrated where the ranks share the cores, and :data:`ID_BYTES_OWN_CORES` where each rank
has cores of its own (:func:`id_bytes_for`; docs/benchmarks.md). Every plan is ``--strategy des
--plan ...`` (``--strategy alltoall`` is ``--plan exchange``); :meth:`PlanCost.sites` maps the
terms onto their Communicator sites.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from des.errors import ConfigError
from des.row_blocks import row_bounds

PARTIALS, EXCHANGE = "partials", "exchange"
MODES = (PARTIALS, EXCHANGE)


# ---------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Operator:
    """One substitution as the cost model sees it."""

    name: str
    block: str
    block_dim: int
    width: int  # w_j = S_M / s: columns of the [B, P] buffer
    field_params: int  # |W_j|: its field parameters over ALL fields (replicated when exchanged)


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a model: its operators in buffer order, the dims of the blocks
    and the size of the top network."""

    operators: tuple[Operator, ...]
    blocks: Mapping[str, int]  # block name -> d_k
    top_params: int  # |θ_top|
    num_fields: int

    @property
    def buffer_width(self) -> int:
        """P = Σ_j w_j."""
        return sum(op.width for op in self.operators)

    def operator(self, name: str) -> Operator:
        for op in self.operators:
            if op.name == name:
                return op
        raise KeyError(f"no operator {name!r} (the model has {', '.join(o.name for o in self.operators)})")


def _size(shape: Sequence[int]) -> int:
    return int(math.prod(int(d) for d in shape))


def model_shape(model: Any) -> ModelShape:
    """The :class:`ModelShape` of a ``des.models`` model (read from its declarations only: blocks,
    substitutions, top parameter specs). Operators are named by their substitution; a name used
    twice gets its buffer position appended (``linear@2``)."""
    subs = list(model.substitutions())
    names = [s.name for s in subs]
    operators = tuple(
        Operator(name=s.name if names.count(s.name) == 1 else f"{s.name}@{i}", block=s.block, block_dim=int(s.dim),
                 width=int(s.width),
                 field_params=int(model.num_fields) * sum(_size(p.shape) for p in s.field_params().values()))
        for i, s in enumerate(subs))
    blocks = {b.name: int(b.dim) for b in model.blocks()}
    # the top network's weights and the dense features' (replicated with them, AllReduced together)
    top = sum(_size(spec.shape) for spec in model.top_params().values()) + sum(
        _size(spec.shape) for sub in model.substitutions() for spec in sub.dense_params().values())
    return ModelShape(operators, blocks, top, int(model.num_fields))


@dataclass(frozen=True)
class UniqueIds:
    """``per_block[q][f]`` = U_{q,f}: distinct ids of field f in row block q of a global batch of
    ``batch_size`` rows split over ``ranks`` (mean over ``batches`` sampled batches)."""

    batch_size: int
    ranks: int
    per_block: np.ndarray  # [N, F] float
    batches: int = 1

    def __post_init__(self) -> None:
        per_block = np.asarray(self.per_block, dtype=np.float64)
        if per_block.ndim != 2 or per_block.shape[0] != self.ranks:
            raise ValueError(f"UniqueIds: per_block must be [ranks={self.ranks}, fields], not {per_block.shape}")
        object.__setattr__(self, "per_block", per_block)

    @property
    def per_sample(self) -> float:
        """Distinct ids per sample, summed over the fields and the row blocks (an id seen in two
        row blocks counts twice: it travels to both)."""
        return float(self.per_block.sum()) / self.batch_size


def row_blocks(batch_size: int, ranks: int) -> list[int]:
    """b_r: rows of rank r's block, ``⌊(r+1)B/N⌋ - ⌊rB/N⌋`` (the Communicator's ``row_bounds``)."""
    bounds = row_bounds(batch_size, ranks)
    return [hi - lo for lo, hi in zip(bounds[:-1], bounds[1:])]


def unique_ids_of_batches(batches: Iterable[Any], ranks: int, num_fields: int) -> UniqueIds:
    """U_{q,f} averaged over ``batches`` (``des.data`` Batches of a global batch, all fields)."""
    total, count, size = None, 0, None
    for batch in batches:
        if size is not None and batch.size != size:
            raise ValueError(f"batches of {size} and {batch.size} rows: the statistics are per batch size")
        size = batch.size
        bounds = row_bounds(batch.size, ranks)
        counts = np.zeros((ranks, num_fields))
        for q in range(ranks):
            block = batch.take(bounds[q], bounds[q + 1])
            for f in range(num_fields):
                counts[q, f] = np.unique(block.fields[f].keys).size  # what the exchange moves: its distinct ids
        total = counts if total is None else total + counts
        count += 1
    if not count:
        raise ValueError("unique_ids_of_batches: no batch")
    return UniqueIds(int(size), ranks, total / count, count)


def estimate_unique_ids(store: Any, batch_size: int, ranks: int, *, batches: int = 4, seed: int = 0,
                        split: str = "train", drop_last: bool = True) -> UniqueIds:
    """U_{q,f} from the first ``batches`` batches of epoch 0 in the training order (``--seed``), as
    the run will see them: exact for those steps, an estimate for the rest. (The store's per-field
    ``distinct`` counts are over all rows; what travels is distinct per row block, which depends on
    B and N, so it is counted on the batches themselves.)"""
    from des.data import BatchReader

    reader = BatchReader(store, split, batch_size=batch_size, seed=seed, epoch=0, drop_last=drop_last)
    # full batches only (the statistics are per batch size), unless the data has no full batch
    taken = range(min(batches, max(reader.num_rows // batch_size, 1), len(reader)))
    return unique_ids_of_batches((reader.batch(i) for i in taken), ranks, store.num_fields)


# ---------------------------------------------------------------------------------------- costs
#: What one collective call costs beyond its bytes, in bytes (its latency times the bandwidth): plans
#: are ranked by bytes + this x calls, so a mixed plan (5 collectives per step instead of 3) must
#: save more than two of these per step and rank: every collective is a point where ranks sharing
#: cores wait for each other (the calibration runs: docs/benchmarks.md, "Planner").
CALL_BYTES = 65_536
#: What the exchange's local work costs beyond its bytes, in bytes per distinct id and row block a
#: rank handles (as an owner: find the row blocks' distinct ids, gather them, scatter their
#: gradient sums; as a row owner: pool them, sum their gradients per id), work the partials plan
#: does not have. Plans are ranked by bytes + this x those pairs. Where ranks share cores (a rank
#: with less than two cores of its own), a byte costs a wait for the peer's compute, and the value
#: sits between what Criteo (few distinct ids per sample: the exchange wins) and heavy multi-hot
#: data (many: the partials win) allow; counting bytes alone, the planner picked the slower plan on
#: the latter (docs/benchmarks.md, "The planner's constants").
ID_BYTES = 16
#: :data:`ID_BYTES` where every rank's threads have cores of their own (:func:`id_bytes_for`): bytes
#: move through shared memory while no rank waits for another's compute, and the per-id work weighs
#: eight times as much against them (16-core host: a mixed plan 1.6-1.8x slower than all partials on
#: multi-hot data needs more than 74, the exchange 1.15x faster on Criteo-shaped data at N = 2 less
#: than 190; the value sits between them, 1.5x from each).
ID_BYTES_OWN_CORES = 128


def id_bytes_for(threads: int, local_ranks: int, cores: int) -> int:
    """:data:`ID_BYTES_OWN_CORES` where each of the ``local_ranks`` ranks of a machine whose job
    may use ``cores`` cores (its affinity: a container's, not the machine's) has ``threads`` >= 2
    of them to itself, else :data:`ID_BYTES`."""
    return ID_BYTES_OWN_CORES if threads >= 2 and local_ranks * threads <= cores else ID_BYTES


@dataclass
class PlanCost:
    """Bytes each rank sends per step, term by term (``terms[name][r]``), for one plan, and its
    collective calls per step."""

    plan: dict[str, str]
    batch_size: int
    ranks: int
    terms: dict[str, list[float]] = field(default_factory=dict)
    calls: int = 0
    #: mean over ranks of the distinct (id, row block) pairs a rank handles in the exchange, as
    #: an owner and as a row owner (0 when nothing is exchanged)
    id_pairs: float = 0.0
    #: what a pair costs in bytes (:data:`ID_BYTES` or :data:`ID_BYTES_OWN_CORES`)
    id_bytes: int = ID_BYTES
    #: how the exchanged blocks travel: per distinct id (``ids``) or pooled per row and field (``rows``)
    exchange_by: str = "ids"

    @property
    def score(self) -> float:
        """What :func:`best_plan` minimizes: the mean bytes plus :data:`CALL_BYTES` per call plus
        :attr:`id_bytes` per exchanged (id, row block) pair."""
        return self.mean + CALL_BYTES * self.calls + self.id_bytes * self.id_pairs

    def per_rank(self) -> list[float]:
        return [sum(values[r] for values in self.terms.values()) for r in range(self.ranks)]

    @property
    def mean(self) -> float:
        """Mean over ranks of the bytes sent per step (what ``summary.json``'s bytes_per_step is)."""
        return float(np.mean(self.per_rank())) if self.ranks else 0.0

    def term_mean(self, name: str) -> float:
        return float(np.mean(self.terms.get(name, [0.0])))

    def sites(self) -> dict[str, list[float]]:
        """The terms as the Communicator sites of ``--strategy des --plan`` (per rank)."""
        t, n = self.terms, self.ranks
        if "forward_partials" in t:  # the replicated upper network
            return {"forward_partials": t["forward_partials"]}
        sites = {"partials_reduce_scatter": "partials_reduce_scatter", "gradient_allgather": "gradient_allgather",
                 "exchange_values": "rows", "exchange_gradients": "row_gradients"}
        out = {site: t[term] for site, term in sites.items() if term in t}
        out["top_gradients"] = _add(t.get("field_weight_gradients", [0.0] * n),
                                    t.get("split_weight_gradients", [0.0] * n), t["top_gradients"], t["loss"])
        return out


def _add(*lists: Sequence[float]) -> list[float]:
    return [float(sum(values)) for values in zip(*lists)]


def _check(shape: ModelShape, batch_size: int, placement: Sequence[Sequence[int]], dtype_size: int) -> None:
    from des.placement import check_placement

    try:
        check_placement(placement, shape.num_fields, len(placement))
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if batch_size < 1 or dtype_size < 1:
        raise ValueError(f"batch size {batch_size} and dtype size {dtype_size} must be positive")


def normalize_plan(shape: ModelShape, plan: str | Mapping[str, str]) -> dict[str, str]:
    """``"partials"``/``"exchange"`` (every operator) or ``{operator: mode}`` (the rest: partials)."""
    if isinstance(plan, str):
        if plan not in MODES:
            raise ValueError(f"plan {plan!r}: not one of {', '.join(MODES)}")
        return {op.name: plan for op in shape.operators}
    unknown = set(plan) - {op.name for op in shape.operators}
    bad = {m for m in plan.values() if m not in MODES}
    if unknown or bad:
        raise ValueError(f"plan {dict(plan)}: unknown operators {sorted(unknown)} or modes {sorted(bad)}")
    return {op.name: plan.get(op.name, PARTIALS) for op in shape.operators}


AUTO = "auto"


def parse_plan(text: str, shape: ModelShape) -> str | dict[str, str]:
    """``--plan``: ``auto``, ``partials``, ``exchange`` or ``OP=MODE,...`` (operators not named:
    partials) -> ``"auto"`` or ``{operator: mode}`` for every operator. ValueError, one line."""
    text = text.strip()
    if text == AUTO:
        return AUTO
    if text in MODES:
        return normalize_plan(shape, text)
    plan: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, mode = (x.strip() for x in item.partition("="))
        if not sep:
            raise ValueError(f"--plan {text!r}: {item!r} is not OP=MODE (or use auto, partials, exchange)")
        plan[name] = mode
    try:
        return normalize_plan(shape, plan)
    except ValueError:
        ops = ", ".join(op.name for op in shape.operators)
        raise ValueError(f"--plan {text!r}: operators are {ops}; modes {', '.join(MODES)}") from None


def format_plan(plan: Mapping[str, str]) -> str:
    """``{operator: mode}`` -> the ``--plan`` text that gives it."""
    modes = set(plan.values())
    return next(iter(modes)) if len(modes) == 1 else ",".join(f"{k}={v}" for k, v in plan.items())


def plan_cost(shape: ModelShape, plan: str | Mapping[str, str], batch_size: int,
              placement: Sequence[Sequence[int]], unique: UniqueIds | None, dtype_size: int = 4,
              upper: str = "data-parallel", id_bytes: int = ID_BYTES, exchange_by: str = "ids") -> PlanCost:
    """Bytes per step per rank of ``plan`` (see the module docstring for the formulas).
    ``unique`` (U_{q,f} for this B and N) is needed only when an operator is exchanged;
    ``id_bytes``: what the score counts per exchanged (id, row block) pair (:func:`id_bytes_for`);
    ``exchange_by``: ``ids`` or ``rows`` (``--exchange-by``).

    ``upper="replicated"`` is the paper's step (``des --upper replicated``), all partials only:
    ONE ring AllReduce of the whole ``[B, P]`` buffer, ``2 (N-1)/N · s · B · P``, and nothing else
    (every rank runs the top network on the whole batch: no gradient leaves a rank)."""
    from des.placement import split_groups

    _check(shape, batch_size, placement, dtype_size)
    plan = normalize_plan(shape, plan)
    n, s = len(placement), dtype_size
    ring = 2.0 * (n - 1) / n * s  # ring AllReduce: bytes sent per float of the payload
    cost = PlanCost(plan, batch_size, n, id_bytes=id_bytes, exchange_by=exchange_by)
    # fields split by key: their pooled values (every block an operator reads) join the partials'
    # columns in every plan, and the partials operators' slices of them are trained where the rows are
    split = sorted(split_groups(placement))
    share_width = len(split) * sum(shape.blocks[b] for b in {op.block for op in shape.operators})
    if upper == "replicated":
        if set(plan.values()) != {PARTIALS}:
            raise ValueError("the replicated upper network runs the all-partials plan only")
        cost.terms["forward_partials"] = [ring * batch_size * (shape.buffer_width + share_width)] * n
        cost.calls = 1 if n > 1 else 0
        return cost
    if upper != "data-parallel":
        raise ValueError(f"upper {upper!r}: not data-parallel or replicated")
    partial_width = sum(op.width for op in shape.operators if plan[op.name] == PARTIALS) + share_width
    split_weights = sum(op.field_params // shape.num_fields * len(split) for op in shape.operators
                        if plan[op.name] == PARTIALS)
    if partial_width:
        # one reduce-scatter of the partials operators' columns and one all-gather of G (B - b_r rows each)
        cost.terms["partials_reduce_scatter"] = [b / 2 for b in partials_bytes(partial_width, batch_size, n, s)]
        cost.terms["gradient_allgather"] = list(cost.terms["partials_reduce_scatter"])
    exchanged = [op for op in shape.operators if plan[op.name] == EXCHANGE]
    if exchanged and exchange_by == "rows":
        _row_exchange_terms(cost, shape, exchanged, placement, split, s, ring)
    elif exchanged:
        _exchange_terms(cost, shape, exchanged, placement, split, unique, s, ring)
    if split_weights:
        cost.terms["split_weight_gradients"] = [ring * split_weights] * n
    cost.terms["top_gradients"] = [ring * shape.top_params] * n
    cost.terms["loss"] = [ring] * n
    # reduce-scatter + all-gather of the partials, two Alltoallv of the exchange, the AllReduce
    cost.calls = (2 * bool(partial_width) + 2 * bool(exchanged) + 1) if n > 1 else 0
    return cost


def _exchange_terms(cost: PlanCost, shape: ModelShape, exchanged: list[Operator], placement: Sequence[Sequence[int]],
                    split: list[int], unique: UniqueIds | None, s: int, ring: float) -> None:
    """The exchanged operators' terms of :func:`plan_cost`: rows served and fetched per distinct
    id and row block, their gradients back, the field weights' AllReduce, the (id, row block) pairs."""
    n, batch_size = cost.ranks, cost.batch_size
    if unique is None or unique.ranks != n or unique.batch_size != batch_size:
        raise ValueError(f"exchange needs the unique ids of B={batch_size} on {n} row blocks")
    u = unique.per_block  # [N, F]
    owner = np.full(shape.num_fields, -1, dtype=np.int64)  # -1: split, its values travel as columns
    for r, fields in enumerate(placement):
        owner[[f for f in fields if f not in split]] = r
    whole = owner >= 0
    # each block once, whatever the number of operators reading it
    row_floats = sum(shape.blocks[b] for b in {op.block for op in exchanged})
    remote = [float(u[r][whole & (owner != r)].sum()) for r in range(n)]  # ids row owner r fetches
    served = [float(sum(u[q][owner == r].sum() for q in range(n) if q != r)) for r in range(n)]
    cost.terms["rows"] = [s * row_floats * served[r] for r in range(n)]
    cost.terms["row_gradients"] = [s * row_floats * remote[r] for r in range(n)]
    cost.terms["field_weight_gradients"] = [ring * sum(op.field_params for op in exchanged)] * n
    # each (id, row block) pair: routed by its field's owner, pooled by the block's row owner
    cost.id_pairs = 2.0 * float(u[:, whole].sum()) / n if n > 1 else 0.0


def _row_exchange_terms(cost: PlanCost, shape: ModelShape, exchanged: list[Operator],
                        placement: Sequence[Sequence[int]], split: list[int], s: int, ring: float) -> None:
    """The exchanged operators' terms of :func:`plan_cost` by rows: every row's pooled values of
    the owner's whole fields to their row owner, their gradients back, the field weights' AllReduce."""
    row_floats = sum(shape.blocks[b] for b in {op.block for op in exchanged})
    held = [len([f for f in fields if f not in split]) for fields in placement]
    sizes = row_blocks(cost.batch_size, cost.ranks)
    cost.terms["rows"] = [s * row_floats * (cost.batch_size - b) * h for b, h in zip(sizes, held)]
    cost.terms["row_gradients"] = [s * row_floats * b * (sum(held) - h) for b, h in zip(sizes, held)]
    cost.terms["field_weight_gradients"] = [ring * sum(op.field_params for op in exchanged)] * cost.ranks


@dataclass(frozen=True)
class OperatorCost:
    """One operator alone in each mode (mean bytes/step/rank over ranks, shared terms excluded;
    exchanged alone: its block's values and gradients and its weights' AllReduce)."""

    operator: Operator
    partials: float
    exchange: float
    detail: dict[str, float]

    @property
    def cheaper(self) -> str:
        return PARTIALS if self.partials <= self.exchange else EXCHANGE


def partials_bytes(width: int, batch_size: int, ranks: int, dtype_size: int = 4) -> list[float]:
    """Per rank: the reduce-scatter of ``width`` columns by rows plus the all-gather of their
    gradient, ``2 (B - b_r) · s · width``."""
    return [2.0 * (batch_size - b) * dtype_size * width for b in row_blocks(batch_size, ranks)]


def operator_costs(shape: ModelShape, batch_size: int, placement: Sequence[Sequence[int]], unique: UniqueIds | None,
                   dtype_size: int = 4, exchange_by: str = "ids") -> list[OperatorCost]:
    """Per operator: the bytes of its own terms as partials, and exchanged alone (every other
    operator partials, the exchange travelling ``exchange_by``): its block's values and gradients,
    its weights' AllReduce."""
    n = len(placement)
    out = []
    for op in shape.operators:
        partials = float(np.mean(partials_bytes(op.width, batch_size, n, dtype_size)))
        detail: dict[str, float] = {"partials": partials}
        exchange = math.inf
        if unique is not None:
            ex = plan_cost(shape, {op.name: EXCHANGE}, batch_size, placement, unique, dtype_size,
                           exchange_by=exchange_by)
            own = ("rows", "row_gradients", "field_weight_gradients")
            detail.update({t: ex.term_mean(t) for t in own})
            exchange = sum(detail[t] for t in own)
        out.append(OperatorCost(op, partials, exchange, detail))
    return out


def exchange_way(shape: ModelShape, batch_size: int, placement: Sequence[Sequence[int]], unique: UniqueIds | None,
                 dtype_size: int = 4) -> str:
    """``--exchange-by auto``: ``rows`` where the exchanged blocks' values and gradients are fewer
    bytes pooled per row and field than per distinct id, else ``ids``. Both count ``Σ d`` floats of
    the exchanged blocks per unit (a row and field, or a distinct id and row block), so the choice
    is the same for every set of exchanged operators: it is the data's (ids per row, repeats in a
    row block), made once, on the all-exchange plan. Without id statistics: ``ids``."""
    if unique is None or len(placement) < 2:
        return "ids"

    def moved(way: str) -> float:
        cost = plan_cost(shape, EXCHANGE, batch_size, placement, unique, dtype_size, exchange_by=way)
        return cost.term_mean("rows") + cost.term_mean("row_gradients")

    return "rows" if moved("rows") < moved("ids") else "ids"


def best_plan(shape: ModelShape, batch_size: int, placement: Sequence[Sequence[int]], unique: UniqueIds | None,
              dtype_size: int = 4, id_bytes: int = ID_BYTES, exchange_by: str = "ids") -> PlanCost:
    """The plan with the lowest :attr:`PlanCost.score` (mean bytes over ranks + :data:`CALL_BYTES`
    per collective call + ``id_bytes`` per exchanged (id, row block) pair), by trying all
    2^ops plans: operators interact (a block two exchanged operators read travels once), so the
    per-operator choice alone is not always the best (DeepFM on Criteo: once the first FC layer
    exchanges the embedding block, FM rides along for free). Its score never exceeds either pure
    plan's; its bytes may, by the exchange's local work it avoids (heavy multi-hot data at N=4:
    all partials, 10 % more bytes than all exchange). Plans are tried all-partials first and a
    later one must be strictly cheaper, so a tie keeps the earlier, more-partials plan. Exchanges
    travel ``exchange_by`` (:func:`exchange_way`)."""
    names = [op.name for op in shape.operators]
    choices = [(PARTIALS,) * len(names)] if unique is None else itertools.product(MODES, repeat=len(names))
    best: PlanCost | None = None
    for modes in choices:
        cost = plan_cost(shape, dict(zip(names, modes)), batch_size, placement, unique, dtype_size, id_bytes=id_bytes,
                         exchange_by=exchange_by)
        if best is None or cost.score < best.score - 1e-9:
            best = cost
    assert best is not None
    return best


@dataclass
class Planning:
    """One planner run for a job: the model's shape, the batch size, the placement and the data's
    id statistics, with the cheapest plan found once (:attr:`best`); what set-up resolves ``auto``
    to and what the start-up report and ``summary.json`` say of the plan that runs."""

    shape: ModelShape
    batch_size: int
    placement: Sequence[Sequence[int]]
    unique: UniqueIds
    dtype_size: int = 4
    id_bytes: int = ID_BYTES  # :func:`id_bytes_for` this job's ranks and cores
    #: how exchanges travel (``ids``/``rows``; ``auto``: :func:`exchange_way`, resolved here)
    exchange_by: str = "ids"
    best: PlanCost = field(init=False)

    def __post_init__(self) -> None:
        if self.exchange_by == AUTO:
            self.exchange_by = exchange_way(self.shape, self.batch_size, self.placement, self.unique, self.dtype_size)
        self.best = best_plan(self.shape, self.batch_size, self.placement, self.unique, self.dtype_size, self.id_bytes,
                              self.exchange_by)

    def cost(self, plan: str | Mapping[str, str], upper: str = "data-parallel") -> PlanCost:
        return plan_cost(self.shape, plan, self.batch_size, self.placement, self.unique, self.dtype_size, upper=upper,
                         id_bytes=self.id_bytes, exchange_by=self.exchange_by)

    def report(self) -> str:
        return report(self.shape, self.batch_size, self.placement, self.unique, self.dtype_size, best=self.best,
                      exchange_by=self.exchange_by)


# ---------------------------------------------------------------------------------------- report
def _bytes(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def report(shape: ModelShape, batch_size: int, placement: Sequence[Sequence[int]], unique: UniqueIds | None,
           dtype_size: int = 4, title: str = "", best: PlanCost | None = None, exchange_by: str = "ids") -> str:
    """The start-up table: per operator, predicted bytes/step/rank (mean over ranks) as partials and
    exchanged alone (travelling ``exchange_by``), which is cheaper and why; then the shared terms and
    the pure and best plans."""
    from des.placement import whole_fields

    n = len(placement)
    whole = sum(len(whole_fields(placement, r)) for r in range(n))  # a split field travels in the partials
    lines = [f"planner{' (' + title + ')' if title else ''}: B={batch_size}, N={n}, {dtype_size}-byte floats; "
             "bytes sent per step per rank (mean over ranks)"]
    header = f"  {'operator':<12} {'width':>5} {'block':<14} {'partials':>10} {'exchange':>10}  {'cheaper':<8} why"
    lines.append(header)
    for c in operator_costs(shape, batch_size, placement, unique, dtype_size, exchange_by):
        op = c.operator
        per_sample = c.partials / batch_size
        if unique is None or n == 1:
            why = "one rank: nothing moves" if n == 1 else "no id statistics: exchange not estimated"
        else:
            # per sample of the global batch, so the two sides compare directly
            moved = (c.exchange - c.detail["field_weight_gradients"]) / batch_size
            units = (f"{unique.per_sample:.1f} distinct ids/sample (per row block)" if exchange_by == "ids"
                     else f"{whole} pooled fields/sample (by rows)")
            why = (f"{op.width} floats/sample -> {per_sample:,.0f} B/sample; exchange: {units}, (N-1)/N remote, "
                   f"x 2x{dtype_size}x{op.block_dim} B -> {moved:,.0f} B/sample")
            if op.field_params:
                why += f" + {_bytes(c.detail['field_weight_gradients'])} AllReduce of {op.field_params:,} weights"
        lines.append(f"  {op.name:<12} {op.width:>5} {op.block + '(' + str(op.block_dim) + ')':<14} "
                     f"{_bytes(c.partials):>10} {_bytes(c.exchange):>10}  {c.cheaper if n > 1 else '-':<8} {why}")
    pure = {mode: plan_cost(shape, mode, batch_size, placement, unique, dtype_size, exchange_by=exchange_by)
            for mode in (MODES if unique is not None else (PARTIALS,))}
    shared = pure[PARTIALS].term_mean("top_gradients") + pure[PARTIALS].term_mean("loss")
    lines.append(f"  shared by every plan: top gradients + loss {_bytes(shared)} ({shape.top_params:,} + 1 floats); "
                 "exchanged blocks travel once per step even when several operators read them")
    best = best or best_plan(shape, batch_size, placement, unique, dtype_size, exchange_by=exchange_by)
    totals = ", ".join(f"all {mode} {_bytes(c.mean)}" for mode, c in pure.items())
    chosen = ", ".join(f"{k}={v}" for k, v in best.plan.items())
    lines.append(f"  exchanges travel by {exchange_by} (--exchange-by: per distinct id, or pooled per row and field)")
    lines.append(f"  plans: {totals}; cheapest {chosen} {_bytes(best.mean)} in {best.calls} collective calls "
                 f"(ranked by bytes + {_bytes(CALL_BYTES)} per call + {best.id_bytes} B per distinct id and row block "
                 f"an exchange handles: {best.id_pairs:,.0f} per rank)")
    return "\n".join(lines)
