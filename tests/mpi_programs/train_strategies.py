"""``mpiexec -n N python -m tests.mpi_programs.train_strategies OUTPUT RUN [RUN ...] -- DES.TRAIN FLAGS``:
one ``des.train`` run per RUN in ONE launch (a rank's start-up, TensorFlow's import, is paid once),
each into ``OUTPUT/<name>`` with a fresh Communicator (its own byte counters). A RUN is a strategy
name, or ``NAME:STRATEGY:PLAN[:BY]`` (``--plan PLAN``, e.g. ``mixed:des:first_fc=exchange``; ``BY``:
``--exchange-by BY``)."""

import sys

from des.collectives import run_main


def main() -> int:
    from des.train import main as train

    end = sys.argv.index("--")
    output, runs, flags = sys.argv[1], sys.argv[2:end], sys.argv[end + 1:]
    for run in runs:
        name, strategy, plan, by = (run.split(":", 3) + ["", "", ""])[:4] if ":" in run else (run, run, "", "")
        train(["--strategy", strategy, "--output", f"{output}/{name}", *(["--plan", plan] if plan else []),
               *(["--exchange-by", by] if by else []), *flags])
    return 0


if __name__ == "__main__":
    run_main(main, "train_strategies")
