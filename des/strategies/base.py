"""The strategy protocol: what the training loop (:mod:`des.runner`) needs from a way of training,
and nothing more (``docs/design.md``, section "Strategies").

A strategy is one rank's share of a training job: the state it holds and the step it runs. The
built-ins are ``des`` (the paper's step: partial sums, or per operator an exchange of its inputs,
``--plan``), ``alltoall`` (``des --plan exchange``: the embedding exchange of TorchRec/HugeCTR),
``persia`` and ``hierarchical`` (the related systems, as the DES step with one hook changed) and
``ps`` (an asynchronous parameter server); each is assembled from the shared components of
:mod:`des.strategies.components` (a :class:`~des.strategies.components.FieldShard` of tables, a
:class:`~des.strategies.components.DenseParams`).

What the runner asks of a strategy:

* ``role`` -- ``"train"`` (runs steps) or ``"serve"`` (answers other ranks, e.g. a ps server: the
  runner calls :meth:`Strategy.serve` and nothing else);
* :meth:`reader_options` -- what the batch reader must read on this rank (fields, row shard);
* :meth:`steps` -- which global batches this rank trains (lock-step: all of them; a ps worker:
  every W-th);
* :meth:`train_step` (batch -> mean loss) and :meth:`predict` (batch -> predictions and labels
  of the whole batch, on every rank of :attr:`evaluators`);
* :meth:`state` / :meth:`load_state` -- the live state a checkpoint saves and restores;
* ``phases`` (phase -> category of the paper's Figure 7) and ``traffic_sites`` (the communicator
  sites of training traffic), read by the summary and the benchmarks.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from des.errors import ConfigError
from des.strategies.pipeline import Pipeline, Prefetch

if TYPE_CHECKING:  # the protocol itself loads no TensorFlow
    from des.collectives import Communicator
    from des.config import TrainConfig
    from des.hashtable import EmbeddingTable
    from des.models.base import Model
    from des.options import Optimizers, TableOptions
    from des.strategies.components import DenseParams

#: The categories of the DES paper's Figure 7; every phase a strategy times maps to one of them.
CATEGORIES = ("lookup", "partials", "communication", "top", "backward", "update")


class PhaseTimer:
    """Wall seconds per named phase, accumulated over steps. Only declared phases can be timed, so
    the summary and the breakdown benchmark never meet a phase they cannot place."""

    def __init__(self, phases: Iterable[str]) -> None:
        self.declared = frozenset(phases)
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if phase not in self.declared:
            raise KeyError(f"phase {phase!r} is not declared (declared: {', '.join(sorted(self.declared))})")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def ms_per_step(self) -> dict[str, float]:
        steps = max(self.steps, 1)
        return {phase: 1000.0 * self.seconds[phase] / steps for phase in self.seconds}

    def reset(self) -> None:
        self.seconds.clear()
        self.steps = 0


def untimed(phase: str) -> nullcontext:
    """Stands in for the phase timer outside training steps (evaluation is not timed)."""
    return nullcontext()


@dataclass(frozen=True)
class StrategyOptions:
    """A strategy's own options, declared on its class as ``Options`` (as a model declares its
    :class:`~des.models.base.ModelDefaults`): typed fields, each the ``des.train`` option of the
    same name (``des/config.py`` declares its flag and help, with the same default: a test checks
    they agree), checked once when made (:meth:`check`: a one-line :class:`ConfigError`).
    Strategies read them as attributes, never by name."""

    def __post_init__(self) -> None:
        for f in fields(self):  # typed: a TOML or flag value of another type is refused, not coerced later
            value, kind = getattr(self, f.name), type(f.default)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind in (int, float) and number and (kind is float or float(value).is_integer()):
                object.__setattr__(self, f.name, kind(value))  # 2.0 -> 2, 1 -> 1.0: nothing lost
            elif kind in (int, float, str) and not isinstance(value, kind):
                raise ConfigError(f"--{f.name.replace('_', '-')} {value!r}: expected {kind.__name__}")
        self.check()

    def check(self) -> None:
        """Refuse values this strategy cannot run (default: none)."""

    @classmethod
    def of(cls, config: Any) -> "StrategyOptions":
        """The options from a :class:`~des.config.TrainConfig` (or anything with these attributes)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)})


@dataclass(frozen=True)
class StrategyContext:
    """Everything a strategy is built from (the same for every strategy)."""

    model: "Model"
    comm: "Communicator"
    optimizers: "Optimizers"
    placement: list[list[int]]
    seed: int = 0
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float32))
    tables: "TableOptions | None" = None
    #: the strategy's own options (its class's :class:`StrategyOptions`)
    options: StrategyOptions = field(default_factory=StrategyOptions)
    #: dtype of the top network's compute ("bfloat16"), or None: :attr:`dtype`
    compute_dtype: str | None = None


