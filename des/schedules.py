"""Learning-rate schedules: a multiplier of an optimizer's rate, a pure function of the global step.

A schedule multiplies the learning rate (FTRL: ``alpha``) of the optimizers it is given to
(``--sparse-schedule`` for every embedding block and the order-1 weights, ``--dense-schedule`` for
the dense weights). The factor of global step ``s`` (0-based: the step being trained) depends only
on ``s``, the run's planned number of steps and, for ``plateau``, on the validation history, which
is the same on every rank of a synchronous strategy; so a schedule keeps N ranks == 1 rank.

Specs (``name:key=value,...``):

* ``constant`` -- factor 1;
* ``warmup:steps=W`` -- linear warm-up ``(s+1)/W`` for the first W steps, then 1;
* ``linear:warmup=W,end=E`` -- warm-up, then linear decay from 1 to ``E`` at the last step;
* ``cosine:warmup=W,end=E`` -- warm-up, then half a cosine from 1 down to ``E``;
* ``plateau:factor=F,patience=P,min=M,warmup=W`` -- FuxiCTR's ``ReduceLROnPlateau``: after P
  validations in a row without improvement of ``--monitor`` the factor is multiplied by F (not
  below M).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from des.errors import ConfigError

_PARAMS = {"constant": {}, "warmup": {"steps": 0.0},
           "linear": {"warmup": 0.0, "end": 0.0}, "cosine": {"warmup": 0.0, "end": 0.0},
           "plateau": {"factor": 0.5, "patience": 1.0, "min": 0.0, "warmup": 0.0}}


@dataclass(frozen=True)
class Schedule:
    kind: str = "constant"
    params: dict[str, float] = field(default_factory=dict)

    @property
    def warmup(self) -> int:
        return int(self.params.get("warmup", self.params.get("steps", 0)))

    @property
    def on_plateau(self) -> bool:
        return self.kind == "plateau"

    @property
    def constant(self) -> bool:
        """Whether the factor is 1 at every step (no warm-up, no decay, no plateau)."""
        return self.kind == "constant"

    def factor(self, step: int, total_steps: int, plateau: float = 1.0) -> float:
        """The multiplier of the learning rate at 0-based global ``step`` of ``total_steps``."""
        w = self.warmup
        if w and step < w:
            return (step + 1) / w * plateau
        if self.kind in ("linear", "cosine"):
            end = self.params["end"]
            progress = min(max((step - w) / max(total_steps - w - 1, 1), 0.0), 1.0)
            if self.kind == "linear":
                return 1.0 - (1.0 - end) * progress
            return end + (1.0 - end) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return plateau

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_schedule(spec: str, flag: str) -> Schedule:
    """``"cosine:warmup=100,end=0.1"`` -> :class:`Schedule`; a one-line :class:`ConfigError` otherwise."""
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip() or "constant"
    if kind not in _PARAMS:
        raise ConfigError(f"--{flag} {spec!r}: unknown schedule {kind!r} (choose one of: {', '.join(_PARAMS)})")
    params = dict(_PARAMS[kind])
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in params:
            raise ConfigError(f"--{flag} {spec!r}: {kind} takes {', '.join(params) or 'no parameters'} "
                              f"(key=value), got {item!r}")
        try:
            params[key] = float(value)
        except ValueError:
            raise ConfigError(f"--{flag} {spec!r}: {key} is not a number") from None
        if not math.isfinite(params[key]) or params[key] < 0:
            raise ConfigError(f"--{flag} {spec!r}: {key} must be a finite number >= 0 (a rate is never "
                              f"negative), got {value.strip()}")
    if kind == "plateau" and not 0 < params["factor"] <= 1:
        raise ConfigError(f"--{flag} {spec!r}: factor must be in (0, 1], got {params['factor']:g}")
    if kind in ("linear", "cosine") and params["end"] > 1:
        raise ConfigError(f"--{flag} {spec!r}: end is a fraction of the rate, in [0, 1], got {params['end']:g}")
    for key in ("warmup", "steps", "patience"):
        if key in params and params[key] != int(params[key]):
            raise ConfigError(f"--{flag} {spec!r}: {key} must be a whole number of steps/validations")
    return Schedule(kind, params)


@dataclass
class Plateau:
    """Reduce-on-plateau state of one schedule (saved in the checkpoint manifest)."""

    scale: float = 1.0
    bad: int = 0

    def update(self, schedule: Schedule, improved: bool) -> bool:
        """After a validation; returns whether the rate was reduced."""
        if not schedule.on_plateau:
            return False
        if improved:
            self.bad = 0
            return False
        self.bad += 1
        if self.bad < schedule.params["patience"]:
            return False
        self.bad = 0
        new = max(self.scale * schedule.params["factor"], schedule.params["min"])
        reduced, self.scale = new < self.scale, new
        return reduced
