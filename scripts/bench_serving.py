""".venv/bin/python scripts/bench_serving.py [--models deepfm,dcnv2] [--schema-models deepfm] [--batches 1,64,1024,8192]
       [--rounds 3] [--baseline CHECKOUT] [--threads N] [--stages] [--profile] [--work DIR]

Serving numbers of exported models (``python -m des.export``), each next to its roofline: the same
network's forward (``des.serving.model.ServedModel.forward``: the substitutions' reference forms
and the top network, with the same weights) as a plain ``tf.function`` on dense inputs (the pooled
embeddings and dense features of the same rows, precomputed), on the same threads, traced for any
batch size as the SavedModel is. Per model and batch size: rows/s of the SavedModel's
``serving_default`` (named columns) and of the roofline and their ratio, and of its ``examples``
signature on the same rows as serialized ``tf.Example`` s (serialized before the timing, as a
server receives them: ``examples/serving_client.py``'s ``serialized_examples``); the roofline traced per batch size too
("fixed-shape", which lets TF fold what depends on the shape alone, such as FM's pair mask: a
bound no SavedModel reaches); with ``--baseline`` the SavedModels that another checkout's
``des.export`` writes of the same checkpoints (before and after in one run); with ``--stages``
where the time goes: the key transform alone (``request_fields``), then the lookup and pooling too
(``ServedModel.pooled``), each a ``tf.function`` of its own; with ``--profile`` per-op timings of
each SavedModel (TF's step stats, the op types that take the most and the op runs a call: a
count that load does not change; both signatures). One-row requests: median and p99 latency.
"empty SavedModel": a SavedModel with the same named inputs (and an ``examples`` signature of one
string) that computes nothing, called the same way: the floor of a call through
``tf.saved_model.load``'s signature (binding and checking the named tensors in Python, then the
function call), which a model server's C++ ``Session::Run`` does not pay. The export's time and
size (next to the checkpoint's).

Models: ``--models`` trained on the shipped Criteo sample (one epoch, default sizes, one rank),
``--schema-models`` on synthetic rows of ``tests/data/every_kind.toml`` (string, int, multi-valued
and dense columns, buckets and derived fields; ``--schema-rows`` rows to train on, requests from
rows of another seed, so some ids are unknown). Calls alternate (each side in turn, call by call,
over ``--rounds`` rounds of every model and batch size) and medians are reported, so a shared
machine's load falls on all sides alike. ``--work DIR`` keeps (and reuses) the trained runs. The
SavedModels are loaded with plain ``tf.saved_model.load``; inter-op threads 1.

Expect (a 2-core machine; recorded runs in ``docs/benchmarks.md``, "Serving"): the SavedModel
smaller than the checkpoint (no optimizer slots); at 1024 rows and more the SavedModel at half the
roofline or better (the fixed-shape one: about half); one-row requests in 1-2 ms with other jobs
on the machine, about 0.6 ms of it the empty SavedModel's (the Python signature's binding of 39
named inputs), most of the rest the MLP's matrix products and TF's cost per op run; through
``examples`` about 0.4 ms less (one input to bind; the parse is one op).
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
sys.path.insert(0, str(REPO / "examples"))
EXAMPLES = "examples"  # the SavedModel's signature of serialized tf.Examples, and its input
SCHEMA = REPO / "tests" / "data" / "every_kind.toml"
MISSING_INT = -(2**63)


def serialized_examples(request: dict):
    """The rows of a named request as serialized ``tf.Example`` s (``examples/serving_client.py``'s)."""
    from serving_client import serialized_examples as examples_of

    return examples_of(request)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def empty_savedmodel(signature: dict, folder: Path):
    """The floor of a call: a SavedModel with the same named inputs that computes nothing (zeros of
    the batch's length), saved and loaded as the export is; its ``serving_default``."""
    import tensorflow as tf

    module = tf.Module()
    specs = [tf.TensorSpec(spec.shape, spec.dtype, name=name) for name, spec in signature.items()]

    @tf.function(input_signature=specs, autograph=False)
    def serving_default(*columns):
        return {"probability": tf.zeros(tf.shape(columns[0]), tf.float32)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False)
    def examples(serialized):
        return {"probability": tf.zeros(tf.shape(serialized), tf.float32)}

    tf.saved_model.save(module, str(folder), signatures={"serving_default": serving_default, "examples": examples})
    return tf.saved_model.load(str(folder)).signatures


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

    def __init__(self, run: Path, work: Path, largest: int, schema: bool, baseline: str = "") -> None:
        import tensorflow as tf

        from des.checkpoint import read_manifest, resolve_checkpoint
        from des.config import TrainConfig
        from des.building import build_model
        from des.data.schema import trained_schema
        from des.export import export
        from des.serving.model import ServedModel, request_fields
        from des.serving.state import read_checkpoint

        self.folder = work / f"{run.name}.savedmodel"
        self.info = export(run, self.folder, force=True)
        self.checkpoint_bytes = folder_bytes(resolve_checkpoint(str(run)))
        signatures = tf.saved_model.load(str(work / f"{run.name}.savedmodel")).signatures
        self.serve, self.serve_examples = signatures["serving_default"], signatures["examples"]
        signature = self.serve.structured_input_signature[1]
        empty = empty_savedmodel(signature, work / f"{run.name}.empty.savedmodel")
        self.empty, self.empty_examples = empty["serving_default"], empty["examples"]
        self.baseline = self.baseline_folder = None
        if baseline:  # the same checkpoint exported by another checkout's des.export
            folder = work / f"{run.name}.baseline.savedmodel"
            subprocess.run([sys.executable, "-m", "des.export", "--checkpoint", str(run), "--output", str(folder),
                            "--force"], cwd=baseline, env={**os.environ, "PYTHONPATH": baseline}, check=True,
                           stdout=subprocess.DEVNULL)
            self.baseline = tf.saved_model.load(str(folder)).signatures["serving_default"]
            self.baseline_folder = folder
            self.baseline_bytes = folder_bytes(folder)
        self.name = f"{self.info['model']['model']}" + (" (every_kind)" if schema else " (criteo)")
        self.request = csv_request(work / "every_kind-requests.csv", signature) if schema else criteo_request(largest)
        self.examples = serialized_examples(self.request)  # the same rows, one tf.Example each
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
        # traced for any batch size, as the SavedModel is; ``forward_static``: traced per batch size,
        # which lets TF fold what depends on the shape alone (a bound no SavedModel reaches)
        self.forward_static = tf.function(served.forward)
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
        return ({**{k: v[:rows] for k, v in self.request.items()}, EXAMPLES: self.examples[:rows]},
                ({b: v[:rows] for b, v in pooled.items()}, dense[:rows]))


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(subject: Subject, rows: int, calls: int, stages: bool, out: dict) -> None:
    """``calls`` alternating calls of the SavedModel (both signatures), the roofline (and the stages)
    on ``rows`` rows, their seconds appended to ``out``."""
    both, (pooled, dense) = subject.batch(rows)
    request, examples = {k: v for k, v in both.items() if k != EXAMPLES}, both[EXAMPLES]
    runs = {"savedmodel": lambda: subject.serve(**request)["probability"].numpy(),
            "examples": lambda: subject.serve_examples(examples=examples)["probability"].numpy(),
            "forward": lambda: subject.forward(pooled, dense).numpy(),
            "static": lambda: subject.forward_static(pooled, dense if subject.schema.dense_names else None).numpy()}
    runs["empty"] = lambda: subject.empty(**request)["probability"].numpy()
    runs["empty_examples"] = lambda: subject.empty_examples(examples=examples)["probability"].numpy()
    if subject.baseline is not None:
        runs["baseline"] = lambda: subject.baseline(**request)["probability"].numpy()
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


def profile_ops(folder: Path, request: dict, calls: int, threads: int, signature_name: str = "serving_default"
                ) -> tuple[float, int, list] | None:
    """Per-op timings of a SavedModel's ``signature_name`` on ``request`` (its inputs by name; TF's
    step stats of a traced session run, the SavedModel loaded as a graph): the median over
    ``calls`` traced calls of the summed op time, the op runs a call, and per op type its median
    ms and runs a call; None if the SavedModel has no such signature."""
    import collections

    import tensorflow as tf

    graph = tf.Graph()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=1)
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=config) as session:
        signatures = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(folder)).signature_def
        if signature_name not in signatures:
            return None
        signature = signatures[signature_name]
        feed = {signature.inputs[k].name: v.numpy() for k, v in request.items() if k in signature.inputs}
        output = signature.outputs["probability"].name
        for _ in range(3):
            session.run(output, feed)
        totals, per_op, runs = [], collections.defaultdict(list), 0
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        for _ in range(calls):
            metadata, ops = tf.compat.v1.RunMetadata(), collections.Counter()
            session.run(output, feed, options=options, run_metadata=metadata)
            counts = collections.Counter()
            for node in (n for device in metadata.step_stats.dev_stats for n in device.node_stats):
                op = node.timeline_label.split(" = ")[1].split("(")[0] if " = " in node.timeline_label else node.node_name
                ops[op] += node.op_end_rel_micros - node.op_start_rel_micros
                counts[op] += 1
            totals.append(sum(ops.values()) / 1000)
            runs = sum(counts.values())
            for op in ops:
                per_op[op].append((ops[op] / 1000, counts[op]))
    ranked = sorted(((statistics.median(t for t, _ in v), v[0][1], op) for op, v in per_op.items()), reverse=True)
    return statistics.median(totals), runs, ranked


