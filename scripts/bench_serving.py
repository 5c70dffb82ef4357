""".venv/bin/python scripts/bench_serving.py [--models deepfm,dcnv2] [--schema-models deepfm] [--batches 1,64,1024,8192]

Serving numbers of exported models (``python -m des.export``), each next to its roofline: the same
network's forward (``des.serving.model.ServedModel.forward``: the substitutions' reference forms
and the top network, with the same weights) as a plain ``tf.function`` on dense inputs (the pooled
embeddings and dense features of the same rows, precomputed), on the same threads. Per model and
batch size: rows/s of the SavedModel's ``serving_default`` and of the roofline, their ratio, and
with ``--stages`` where the SavedModel's time goes: the key transform alone (``request_fields``),
then the lookup and pooling too (``ServedModel.pooled``), each as a ``tf.function`` of its own.
One-row requests: median and p99 latency. The export's time and size (next to the checkpoint's).

Models: ``--models`` trained on the shipped Criteo sample (one epoch, default sizes, one rank),
``--schema-models`` on synthetic rows of ``tests/data/every_kind.toml`` (string, int, multi-valued
and dense columns, buckets and derived fields; ``--schema-rows`` rows to train on, requests from
rows of another seed, so some ids are unknown). Calls alternate (SavedModel, roofline, stages,
call by call, over ``--rounds`` rounds of every model and batch size) and medians are reported,
so a shared machine's load falls on both sides alike. ``--work DIR`` keeps (and reuses) the
trained runs. The SavedModels are loaded with plain ``tf.saved_model.load``.

Expect (a 2-core machine; recorded runs in ``docs/benchmarks.md``, "Serving"): the SavedModel
smaller than the checkpoint (no optimizer slots); at 1024 rows and more the SavedModel at half the
roofline or better; one-row requests in about a millisecond, dominated by TF's per-call overhead.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SCHEMA = REPO / "tests" / "data" / "every_kind.toml"
MISSING_INT = -(2**63)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def criteo_request(rows: int) -> dict:
    """The first ``rows`` rows of the shipped sample as a ``serving_default`` request."""
    import tensorflow as tf

    with gzip.open(REPO / "datasets" / "criteo_sample.txt.gz", "rt") as fh:
        lines = [next(fh).rstrip("\n").split("\t") for _ in range(rows)]
    out = {f"I{i + 1}": tf.constant([int(r[1 + i]) if r[1 + i] else MISSING_INT for r in lines], tf.int64)
           for i in range(13)}
    out.update({f"C{i + 1}": tf.constant([r[14 + i] for r in lines]) for i in range(26)})
    return out


def csv_request(path: Path, signature: dict) -> dict:
    """The rows of a CSV file as a request, each column in its signature's dtype."""
    import tensorflow as tf

    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    out = {}
    for name, spec in signature.items():
        convert, missing = {tf.int64: (int, MISSING_INT), tf.float64: (float, float("nan"))}.get(spec.dtype, (str, ""))
        out[name] = tf.constant([convert(r[name]) if r[name] != "" else missing for r in rows], spec.dtype)
    return out


