"""Train a CTR model with Distributed Equivalent Substitution.

    mpirun -n 4 .venv/bin/python -m des.train --model deepfm      # 4 ranks
    .venv/bin/python -m des.train --model lr                      # 1 rank

With no other flag it trains on the shipped Criteo sample (prepared into a cache on first use),
validates after each epoch, tests at the end and leaves a run folder with ``config.json``,
``metrics.jsonl``, ``summary.json`` and ``checkpoints/``. ``--help`` lists every option. The loop
itself is :mod:`des.runner` (the same for every ``--strategy``).
"""

from __future__ import annotations

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


if __name__ == "__main__":
    run_main(main, "des.train")