def print_profiles(subjects: list, batches: list[int], threads: int) -> None:
    """``--profile``: per model and batch size, the op types that take the most time."""
    for subject in subjects:
        for name, folder in (("SavedModel", subject.folder), ("baseline", subject.baseline_folder)):
            if folder is None:
                continue
            for rows, signature in ((rows, s) for rows in batches for s in ("serving_default", EXAMPLES)):
                request, _ = subject.batch(rows)
                profile = profile_ops(folder, request, 5 if rows >= 1024 else 20, threads, signature)
                if profile is None:
                    continue
                total, runs, ranked = profile
                top = "; ".join(f"{op} {ms:.3f} ms x{n}" for ms, n, op in ranked[:14])
                print(f"profile {subject.name} {name} ({signature}), {rows} rows: {total:.3f} ms summed over "
                      f"{runs} op runs; {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--models", default="deepfm,dcnv2", help="models trained on the Criteo sample")
    parser.add_argument("--schema-models", default="deepfm", help="models trained on every_kind rows ('' for none)")
    parser.add_argument("--schema-rows", type=int, default=16384)
    parser.add_argument("--batches", default="1,64,1024,8192")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every model and batch size")
    parser.add_argument("--requests", type=int, default=300, help="one-row calls per round")
    parser.add_argument("--stages", action="store_true", help="time the key transform and the pooling alone too")
    parser.add_argument("--baseline", default="", help="a checkout of another commit: its des.export's SavedModels "
                        "timed too, alternating (before and after in one run)")
    parser.add_argument("--threads", type=int, default=0, help="TF intra-op threads (default: TF's, one per core)")
    parser.add_argument("--profile", action="store_true", help="per-op timings of each SavedModel (TF's step stats)")
    parser.add_argument("--work", default="", help="folder for the runs and SavedModels (kept; default: a new one)")
    args = parser.parse_args()
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_serving-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    runs = [(train(work, m, False, 0), False) for m in filter(None, args.models.split(","))]
    runs += [(train(work, m, True, args.schema_rows), True) for m in filter(None, args.schema_models.split(","))]
    baseline = str(Path(args.baseline).resolve()) if args.baseline else ""
    subjects = [Subject(run, work, max(batches), schema, baseline) for run, schema in runs]
    times: dict[tuple[str, int], dict] = {}
    for _ in range(args.rounds):
        for subject in subjects:
            for rows in batches:
                calls = args.requests if rows == 1 else max(8, 16384 // rows)
                measure(subject, rows, calls, args.stages, times.setdefault((subject.name, rows), {}))
    report(args, subjects, batches, times, work)
    if args.profile:
        print_profiles(subjects, batches, args.threads or os.cpu_count())


def report(args, subjects: list, batches: list[int], times: dict, work: Path) -> None:
    import benchlib

    rows_out, sizes = [], []
    for subject in subjects:
        info = subject.info
        sizes.append({"model": subject.name, "rows": info["rows"], "export_s": info["seconds"],
                      "savedmodel_mib": info["bytes"] / 2**20, "checkpoint_mib": subject.checkpoint_bytes / 2**20,
                      "baseline_mib": subject.baseline_bytes / 2**20 if subject.baseline is not None else None})
        for rows in batches:
            t = {k: statistics.median(v) for k, v in times[(subject.name, rows)].items()}
            row = {"model": subject.name, "batch": rows, "savedmodel": rows / t["savedmodel"],
                   "forward": rows / t["forward"], "ratio": t["forward"] / t["savedmodel"],
                   "savedmodel_ms": 1000 * t["savedmodel"], "forward_ms": 1000 * t["forward"],
                   "static": rows / t["static"], "static_ratio": t["static"] / t["savedmodel"],
                   "empty_ms": 1000 * t["empty"], "examples": rows / t["examples"],
                   "examples_ratio": t["forward"] / t["examples"], "examples_ms": 1000 * t["examples"],
                   "empty_examples_ms": 1000 * t["empty_examples"]}
            if subject.baseline is not None:
                row.update(baseline=rows / t["baseline"], baseline_ratio=t["forward"] / t["baseline"])
            if args.stages:
                row.update(features_ms=1000 * t["features"], pooled_ms=1000 * t["pooled"])
            if rows == 1:
                for key, name in (("p99_ms", "savedmodel"), ("examples_p99_ms", "examples")):
                    ordered = sorted(times[(subject.name, rows)][name])
                    row[key] = 1000 * ordered[int(0.99 * (len(ordered) - 1))]
            rows_out.append(row)
    columns = [("model", "model", ""), ("batch", "batch", "d"), ("savedmodel", "SavedModel rows/s", ",.0f"),
               ("forward", "roofline rows/s", ",.0f"), ("ratio", "ratio", ".2f"),
               ("savedmodel_ms", "SavedModel ms", ".3f"), ("forward_ms", "roofline ms", ".3f"),
               ("static", "fixed-shape roofline rows/s", ",.0f"), ("static_ratio", "its ratio", ".2f")]
    if args.baseline:
        columns[3:3] = [("baseline", "baseline rows/s", ",.0f"), ("baseline_ratio", "baseline ratio", ".2f")]
    if args.stages:
        columns += [("features_ms", "keys ms", ".3f"), ("pooled_ms", "keys + lookup ms", ".3f")]
    columns += [("empty_ms", "empty SavedModel ms", ".3f"), ("p99_ms", "p99 ms (1 row)", ".3f"),
                ("examples", "examples rows/s", ",.0f"), ("examples_ratio", "examples ratio", ".2f"),
                ("examples_ms", "examples ms", ".3f"), ("empty_examples_ms", "empty SavedModel's examples ms", ".3f"),
                ("examples_p99_ms", "examples p99 ms (1 row)", ".3f")]
    size_columns = [("model", "model", ""), ("rows", "table rows", ",d"), ("export_s", "export s", ".1f"),
                    ("savedmodel_mib", "SavedModel MiB", ".1f"), ("checkpoint_mib", "checkpoint MiB", ".1f"),
                    ("baseline_mib", "baseline SavedModel MiB", ".1f")]
    print(benchlib.entry("bench_serving", benchlib.environment(), sys.argv[1:],
                         [("", columns, rows_out), ("", size_columns, sizes)],
                         [f"medians of alternating calls over {args.rounds} rounds ({args.requests} one-row calls a "
                          f"round); ratio: roofline time / SavedModel time; load average {os.getloadavg()[0]:.2f}.",
                          f"runs and SavedModels in {work}"]))


if __name__ == "__main__":
    main()