def train(work: Path, model: str, schema: bool, rows: int) -> Path:
    """The run folder of ``model`` (trained unless ``work`` has it)."""
    run = work / (f"{model}-every_kind" if schema else model)
    if (run / "checkpoints").is_dir():
        return run
    args = [sys.executable, "-m", "des.train", "--model", model, "--epochs", "1", "--no-progress", "--output", str(run)]
    if schema:
        from des.data.synth_schema import synthesize_schema

        if not (work / "every_kind.csv").exists():
            synthesize_schema(work / "every_kind.csv", rows, str(SCHEMA), seed=0, file_format="raw")
            synthesize_schema(work / "every_kind-requests.csv", 8192, str(SCHEMA), seed=1, file_format="raw")
        args += ["--data", str(work / "every_kind.csv"), "--schema", str(SCHEMA), "--cache-dir", str(work / "cache")]
    subprocess.run(args, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return run


class Subject:
    """One exported model: its SavedModel's signature, a request of the largest batch, and the
    same network built by des (the roofline's forward and the stages)."""

    def __init__(self, run: Path, work: Path, largest: int, schema: bool) -> None:
        import tensorflow as tf

        from des.checkpoint import read_manifest, resolve_checkpoint
        from des.config import TrainConfig
        from des.building import build_model
        from des.data.schema import trained_schema
        from des.export import export
        from des.serving.model import ServedModel, request_fields
        from des.serving.state import read_checkpoint

        self.info = export(run, work / f"{run.name}.savedmodel", force=True)
        self.checkpoint_bytes = folder_bytes(resolve_checkpoint(str(run)))
        self.serve = tf.saved_model.load(str(work / f"{run.name}.savedmodel")).signatures["serving_default"]
        signature = self.serve.structured_input_signature[1]
        self.name = f"{self.info['model']['model']}" + (" (every_kind)" if schema else " (criteo)")
        self.request = csv_request(work / "every_kind-requests.csv", signature) if schema else criteo_request(largest)
        folder, manifest = read_manifest(run)
        self.schema = trained_schema(manifest.get("schema"), "", str(folder))
        model = build_model(TrainConfig(**manifest["config"]), manifest["num_fields"],
                            manifest["model"].get("num_dense", 0))
        self.served = served = ServedModel(model, read_checkpoint(folder, manifest, model))
        reads_dense = bool(self.schema.dense_names)

        def pooled(request):
            features = request_fields(self.schema, request)
            size = tf.shape(next(iter(request.values())))[0]
            return served.pooled(features, size), features.dense if reads_dense else None

        def features(request):
            features = request_fields(self.schema, request)
            return features.one_hot, features.multi_valued, features.weights, features.dense

        self.features = tf.function(features)
        self.pooled = tf.function(pooled)
        inputs, dense = self.pooled(self.request)  # the roofline's inputs: the same rows, precomputed
        self.inputs = ({b: tf.constant(v.numpy()) for b, v in inputs.items()},
                       None if dense is None else tf.constant(dense.numpy()))
        # traced for any batch size, as the SavedModel is (a fixed shape would let TF fold more)
        specs = {b: tf.TensorSpec([None, *v.shape[1:]], v.dtype) for b, v in inputs.items()}
        if dense is None:
            self.forward = tf.function(lambda pooled, dense: served.forward(pooled, None),
                                       input_signature=[specs, tf.TensorSpec([None, 0], tf.float32)])
            self.inputs = (self.inputs[0], tf.zeros([len(next(iter(self.request.values()))), 0], tf.float32))
        else:
            self.forward = tf.function(served.forward,
                                       input_signature=[specs, tf.TensorSpec([None, dense.shape[1]], dense.dtype)])

    def batch(self, rows: int) -> tuple[dict, tuple]:
        """The request and the roofline's inputs of the first ``rows`` rows."""
        pooled, dense = self.inputs
        return {k: v[:rows] for k, v in self.request.items()}, ({b: v[:rows] for b, v in pooled.items()}, dense[:rows])


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(subject: Subject, rows: int, calls: int, stages: bool, out: dict) -> None:
    """``calls`` alternating calls of the SavedModel, the roofline (and the stages) on ``rows`` rows,
    their seconds appended to ``out``."""
    request, (pooled, dense) = subject.batch(rows)
    runs = {"savedmodel": lambda: subject.serve(**request)["probability"].numpy(),
            "forward": lambda: subject.forward(pooled, dense).numpy()}
    if stages:
        runs["features"] = lambda: [t.numpy() for t in tf_flat(subject.features(request))]
        runs["pooled"] = lambda: [t.numpy() for t in tf_flat(subject.pooled(request))]
    for call in runs.values():  # warm-up (and tracing)
        call()
    for _ in range(calls):
        for name, call in runs.items():
            out.setdefault(name, []).append(timed(call))


def tf_flat(structure) -> list:
    import tensorflow as tf

    return [t for t in tf.nest.flatten(structure, expand_composites=True) if t is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--models", default="deepfm,dcnv2", help="models trained on the Criteo sample")
    parser.add_argument("--schema-models", default="deepfm", help="models trained on every_kind rows ('' for none)")
    parser.add_argument("--schema-rows", type=int, default=16384)
    parser.add_argument("--batches", default="1,64,1024,8192")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every model and batch size")
    parser.add_argument("--requests", type=int, default=300, help="one-row calls per round")
    parser.add_argument("--stages", action="store_true", help="time the key transform and the pooling alone too")
    parser.add_argument("--work", default="", help="folder for the runs and SavedModels (kept; default: a new one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_serving-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    runs = [(train(work, m, False, 0), False) for m in filter(None, args.models.split(","))]
    runs += [(train(work, m, True, args.schema_rows), True) for m in filter(None, args.schema_models.split(","))]
    subjects = [Subject(run, work, max(batches), schema) for run, schema in runs]
    times: dict[tuple[str, int], dict] = {}
    for _ in range(args.rounds):
        for subject in subjects:
            for rows in batches:
                calls = args.requests if rows == 1 else max(8, 16384 // rows)
                measure(subject, rows, calls, args.stages, times.setdefault((subject.name, rows), {}))
    report(args, subjects, batches, times, work)


def report(args, subjects: list, batches: list[int], times: dict, work: Path) -> None:
    import benchlib

    rows_out, sizes = [], []
    for subject in subjects:
        info = subject.info
        sizes.append({"model": subject.name, "rows": info["rows"], "export_s": info["seconds"],
                      "savedmodel_mib": info["bytes"] / 2**20, "checkpoint_mib": subject.checkpoint_bytes / 2**20})
        for rows in batches:
            t = {k: statistics.median(v) for k, v in times[(subject.name, rows)].items()}
            row = {"model": subject.name, "batch": rows, "savedmodel": rows / t["savedmodel"],
                   "forward": rows / t["forward"], "ratio": t["forward"] / t["savedmodel"],
                   "savedmodel_ms": 1000 * t["savedmodel"], "forward_ms": 1000 * t["forward"]}
            if args.stages:
                row.update(features_ms=1000 * t["features"], pooled_ms=1000 * t["pooled"])
            if rows == 1:
                ordered = sorted(times[(subject.name, rows)]["savedmodel"])
                row["p99_ms"] = 1000 * ordered[int(0.99 * (len(ordered) - 1))]
            rows_out.append(row)
    columns = [("model", "model", ""), ("batch", "batch", "d"), ("savedmodel", "SavedModel rows/s", ",.0f"),
               ("forward", "roofline rows/s", ",.0f"), ("ratio", "ratio", ".2f"),
               ("savedmodel_ms", "SavedModel ms", ".3f"), ("forward_ms", "roofline ms", ".3f")]
    if args.stages:
        columns += [("features_ms", "keys ms", ".3f"), ("pooled_ms", "keys + lookup ms", ".3f")]
    columns += [("p99_ms", "p99 ms (1 row)", ".3f")]
    size_columns = [("model", "model", ""), ("rows", "table rows", ",d"), ("export_s", "export s", ".1f"),
                    ("savedmodel_mib", "SavedModel MiB", ".1f"), ("checkpoint_mib", "checkpoint MiB", ".1f")]
    print(benchlib.entry("bench_serving", benchlib.environment(), sys.argv[1:],
                         [("", columns, rows_out), ("", size_columns, sizes)],
                         [f"medians of alternating calls over {args.rounds} rounds ({args.requests} one-row calls a "
                          f"round); ratio: roofline time / SavedModel time; load average {os.getloadavg()[0]:.2f}.",
                          f"runs and SavedModels in {work}"]))


if __name__ == "__main__":
    main()
