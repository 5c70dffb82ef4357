"""``--strategy persia``: Persia's hybrid training (Lian et al., 2022, the paper's Algorithms 1 and 2):
the embedding layer trained asynchronously, the dense network synchronously.

The step is ``alltoall``'s (``des/strategies/exchange.py``): the field owners send the values of
the ids each row block uses to its row owner (Persia's embedding workers serving the NN workers),
the row owners run the whole network on their rows and AllReduce the dense gradients (Persia's NN
workers, synchronous), and the per-id gradient sums travel back to the owners. What differs is
when an owner applies them: Persia's embedding servers apply a gradient whenever it arrives, while
the NN workers have already moved on, with a bound ``tau`` on how far they may run ahead of the
updates they have not seen (the staleness bound of the paper's convergence theorem, its eq. 6).

Here that bound is held exactly, at every step: the sparse update computed at step ``t`` is applied
at the end of step ``t + tau``, so step ``t`` reads embeddings that miss the updates of steps
``t - tau .. t - 1`` and no others (a first-in first-out queue of ``tau`` updates per owner). Every
owner queues alike, so the run is a pure function of the seed, like the others: N ranks train what
one rank trains (``des.check`` holds), and ``tau = 0`` is ``alltoall``. A real asynchronous system
sees staleness anywhere between 0 and its bound; this is its worst case, repeatable.

An update is applied with the optimizer's clock of the step it is applied at (an embedding server
steps its optimizer when a gradient arrives) and the learning-rate factor of the step that computed
it. Whatever reads or replaces the whole state (a validation, a checkpoint, an eviction, the end)
first applies the updates in flight (:meth:`settle`), as a Persia checkpoint waits for the
in-flight gradients: the state saved is consistent, and a resumed run equals a straight one with
the same checkpoints.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from des.errors import ConfigError
from des.strategies.alltoall import AllToAll
from des.strategies.base import StrategyContext
from des.strategies.stages import SparseUpdate


class DelayedSparse:
    """Persia's sparse-update stage: an update submitted at step ``t`` is applied at the end of step
    ``t + staleness`` (a first-in first-out queue; ``staleness`` 0 applies it at once). An update
    holds only what it reads (the lookups, the route's synthetic batch, the gradients), not values."""

    def __init__(self, staleness: int) -> None:
        self.staleness = staleness
        #: computed, not yet applied, oldest first
        self.in_flight: deque[SparseUpdate] = deque()

    @property
    def holds_back(self) -> bool:
        """Updates land ``staleness`` steps late: the pipeline must hand every one over."""
        return self.staleness > 0

    def submit(self, update: SparseUpdate) -> None:
        """Queue this step's sparse update; apply the one computed ``staleness`` steps ago."""
        self.in_flight.append(update)
        while len(self.in_flight) > self.staleness:
            self.in_flight.popleft().apply()

    def settle(self) -> None:
        """Every update in flight, oldest first."""
        while self.in_flight:
            self.in_flight.popleft().apply()


class Persia(AllToAll):
    """:class:`AllToAll` whose sparse updates land ``tau`` steps after they are computed."""

    name = "persia"
    description = ("Persia's hybrid training: embeddings exchanged as alltoall, their updates applied --staleness "
                   "steps late, the dense network synchronous")

    @dataclass(frozen=True)
    class Options(AllToAll.Options):
        """alltoall's options and ``--staleness`` (tau)."""

        staleness: int = 1

        def check(self) -> None:
            super().check()
            if self.staleness < 0:
                raise ConfigError(f"--staleness must be 0 or more steps, got {self.staleness}")

    def __init__(self, context: StrategyContext) -> None:
        #: tau: the sparse updates a step may not have seen yet
        self.staleness = context.options.staleness
        super().__init__(context)

    def sparse_stage(self) -> DelayedSparse:
        """The delayed stage (module docstring)."""
        return DelayedSparse(self.staleness)

    def describe(self) -> str:
        return f"{super().describe()}; sparse updates applied {self.staleness} step(s) late"

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "staleness": self.staleness}
