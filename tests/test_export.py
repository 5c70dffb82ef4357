"""``python -m des.export``: a SavedModel that a process without des loads and that predicts what
``des.evaluate --predictions`` predicts, for every built-in model, from 1-rank and 2-rank checkpoints,
with unknown ids and missing values; the key transform and initial values as TF ops; bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, criteo_head, mpi_env, run_mpi

SMALL = ["--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "256", "--eval-batch-size", "1024",
         "--no-progress", "--table-capacity", "256", "--max-steps", "6"]
# (name, model, ranks, flags): one run per model, 1 and 2 ranks, both strategies that checkpoint,
# all three unknown-id behaviours, with admission. (Checkpoints hold one file per field whatever the
# rank count; one multi-rank run shows the export reads what several ranks wrote.)
RUNS = [
    ("deepfm-2", "deepfm", 2, ["--strategy", "alltoall", "--unadmitted", "init"]),
    ("wdl-1", "wdl", 1, ["--min-count", "2", "--unadmitted", "init"]),
    ("fm-1", "fm", 1, ["--unadmitted", "zero", "--min-count", "2"]),
    ("lr-1", "lr", 1, []),  # its defaults: --min-count 2 --unadmitted shared
]

# Rows a service may receive: unknown ids (either case), missing values, integer edge values.
EDITED = [
    "1\t" + "\t" * 12 + "\t" * 26,  # everything missing
    "0\t0\t1\t2\t3\t-1\t-2147483649\t2147483648\t9223372036854775807\t-9223372036854775807\t20\t1000000\t7\t55"
    "\tdeadbeef\tDEADBEEF\t00000000\tffffffff" + "\t" * 22,
    "1\t3\t\t\t4\t\t\t\t\t\t\t\t\t5\t" + "\t".join(["0badc0de"] * 26),
]


def _edited_rows(source: Path, out: Path) -> Path:
    lines = source.read_text().splitlines()[:300]
    # Real rows with one categorical value replaced by an id no model has seen.
    changed = []
    for i, line in enumerate(lines[:20]):
        cols = line.split("\t")
        cols[14 + i % 26] = f"{0xabc00000 + i:08x}"
        changed.append("\t".join(cols))
    out.write_text("\n".join(lines + changed + EDITED) + "\n")
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """Train each run, predict the edited rows with des.evaluate, export, and serve them without des."""
    from des import evaluate, export, train

    root = tmp_path_factory.mktemp("export")
    criteo_head(root / "small.tsv", 2000)
    rows = _edited_rows(root / "small.tsv", root / "requests.tsv")
    models, expected = [], {}
    for name, model, ranks, flags in RUNS:
        args = ["--data", str(root / "small.tsv"), "--cache-dir", str(root / "cache"), "--output", str(root / name),
                "--model", model, *SMALL, *flags]
        if ranks == 1:
            train.main(args)  # in this process: no second TensorFlow start-up
        else:
            run_mpi(ranks, ["-m", "des.train", *args])
        evaluate.main(["--checkpoint", str(root / name), "--data", str(rows), "--cache-dir", str(root / "cache"),
                       "--predictions", str(root / f"{name}.evaluate.txt")])
        expected[name] = np.loadtxt(root / f"{name}.evaluate.txt")
        export.main(["--checkpoint", str(root / name), "--output", str(root / f"{name}.savedmodel")])
        models.append(str(root / f"{name}.savedmodel"))
    # and the 2-rank run with 8-bit rows (test_int8_rows_serve_close_to_float32_in_a_smaller_export), served last
    export.main(["--checkpoint", str(root / "deepfm-2"), "--output", str(root / "deepfm-2.int8"), "--export-dtype",
                 "int8"])
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "serving_client.py"), "--examples", str(rows),
                           str(root / "served-"), *models, str(root / "deepfm-2.int8")], cwd=root, env=mpi_env(1),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    served = {name: np.loadtxt(root / f"served-{i}.txt") for i, (name, *_) in enumerate([*RUNS, ("int8",)])}
    examples = {name: np.loadtxt(root / f"served-{i}.examples.txt") for i, (name, *_) in enumerate(RUNS)}
    return {"root": root, "expected": expected, "served": served, "examples": examples, "rows": rows}


@pytest.mark.parametrize("name", [r[0] for r in RUNS])
def test_served_probabilities_equal_evaluate(exported: dict, name: str) -> None:
    expected, served = exported["expected"][name], exported["served"][name]
    assert served.shape == expected.shape == (300 + 20 + len(EDITED),)
    # --predictions keeps 8 decimals: 1e-6 is the float32 bound docs/serving.md promises.
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", [r[0] for r in RUNS])
def test_examples_signature_serves_the_same_probabilities(exported: dict, name: str) -> None:
    """The ``examples`` signature (each row one serialized ``tf.Example``, missing values left out)
    predicts what ``des.evaluate`` does, and exactly what ``serving_default`` does."""
    served, expected = exported["examples"][name], exported["expected"][name]
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(served, exported["served"][name])


def test_unknown_ids_and_missing_values_matter(exported: dict) -> None:
    """The edited rows are not all predicted alike: unknown ids take their init (or zero) values."""
    served = exported["served"]["deepfm-2"]
    assert len(set(np.round(served[-3:], 7))) == 3


def test_shared_row_serves_unknown_and_unadmitted_ids(exported: dict) -> None:
    """``--unadmitted shared``: an id seen in training but not admitted and ids never seen are all
    served as the field's shared row (one probability); an admitted id is its own row."""
    import tensorflow as tf

    from des.checkpoint import read_manifest
    from des.hashtable import EmbeddingTable
    from des.hashtable.table import SHARED_KEY

    folder, _ = read_manifest(exported["root"] / "lr-1")
    table = EmbeddingTable.load(folder / "field-013.table")  # C1
    keys = table.keys()  # the admitted ids' rows; an id seen once is pending (no row, its count)
    assert table.admitted_count == len(table) and table.pending_count
    seen_once, known = (int(k) & (2**40 - 1) for k in (table.pending()[0][0], keys[keys != SHARED_KEY][0]))
    values = [f"{seen_once:08x}", "abc00001", "ABC00002", f"{known:08x}"]
    serve = tf.saved_model.load(str(exported["root"] / "lr-1.savedmodel")).signatures["serving_default"]
    request = {f"I{i}": tf.constant([1] * len(values), tf.int64) for i in range(1, 14)}
    request.update({f"C{i}": tf.constant(["68fd1e64"] * len(values)) for i in range(2, 27)}, C1=tf.constant(values))
    p = serve(**request)["probability"].numpy()
    assert p[0] == p[1] == p[2] != p[3]


