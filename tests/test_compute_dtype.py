"""``--compute-dtype bfloat16``: the top network computes in bf16 on casts of float32 master
weights; optimizer state and checkpoints stay float32, and the model learns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import criteo_head, run_mpi_many
from tests.test_train import checkpoint_arrays


#: FinalMLP's second stream and gates as wide as --hidden's first layer (their defaults: 800)
SMALLER = {"finalmlp": ("--model-options", "mlp2_hidden=32;fs_hidden=32")}
MODELS = ["deepfm", "dcnv2", "dlrm", "finalmlp", "xdeepfm"]


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """Every model's bf16 run on 2 ranks, one after another in one launch: the folder and their
    standard outputs."""
    root = tmp_path_factory.mktemp("bf16")
    criteo_head(root / "small.tsv", 2000)
    runs = {model: ["-m", "des.train", "--data", str(root / "small.tsv"), "--cache-dir", str(root / "cache"),
                    "--output", str(root / model), "--model", model, "--hidden", "32,16", "--batch-size", "128",
                    "--epochs", "2", "--early-stop", "0", "--compute-dtype", "bfloat16", "--no-progress",
                    *SMALLER.get(model, ())] for model in MODELS}
    return root, run_mpi_many(2, runs, root / "jobs", timeout=400)


@pytest.mark.mpi
@pytest.mark.parametrize("model", MODELS)
def test_bfloat16_top_network_trains_and_learns_on_two_ranks(bf16_runs, model: str) -> None:
    root, stdout = bf16_runs
    assert "compute_dtype=bfloat16" in stdout[model]
    summary = json.loads((root / model / "summary.json").read_text())
    records = [json.loads(line) for line in (root / model / "metrics.jsonl").read_text().splitlines()]
    assert summary["test_auc"] > 0.65, summary["test_auc"]  # learned (a constant model scores 0.5)
    if model != "dlrm":  # (DLRM has no order-1 term: its bias moves at the dense Adam's pace, too slowly for
        # its training loss to reach the positive rate's in 28 steps)
        assert records[-1]["auc"] > records[0]["auc"] - 0.02 and records[-1]["train_loss"] < 0.6
    arrays = checkpoint_arrays(root / model / "checkpoints")
    floats = {k: v.dtype for k, v in arrays.items() if v.dtype.kind == "f"}
    assert floats and set(floats.values()) == {np.dtype(np.float32)}, floats


def test_bfloat16_needs_float32_master_weights() -> None:
    from des.config import TrainConfig
    from des.errors import ConfigError

    with pytest.raises(ConfigError, match="--compute-dtype bfloat16 needs --dtype float32"):
        TrainConfig(dtype="float64", compute_dtype="bfloat16").validate()


def test_bfloat16_refuses_xla_whose_cpu_matmuls_have_no_bf16_kernels() -> None:
    from des.config import TrainConfig
    from des.errors import ConfigError

    with pytest.raises(ConfigError, match="--compute-dtype bfloat16 with --xla on: .* use --xla off"):
        TrainConfig(compute_dtype="bfloat16", xla="on").validate()
    TrainConfig(compute_dtype="bfloat16", xla="off").validate()
    TrainConfig(compute_dtype="auto", xla="on").validate()


def test_bfloat16_runs_the_first_fc_partials_in_bf16_and_keeps_fm_in_float32() -> None:
    """``low_precision_local``: under bf16 the first FC layer's partials and their gradients are bf16
    matmuls on casts of the float32 values (results cast back to float32); FM's sums of squares and
    the linear sums stay float32, equal to the float32 step's to the bit."""
    import tensorflow as tf

    from des.hashtable import optimizer_from_spec
    from des.models import DeepFM
    from des.options import Optimizers
    from des.strategies.components import DenseParams
    from des.strategies.forms import ModelSplitForm

    model = DeepFM(num_fields=5, embedding_dim=4, hidden=(6, 3))
    optimizers = Optimizers(sparse={}, dense=optimizer_from_spec("adam:lr=0.001"))
    dense = DenseParams(model, range(5), optimizers, seed=0, dtype=np.float32)
    forms = {c: ModelSplitForm(model, dense, np.float32, c) for c in (None, "bfloat16")}
    rng = np.random.default_rng(0)
    pooled = [rng.normal(0, 0.3, (7, 5, b.dim)).astype(np.float32) for b in model.blocks()]
    params = [dense.field_params[n] for n in forms[None].split_params]
    fp32, bf16 = (forms[c].partials(pooled, params, []).numpy() for c in (None, "bfloat16"))
    first_fc = slice(fp32.shape[1] - 6, None)  # linear (1), FM (k + 1), then the first FC layer (6)
    np.testing.assert_array_equal(bf16[:, : first_fc.start], fp32[:, : first_fc.start])
    kernel = dense.field_params["2:first_fc:kernel"]
    as_bf16 = lambda a: tf.cast(a, tf.bfloat16)  # noqa: E731
    expected = tf.cast(tf.einsum("bfk,fkh->bh", as_bf16(pooled[1]), as_bf16(kernel)), tf.float32).numpy()
    np.testing.assert_array_equal(bf16[:, first_fc], expected)
    assert not np.array_equal(bf16[:, first_fc], fp32[:, first_fc])

    grad = rng.normal(0, 1, fp32.shape).astype(np.float32)
    (emb32, field32, _), (emb16, field16, _) = (
        [[g.numpy() for g in part] for part in forms[c].local_backward(pooled, params, grad)] for c in (None, "bfloat16"))
    names = forms[None].split_params
    for name, g32, g16 in zip(names, field32, field16):
        if "first_fc" in name:  # V_iᵀ G in bf16: every value a bf16 number
            np.testing.assert_array_equal(g16, tf.cast(as_bf16(g16), tf.float32).numpy())
            np.testing.assert_allclose(g16, g32, rtol=0.05, atol=0.05)
        else:
            np.testing.assert_array_equal(g16, g32)
    np.testing.assert_array_equal(emb16[0], emb32[0])  # the linear block: read by no matmul
