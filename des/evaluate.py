"""Evaluate a trained checkpoint on other data, with any number of ranks.

    .venv/bin/python -m des.evaluate --checkpoint runs/deepfm-.../checkpoints --data FILE.tsv.gz \\
        --predictions preds.txt
    mpirun -n 2 .venv/bin/python -m des.evaluate --checkpoint ... --data ...

Prints AUC, logloss and the row count; ``--predictions`` writes one click probability per input row,
in input order. Ids never seen in training are looked up without being inserted (they contribute
their deterministic initial value, zero, or the field's shared row, as the model was trained with
``--unadmitted``).
"""

from __future__ import annotations

import os
from pathlib import Path

from des import runtime  # noqa: F401  (quiets TensorFlow before it is imported)
from des.collectives import Communicator, run_main
from des.config import TrainConfig
from des.errors import ArgumentParser, ConfigError, UsageError


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="des.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder, checkpoints/ folder or run folder")
    parser.add_argument("--data", required=True, help="a raw file (read with the checkpoint's schema) or a prepared "
                        "directory")
    parser.add_argument("--schema", default="", help="the data's schema (default: the checkpoint's, training "
                        "statistics included; another is refused)")
    parser.add_argument("--split", default="all", choices=("all", "train", "validation", "test"),
                        help="rows of a prepared directory to evaluate (a raw file is evaluated whole)")
    parser.add_argument("--predictions", default="", help="write one probability per row here (input order)")
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--bad-rows", default="fail", choices=("fail", "skip"))
    parser.add_argument("--cache-dir", default="")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    runtime.configure_threads()
    comm = Communicator()
    import numpy as np

    from des.building import build_strategy, open_data
    from des.checkpoint import load_checkpoint, read_manifest
    from des.data.inputs import WHOLE_FILE
    from des.data.schema import trained_schema
    from des.metrics import auc_or_none, logloss
    from des.predictions import predict_split
    from des.plugins import load_plugins

    folder, manifest = read_manifest(args.checkpoint)
    config = TrainConfig(**manifest["config"])
    load_plugins(config.plugins)
    schema = trained_schema(manifest.get("schema"), args.schema, f"checkpoint {folder}")
    # A raw file is prepared whole (every row in the test split, in input order): the cache entry
    # that --train-data, --validation-data and --test-data use for the same file. With the
    # checkpoint's resolved schema: its quantiles and means are the training data's.
    store = open_data(config, comm, data=args.data, split=WHOLE_FILE, bad_rows=args.bad_rows, schema=schema)
    if store.num_fields != manifest["num_fields"]:
        raise ConfigError(f"{args.data} has {store.num_fields} fields, the checkpoint's model {manifest['num_fields']}")
    split = args.split if Path(args.data).is_dir() else "all"
    # Any checkpoint (of any synchronous strategy, on any number of ranks) is evaluated with DES.
    dense = manifest["model"].get("num_dense", 0)
    if store.num_dense != dense:
        raise ConfigError(f"{args.data} has {store.num_dense} dense features, the checkpoint's model {dense}")
    strategy = build_strategy(config, comm, store.num_fields,
                              [store.distinct_count(f) for f in range(store.num_fields)], strategy="des",
                              loads_tables=True, num_dense=dense)
    load_checkpoint(strategy, args.checkpoint)

    result = predict_split(strategy, store, split, args.batch_size)
    if result is None:
        raise ConfigError(f"{args.data} has no rows in split {split!r}")
    p, y = result
    if comm.rank == 0:
        auc = auc_or_none(y, p, f"{args.data}")
        print(f"rows {y.size}  auc {'n/a' if auc is None else format(auc, '.6f')}  logloss {logloss(y, p):.6f}")
        skipped = store.manifest.get("bad_rows", {}).get("skipped", 0)
        if skipped:  # --bad-rows skip: say which input rows have no prediction
            print(f"skipped {skipped} malformed row(s) (first: {', '.join(store.manifest['bad_rows']['first_skipped'])}); "
                  f"predictions are for the {y.size} other rows, in input order")
        if args.predictions:
            out = Path(args.predictions)
            tmp = out.with_name(out.name + ".tmp")
            # float64 runs keep every digit (%.17g round-trips a double); float32 as before.
            np.savetxt(tmp, p, fmt="%.17g" if p.dtype == np.float64 else "%.8f")
            os.replace(tmp, out)
            print(f"predictions: {out}")
    comm.barrier()
    return 0


if __name__ == "__main__":
    run_main(main, "des.evaluate")
