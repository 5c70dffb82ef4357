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
from des.config import load_config


def main(argv: list[str] | None = None) -> int:
    config = load_config(argv)
    from des.runner import train

    train(config, Communicator())
    return 0


if __name__ == "__main__":
    run_main(main, "des.train")
