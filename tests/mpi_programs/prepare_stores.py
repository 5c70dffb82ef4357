"""Prepares the stores a JSON file lists, on every rank of the job (``des.data.prepare`` and
``prepare_splits`` given ``MPI.COMM_WORLD``): ``[{"output": DIR, "inputs": [...] or "splits":
{role: [...]}, "options": {...}}, ...]`` (a schema a name, a TOML file or its ``to_dict()``). A preparation that fails leaves its one-line error in
``DIR.error`` (written by rank 0)."""

import json
import sys

from mpi4py import MPI

from des.data import DataError, prepare, prepare_splits
from des.data.schema import Schema


def main() -> None:
    comm = MPI.COMM_WORLD
    with open(sys.argv[1]) as handle:
        jobs = json.load(handle)
    for job in jobs:
        if isinstance(job["options"].get("schema"), dict):  # a schema as plain data
            job["options"]["schema"] = Schema.from_dict(job["options"]["schema"])
        try:
            if "splits" in job:
                prepare_splits(job["splits"], job["output"], progress=False, comm=comm, **job["options"])
            else:
                prepare(job["inputs"], job["output"], progress=False, comm=comm, **job["options"])
        except DataError as error:
            if comm.Get_rank() == 0:
                with open(job["output"] + ".error", "w") as handle:
                    handle.write(str(error))


if __name__ == "__main__":
    main()
