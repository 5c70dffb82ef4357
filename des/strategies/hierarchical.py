"""``--strategy hierarchical``: Hierarchical Training (Huang et al., KDD 2021) on the DES step.

HT replaces each trainer of an EASGD system by a group of nodes that trains one replica of the
dense network synchronously; the groups' replicas are reconciled in the background by EASGD
(ShadowSync), and the embedding tables live once, on sparse parameter servers every group uses.
Here, with ``N`` ranks in ``K = N / G`` groups of ``--group-size G`` consecutive ranks:

* the tables and the field slices of the substituted operators are one copy, owned by field over
  all N ranks as in ``des`` (HT's shared sparse servers; DES puts the first FC layer's field slices
  with the fields). The DES step runs unchanged up to the top network: every rank computes the
  partials of the whole global batch for its fields, and the reduce-scatter brings each rank its
  row block, so group ``g`` holds the rows of its ranks, ``B/K`` of them;
* each group trains its own replica of the upper network (the layers above the substituted ones,
  and the dense features' weights) on its rows: the loss shares and top gradients are summed over
  the group only (an AllReduce of the group's communicator), as the mean over the group's rows;
* the buffer gradient ``G`` is the global batch's (normalised by B, gathered from every rank), so
  the shared tables and field slices take one update per step from every group's rows: HT's
  pushes to its sparse servers without their staleness (each group's gradient applied at once);
* every ``--sync-every`` steps the replicas are reconciled, with one AllReduce over all ranks of
  the groups' weights (each group's first rank contributes, the others zeros):
  ``--group-sync easgd`` (Zhang, Choromanska & LeCun 2015, synchronous EASGD, their eqs. 5-6):
  ``x_g <- x_g - alpha (x_g - c)``, ``c <- c + alpha Σ_g (x_g - c)`` with a center ``c`` held
  alike on every rank; ``average``: ``x_g <- mean_g x_g`` (model averaging). Each group keeps its
  optimizer state.

A validation, a checkpoint, an eviction and the end of training read one model: they first make
the replicas one (:meth:`settle`: weights and optimizer state averaged over the groups, the center
set to that average), so checkpoints hold one model and a resumed run equals a straight one with
the same checkpoints. With ``G = N`` (one group) nothing differs from ``des``, bit for bit; with
SGD and ``average`` every step, any G trains what ``des`` trains (the groups' mean gradient is the
batch's), which ``tests/test_exactness.py`` checks. The reconciliation is in the step (blocking)
rather than in the background: deterministic, and its cost is in the measured speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from des.errors import ConfigError
from des.strategies.base import StrategyContext
from des.strategies.des import DES
from des.strategies.stages import AllRanks

#: EASGD's ``beta = K alpha`` (the EASGD paper's recommended 0.9): ``--easgd-alpha 0`` means ``0.9 / K``
EASGD_BETA = 0.9


class Hierarchical(DES):
    """DES with one replica of the upper network per group of ranks, reconciled every few steps."""

    name = "hierarchical"
    description = ("Hierarchical Training: groups of --group-size ranks, each training its own replica of the upper "
                   "network, reconciled by EASGD or averaging; tables and field slices one copy")
    exact_over_ranks = False  # the model depends on the number of groups
    fixed_plan = "partials"
    communication_plan = None  # the planner does not model the groups' traffic
    phases = {**DES.phases, "group_sync": "communication"}
    traffic_sites = (*DES.traffic_sites, "group_sync")
    allreduce_sites = (*DES.allreduce_sites, "group_sync")

    @classmethod
    def des_equivalent_flags(cls, ranks: int) -> tuple[str, ...]:
        return ("--group-size", str(ranks))  # one group: des

    @dataclass(frozen=True)
    class Options(DES.Options):
        """des's options (every operator partials, the upper network data-parallel) and the groups':
        ``--group-size``, ``--group-sync``, ``--sync-every``, ``--easgd-alpha``."""

        group_size: int = 1
        group_sync: str = "easgd"
        sync_every: int = 4
        easgd_alpha: float = 0.0

        def check(self) -> None:
            if self.upper != "data-parallel":
                raise ConfigError("--upper replicated is not supported with --strategy hierarchical (each group "
                                  "trains its replica of the upper network on its rows)")
            if self.plan not in ("auto", "measure", "partials"):
                raise ConfigError(f"--plan {self.plan}: --strategy hierarchical runs every operator as partials "
                                  "(an exchanged operator's weights would be one copy trained with the groups' tops)")
            if self.group_size < 1 or self.sync_every < 1:
                raise ConfigError(f"--group-size and --sync-every must be at least 1, got {self.group_size} "
                                  f"and {self.sync_every}")
            if not 0 <= self.easgd_alpha <= 1:
                raise ConfigError(f"--easgd-alpha must be within [0, 1], got {self.easgd_alpha}")
            if self.group_sync not in ("easgd", "average"):
                raise ConfigError(f"--group-sync {self.group_sync!r} is not one of easgd, average")

    @classmethod
    def check_options(cls, config) -> None:
        if config.placement == "split":
            raise ConfigError("--placement split is not supported with --strategy hierarchical (a split field's "
                              "weight slices are trained with the upper network, which each group holds apart)")
        super().check_options(config)

    @classmethod
    def place(cls, num_fields, ranks, distinct, config, work=None):
        cls.group_size_of(cls.Options.of(config), ranks)  # refused before anything is built
        return super().place(num_fields, ranks, distinct, config, work)

    @staticmethod
    def group_size_of(options: "Hierarchical.Options", ranks: int) -> int:
        """``--group-size``, which must divide the ranks."""
        if ranks % options.group_size:
            raise ConfigError(f"--group-size {options.group_size} does not divide the {ranks} ranks")
        return options.group_size

    def __init__(self, context: StrategyContext) -> None:
        options, comm = context.options, context.comm
        self.group_size = self.group_size_of(options, comm.size)
        #: K: replicas of the upper network
        self.groups = comm.size // self.group_size
        self.group = comm.rank // self.group_size
        #: the ranks of this rank's group (one group: the job's communicator, so G = N is des's step)
        self.group_comm = comm if self.groups == 1 else comm.split(self.group)
        super().__init__(context)  # builds the step, whose top reduction is the group's (top_reduction)
        self.sync_mode = options.group_sync
        self.sync_every = options.sync_every
        self.alpha = options.easgd_alpha or EASGD_BETA / self.groups
        #: the replicas differ (not for one group, nor a model without layers above the substituted ones)
        self.replicated = self.groups > 1 and bool(self.dense.top_params)
        #: EASGD's center variable (the same on every rank)
        self.center = self._top_weights() if self.replicated and self.sync_mode == "easgd" else None
        self.syncs = 0
        self._apart = False  # the replicas may differ (trained since they were last made one)

    # ------------------------------------------------------------------ the step
    def top_reduction(self) -> Any:
        """The loss and top gradients summed over the group, as the mean over the group's rows."""
        if self.groups == 1:
            return super().top_reduction()
        return GroupReduction(self.group_comm, self.comm, self.group, self.group_size)

    def train_step(self, batch: Any) -> float:
        loss = super().train_step(batch)
        if self.replicated:
            self._apart = True
            if self.step_count % self.sync_every == 0:
                with self.timer("group_sync"):
                    self.pipeline.dense_done()  # the step's dense update, on the background thread
                    self._reconcile()
        return loss

    def _reconcile(self) -> None:
        """EASGD's elastic step or model averaging, over the groups' weights."""
        weights = self._top_weights()
        if self.sync_mode == "average":
            self._set_top_weights(self._sum_over_groups(weights) / self.groups)
        else:
            difference = weights - self.center
            total = self._sum_over_groups(difference)  # Σ_g (x_g - c)
            self._set_top_weights(weights - self.alpha * difference)
            self.center += self.alpha * total
        self.syncs += 1

    def settle(self) -> None:
        """The deferred updates, then one model: the groups' weights and optimizer states averaged
        (collective: every rank settles at the same points)."""
        super().settle()
        if not self._apart:
            return
        held = [*self.dense.top_params.values(),
                *[slot for state in self.dense.top_states.values() for slot in state.slot_arrays()]]
        mean = self._sum_over_groups(np.concatenate([a.reshape(-1) for a in held])) / self.groups
        offset = 0
        for array in held:  # in place: the TF tensors and the optimizers hold these arrays
            array[...] = mean[offset : offset + array.size].reshape(array.shape)
            offset += array.size
        if self.center is not None:
            self.center = self._top_weights()
        self._apart = False

    def load_state(self, state) -> None:
        super().load_state(state)
        self._apart = False
        if self.center is not None:
            self.center = self._top_weights()

    # ------------------------------------------------------------------ pieces
    def _top_weights(self) -> np.ndarray:
        """This rank's replica of the upper network, flat (a copy)."""
        return np.concatenate([w.reshape(-1) for w in self.dense.top_params.values()])

    def _set_top_weights(self, flat: np.ndarray) -> None:
        for value, part in zip(self.dense.top_params.values(), self.dense.split_top(flat)):
            value[...] = part  # in place: the TF tensors over them stay current

    def _sum_over_groups(self, values: np.ndarray) -> np.ndarray:
        """The sum over the groups of a vector each group holds alike on its ranks (its first rank
        contributes, the others zeros: one AllReduce over every rank)."""
        buffer = values.astype(self.dtype) if self.group_comm.rank == 0 else np.zeros_like(values, dtype=self.dtype)
        return self.comm.allreduce_sum_(buffer, "group_sync")

    # ------------------------------------------------------------------ reporting
    def describe(self) -> str:
        sync = (f"EASGD alpha {self.alpha:g}" if self.sync_mode == "easgd" else "model averaging")
        return (f"{self.groups} group(s) of {self.group_size} rank(s), each its own upper network ({sync} every "
                f"{self.sync_every} steps); tables and field slices one copy; buffer {self.buffer_width} floats/sample")

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "group_size": self.group_size, "groups": self.groups,
                "group_sync": self.sync_mode, "sync_every": self.sync_every,
                "easgd_alpha": self.alpha if self.sync_mode == "easgd" else None, "syncs": self.syncs}

    def memory(self) -> dict[str, int]:
        held = super().memory()
        if self.center is not None:
            held["dense_bytes"] += self.center.nbytes
        return held


class GroupReduction(AllRanks):
    """The top reduction over one group's communicator: each rank's share was normalised by the
    whole batch, so it is rescaled to the mean over the group's rows first."""

    def __init__(self, group_comm: Any, comm: Any, group: int, group_size: int) -> None:
        super().__init__(group_comm)
        self.job_comm, self.group, self.group_size = comm, group, group_size

    def start(self, packed: np.ndarray, rows: int) -> Any:
        bounds = self.job_comm.row_bounds(rows)
        mine = bounds[(self.group + 1) * self.group_size] - bounds[self.group * self.group_size]
        packed *= rows / mine
        return super().start(packed, rows)
