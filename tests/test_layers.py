"""The layers floor (des/layers/): each block against its paper's formula written out in numpy, in
float64 to 1e-12, with weights drawn as the engine draws them plus noise (so zero-initialized
biases and contexts are not zero). DCN-v2's mixture of experts: tests/test_dcnv2_dlrm.py; the
models built of these blocks, N ranks == 1 rank: tests/test_exactness.py."""

from __future__ import annotations

import numpy as np
import pytest

from des.layers import AttentionUnit, BilinearFusion, CompressedInteraction, CrossNetwork, DeepTower, DotInteraction, FieldGate
from des.substitutions import draw_param

RNG = np.random.default_rng(0)


def weights(layer) -> dict[str, np.ndarray]:
    return {name: draw_param(spec, 1, "layer", name) + RNG.normal(scale=0.1, size=spec.shape)
            for name, spec in layer.params().items()}


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


@pytest.mark.parametrize("output_units", [0, 1, 3])
def test_the_tower_is_an_mlp(output_units: int) -> None:
    tower = DeepTower((4, 3), "relu", input_dim=5, output_units=output_units, prefix="t")
    w, x = weights(tower), RNG.normal(size=(6, 5))
    h = relu(relu(x @ w["t_kernel_0"] + w["t_bias_0"]) @ w["t_kernel_1"] + w["t_bias_1"])
    expected = h if not output_units else h @ w["t_kernel_2"] + w["t_bias_2"]
    np.testing.assert_allclose(tower(w, x).numpy(), expected[:, 0] if output_units == 1 else expected, rtol=1e-12)
    outside = DeepTower((4, 3), "relu", output_units=output_units, prefix="t")  # W_0 x from outside
    assert set(outside.params()) == set(tower.params()) - {"t_kernel_0"}
    np.testing.assert_allclose(outside(w, x @ w["t_kernel_0"]).numpy(), tower(w, x).numpy(), rtol=1e-12)


def test_prelu_learns_each_units_negative_slope() -> None:
    """PReLU (He et al. 2015; DIN's MLP): max(x, 0) + a_i min(x, 0) per hidden unit, a_i its own."""
    tower = DeepTower((4, 3), "prelu", input_dim=5, prefix="t")
    w, x = weights(tower), RNG.normal(size=(6, 5))
    assert tower.params()["t_alpha_0"].shape == (4,) and tower.params()["t_alpha_1"].init == "zeros"

    def prelu(v: np.ndarray, a: np.ndarray) -> np.ndarray:
        return np.maximum(v, 0.0) + a * np.minimum(v, 0.0)

    h = prelu(x @ w["t_kernel_0"] + w["t_bias_0"], w["t_alpha_0"])
    h = prelu(h @ w["t_kernel_1"] + w["t_bias_1"], w["t_alpha_1"])
    np.testing.assert_allclose(tower(w, x).numpy(), (h @ w["t_kernel_2"] + w["t_bias_2"])[:, 0], rtol=1e-12)
    with pytest.raises(ValueError, match="known: relu, tanh, sigmoid, linear, prelu"):
        DeepTower((4,), "dice")


def test_the_cross_network_is_eq_1() -> None:
    """x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l, W_0 x_0 given from outside."""
    cross = CrossNetwork(4, 3)
    w, x0 = weights(cross), RNG.normal(size=(6, 4))
    w0 = RNG.normal(size=(4, 4))
    xl = x0
    for layer in range(3):
        xl = x0 * (xl @ (w0 if layer == 0 else w[f"cross_kernel_{layer}"]) + w[f"cross_bias_{layer}"]) + xl
    np.testing.assert_allclose(cross(w, x0, x0 @ w0).numpy(), xl, rtol=1e-12)
    assert cross.first_units == 4 and CrossNetwork(4, 2, "mix", low_rank=3, experts=2).first_units == 8


def test_the_dot_interaction_is_every_pair_once() -> None:
    vectors = RNG.normal(size=(3, 4, 2))
    expected = [[v[i] @ v[j] for i in range(4) for j in range(i + 1, 4)] for v in vectors]
    np.testing.assert_allclose(DotInteraction()(vectors).numpy(), expected, rtol=1e-12)
    assert DotInteraction.output_dim(4) == 6


@pytest.mark.parametrize("split_half", [True, False])
def test_the_cin_is_xdeepfms_eq_6(split_half: bool) -> None:
    """X^l_h = relu(Σ_{i,j} W^{l,h}_{ij} X^0_i ⊙ X^{l-1}_j + b^l_h), the kernel's rows (i, j) with
    X^0's field i major (DeepCTR's); each layer's pooled maps (split_half: the second half)."""
    fields, k, sizes = 3, 2, (4, 2)
    cin = CompressedInteraction(fields, sizes, split_half=split_half)
    w, x0 = weights(cin), RNG.normal(size=(5, fields, k))
    hidden, pooled = x0, []
    for layer, size in enumerate(sizes):
        kernel = w[f"cin_kernel_{layer}"].reshape(fields, hidden.shape[1], size)
        maps = relu(np.einsum("bid,bjd,ijh->bhd", x0, hidden, kernel) + w[f"cin_bias_{layer}"][None, :, None])
        carried = size // 2 if split_half and layer < len(sizes) - 1 else (0 if layer == len(sizes) - 1 else size)
        pooled.append(maps[:, carried:].sum(axis=2))
        hidden = maps[:, :carried]
    np.testing.assert_allclose(cin(w, x0).numpy(), np.concatenate(pooled, axis=1), rtol=1e-12)
    assert cin.output_dim == (2 + 2 if split_half else 4 + 2)
    with pytest.raises(ValueError, match="must be even"):
        CompressedInteraction(fields, (3, 2))


