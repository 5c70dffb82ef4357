"""``--strategy alltoall``: the embedding exchange of TorchRec/HugeCTR/PICASSO (model parallelism of
the embeddings, data parallelism of the rest), as the planner's all-exchange plan of the hybrid DES
step: ``--strategy des --plan exchange`` (``des/strategies/exchange.py``; one implementation of
the exchange). Every rank reads the whole batch, looks up its fields' ids (as DES: admission
counts every occurrence), sends the values of the distinct ids of each row block to its row owner
and gets their gradient sums back (or, ``--exchange-by rows``, where that moves fewer bytes: each
row's pooled values, TorchRec's and HugeCTR's pooled all-to-all); the row owner runs every
operator whole (``combine(local)`` on all fields, equal to its ``reference``) and the top network
on its rows, with every field weight replicated (their gradients AllReduced with the top's).

Kept as a name of its own for the benchmarks and the paper's tables; checkpoints are
interchangeable with DES's.
"""

from __future__ import annotations

from dataclasses import dataclass

from des.errors import ConfigError
from des.strategies.des import DES


class AllToAll(DES):
    """:class:`DES` with every operator exchanged."""

    name = "alltoall"
    description = "embedding rows exchanged with Alltoallv, dense gradients AllReduced (TorchRec-style; = des --plan exchange)"
    communication_plan = "exchange"
    fixed_plan = "exchange"

    @dataclass(frozen=True)
    class Options(DES.Options):
        """des's options; the plan is always the exchange (``--plan`` is not read)."""

        def check(self) -> None:
            if self.upper != "data-parallel":
                raise ConfigError("--upper replicated is not supported with --strategy alltoall (the rows are split)")
