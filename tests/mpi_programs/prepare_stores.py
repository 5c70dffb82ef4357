"""Prepares the stores a JSON file lists, on every rank of the job (``des.data.prepare`` and
``prepare_splits`` given ``MPI.COMM_WORLD``): ``[{"output": DIR, "inputs": [...] or "splits":
{role: [...]} or "cache": FILE (``open_dataset`` into the cache folder DIR), "options": {...}}, ...]``
(a schema a name, a TOML file or its ``to_dict()``; ``"digest_block": BYTES``: the job's files
hashed in blocks of that size, ``des.data.blocks.DIGEST_BLOCK``). A preparation that fails leaves
its one-line error in ``DIR.error`` (written by rank 0)."""

import json
import sys

from mpi4py import MPI

from des.data import DataError, blocks, open_dataset, prepare, prepare_splits
from des.data.schema import Schema


def main() -> None:
    comm = MPI.COMM_WORLD
    with open(sys.argv[1]) as handle:
        jobs = json.load(handle)
    for job in jobs:
        if isinstance(job["options"].get("schema"), dict):  # a schema as plain data
            job["options"]["schema"] = Schema.from_dict(job["options"]["schema"])
        default_block, blocks.DIGEST_BLOCK = blocks.DIGEST_BLOCK, job.get("digest_block", blocks.DIGEST_BLOCK)
        try:
            if "cache" in job:  # prepared into the cache folder at output
                open_dataset(job["cache"], cache_dir=job["output"], comm=comm, **job["options"])
            elif "splits" in job:
                prepare_splits(job["splits"], job["output"], progress=False, comm=comm, **job["options"])
            else:
                prepare(job["inputs"], job["output"], progress=False, comm=comm, **job["options"])
        except DataError as error:
            if comm.Get_rank() == 0:
                with open(job["output"] + ".error", "w") as handle:
                    handle.write(str(error))
        finally:
            blocks.DIGEST_BLOCK = default_block


if __name__ == "__main__":
    main()
