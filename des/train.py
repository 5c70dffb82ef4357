"""Train a CTR model with Distributed Equivalent Substitution.

    mpirun -n 4 .venv/bin/python -m des.train --model deepfm      # 4 ranks
    .venv/bin/python -m des.train --model lr                      # 1 rank

With no other flag it trains on the shipped Criteo sample (prepared into a cache on first use),
validates after each epoch, tests at the end and leaves a run folder with ``config.json``,
``metrics.jsonl``, ``summary.json`` and ``checkpoints/``. ``--help`` lists every option. The loop
itself is :mod:`des.runner` (the same for every ``--strategy``). In a notebook or a test,
:func:`run` trains on this one process and returns the summary (``docs/python-api.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from des import runtime  # noqa: F401  (quiets TensorFlow before it is imported)
from des.collectives import Communicator, run_main
from des.config import TrainConfig, load_config


def before_tensorflow(config: TrainConfig) -> None:
    """What TensorFlow must know before it loads: a bf16 job keeps oneDNN's kernels
    (``des/_tensorflow_env.py``). A no-op once TensorFlow is loaded."""
    if config.compute_dtype == "bfloat16":
        from des._tensorflow_env import will_compute_in_bfloat16

        will_compute_in_bfloat16()


def main(argv: list[str] | None = None, *, warmup_steps: int = 1) -> int:
    """``warmup_steps``: the first steps that the throughput and the phase timers leave out (the
    benchmarks' warm-up; :func:`des.runner.train`)."""
    config = load_config(argv)
    before_tensorflow(config)
    from des.runner import train

    train(config, Communicator(), warmup_steps=warmup_steps)
    return 0


def run(config: TrainConfig | Mapping[str, Any] | Sequence[str] | str, *, warmup_steps: int = 1) -> dict[str, Any]:
    """Train on this process alone (``MPI.COMM_SELF``, one rank, also inside an MPI job) and return
    the run's summary (``summary.json``'s entries: ``run_folder``, ``checkpoint``, ``test_auc``, ...).

    ``config``: a :class:`des.config.TrainConfig`; the command line's flags as a list
    (``["--model", "deepfm", "--max-steps", "100"]``) or one string; or a mapping of options
    (``{"model": "deepfm", "hidden": [16, 8], "progress": False}``: a ``True``/``False`` is
    ``--flag``/``--no-flag``, a list is joined by commas). Errors are raised (a
    :class:`des.errors.DesError` of one line), not printed."""
    from mpi4py import MPI

    if not isinstance(config, TrainConfig):
        config = load_config(flags_of(config))
    before_tensorflow(config)
    from des.runner import train

    return train(config, Communicator(MPI.COMM_SELF), warmup_steps=warmup_steps)


def flags_of(options: Mapping[str, Any] | Sequence[str] | str) -> list[str]:
    """Command-line flags of :func:`run`'s ``config`` given as flags, a string or a mapping."""
    import shlex

    if isinstance(options, str):
        return shlex.split(options)
    if not isinstance(options, Mapping):
        return [str(x) for x in options]
    flags: list[str] = []
    for name, value in options.items():
        flag = "--" + str(name).replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            flags += [flag, ",".join(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags


if __name__ == "__main__":
    run_main(main, "des.train")
