"""Export a trained checkpoint as a TensorFlow SavedModel that serves raw requests.

    .venv/bin/python -m des.export --checkpoint runs/deepfm-.../checkpoints --output exported/deepfm [--force]

The SavedModel's ``serving_default`` signature takes one batch of requests as named 1-D inputs of
equal length, one per raw column the data's schema reads (the checkpoint records it), and returns
``{"probability": [batch]}`` in the model's dtype (float32 by default):

* Criteo (the default schema): ``I1`` .. ``I13`` int64 (a missing value is ``-2**63``,
  ``MISSING_INT``) and ``C1`` .. ``C26`` strings (8 hex digits in either case, or ``""`` for
  missing). (The one integer a request cannot carry is -2**63 itself, which training clips like
  any value below -2**31.)
* any other schema: each read column in its declared dtype, int64 (missing ``-2**63``), float64
  (missing NaN) or string (missing ``""``); a multi-valued column as its delimited text
  (``"Action|Comedy"``). ``des_export.json`` lists them.

Its ``examples`` signature takes the same rows as one string input ``examples``, a serialized
``tf.Example`` a row (each column a feature of its name; ``des.serving.model.parsed_examples``),
and returns the same ``probability``.

What is inside, as plain TensorFlow ops and variables (loading it needs TensorFlow only, never
des), is ``des.serving``'s: ``des/serving/model.py`` builds the graph from what
``des/serving/state.py`` reads of the checkpoint. This module is the command line and the writing:
a SavedModel built in a hidden folder, verified, synced and renamed into place, and the numbered
versions of ``des.train --export-every``.

A request with a missing or extra column, or a column of another type, is refused by the signature;
a value the key transform cannot read (a Criteo categorical that is not 8 hex digits, a timestamp
not in its format) or columns of unequal length fail with an ``InvalidArgumentError`` naming the
column. The checkpoint may come from any number of ranks and any strategy: only its per-field files
are read, one field at a time, on one process.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from des import runtime  # noqa: F401  (quiets TensorFlow before it is imported)
from des.collectives import run_main
from des.data.features import MISSING_INT  # an integer column's "missing" in a request
from des.errors import ArgumentParser, ConfigError, DesError, UsageError
from des.hashtable.tf_init import initial_values  # noqa: F401  (des.export's names)
from des.serving.model import EXAMPLES, ROW_DTYPES, build_module, describe_inputs, request_signature, signatures
from des.serving.state import read_checkpoint


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="des.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder, checkpoints/ folder or run folder")
    parser.add_argument("--output", required=True, help="SavedModel folder to create")
    parser.add_argument("--force", action="store_true", help="replace an existing --output folder")
    parser.add_argument("--schema", default="", help="the data's schema (default: the checkpoint's; another is "
                        "refused)")
    parser.add_argument("--export-dtype", default="float32", choices=ROW_DTYPES,
                        help="table rows as trained (float32) or int8 with a scale and offset per row and block, "
                        "dequantized inside the SavedModel (a quarter of the rows' bytes)")
    return parser


def export(checkpoint: str | Path, output: str | Path, *, force: bool = False, schema: str = "",
           export_dtype: str = "float32") -> dict[str, Any]:
    """Write the SavedModel of ``checkpoint`` to ``output`` (atomically); returns what was written.
    ``schema``: a ``--schema`` given by the user, which must be the checkpoint's; ``export_dtype``:
    how the table rows are held (``des.serving.model.ROW_DTYPES``)."""
    start = time.perf_counter()
    output = Path(output).resolve()
    if output.exists() and not force:
        raise ConfigError(f"output folder {output} exists (use --force to replace it)")
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    info = write_savedmodel(checkpoint, tmp, schema, export_dtype)
    _put_in_place(tmp, output, output.with_name(f".{output.name}.old-{os.getpid()}"))
    info["seconds"] = time.perf_counter() - start
    info["bytes"] = sum(p.stat().st_size for p in output.rglob("*") if p.is_file())
    return info


def write_savedmodel(checkpoint: str | Path, folder: Path, schema: str = "", export_dtype: str = "float32"
                     ) -> dict[str, Any]:
    """Write the SavedModel of ``checkpoint`` and its ``des_export.json`` into ``folder`` (replaced
    if present; the caller renames it into place), verified and synced; returns the json's content.
    A bad checkpoint fails before anything is written."""
    import tensorflow as tf

    from des.checkpoint import read_manifest
    from des.config import TrainConfig
    from des.data.schema import trained_schema
    from des.plugins import load_plugins
    from des.building import build_model

    folder, (checkpoint, manifest) = Path(folder), read_manifest(checkpoint)
    config = TrainConfig(**manifest["config"])
    load_plugins(config.plugins)  # a user model (or a schema's transform) is rebuilt from its plugin
    data_schema = trained_schema(manifest.get("schema"), schema, f"checkpoint {checkpoint}")
    if len(data_schema.field_names) != manifest["num_fields"]:
        raise ConfigError(f"checkpoint {checkpoint} has {manifest['num_fields']} fields; its schema "
                          f"{data_schema.name!r} has {len(data_schema.field_names)}")
    model = build_model(config, manifest["num_fields"], manifest["model"].get("num_dense", 0))
    state = read_checkpoint(checkpoint, manifest, model)
    module = build_module(model, state, data_schema, export_dtype)

    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    tf.saved_model.save(module, str(folder), signatures=signatures(module))
    info = {"checkpoint": str(checkpoint), "step": manifest["step"], "ranks": manifest["ranks"],
            "model": manifest["model"], "dtype": manifest["dtype"], "rows": int(state["offsets"][-1]),
            "unadmitted": state["unadmitted"], "min_count": state["min_count"], "missing_int": MISSING_INT,
            "schema": data_schema.to_dict(), "inputs": describe_inputs(data_schema),
            "outputs": {"probability": manifest["dtype"]}, "rows_dtype": export_dtype}
    (folder / "des_export.json").write_text(json.dumps(info, indent=1))
    _verify_savedmodel(folder, set(request_signature(data_schema)))
    _sync_tree(folder)
    return info


def _verify_savedmodel(folder: Path, inputs: set[str]) -> None:
    """What a model server reads first, read back: the graph parses, its ``serving_default``
    takes ``inputs`` and its ``examples`` one string, both return ``probability``; the variables'
    index is there."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((folder / "saved_model.pb").read_bytes())
    defs = saved.meta_graphs[0].signature_def
    wanted = {"serving_default": inputs, EXAMPLES: {EXAMPLES}}
    if any(name not in defs or set(defs[name].inputs) != names or set(defs[name].outputs) != {"probability"}
           for name, names in wanted.items()) or not (folder / "variables" / "variables.index").is_file():
        raise DesError(f"the SavedModel written to {folder} is incomplete: not putting it in place")


