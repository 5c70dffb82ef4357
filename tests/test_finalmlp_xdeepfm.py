"""FinalMLP and xDeepFM against their papers' equations written out in numpy on the whole inputs
(FuxiCTR's FinalMLP and DeepCTR's xDeepFM), through the model's substitutions (their reference
forms) and its top network. (N ranks == 1 rank: tests/test_exactness.py; a resume on another
number of ranks: tests/test_dcnv2_dlrm.py; bf16: tests/test_compute_dtype.py; the SavedModel:
tests/test_export_schema.py; each block alone: tests/test_layers.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from des.building import parse_model_options
from des.models import FinalMLP, XDeepFM
from des.substitutions import draw_param

ROWS, FIELDS, K, DENSE = 5, 3, 2, 1


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def mlp(x: np.ndarray, w: dict, prefix: str, depth: int, start: int = 0) -> np.ndarray:
    for i in range(start, depth):
        x = relu(x @ w[f"{prefix}_kernel_{i}"] + w[f"{prefix}_bias_{i}"])
    return x


def top_weights(model, rng) -> dict[str, np.ndarray]:
    return {name: draw_param(spec, 1, "top", name) + rng.normal(scale=0.1, size=spec.shape)
            for name, spec in model.top_params().items()}


def substituted(model, emb: np.ndarray, dense: np.ndarray) -> tuple[list, dict]:
    """The substitutions' reference outputs (the operators on all fields) and their field kernels."""
    outputs, kernels = [], {}
    for i, sub in enumerate(model.substitutions()):
        params = sub.init_field_params(2, range(FIELDS), np.float64)
        dense_params = sub.init_dense_params(2, np.float64)
        block = emb if sub.block == "embedding" else emb[:, :, :1]
        args = (dense, dense_params) if sub.reads_dense else ()
        outputs.append(sub.reference(block, params, *args))
        kernels.update({f"{i}:{name}": value for name, value in {**params, **dense_params}.items()})
    return outputs, kernels


@pytest.mark.parametrize("use_fs", [True, False])
def test_finalmlp_is_the_papers_two_gated_streams_and_bilinear_fusion(use_fs: bool) -> None:
    model = FinalMLP(num_fields=FIELDS, embedding_dim=K, hidden=(4, 4), num_dense=DENSE, mlp2_hidden=(6,),
                     fs_hidden=(3,), num_heads=2, use_fs=use_fs)
    rng = np.random.default_rng(0)
    emb, dense = rng.normal(size=(ROWS, FIELDS, K)), rng.normal(size=(ROWS, DENSE))
    w = top_weights(model, rng)
    outputs, kernels = substituted(model, emb, dense)
    got = model.top(w, outputs).numpy()

    x = np.concatenate([emb.reshape(ROWS, -1), dense], axis=1)
    if use_fs:  # FuxiCTR's FeatureSelection: x ⊙ 2σ(MLP(c_s)), then each stream's whole MLP
        gates = [2 / (1 + np.exp(-(mlp(w[f"fs{s}_context"], w, f"fs{s}", 1) @ w[f"fs{s}_kernel_1"]
                                   + w[f"fs{s}_bias_1"]))) for s in (1, 2)]
        y1, y2 = mlp(x * gates[0], w, "mlp1", 2), mlp(x * gates[1], w, "mlp2", 1)
    else:  # [W_1 | W_2] over the fields and the dense features
        joined = np.concatenate([kernels["0:kernel"].reshape(FIELDS * K, -1), kernels["0:dense_kernel"]])
        first = x @ joined
        y1 = mlp(relu(first[:, :4] + w["mlp1_bias_0"]), w, "mlp1", 2, start=1)
        y2 = relu(first[:, 4:] + w["mlp2_bias_0"])
    bilinear = sum(y1[:, 2 * h:2 * h + 2] @ w["fusion_xy_kernel"][h] * y2[:, 3 * h:3 * h + 3] for h in range(2))
    expected = y1 @ w["fusion_x_kernel"] + y2 @ w["fusion_y_kernel"] + bilinear.sum(axis=1) + w["bias"][0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert [s.name for s in model.substitutions()] == (["embeddings"] if use_fs else ["first_fc"])


def test_xdeepfm_sums_the_linear_term_the_cin_and_the_dnn() -> None:
    model = XDeepFM(num_fields=FIELDS, embedding_dim=K, hidden=(4,), num_dense=DENSE, cin_layers=(2, 3))
    rng = np.random.default_rng(1)
    emb_k, dense = rng.normal(size=(ROWS, FIELDS, K)), rng.normal(size=(ROWS, DENSE))
    w = top_weights(model, rng)
    outputs, kernels = substituted(model, emb_k, dense)  # (the linear block: the embeddings' first column)
    got = model.top(w, outputs).numpy()

    linear = emb_k[:, :, 0].sum(axis=1) + dense @ kernels["0:dense_weight"]
    hidden, pooled = emb_k, []
    for layer, (size, carried) in enumerate(((2, 1), (3, 0))):  # split_half: half of layer 0's maps go on
        kernel = w[f"cin_kernel_{layer}"].reshape(FIELDS, hidden.shape[1], size)
        maps = relu(np.einsum("bid,bjd,ijh->bhd", emb_k, hidden, kernel) + w[f"cin_bias_{layer}"][None, :, None])
        pooled.append(maps[:, carried:].sum(axis=2))
        hidden = maps[:, :carried]
    cin = np.concatenate(pooled, axis=1) @ w["cin_output_kernel"]
    x = np.concatenate([emb_k.reshape(ROWS, -1), dense], axis=1)
    first = x @ np.concatenate([kernels["2:kernel"].reshape(FIELDS * K, -1), kernels["2:dense_kernel"]])
    dnn = relu(first + w["deep_bias_0"]) @ w["deep_kernel_1"][:, 0] + w["deep_bias_1"][0]
    np.testing.assert_allclose(got, linear + cin + dnn + w["bias"][0], rtol=1e-12)


def test_their_options_and_what_they_refuse() -> None:
    assert parse_model_options("finalmlp", FinalMLP, "mlp2_hidden=64,32;num_heads=2;use_fs=false") == {
        "mlp2_hidden": (64, 32), "num_heads": 2, "use_fs": False}
    assert parse_model_options("xdeepfm", XDeepFM, "cin_layers=8,4;split_half=false") == {
        "cin_layers": (8, 4), "split_half": False}
    with pytest.raises(ValueError, match="finalmlp: the fusion's heads \\(3\\) must divide"):
        FinalMLP(hidden=(8,), num_heads=3)
    with pytest.raises(ValueError, match="xdeepfm: with split_half the CIN's layer sizes but the last must be even"):
        XDeepFM(cin_layers=(5, 4))