def test_int8_rows_serve_close_to_float32_in_a_smaller_export(exported: dict) -> None:
    """``des.export --export-dtype int8``: the same requests, served without des from 8-bit rows
    (a scale and offset per row and block of 2 or more columns), within a small distance of the
    float32 export, which stays the one equal to des.evaluate; the weights take fewer bytes."""
    root = exported["root"]
    served, full = exported["served"]["int8"], exported["served"]["deepfm-2"]
    assert 0 < np.abs(served - full).max() < 0.02
    size = {name: sum(p.stat().st_size for p in (root / name / "variables").glob("*") if p.is_file())
            for name in ("deepfm-2.savedmodel", "deepfm-2.int8")}  # the weights (the graph has a few more ops)
    assert size["deepfm-2.int8"] < 0.9 * size["deepfm-2.savedmodel"]
    assert json.loads((root / "deepfm-2.int8" / "des_export.json").read_text())["rows_dtype"] == "int8"


def _one_row_ops(folder: Path, signature_name: str, feed_of) -> list[str]:
    """The op types one traced run of ``signature_name`` runs, as TF's step stats list them when
    the SavedModel runs as a graph (as a model server runs it); ``feed_of(signature)``: the feed."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        signature = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(folder)).signature_def[
            signature_name]
        feed = feed_of(signature)
        output, metadata = signature.outputs["probability"].name, tf.compat.v1.RunMetadata()
        session.run(output, feed)
        session.run(output, feed, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                    run_metadata=metadata)
    return [node.timeline_label.split(" = ")[-1].split("(")[0] for device in metadata.step_stats.dev_stats
            for node in device.node_stats]


def test_a_one_row_request_runs_few_ops(exported: dict) -> None:
    """One row of Criteo served by the LR export (``--unadmitted shared``) runs at most 175 ops, as
    TF's step stats count them when the SavedModel runs as a graph (as a model server runs it):
    each kind of column in a few ops, the one-hot keys looked up as ``[B, k]`` and read by one
    gather (an unknown id's fallback row picked before it), no op per field and none on the ids
    that miss. (265 before the hex ids' table gather and the fallback rows.) Through the
    ``examples`` signature, 30 fewer: one input and one parse instead of 39 inputs, then the same
    graph (called, and inlined: no op per column for the call). A count, not a time."""
    def named(signature):
        feed = {signature.inputs[f"I{i}"].name: np.array([i], np.int64) for i in range(1, 14)}
        feed.update({signature.inputs[f"C{i}"].name: np.array([b"68fd1e64"]) for i in range(1, 27)})
        return feed

    def examples(signature):
        import tensorflow as tf

        row = {f"I{i}": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])) for i in range(1, 14)}
        text = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"68fd1e64"]))
        row.update({f"C{i}": text for i in range(1, 27)})
        example = tf.train.Example(features=tf.train.Features(feature=row)).SerializeToString()
        return {signature.inputs["examples"].name: np.array([example])}

    folder = exported["root"] / "lr-1.savedmodel"
    ops = _one_row_ops(folder, "serving_default", named)
    assert 100 < len(ops) <= 175, len(ops)
    assert "LookupTableFindV2" in ops and not {"Tile", "TensorScatterUpdate"} & set(ops), ops
    parsed = _one_row_ops(folder, "examples", examples)
    assert len(parsed) <= len(ops) - 30 and parsed.count("ParseExampleV2") == parsed.count("_Arg") == 1, parsed


def test_quantized_rows_are_within_half_a_step() -> None:
    """``quantize_rows``: each block of each row on 256 levels between its minimum and maximum, every
    value within half a level (float32 rounding aside), a row whose block is constant exactly."""
    from des.serving.model import quantize_rows

    rng = np.random.default_rng(0)
    values = rng.normal(size=(50, 9)).astype(np.float32)
    values[3, 1:] = 0.25  # the embedding block of row 3: constant
    q, scale, offset = quantize_rows(values, [(0, 1), (1, 9)])
    assert q.dtype == np.int8 and scale.shape == offset.shape == (50, 2)
    columns = np.array([0] + [1] * 8)
    back = (q.astype(np.float32) + 128) * scale[:, columns] + offset[:, columns]
    assert (np.abs(back - values) <= scale[:, columns] / 2 + 1e-6).all()
    assert (back[3, 1:] == 0.25).all() and (back[:, 0] == values[:, 0]).all()  # one value a block: exact
    assert q[:, 1:].min() == -128 and q[:, 1:].max() == 127  # the ends of each block's range are levels


@pytest.mark.parametrize("kind", ["normal", "uniform", "truncated_normal", "zeros"])
def test_initial_values_match_the_tables(kind: str) -> None:
    """Unknown ids under ``--unadmitted init``: the splitmix64 streams in uint64 TF ops."""
    import tensorflow as tf

    from des.data.keys import make_key
    from des.export import initial_values
    from des.hashtable import Initializer

    init = Initializer(kind, 0.7 if kind == "truncated_normal" else 0.05)  # 0.7 * N: rejections happen
    for field, dim in ((0, 1), (17, 5), (38, 8)):
        keys = np.concatenate([make_key(field, np.arange(1000)), [make_key(field, 2**32), make_key(field, 2**40 - 1)]])
        base = Initializer.stream_base(123, field, "embedding")
        want = init.values(keys, dim, seed=123, field=field, block="embedding", dtype=np.float64)
        got = initial_values(tf.constant(keys), tf.fill([keys.size], tf.constant(base, tf.uint64)),
                             init.kind, init.scale, dim).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_bad_input(exported: dict, tmp_path: Path) -> None:
    import tensorflow as tf

    from des import export
    from des.checkpoint import CheckpointError
    from des.errors import ConfigError

    root = exported["root"]
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        export.main(["--checkpoint", str(tmp_path), "--output", str(tmp_path / "out")])
    with pytest.raises(CheckpointError, match="does not exist"):
        export.main(["--checkpoint", str(tmp_path / "nothing"), "--output", str(tmp_path / "out")])
    with pytest.raises(ConfigError, match="exists .*--force"):
        export.main(["--checkpoint", str(root / "lr-1"), "--output", str(root / "lr-1.savedmodel")])
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "stale").write_text("x")
    export.main(["--checkpoint", str(root / "lr-1"), "--output", str(tmp_path / "old"), "--force"])
    assert not (tmp_path / "old" / "stale").exists() and (tmp_path / "old" / "saved_model.pb").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left

    serve = tf.saved_model.load(str(tmp_path / "old")).signatures["serving_default"]
    request = {f"I{i}": tf.constant([1, MISSING], tf.int64) for i, MISSING in ((i, -(2**63)) for i in range(1, 14))}
    request.update({f"C{i}": tf.constant(["68fd1e64", ""]) for i in range(1, 27)})
    assert serve(**request)["probability"].shape == (2,)
    with pytest.raises(TypeError, match="C26"):  # a column fewer
        serve(**{k: v for k, v in request.items() if k != "C26"})
    with pytest.raises(TypeError):  # a column more
        serve(**request, label=tf.constant([0, 1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected to be a int64 tensor but is a string"):
        serve(**{**request, "I3": tf.constant(["1", "2"])})  # a string where an int64 column is expected
    with pytest.raises(tf.errors.InvalidArgumentError, match="C7"):
        serve(**{**request, "C7": tf.constant(["68fd1e64", "xyz"])})
    with pytest.raises(tf.errors.InvalidArgumentError, match="I5"):
        serve(**{**request, "I5": tf.constant([1, 2, 3], tf.int64)})


def test_examples_signature_bad_input(exported: dict) -> None:
    """A feature of another type, or with two values, fails naming its column; a feature left out is
    the column's missing value; a feature the model does not read is ignored, as ``tf.Example``
    consumers do."""
    import tensorflow as tf

    serve = tf.saved_model.load(str(exported["root"] / "lr-1.savedmodel")).signatures["examples"]
    named = tf.saved_model.load(str(exported["root"] / "lr-1.savedmodel")).signatures["serving_default"]

    def example(**features) -> bytes:
        return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()

    ints = tf.train.Feature(int64_list=tf.train.Int64List(value=[7]))
    text = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"68fd1e64"]))
    request = {f"I{i}": tf.constant([-(2**63)], tf.int64) for i in range(1, 14)}
    request.update({f"C{i}": tf.constant([""]) for i in range(1, 27)}, I2=tf.constant([7], tf.int64),
                   C3=tf.constant(["68fd1e64"]))
    p = serve(examples=tf.constant([example(I2=ints, C3=text, label=ints)]))["probability"].numpy()
    assert p == named(**request)["probability"].numpy()
    with pytest.raises(tf.errors.InvalidArgumentError, match="I4"):
        serve(examples=tf.constant([example(I4=text)]))  # bytes where an int64 column is expected
    with pytest.raises(tf.errors.InvalidArgumentError, match="C5"):
        serve(examples=tf.constant([example(C5=tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"1", b"2"])))]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="C7"):
        serve(examples=tf.constant([example(C7=tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"xyz"])))]))


def test_signature_lists_named_inputs(exported: dict) -> None:
    """The SignatureDef that ``saved_model_cli show --all`` prints and a model server reads (read
    here with the function saved_model_cli uses, without starting another TensorFlow)."""
    from tensorflow.python.tools import saved_model_utils

    meta_graph = saved_model_utils.get_meta_graph_def(str(exported["root"] / "fm-1.savedmodel"), "serve")
    signature = meta_graph.signature_def["serving_default"]
    assert set(signature.inputs) == {f"I{i}" for i in range(1, 14)} | {f"C{i}" for i in range(1, 27)}
    assert set(signature.outputs) == {"probability"}
    examples = meta_graph.signature_def["examples"]
    assert set(examples.inputs) == {"examples"} and examples.inputs["examples"].dtype == 7  # DT_STRING
    assert set(examples.outputs) == {"probability"}
