"""Train each model K steps with the DES engine on however many ranks this job has, then write what
a 1-rank run must reproduce: held-out predictions, every field's table rows, field-parameter slices
and the top parameters (one ``.npz`` per model and rank). Also checks, inside the job, that the
replicated top parameters are bit-identical on all ranks.

    mpiexec -n N python -m tests.mpi_programs.exactness --out DIR \
        --run NAME:PREPARED_DIR:DTYPE:PLACEMENT:MODEL,MODEL...:STRATEGY:EMBEDDING_OPTIMIZER [--run ...]

Each ``--run`` writes ``DIR/NAME/<model>-rank<r>.npz``. Several runs share one launch because
starting TensorFlow on every rank is the expensive part.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from des.collectives import Communicator, install_abort_hook
from des.data import ColumnStore
from des.data.batch_reader import BatchReader
from des.options import Optimizers, TableOptions
from des.strategies import engine_class
from des.hashtable import FTRL, Adam, optimizer_from_spec
from des.models import get_model
from des.placement import place_fields

SMALL = {"embedding_dim": 4, "hidden": (16, 8)}


def small_model(name: str, num_fields: int):
    cls = get_model(name)
    if name == "lr":
        return cls(num_fields=num_fields)
    if name == "fm":
        return cls(num_fields=num_fields, embedding_dim=4)
    return cls(num_fields=num_fields, **SMALL)


def make_optimizers(embedding: str) -> Optimizers:
    return Optimizers(
        sparse={"linear": FTRL(alpha=0.1, l1=0.01, l2=0.001), "embedding": optimizer_from_spec(embedding)},
        dense=Adam(lr=0.01),
    )


def train_and_dump(
    comm: Communicator, store: ColumnStore, model_name: str, steps: int, batch_size: int,
    dtype: str, placement_policy: str, strategy: str, embedding_optimizer: str, out: Path,
) -> None:
    model = small_model(model_name, store.num_fields)
    counts = [store.distinct_count(f) for f in range(store.num_fields)]
    placement = place_fields(store.num_fields, comm.size, placement_policy, counts)
    engine = engine_class(strategy)(
        model, comm, placement, make_optimizers(embedding_optimizer), seed=3, dtype=np.dtype(dtype),
        tables=TableOptions(capacity=64),  # small, so the tables grow during the test
    )
    done, epoch, losses = 0, 0, []
    while done < steps:
        for batch in BatchReader(store, "train", batch_size=batch_size, seed=5, epoch=epoch,
                                 **engine.reader_options()):
            losses.append(engine.train_step(batch))
            done += 1
            if done == steps:
                break
        epoch += 1
    held_out = next(iter(BatchReader(store, "validation", batch_size=256, seed=0, shuffle=False, drop_last=False,
                                     **engine.reader_options())))
    predictions, _ = engine.predict_with_labels(held_out)

    checksums = comm.allgather(np.frombuffer(bytes.fromhex(engine.dense_checksum()), dtype=np.uint8), "check")
    if not all(np.array_equal(checksums[0], c) for c in checksums):
        raise AssertionError(f"{model_name}: top parameters differ between ranks")

    arrays: dict[str, np.ndarray] = {"predictions": predictions, "losses": np.array(losses)}
    for name, value in engine.top_params.items():
        arrays[f"top/{name}"] = value
    for field in engine.fields:
        j = engine.field_param_index(field)
        table = engine.tables[field]
        keys = np.sort(table.keys())
        rows = table.lookup(keys, insert=False)
        arrays[f"field/{field}/keys"] = keys
        for block in engine.blocks:
            arrays[f"field/{field}/{block.name}"] = table.gather(block.name, keys, rows)
        for name, value in engine.field_params.items():
            arrays[f"field/{field}/param/{name}"] = value[j]
    np.savez(out / f"{model_name}-rank{comm.rank}.npz", **arrays)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--run", action="append", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    comm = Communicator()
    for run in args.run:
        name, data, dtype, placement, models, strategy, embedding_optimizer = run.split(":", 6)
        store = ColumnStore.open(data)
        out = Path(args.out) / name
        out.mkdir(parents=True, exist_ok=True)
        for model in models.split(","):
            train_and_dump(comm, store, model, args.steps, args.batch_size, dtype, placement,
                           strategy, embedding_optimizer, out)
    comm.barrier()
    if comm.rank == 0:
        print(f"exactness: {comm.size} ranks ok, pid {os.getpid()}")


if __name__ == "__main__":
    install_abort_hook("exactness")
    main()