@dataclass
class ShardState:
    """The live state of one rank that a checkpoint saves and restores (``des.checkpoint``).

    ``tables`` are this rank's fields (it writes and reads their files); ``dense`` holds the field
    slices of :attr:`dense_fields` (a rank's own fields, or every field where a strategy replicates
    them) and the top network. Arrays are the strategy's own, so loading writes into it.
    """

    model: "Model"
    dtype: np.dtype
    seed: int
    placement: list[list[int]]
    step: int
    tables: dict[int, "EmbeddingTable"]
    dense: "DenseParams"
    #: this rank's fields that use another field's table, and that field (which holds it, here too)
    shared: dict[int, int] = field(default_factory=dict)

    @property
    def fields(self) -> list[int]:
        return sorted(self.tables)

    def evict(self, rank: int, ttl: int, max_rows: int) -> dict[int, int]:
        """Eviction of rank ``rank``'s tables at this step (every rank at the same steps): rows unseen
        for more than ``ttl`` steps (0: none by age), then each table down to ``max_rows`` rows (0: no
        budget; :meth:`EmbeddingTable.evict`; a strategy refuses a budget over fields split by key,
        whose shares' rows one table would rank together). Rows evicted, by field."""
        return {field: table.evict(ttl or None, self.step, max_rows) for field, table in self.tables.items()}