def _sync_tree(folder: Path) -> None:
    """fsync every file and folder below ``folder``: a rename must never publish a folder whose
    contents a crash of the machine could still lose."""
    for path in [*folder.rglob("*"), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _put_in_place(tmp: Path, final: Path, old: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` is moved to ``old`` first and deleted
    last, so a crash leaves the old folder or the new one under ``final``, never half of one."""
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------- versions
# des.train --export-every: numbered SavedModels in TF Serving's layout (it serves the highest
# numeric subfolder and ignores others, so hidden names hide what is not complete).
_LEFTOVER_PREFIXES = (".tmp-", ".old-", ".del-")


def check_export_dir(path: str) -> Path:
    """``--export-dir`` resolved; a one-line :class:`ConfigError` if it is a file or cannot be
    written (nothing is created: the first export creates it)."""
    root = Path(path).resolve()
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ConfigError(f"--export-dir {root}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--export-dir {root} is not writable: {existing} is not a writable directory")
    return root


def exported_versions(root: Path) -> list[int]:
    """The versions in ``root`` (its numeric subfolders), in increasing order."""
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isascii() and p.name.isdigit() and p.is_dir())


def export_version(checkpoint: str | Path, root: Path, version: int, keep: int = 0, export_dtype: str = "float32"
                   ) -> dict[str, Any]:
    """Write ``checkpoint`` as ``root/<version>/`` (built in ``root/.tmp-<version>``, verified,
    then renamed into place; what a crashed export left is removed first). The new version is then
    the highest: versions above it (of a job that got further before this one resumed from an
    earlier checkpoint, or the steps after the best one an early stop went back to) are removed,
    and with ``keep`` all but the newest ``keep``; ``export_dtype`` as :func:`export`'s. Returns
    ``{"version", "step", "path"}`` and ``bytes``, ``seconds``, ``removed``."""
    start = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.iterdir():
        if leftover.name.startswith(_LEFTOVER_PREFIXES):
            shutil.rmtree(leftover, ignore_errors=True)
    final = root / str(version)
    info = write_savedmodel(checkpoint, root / f".tmp-{version}", export_dtype=export_dtype)
    _put_in_place(root / f".tmp-{version}", final, root / f".old-{version}")
    versions = exported_versions(root)
    removed = [v for v in versions if v > version]
    if keep:  # the newest ``keep`` are this one and the ``keep - 1`` below it
        below = [v for v in versions if v < version]
        removed += below[: max(len(below) - (keep - 1), 0)]
    for v in removed:  # hidden by a rename first: a deletion cut short is never served
        os.replace(root / str(v), root / f".del-{v}")
        shutil.rmtree(root / f".del-{v}", ignore_errors=True)
    return {"version": version, "step": info["step"], "path": str(final), "removed": removed,
            "bytes": sum(p.stat().st_size for p in final.rglob("*") if p.is_file()),
            "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.output.strip():
        raise UsageError("--output must name a folder")
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() > 1:  # every rank would write the same folder
        raise UsageError("des.export runs on one process: start it without mpiexec")
    runtime.configure_threads()
    info = export(args.checkpoint, args.output, force=args.force, schema=args.schema, export_dtype=args.export_dtype)
    print(f"exported {info['model']['model']} (step {info['step']}, written by {info['ranks']} rank(s), "
          f"{info['rows']} rows) to {args.output}: {info['bytes'] / 2**20:.1f} MiB in {info['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    run_main(main, "des.export")
