"""Command line: ``python -m des.data {prepare,synth,inspect} ...`` (``--help`` on each)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from des.errors import DesError
from des.plugins import load_plugins

from .build import DEFAULT_CHUNK_ROWS, on_first_rank, existing_preparation, prepare, prepare_splits
from .errors import DataError
from .schema import BUILT_IN, load_schema
from .split import DEFAULT_SPLIT, check_fractions
from .store import ColumnStore
from .summary import DEFAULT_TOP_K, format_summary
from .synth import DEFAULT_MULTI_HOT_FIELDS, default_config, synthesize_store, synthesize_tsv
from .tsv import BAD_ROW_POLICIES

PROG = "des.data"


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line ``des.data: error: ...`` (exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        _fail(message)


def _report_error(message: str) -> int:
    """Print the one line (rank 0 alone in a job, where every rank fails alike: ``ranks.py``)."""
    if _speaks():
        print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _fail(message: str) -> None:
    sys.exit(_report_error(message))


def _fractions(text: str) -> tuple[float, float, float]:
    try:
        return check_fractions(text)
    except DataError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=PROG, description="Prepare, generate and inspect des column stores.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    default_split = ",".join(str(x) for x in DEFAULT_SPLIT)

    schema_help = (f"dataset schema: built in ({', '.join(BUILT_IN)}; default criteo) or a TOML file "
                   "(docs/data.md)")
    plugins_help = "modules or .py files that register transforms (des.data.register_transform), comma-separated"
    prep = commands.add_parser("prepare", help="validate raw files of a schema and write a column store")
    prep.add_argument("--input", nargs="+", metavar="FILE",
                      help="raw files: Criteo TSV (plain or .gz), or the schema's CSV/TSV (.gz) or Parquet files")
    for role in ("train", "validation", "test"):
        prep.add_argument(f"--{role}", nargs="+", metavar="FILE",
                          help=f"instead of --input/--split: raw files whose rows are all the {role} split (one "
                               "store; the schema's statistics from the --train files only)")
    prep.add_argument("--schema", default="criteo", metavar="NAME|FILE", help=schema_help)
    prep.add_argument("--plugins", default="", metavar="A.py,pkg.mod", help=plugins_help)
    prep.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="a progress bar on stderr (default: when stderr is a terminal)")
    prep.add_argument("--output", required=True, metavar="DIR", help="store directory to create")
    split_help = f"train,validation,test fractions (default {default_split})"
    prep.add_argument("--split", type=_fractions, default=DEFAULT_SPLIT, help=split_help)
    prep.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    prep.add_argument(
        "--bad-rows", choices=BAD_ROW_POLICIES, default="fail", help="fail on the first bad row, or skip and count"
    )
    prep.add_argument(
        "--chunk-rows", type=_positive_int, default=DEFAULT_CHUNK_ROWS, help=f"rows per chunk ({DEFAULT_CHUNK_ROWS})"
    )
    prep.add_argument(
        "--force", action="store_true",
        help="replace an existing store at --output (a store of the same inputs and options is kept as is)",
    )
    _add_synth(commands, plugins_help, split_help)
    inspect = commands.add_parser("inspect", help="summarize a column store")
    inspect.add_argument("directory", help="store directory")
    inspect.add_argument(
        "--top-k", type=_positive_int, default=DEFAULT_TOP_K, metavar="K",
        help=f"show the share of each field's K most frequent ids (default {DEFAULT_TOP_K})",
    )
    return parser


def _add_synth(commands: Any, plugins_help: str, split_help: str) -> None:
    """The ``synth`` command's arguments."""
    synth = commands.add_parser("synth", help="generate synthetic data of a schema with a known oracle")
    synth.add_argument("--rows", type=_positive_int, required=True, help="number of rows")
    synth.add_argument("--output", required=True,
                       help="store directory (--format store) or raw file (--format tsv or raw)")
    synth.add_argument("--seed", type=int, default=0, help="generator and split seed (default 0)")
    synth.add_argument(
        "--format", choices=("store", "tsv", "raw"), default="store",
        help="column store, raw Criteo TSV (.gz for gzip), or (with --schema) a raw file in the schema's format",
    )
    synth.add_argument("--schema", metavar="NAME|FILE",
                       help="dataset schema (built in: " + ", ".join(BUILT_IN) + "; or a TOML file); without it, "
                            "Criteo-shaped data of des.data.synth's generator (the --multi-hot options)")
    synth.add_argument("--plugins", default="", metavar="A.py,pkg.mod", help=plugins_help)
    synth.add_argument("--multi-hot", action="store_true", help=f"make {','.join(DEFAULT_MULTI_HOT_FIELDS)} multi-hot")
    synth.add_argument("--multi-hot-fields", metavar="C1,C2,..", help="categorical fields to make multi-hot")
    synth.add_argument("--max-hot", type=_positive_int, default=4, help="multi-hot rows have 0..k ids (default 4)")
    synth.add_argument("--weighted", action="store_true", help="multi-hot ids carry weights in [0.5, 1.5)")
    synth.add_argument("--vocab-scale", type=float, default=1.0, help="scale every vocabulary size (default 1.0)")
    synth.add_argument("--zipf-scale", type=float, default=1.0,
                       help="multiply every field's Zipf exponent (default 1.0; 0: uniform over each vocabulary, "
                            "so with a large --vocab nearly every id is new)")
    synth.add_argument("--vocab", type=int, default=0,
                       help="every categorical field's vocabulary size, at most 2^32 (default 0: Criteo-like "
                            "sizes times --vocab-scale)")
    synth.add_argument("--positive-rate", type=float, default=0.25, help="target positive rate (default 0.25)")
    synth.add_argument("--latent-dim", type=_positive_int, default=4, help="latent size of the oracle FM (default 4)")
    synth.add_argument("--split", type=_fractions, default=DEFAULT_SPLIT, help=split_help)
    synth.add_argument("--force", action="store_true", help="replace an existing output")