def test_the_gate_and_the_fusion_are_finalmlps() -> None:
    """FuxiCTR's FeatureSelection without context (x ⊙ 2σ(MLP(c))) and InteractionAggregation
    (w_xᵀx + w_yᵀy + Σ_h x_hᵀ W_h y_h)."""
    gate = FieldGate(6, 2, (3,), prefix="fs1")
    w, x = weights(gate), RNG.normal(size=(4, 6))
    g = 2 / (1 + np.exp(-(relu(w["fs1_context"] @ w["fs1_kernel_0"] + w["fs1_bias_0"]) @ w["fs1_kernel_1"]
                          + w["fs1_bias_1"])))
    np.testing.assert_allclose(gate(w, x).numpy(), x * g, rtol=1e-12)
    fusion = BilinearFusion(4, 6, heads=2)
    w, x, y = weights(fusion), RNG.normal(size=(5, 4)), RNG.normal(size=(5, 6))
    bilinear = sum(np.einsum("bi,ij,bj->b", x[:, 2 * h:2 * h + 2], w["fusion_xy_kernel"][h], y[:, 3 * h:3 * h + 3])
                   for h in range(2))
    np.testing.assert_allclose(fusion(w, x, y).numpy(), x @ w["fusion_x_kernel"] + y @ w["fusion_y_kernel"] + bilinear,
                               rtol=1e-12)
    with pytest.raises(ValueError, match="heads \\(4\\) must divide"):
        BilinearFusion(4, 6, heads=4)


def test_the_attention_unit_is_dins():
    """DIN's activation unit (eq. 3, no softmax): a_t = MLP([q, e_t, q - e_t, q * e_t]), Σ_t a_t e_t;
    an empty slot (a zero item) adds nothing; with ``softmax`` the shares of the present slots."""
    unit = AttentionUnit(3, (4,), "prelu", prefix="a")
    w, q, items = weights(unit), RNG.normal(size=(5, 3)), RNG.normal(size=(5, 2, 3))
    items[1, 1] = 0.0
    x = np.concatenate([np.repeat(q[:, None], 2, 1), items, q[:, None] - items, q[:, None] * items], axis=2)
    h = x @ w["a_kernel_0"] + w["a_bias_0"]
    scores = ((relu(h) + w["a_alpha_0"] * np.minimum(h, 0)) @ w["a_kernel_1"] + w["a_bias_1"])[..., 0]
    np.testing.assert_allclose(unit(w, q, items).numpy(), np.einsum("bl,blk->bk", scores, items), rtol=1e-12)
    # softmax over a row's present slots: row 1's empty slot takes no share, row 2 (all empty) pools to 0
    items[2] = 0.0
    x = np.concatenate([np.repeat(q[:, None], 2, 1), items, q[:, None] - items, q[:, None] * items], axis=2)
    h = x @ w["a_kernel_0"] + w["a_bias_0"]
    scores = ((relu(h) + w["a_alpha_0"] * np.minimum(h, 0)) @ w["a_kernel_1"] + w["a_bias_1"])[..., 0]
    present = np.any(items != 0, axis=2)
    exps = np.where(present, np.exp(scores), 0.0)
    shares = exps / np.maximum(exps.sum(axis=1, keepdims=True), 1e-300)
    softmax = AttentionUnit(3, (4,), "prelu", prefix="a", softmax=True)
    pooled = softmax(w, q, items).numpy()
    np.testing.assert_allclose(pooled, np.einsum("bl,blk->bk", shares, items), rtol=1e-12)
    assert shares[1, 1] == 0 and shares[1, 0] == 1 and not pooled[2].any()


@pytest.mark.parametrize("recency", ["concat", "add"])
def test_the_attention_unit_reads_each_slots_position(recency):
    """``recency``: slot t's learned ``p_t`` (row t - 1, t = 1 the most recent) appended to the
    unit's input or added to the item it scores; the pooled vector is still Σ_t a_t e_t of the
    items, an empty slot takes no share and gives its ``p_t`` no gradient."""
    tf = pytest.importorskip("tensorflow")
    unit = AttentionUnit(3, (4,), "prelu", prefix="a", softmax=True, recency=recency, positions=4)
    assert unit.params()["a_position"].shape == (4, 3)
    assert unit.params()["a_kernel_0"].shape[0] == (12 if recency == "add" else 15)
    w, q, items = weights(unit), RNG.normal(size=(5, 3)), RNG.normal(size=(5, 3, 3))
    items[1, 2] = 0.0
    p = np.broadcast_to(w["a_position"][None, :3], items.shape)
    keyed = items + p if recency == "add" else items
    x = np.concatenate([np.repeat(q[:, None], 3, 1), keyed, q[:, None] - keyed, q[:, None] * keyed]
                       + ([p] if recency == "concat" else []), axis=2)
    h = x @ w["a_kernel_0"] + w["a_bias_0"]
    scores = ((relu(h) + w["a_alpha_0"] * np.minimum(h, 0)) @ w["a_kernel_1"] + w["a_bias_1"])[..., 0]
    exps = np.where(np.any(items != 0, axis=2), np.exp(scores), 0.0)
    np.testing.assert_allclose(unit(w, q, items).numpy(), np.einsum("bl,blk->bk", exps / exps.sum(1, keepdims=True),
                                                                      items), rtol=1e-12)
    position = tf.Variable(w["a_position"])
    with tf.GradientTape() as tape:
        pooled = unit({**w, "a_position": position}, q[1:2], items[1:2])  # row 1: slot 3 empty, slot 4 unused
    grad = tape.gradient(pooled, position).numpy()
    assert np.abs(grad[:2]).min() > 0 and not grad[2:].any()
    with pytest.raises(ValueError, match="recency must be one of none, concat, add, got 'time'"):
        AttentionUnit(3, recency="time", positions=4)
