"""Evaluate a trained checkpoint on other data, with any number of ranks.

    .venv/bin/python -m des.evaluate --checkpoint runs/deepfm-.../checkpoints --data FILE.tsv.gz \\
        --predictions preds.txt
    mpirun -n 2 .venv/bin/python -m des.evaluate --checkpoint ... --data ...

Prints AUC, logloss and the row count; ``--predictions`` writes one click probability per input row,
in input order. Ids never seen in training are looked up without being inserted (they contribute
their deterministic initial value, zero, or the field's shared row, as the model was trained with
``--unadmitted``). ``--importance`` also permutes each field (and dense feature) over the evaluated
rows, one at a time, and reports how much AUC and logloss worsen (``des/importance.py``): a table,
and ``importance.csv``/``.json`` (``.png`` with matplotlib) next to the predictions. In a notebook,
``des.load(checkpoint)`` does all this on DataFrames (``des/api.py``).
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
    parser.add_argument("--importance", nargs="?", const="", default=None, metavar="DIR",
                        help="permute each field over the evaluated rows (a seeded permutation, the same on any "
                        "number of ranks) and report the AUC and logloss drops: a table, and importance.csv/.json "
                        "(and .png with matplotlib) in DIR (default: --predictions' folder, else the current one)")
    parser.add_argument("--importance-seed", type=int, default=0, help="seed of --importance's permutations")
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

    from des.building import open_data
    from des.data.inputs import WHOLE_FILE
    from des.metrics import auc_or_none, logloss
    from des.predictions import predict_split

    config, manifest, schema = read_checkpoint(args.checkpoint, args.schema)
    # A raw file is prepared whole (every row in the test split, in input order): the cache entry
    # that --train-data, --validation-data and --test-data use for the same file. With the
    # checkpoint's resolved schema: its quantiles and means are the training data's.
    store = open_data(config, comm, data=args.data, split=WHOLE_FILE, bad_rows=args.bad_rows, schema=schema)
    check_data(store, manifest, args.data)
    split = args.split if Path(args.data).is_dir() else "all"
    strategy = load_model(args.checkpoint, config, manifest, comm,
                          distinct=[store.distinct_count(f) for f in range(store.num_fields)])

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
    if args.importance is not None:
        report_importance(strategy, store, split, args, (p, y))
    comm.barrier()
    return 0


def read_checkpoint(checkpoint: str | Path, schema: str = "") -> tuple[TrainConfig, dict, object]:
    """A checkpoint's training config (its ``--plugins`` loaded), manifest and resolved schema
    (``schema``: a ``--schema`` given anyway, which must declare the same)."""
    from des.checkpoint import read_manifest
    from des.data.schema import trained_schema
    from des.plugins import load_plugins

    folder, manifest = read_manifest(checkpoint)
    config = TrainConfig(**manifest["config"])
    load_plugins(config.plugins)
    return config, manifest, trained_schema(manifest.get("schema"), schema, f"checkpoint {folder}")


def check_data(store, manifest: dict, data: str) -> None:
    """The data has the fields and dense features of the checkpoint's model."""
    if store.num_fields != manifest["num_fields"]:
        raise ConfigError(f"{data} has {store.num_fields} fields, the checkpoint's model {manifest['num_fields']}")
    dense = manifest["model"].get("num_dense", 0)
    if store.num_dense != dense:
        raise ConfigError(f"{data} has {store.num_dense} dense features, the checkpoint's model {dense}")


def load_model(checkpoint: str | Path, config: TrainConfig, manifest: dict, comm: Communicator, *,
               distinct: list[int] | None = None):
    """The checkpoint's model as a ``des`` strategy on ``comm`` (collective), its tables loaded: any
    checkpoint (of any synchronous strategy, on any number of ranks) is evaluated with DES. Its
    fields are placed by ``distinct`` (the data's distinct ids per field; None: all on one rank)."""
    from des.building import build_strategy
    from des.checkpoint import load_checkpoint

    fields = manifest["num_fields"]
    placement = [list(range(fields))] if distinct is None and comm.size == 1 else None
    strategy = build_strategy(config, comm, fields, distinct or [1] * fields, strategy="des", loads_tables=True,
                              placement=placement, num_dense=manifest["model"].get("num_dense", 0))
    load_checkpoint(strategy, checkpoint)
    return strategy


def report_importance(strategy, store, split: str, args, predicted) -> None:
    """``--importance``: the permutation importance of each input (collective), its table printed
    and its files written by rank 0."""
    from des.importance import format_table, permutation_importance, write_importance

    records = permutation_importance(strategy, store, split, args.batch_size, seed=args.importance_seed,
                                     predicted=predicted)
    if strategy.comm.rank == 0:
        folder = Path(args.importance or (Path(args.predictions).parent if args.predictions else "."))
        print(format_table(records))
        about = {"checkpoint": str(args.checkpoint), "data": str(args.data), "split": split, "rows": int(predicted[1].size),
                 "seed": args.importance_seed}
        for path in write_importance(records, folder, about=about):
            print(f"importance: {path}")


if __name__ == "__main__":
    run_main(main, "des.evaluate")
