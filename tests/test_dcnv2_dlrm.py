"""DCN-v2 and DLRM as a user runs them: their own options (``--model-options``), the mixture of
experts against the paper's equation, and a resume on another number of ranks (FinalMLP's and
xDeepFM's too). (N ranks == 1 rank
under every plan and strategy: tests/test_exactness.py; the engine against a plain-TF textbook
implementation: tests/test_reference.py; the SavedModel: tests/test_export_schema.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from des.building import parse_model_options
from des.errors import ConfigError
from des.models import DCNv2, DLRM
from des.substitutions import draw_param
from tests.conftest import criteo_head, run_job, run_mpi_many
from tests.test_train import assert_checkpoints_equal


def test_model_options_are_typed_by_the_constructor() -> None:
    options = parse_model_options("dcnv2", DCNv2, "cross_layers=2; structure=stacked;linear=false;cross=mix")
    assert options == {"cross_layers": 2, "structure": "stacked", "linear": False, "cross": "mix"}
    assert parse_model_options("dlrm", DLRM, "bottom=64,32") == {"bottom": (64, 32)}
    assert parse_model_options("dlrm", DLRM, "") == {}


@pytest.mark.parametrize(("model", "cls", "text", "message"), [
    ("dlrm", DLRM, "cross_layers=2", "dlrm takes name=value pairs of bottom=512,256"),
    ("dcnv2", DCNv2, "cross_layers", "dcnv2 takes name=value pairs of cross_layers=3, structure=parallel"),
    ("dcnv2", DCNv2, "cross_layers=two", "--model-options cross_layers=two: dcnv2 expects a value like '3'"),
    ("dcnv2", DCNv2, "linear=maybe", "expects a value like 'True'"),
    ("dcnv2", DCNv2, "hidden=8,8", "--model-options hidden: set it with --hidden"),
])
def test_bad_model_options_say_what_the_model_takes(model, cls, text, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_model_options(model, cls, text, reserved=["hidden", "embedding_dim"])


def test_the_mixture_of_experts_is_the_papers_equation() -> None:
    """DCN-v2's eq. (3) with DeepCTR's gating, stacked (figure 2 a), written out in numpy on the
    whole inputs, against the model: its substituted first layer (``V_eᵀ x_0`` and the gates from
    the field kernels) and its top network."""
    fields, k, dense, rank, experts = 3, 2, 1, 2, 3
    model = DCNv2(num_fields=fields, embedding_dim=k, hidden=(4,), num_dense=dense, cross_layers=2,
                  structure="stacked", cross="mix", low_rank=rank, experts=experts, linear=False)
    rng = np.random.default_rng(0)
    emb, x = rng.normal(size=(5, fields, k)), rng.normal(size=(5, dense))
    top = {name: draw_param(spec, 1, "top", name) + rng.normal(scale=0.1, size=spec.shape)
           for name, spec in model.top_params().items()}
    concat, first = model.substitutions()
    kernel = first.init_field_params(2, range(fields), np.float64)["kernel"]
    dense_kernel = first.init_dense_params(2, np.float64)["dense_kernel"]
    outputs = [concat.reference(emb, {}, x, {}), first.reference(emb, {"kernel": kernel}, x, {"dense_kernel": dense_kernel})]
    got = model.top(top, outputs).numpy()

    x0 = np.concatenate([emb.reshape(5, -1), x], axis=1)
    first_layer = x0 @ np.concatenate([kernel.reshape(fields * k, -1), dense_kernel])
    xl = x0
    for layer in range(2):
        mixed = np.zeros_like(x0)
        if layer == 0:
            projected, gates = first_layer[:, : experts * rank].reshape(5, experts, rank), first_layer[:, experts * rank:]
        else:
            projected = np.einsum("bd,edr->ber", xl, top[f"cross_v_kernel_{layer}"])
            gates = xl @ top[f"cross_gate_kernel_{layer}"]
        weights = np.exp(gates) / np.exp(gates).sum(axis=1, keepdims=True)
        for e in range(experts):
            inner = np.tanh(np.tanh(projected[:, e]) @ top[f"cross_c_kernel_{layer}"][e])
            expert = x0 * (inner @ top[f"cross_u_kernel_{layer}"][e] + top[f"cross_bias_{layer}"])
            mixed += weights[:, e:e + 1] * expert
        xl = mixed + xl
    hidden = np.maximum(xl @ top["deep_kernel_0"] + top["deep_bias_0"], 0)
    expected = (hidden @ top["deep_kernel_1"] + top["deep_bias_1"])[:, 0] + top["bias"][0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


SMALL = ["--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "128", "--no-progress", "--dtype", "float64",
         "--unadmitted", "init", "--checkpoint-every", "4", "--ttl", "4", "--max-steps", "8"]


RESUMES = [  # (model, ranks, flags)
    ("dcnv2", 2, ["--model-options", "cross_layers=2;cross=mix;low_rank=3;experts=2"]),
    ("dlrm", 3, []),
    ("finalmlp", 4, ["--model-options", "mlp2_hidden=8;fs_hidden=8;num_heads=2"]),
    ("xdeepfm", 2, ["--model-options", "cin_layers=4,3", "--plan", "embeddings=exchange"]),
]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> Path:
    """Each model 8 steps straight on one rank (in this process), and from its step-4 checkpoint on
    its rank count: the runs of one rank count one after another in one launch."""
    root = tmp_path_factory.mktemp("resume")
    data = criteo_head(root / "small.tsv", 1500)
    common = {model: ["-m", "des.train", "--data", str(data), "--cache-dir", str(root / "cache"), "--model", model,
                      *SMALL, *flags] for model, _, flags in RESUMES}
    for model, _, _ in RESUMES:
        run_job(1, [*common[model], "--output", str(root / model / "straight")])
    for ranks in sorted({n for _, n, _ in RESUMES}):
        run_mpi_many(ranks, {model: [*common[model], "--output", str(root / model / "resumed"), "--resume",
                                     str(root / model / "straight" / "checkpoints" / "step-00000004")]
                             for model, n, _ in RESUMES if n == ranks}, root / f"jobs-{ranks}", timeout=300)
    return root


@pytest.mark.mpi
@pytest.mark.parametrize(("model", "ranks", "flags"), RESUMES)
def test_resume_on_another_number_of_ranks(resumed: Path, model: str, ranks: int, flags: list[str]) -> None:
    """8 steps straight on one rank, and from its step-4 checkpoint on ``ranks`` ranks: the same
    checkpoint at step 8, every table row, field slice and top weight to 1e-9."""
    assert_checkpoints_equal(resumed / model / "straight" / "checkpoints", resumed / model / "resumed" / "checkpoints")
    assert json.loads((resumed / model / "resumed" / "summary.json").read_text())["ranks"] == ranks
