"""``mpiexec -n N python -m tests.mpi_programs.entry_points RUNS.json``: des entry points, one after
another in ONE launch (a rank's start-up, TensorFlow's import, is paid once), each called as
``python -m MODULE ARGS...`` calls it (``main(ARGS)``, a fresh Communicator of its own). RUNS.json
lists ``{"name": NAME, "args": ["-m", MODULE, ARGS...]}``; each rank writes what a run prints to
``NAME.rank-R.out`` beside RUNS.json. A run that fails ends the job (``run_main``), as it would alone."""

import importlib
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

from des.collectives import run_main


def main() -> int:
    from mpi4py import MPI

    listing = Path(sys.argv[1])
    rank = MPI.COMM_WORLD.Get_rank()
    for run in json.loads(listing.read_text()):
        flag, module, *args = run["args"]
        assert flag == "-m", run
        with open(listing.parent / f"{run['name']}.rank-{rank}.out", "w") as out, redirect_stdout(out):
            code = importlib.import_module(module).main(args)
        if code:
            raise SystemExit(code)
    return 0


if __name__ == "__main__":
    run_main(main, "entry_points")