_LAUNCHER_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def _job() -> Any:
    """The job's communicator when this process is one of several ranks (``mpiexec -n N``), else
    None (mpi4py not even imported)."""
    if not any(name in os.environ for name in _LAUNCHER_VARIABLES):
        return None
    from mpi4py import MPI

    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def _speaks() -> bool:
    """Whether this process prints (rank 0 of a job, or alone)."""
    comm = _job()
    return comm is None or comm.Get_rank() == 0


def _run_prepare(args: argparse.Namespace) -> None:
    """Prepare (on every rank of a job, each its share: ``ranks.py``); rank 0 prints."""
    load_plugins(args.plugins)
    comm = _job()
    schema = load_schema(args.schema)
    separate = {role: getattr(args, role) for role in ("train", "validation", "test") if getattr(args, role)}
    if bool(separate) == bool(args.input) or (separate and not args.train):
        raise DataError("give --input FILE.. (split by --split), or --train FILE.. with --validation/--test FILE..")
    if separate and (args.split != DEFAULT_SPLIT or args.seed != 0):
        raise DataError("--split and --seed split the rows of --input; with --train each input's rows are its split")
    progress = args.progress if comm is None else False
    if not args.force:
        existing = on_first_rank(comm, lambda: existing_preparation(
            args.input or [p for role in separate.values() for p in role], args.output, split=args.split,
            seed=args.seed, bad_rows=args.bad_rows, schema=schema,
            roles=[r for r, paths in separate.items() for _ in paths] or None))
        if existing is not None:
            if _speaks():
                print(f"already prepared: {existing.num_rows} rows from the same inputs and options in "
                      f"{existing.path} (nothing to do; --force rebuilds it)")
            return
    if separate:
        store = prepare_splits(separate, args.output, schema=schema, bad_rows=args.bad_rows,
                               chunk_rows=args.chunk_rows, overwrite=args.force, progress=progress, comm=comm)
    else:
        store = prepare(args.input, args.output, schema=schema, split=args.split, seed=args.seed,
                        bad_rows=args.bad_rows, chunk_rows=args.chunk_rows, overwrite=args.force,
                        progress=progress, comm=comm)
    if not _speaks():
        return
    manifest = store.manifest
    bad = manifest["bad_rows"]
    if bad["skipped"]:
        print(
            f"{PROG}: skipped {bad['skipped']} bad rows (first at {', '.join(bad['first_skipped'])}); "
            f"first problem: {bad['first_error']}",
            file=sys.stderr,
        )
    rows = ", ".join(f"{name} {manifest['split']['rows'][name]}" for name in manifest["split"]["names"])
    print(f"prepared {store.num_rows} rows ({rows}), positive rate {manifest['positive_rate']:.4f} -> {store.path}")


def _run_synth(args: argparse.Namespace) -> None:
    load_plugins(args.plugins)
    if args.schema is not None:
        from .synth_schema import synthesize_schema

        schema = load_schema(args.schema)
        if args.format == "tsv" and schema.format.type != "criteo":
            raise DataError(f"--format tsv is Criteo's layout; a {schema.name} file is --format raw")
        args.format = "raw" if args.format == "tsv" else args.format
        info = synthesize_schema(args.output, args.rows, schema, seed=args.seed, split=args.split,
                                 positive_rate=args.positive_rate, file_format=args.format, overwrite=args.force)
        auc = "" if info["oracle_auc"] is None else f", oracle test AUC {info['oracle_auc']:.5f}"
        print(f"wrote {info['rows']} rows of {schema.name}, positive rate {info['positive_rate']:.4f}{auc} "
              f"-> {args.output}")
        return
    if args.format == "raw":
        args.format = "tsv"
    multi_hot: tuple[str, ...] = ()
    if args.multi_hot_fields:
        multi_hot = tuple(name.strip() for name in args.multi_hot_fields.split(",") if name.strip())
    elif args.multi_hot:
        multi_hot = DEFAULT_MULTI_HOT_FIELDS
    config = default_config(
        seed=args.seed, multi_hot_fields=multi_hot, max_hot=args.max_hot, weighted=args.weighted,
        vocab_scale=args.vocab_scale, zipf_scale=args.zipf_scale, categorical_vocab=args.vocab,
        positive_rate=args.positive_rate,
        latent_dim=args.latent_dim,
    )
    if args.format == "tsv":
        info = synthesize_tsv(args.output, args.rows, config, overwrite=args.force)
        print(f"wrote {info['rows']} rows, positive rate {info['positive_rate']:.4f} -> {args.output}")
        return
    store = synthesize_store(args.output, args.rows, config, split=args.split, overwrite=args.force)
    oracle = store.manifest["synthetic"]["oracle"]
    auc = "n/a" if oracle["auc"] is None else f"{oracle['auc']:.5f}"
    rate = store.manifest["positive_rate"]
    print(f"wrote {store.num_rows} rows, positive rate {rate:.4f}, oracle test AUC {auc} -> {store.path}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 error, 130 interrupted)."""
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "prepare":
            _run_prepare(args)
        elif not _speaks():  # synth and inspect: rank 0 of a job alone (one output, one summary)
            return 0
        elif args.command == "synth":
            _run_synth(args)
        else:
            print(format_summary(ColumnStore.open(args.directory), top_k=args.top_k))
    except BrokenPipeError:  # e.g. `inspect DIR | head`: the reader went away, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (DesError, OSError) as error:  # DataError, and a plugin's ConfigError
        return _report_error(str(error).replace("\n", " "))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
