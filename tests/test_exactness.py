"""The property we sell: training with N ranks is the same computation as training with 1 rank.

For LR, FM, W&D and DeepFM, K = 20 steps from the same seed with N = 1, 2, 3, 4 ranks give the same
held-out predictions, the same table rows (every id's values), the same field slices of the first
FC layer and the same top parameters: ≤ 1e-9 relative in float64, ≤ 1e-5 in float32 (all
parameters with AdaGrad embeddings; predictions with Adam). "Relative" is to the largest magnitude
of each array (floored at 1e-3), not element-wise, so near-zero entries are not held to 1e-9 of
themselves. The multi-hot
synthetic data (CSR fields, weighted ids) and the balanced placement go through the same check.
A plain-TensorFlow textbook model trained from the same initial values gives the same predictions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import criteo_head, run_mpi

MODELS = ("lr", "fm", "wdl", "deepfm")
RANKS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    from des.data import prepare
    from des.data.synth import default_config, synthesize_store

    root = tmp_path_factory.mktemp("exactness-data")
    criteo = root / "criteo"
    prepare(criteo_head(root / "criteo_head.tsv", 3000), criteo, split=(0.9, 0.1, 0.0), seed=1)
    synth = root / "synth"
    config = default_config(seed=2, multi_hot_fields=("C3", "C7", "C20"), max_hot=4, weighted=True, vocab_scale=0.001)
    synthesize_store(synth, 3000, config, split=(0.9, 0.1, 0.0))
    return {"criteo": criteo, "synth": synth}


@pytest.fixture(scope="module")
def runs(datasets, tmp_path_factory) -> dict[int, Path]:
    """One mpiexec launch per rank count; each trains every model three ways."""
    out = {}
    for n in RANKS:
        folder = tmp_path_factory.mktemp(f"exactness-{n}")
        specs = [
            f"f64:{datasets['criteo']}:float64:mod:{','.join(MODELS)}:des:adam:lr=0.01",
            f"multihot:{datasets['synth']}:float64:balanced:fm,deepfm:des:adam:lr=0.01",
        ]
        if n in (2, 3):
            # The all-to-all baseline computes the same model (references, embedding exchange).
            specs.append(f"alltoall:{datasets['criteo']}:float64:mod:deepfm:alltoall:adam:lr=0.01")
            specs.append(f"alltoall-multihot:{datasets['synth']}:float64:balanced:deepfm:alltoall:adam:lr=0.01")
        # float32 with AdaGrad embeddings: Adam's m/sqrt(v) turns float32 reassociation noise of
        # near-zero gradients into ~1e-4 relative differences of single embedding entries
        # (predictions still agree to ~3e-7), which would hide real bugs behind a loose bound.
        specs.append(f"f32:{datasets['criteo']}:float32:mod:{','.join(MODELS)}:des:adagrad:lr=0.05")
        if n in (1, 4):
            # ... and with the default optimizers (Adam): the predictions are checked.
            specs.append(f"f32adam:{datasets['criteo']}:float32:mod:deepfm:des:adam:lr=0.001")
        args = ["-m", "tests.mpi_programs.exactness", "--out", str(folder)]
        for spec in specs:
            args += ["--run", spec]
        proc = run_mpi(n, args, timeout=420)
        assert f"exactness: {n} ranks ok" in proc.stdout
        out[n] = folder
    return out


def load_state(folder: Path, model: str, ranks: int) -> dict[str, np.ndarray]:
    """Merge the per-rank dumps: predictions and top parameters from rank 0, fields from owners."""
    merged: dict[str, np.ndarray] = {}
    for r in range(ranks):
        with np.load(folder / f"{model}-rank{r}.npz") as arrays:
            for key in arrays.files:
                if key.startswith("field/") or r == 0:
                    assert key not in merged, f"{key} owned by two ranks"
                    merged[key] = arrays[key]
    return merged


def assert_same_state(reference: dict, other: dict, rtol: float, what: str) -> None:
    assert sorted(reference) == sorted(other), f"{what}: different sets of fields/parameters"
    for key, expected in reference.items():
        got = other[key]
        if key.endswith("/keys"):
            np.testing.assert_array_equal(got, expected, err_msg=f"{what}: {key}")
            continue
        scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-3)
        err = float(np.max(np.abs(got - expected))) if expected.size else 0.0
        assert err <= rtol * scale, f"{what}: {key} differs by {err:.3e} (scale {scale:.3e})"


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", RANKS[1:])
@pytest.mark.parametrize("model", MODELS)
def test_n_ranks_equal_one_rank_float64(runs, model: str, ranks: int) -> None:
    one = load_state(runs[1] / "f64", model, 1)
    many = load_state(runs[ranks] / "f64", model, ranks)
    assert_same_state(one, many, 1e-9, f"{model}, {ranks} ranks, float64")
    # Training moved the parameters (a check that compares untrained models proves nothing).
    assert one["losses"][-1] < one["losses"][0]


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", RANKS[1:])
@pytest.mark.parametrize("model", MODELS)
def test_n_ranks_equal_one_rank_float32(runs, model: str, ranks: int) -> None:
    one = load_state(runs[1] / "f32", model, 1)
    many = load_state(runs[ranks] / "f32", model, ranks)
    assert_same_state(one, many, 1e-5, f"{model}, {ranks} ranks, float32")


@pytest.mark.mpi
def test_float32_with_adam_gives_the_same_predictions(runs) -> None:
    one = load_state(runs[1] / "f32adam", "deepfm", 1)
    many = load_state(runs[4] / "f32adam", "deepfm", 4)
    assert_same_state({"predictions": one["predictions"]}, {"predictions": many["predictions"]}, 1e-5,
                      "deepfm, 4 ranks, float32, Adam")


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", RANKS[1:])
@pytest.mark.parametrize("model", ("fm", "deepfm"))
def test_multi_hot_balanced_placement(runs, model: str, ranks: int) -> None:
    one = load_state(runs[1] / "multihot", model, 1)
    many = load_state(runs[ranks] / "multihot", model, ranks)
    assert_same_state(one, many, 1e-9, f"{model}, multi-hot, {ranks} ranks")


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", (2, 3))
@pytest.mark.parametrize("data", ("criteo", "multihot"))
def test_alltoall_equals_des(runs, ranks: int, data: str) -> None:
    """The synchronous all-to-all baseline trains the same DeepFM as DES on one rank."""
    des_run = "f64" if data == "criteo" else "multihot"
    a2a_run = "alltoall" if data == "criteo" else "alltoall-multihot"
    one = load_state(runs[1] / des_run, "deepfm", 1)
    many = load_state(runs[ranks] / a2a_run, "deepfm", ranks)
    assert_same_state(one, many, 1e-9, f"alltoall deepfm, {data}, {ranks} ranks")


def test_dtype_modes_really_differ(runs) -> None:
    """The float32 and float64 runs keep their parameters in their own precision."""
    f64 = load_state(runs[1] / "f64", "deepfm", 1)
    f32 = load_state(runs[1] / "f32", "deepfm", 1)
    assert f64["field/20/embedding"].dtype == np.float64
    assert f32["field/20/embedding"].dtype == np.float32
    assert f32["top/deep_kernel_1"].dtype == np.float32
