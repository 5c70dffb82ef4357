"""``mpiexec -n N python -m tests.mpi_programs.train_strategies OUTPUT STRATEGY,.. -- DES.TRAIN FLAGS``:
one ``des.train`` run per strategy in ONE launch (a rank's start-up, TensorFlow's import, is paid
once), each into ``OUTPUT/<strategy>`` with a fresh Communicator (its own byte counters)."""

import sys

from des.collectives import run_main


def main() -> int:
    from des.train import main as train

    output, strategies = sys.argv[1], sys.argv[2].split(",")
    flags = sys.argv[sys.argv.index("--") + 1:]
    for strategy in strategies:
        train(["--strategy", strategy, "--output", f"{output}/{strategy}", *flags])
    return 0


if __name__ == "__main__":
    run_main(main, "train_strategies")