class Strategy(ABC):
    """One rank of a training job. Subclasses set the class attributes and implement the methods."""

    #: ``--strategy`` value
    name: ClassVar[str]
    #: one line for ``--help`` and the start-up report
    description: ClassVar[str] = ""
    #: every rank ends every step with the same parameters as one rank would: the public N-vs-1
    #: checks (``python -m des.check``) apply. An asynchronous strategy validates only at the end.
    synchronous: ClassVar[bool] = True
    #: N ranks train what one rank trains (``python -m des.check`` compares them); a strategy whose
    #: model depends on N (a ps's workers, hierarchical groups) is checked instead on 2 ranks under
    #: :meth:`des_equivalent_flags` against ``des`` on one
    exact_over_ranks: ClassVar[bool] = True
    #: it can write and resume checkpoints
    checkpoints: ClassVar[bool] = True
    #: fields may share one table (``--shared-tables``: its tables are held by owner field, and the
    #: placement keeps a table's fields on one rank); a strategy that moves rows by field refuses them
    shares_tables: ClassVar[bool] = False
    #: phase -> category (:data:`CATEGORIES`) of the phases :attr:`timer` times on training ranks
    phases: ClassVar[Mapping[str, str]]
    #: communicator sites of training traffic (evaluation, set-up and checkpoints use others)
    traffic_sites: ClassVar[tuple[str, ...]]
    #: the subset of :attr:`traffic_sites` that are AllReduces (the summary reports them apart)
    allreduce_sites: ClassVar[tuple[str, ...]] = ()
    #: the strategy's own options, typed (:class:`StrategyOptions`; ``context.options`` is one)
    Options: ClassVar[type[StrategyOptions]] = StrategyOptions
    #: which of ``des/planner.py``'s pure plans this strategy's traffic is ("partials": every
    #: operator's partial sums, "exchange": every operator's pooled inputs), or None (not modelled):
    #: the start-up report prints the planner's table for it and ``summary.json`` its prediction
    communication_plan: ClassVar[str | None] = None

    def __init__(self, context: StrategyContext) -> None:
        self.context = context
        self.model = context.model
        self.comm = context.comm
        self.placement = [list(p) for p in context.placement]
        self.seed = context.seed
        self.dtype = np.dtype(context.dtype)
        self.timer = PhaseTimer(self.phases)
        self.step_count = 0
        #: the overlap of a step with the next one (``--pipeline on``): des/strategies/pipeline.py
        self.pipeline = Pipeline(self.prepare)

    @classmethod
    def build(cls, model: "Model", comm: "Communicator", placement: Sequence[Sequence[int]],
              optimizers: "Optimizers", *, seed: int = 0, dtype: Any = np.float32,
              tables: "TableOptions | None" = None, **options: Any) -> "Strategy":
        """Shorthand for ``cls(StrategyContext(...))`` (tests, notebooks, one-process use);
        ``options``: fields of the class's :attr:`Options`."""
        return cls(StrategyContext(model, comm, optimizers, [list(p) for p in placement], seed, np.dtype(dtype),
                                   tables, cls.Options(**options)))

    # ------------------------------------------------------------------ placement and roles
    @classmethod
    def place(cls, num_fields: int, ranks: int, distinct: Sequence[int], config: "TrainConfig",
              work: Sequence[float] | None = None) -> list[list[int]]:
        """Fields of every rank (default: every rank owns fields, by ``--placement`` and
        ``--split-fields``; ``work``: each field's work per step, which ``balanced`` balances too;
        fields sharing a table, ``--shared-tables``, placed together)."""
        from des.placement import parse_split_fields, place_fields, shared_tables

        split = parse_split_fields(str(config.split_fields), [str(f) for f in range(num_fields)])
        return place_fields(num_fields, ranks, config.placement, distinct, split, work,
                            shared_tables(config.shared_tables))

    @classmethod
    def check_options(cls, config: "TrainConfig") -> None:
        """Refuse a job this strategy cannot honour (one-line :class:`ConfigError`): its own
        :attr:`Options` checked, and the run's options it has no way to serve."""
        cls.Options.of(config)
        if not cls.checkpoints:
            for flag in ("resume", "checkpoint_every", "export_every", "export_every_files"):
                if getattr(config, flag):
                    raise ConfigError(f"--{flag.replace('_', '-')} is not supported with --strategy {cls.name} "
                                      "(it writes no checkpoints)")
        if not cls.synchronous:
            for flag in ("evict_every", "max_rows_per_field"):  # eviction runs at the same steps on every rank
                if getattr(config, flag):
                    raise ConfigError(f"--{flag.replace('_', '-')} is not supported with --strategy {cls.name} "
                                      "(an asynchronous strategy's ranks do not step together)")
        if not cls.synchronous and config.eval_every:
            raise ConfigError(f"--eval-every is not supported with --strategy {cls.name} "
                              "(an asynchronous strategy validates once, at the end)")

    @classmethod
    def des_equivalent_flags(cls, ranks: int) -> tuple[str, ...]:
        """``des.train`` flags under which this strategy on ``ranks`` ranks trains what ``des``
        trains on one (the conformance check of a strategy that is not :attr:`exact_over_ranks`)."""
        return ()

    @property
    def role(self) -> str:
        """``"train"`` or ``"serve"``."""
        return "train"

    @property
    def evaluators(self) -> list[int]:
        """Ranks that take part in :meth:`predict` (all of them for a synchronous strategy)."""
        return list(range(self.comm.size))

    @property
    def counts_samples(self) -> bool:
        """Does this rank's training count toward throughput? A lock-step strategy: rank 0 alone
        (every rank steps through the same global batches)."""
        return self.comm.rank == 0

    @property
    @abstractmethod
    def fields(self) -> list[int]:
        """The fields whose tables this rank owns."""

    # ------------------------------------------------------------------ the loop's interface
    @abstractmethod
    def reader_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`des.data.batch_reader.BatchReader` for this rank."""

    def steps(self, start: int, stop: int) -> range:
        """Global batch numbers this rank trains, from ``start`` (the next untrained) to ``stop``."""
        return range(start, stop)

    # ------------------------------------------------------------------ the pipelined step
    def prefetch(self, read: Callable[[], Any], step: int) -> Prefetch:
        """The batch of global step ``step``, trained right after the coming :meth:`train_step`
        (``--pipeline on``; nothing such as a validation or checkpoint in between): ``read()`` it
        and :meth:`prepare` it, in the background where this strategy's step overlaps it
        (:class:`~des.strategies.pipeline.Pipeline`)."""
        return self.pipeline.prefetch(read, step)

    def prepare(self, batch: Any, step: int) -> Any:
        """Parameter-free work on ``batch`` before its step ``step`` (default: none). It may run
        while the previous step computes, so it must not read or write parameter values."""
        return batch

    @property
    def overlapped_steps(self) -> int:
        """Steps whose next batch was prepared in the background."""
        return self.pipeline.overlapped_steps

    def settle(self) -> None:
        """Finish the updates a pipelined step left for the next one: before anything but that step
        reads or replaces the weights (:meth:`predict`, :meth:`state` and the methods below call it)."""
        self.pipeline.settle()

    @abstractmethod
    def train_step(self, batch: Any) -> float:
        """One training step on global batch ``batch``; returns its mean logloss."""

    @abstractmethod
    def predict(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        """Click probabilities and labels of the whole global batch (ids not in the tables are
        looked up without being inserted); on every rank of :attr:`evaluators`."""

    def end_training(self) -> None:
        """Called on training ranks after their last step, before the final evaluation."""
        self.settle()

    def close(self) -> None:
        """Called on training ranks when the job is done with this strategy (after evaluation)."""
        self.pipeline.close()

    def serve(self) -> None:
        """Run a serving rank until the training ranks are done (``role == "serve"`` only)."""
        raise NotImplementedError(f"strategy {self.name} has no serving ranks")

    # ------------------------------------------------------------------ state
    @abstractmethod
    def state(self) -> ShardState:
        """The live state a checkpoint writes (and :meth:`load_state` reads back into)."""

    def load_state(self, state: ShardState) -> None:
        """Adopt a state filled by :func:`des.checkpoint.load_checkpoint`."""
        self.settle()
        self.step_count = state.step

    # ------------------------------------------------------------------ reporting
    def describe(self) -> str:
        """One line of the start-up report."""
        return self.description

    def summary(self) -> dict[str, Any]:
        """Strategy-specific entries of ``summary.json`` (collective: every rank calls it)."""
        return {}

    @abstractmethod
    def memory(self) -> dict[str, int]:
        """``rows``, ``table_bytes`` and ``dense_bytes`` held by this rank."""
