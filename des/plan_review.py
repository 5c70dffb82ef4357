"""Switching ``--plan`` during a run: the review of a measured choice, and ``--plan-switch``.

The trials (``des/plan_trials.py``) time the candidate plans on throwaway strategies: a few steps
each, on the first batches, with tables that grow from empty. The run's own steps can disagree:
its tables grow, its pipeline overlaps more or less, another job on the host comes or goes. So a
run whose plan the trials chose reviews that choice on its own steps (:class:`Review`):

1. after the run's first :data:`SKIP` steps (tracing, first compilations), the median of
   :data:`WINDOW` steps, the slowest rank's, is the chosen plan's measured time;
2. where the trials' runner-up took less than that by :data:`MARGIN`, the run switches to it,
   leaves out one step (its tracing) and measures it over :data:`WINDOW` steps the same way;
3. it keeps the runner-up only where the runner-up measured faster by :data:`MARGIN`, else it
   switches back.

So a run switches at most twice, within its first ``SKIP + 2 * WINDOW + 1`` steps, and keeps a
plan other than the trials' only for what its own steps measured. A run too short for both windows
keeps the trials' choice. (Trials run on long runs only, ``des.plan_trials.MIN_STEPS``, or where
``--plan measure`` asks for them: a switch traces a new step and copies the tables once.)

Why a switch is exact: plans train the same model (``des.check``), and a switch is a resume
within the job (:func:`switch`): the running strategy's checkpoint is loaded into one built with
the other plan, and the tables, the optimizer states and the field slices of the dense weights
are re-sharded as resuming on another plan re-shards them. In float64, N ranks that switch train
what one rank trains (a ``des.check`` case). In float32 two plans may round differently, so the
review's switches are printed and recorded (``summary.json``: ``planner.review``) as the
``--plan A --plan-switch STEP:B`` that repeats the run bit for bit without timing anything.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from des.errors import ConfigError

#: steps of the run left out before the first window (the first traces TF and compiles numba)
SKIP = 2
#: steps whose median (the slowest rank's) is a plan's measured time
WINDOW = 20
#: a plan replaces the running one only where it is faster by this fraction
MARGIN = 0.10
#: where a switch's checkpoint is written, inside the run folder (removed right after)
FOLDER = ".plan-switch"


@dataclass(frozen=True)
class Switch:
    """From global step ``step`` on (after ``step`` steps), the run trains with ``--plan plan``."""

    step: int
    plan: str

    def __str__(self) -> str:
        return f"{self.step}:{self.plan}"


def parse_switches(text: str) -> list[Switch]:
    """``--plan-switch STEP:PLAN[;STEP:PLAN...]`` -> the switches, steps increasing; ConfigError, one line."""
    switches: list[Switch] = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        step, sep, plan = (x.strip() for x in item.partition(":"))
        if not sep or not step.isdigit() or int(step) < 1 or not plan:
            raise ConfigError(f"--plan-switch {text!r}: {item!r} is not STEP:PLAN (a step of 1 or more, then the "
                              "--plan from that step on; several separated by ';')")
        if switches and int(step) <= switches[-1].step:
            raise ConfigError(f"--plan-switch {text!r}: the steps must increase")
        if plan in ("auto", "measure"):  # as --plan of a switched run: what is repeated must not be chosen again
            raise ConfigError(f"--plan-switch {text!r}: {item!r} must name the plan itself (partials, exchange or "
                              f"OP=MODE,...), not {plan}: a switched run is repeated from these flags")
        switches.append(Switch(int(step), plan))
    return switches


def format_switches(switches: Sequence[Switch]) -> str:
    return ";".join(map(str, switches))


class Review:
    """When a run changes its plan (module docstring): the runner asks :meth:`quiet` before a step
    (nothing prefetched across a step that may end in a switch) and :meth:`after` after it.

    ``scripted`` (``--plan-switch``) are the switches to make, and nothing is measured; else
    ``trials`` (their measured times, :class:`des.plan_trials.Trials`) are reviewed."""

    def __init__(self, plan: str, start: int, *, trials: Any = None, scripted: Sequence[Switch] = ()) -> None:
        self.first = self.plan = plan  # the plan the run started with, and the running one
        self.scripted = list(scripted)
        self.trials = None if scripted else trials
        self.measured: dict[str, float] = {}  # ms per step of the plans this run measured, the slowest rank's
        self.switches: list[Switch] = []
        self.seconds: list[float] = []  # each switch's wall time (checkpoint, new strategy, load)
        self.sent: list[float] = []  # the bytes this rank had sent in training steps at each switch
        self.window: list[float] = []
        self.counts_after = start + SKIP  # the window counts the steps done after this many
        self.decides_at: int | None = start + SKIP + WINDOW if self.trials is not None else None

    @classmethod
    def of(cls, config: Any, trials: Any, start: int, planned: int) -> "Review | None":
        """The run's review: its ``--plan-switch``, else its trials' review where there were trials
        of two plans or more and ``planned`` steps (from global step ``start``) repay one; else None."""
        if config.plan_switch:
            return cls(config.plan, start, scripted=parse_switches(config.plan_switch))
        if trials is None or len(trials.ms_per_step) < 2 or planned <= SKIP + 2 * WINDOW + 1:
            return None
        return cls(config.plan, start, trials=trials)

    def resumed(self, step: int) -> str | None:
        """Before the first step of a run resumed after ``step`` steps: the plan ``--plan-switch``
        gives that step where it is not the running one (None: keep)."""
        wanted = [s.plan for s in self.scripted if s.step <= step]
        if not wanted or wanted[-1] == self.plan:
            return None
        return self._switch(step, wanted[-1])

    def quiet(self, step: int) -> bool:
        """Whether global step ``step`` may end in a switch (then no batch is prefetched during it)."""
        done = step + 1
        return done == self.decides_at or any(s.step == done for s in self.scripted)

    def after(self, done: int, seconds: float, slowest: Callable[[float], float]) -> str | None:
        """After ``done`` global steps, the last of which took ``seconds`` on this rank: the plan to
        switch to before the next step, or None. ``slowest(x)``: the largest ``x`` of the ranks
        (collective: every rank calls it at the same step)."""
        for switch in self.scripted:
            if switch.step == done:
                return self._switch(done, switch.plan) if switch.plan != self.plan else None
        if self.decides_at is None:
            return None
        if done > self.counts_after:
            self.window.append(seconds)
        if done != self.decides_at:
            return None
        ms = 1000.0 * slowest(float(np.median(self.window)))
        self.measured[self.plan] = ms
        self.decides_at = None
        if self.plan == self.first:  # the trials' choice measured: is the runner-up predicted faster?
            others = {p: t for p, t in self.trials.ms_per_step.items() if p != self.first}
            runner_up = min(others, key=lambda p: others[p])
            if others[runner_up] * (1.0 + MARGIN) >= ms:
                return None
            self.window, self.counts_after, self.decides_at = [], done + 1, done + 1 + WINDOW
            return self._switch(done, runner_up)
        if ms * (1.0 + MARGIN) < self.measured[self.first]:  # the runner-up measured faster: kept
            return None
        return self._switch(done, self.first)

    def _switch(self, done: int, plan: str) -> str:
        self.switches.append(Switch(done, plan))
        self.plan = plan
        return plan

    def sent_before_switch(self, sent: float) -> None:
        """The bytes this rank had sent in training steps (``des.reporting.bytes_sent``) when the
        last switch was decided, before it is made."""
        self.sent.append(float(sent))

    def segments(self, start: int, end: int, sent: float) -> list[tuple[str, int, int, float]]:
        """The run's plans in order, from global step ``start`` to ``end`` (``sent``: this rank's
        bytes by then): ``(plan, from step, to step, bytes this rank sent in them)``."""
        plans = [self.first, *(s.plan for s in self.switches)]
        bounds = [start, *(s.step for s in self.switches), end]
        totals = [0.0, *self.sent, float(sent)]
        return [(plan, bounds[i], bounds[i + 1], totals[i + 1] - totals[i]) for i, plan in enumerate(plans)]

    def took(self, seconds: float) -> None:
        """The last switch took ``seconds``."""
        self.seconds.append(seconds)

    def record(self) -> dict[str, Any]:
        """``summary.json``'s ``planner.review``: the plans measured in the run, its switches, and
        the flags that repeat it."""
        return {"measured_ms_per_step": {p: round(ms, 3) for p, ms in self.measured.items()},
                "switches": [{**dataclasses.asdict(s), "seconds": round(t, 3)} for s, t in
                             zip(self.switches, self.seconds)], "plan": self.plan,
                "repeat": self.repeat(),
                "window_steps": WINDOW, "margin": MARGIN, "scripted": bool(self.scripted)}

    def repeat(self) -> str:
        """The flags that repeat this run's plans: its ``--plan`` and the switches, given or made."""
        switches = self.scripted or self.switches
        return f"--plan {self.first}" + (f" --plan-switch '{format_switches(switches)}'" if switches else "")

    def line(self, done: int) -> str:
        """What the run prints when it switches to the running plan after ``done`` steps."""
        took = f" in {self.seconds[-1]:.1f} s" if self.seconds else ""
        if self.scripted:
            return f"step {done}: switched to --plan {self.plan}{took} (--plan-switch)"
        measured = ", ".join(f"{p} {ms:.1f}" for p, ms in self.measured.items())
        return (f"step {done}: switched to --plan {self.plan}{took} (measured ms/step, the slowest rank's median of "
                f"{WINDOW} steps: {measured}); to repeat this run: {self.repeat()}")


def switch(run: Any, plan: str) -> None:
    """Continue ``run`` with ``--plan plan`` (collective): its strategy's checkpoint, written into
    the run folder, loaded into a strategy built with ``plan`` (``run.rebuild``), which replaces it.
    The trajectory is a resume's: nothing is caught up or evicted for it."""
    from des.checkpoint import load_checkpoint, save_checkpoint

    old, comm = run.strategy, run.comm
    root = run.folder / FOLDER
    epoch, next_batch, _ = run.source.position(old.step_count)
    path = save_checkpoint(old, root, epoch=epoch, next_batch=next_batch, config=run.config.to_dict(),
                           data_order=run.source.data_order)
    new = run.rebuild(plan)
    load_checkpoint(new, path)
    comm.barrier("checkpoint")  # every rank has read what it needs
    if comm.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    old.close()
    run.strategy = new
    run.source.use(new)
    run.config = dataclasses.replace(run.config, plan=plan)
    run.chain = None  # the tables were replaced: no increment of the run's last checkpoint
    run.meter.leave_out_next()  # the new step traces
