"""The MLP tower: ``act(h W_i + b_i)`` over the hidden widths, then optional linear output units."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from des.substitutions.base import ParamSpec

ACTIVATIONS = {"relu": tf.nn.relu, "tanh": tf.tanh, "sigmoid": tf.sigmoid, "linear": tf.identity}
#: activations with a learned parameter per unit: PReLU, ``max(x, 0) + a·min(x, 0)`` (He et al. 2015;
#: DIN's MLP), ``a`` starting at 0 (Keras's ``PReLU``: a ReLU until its slopes learn)
LEARNED_ACTIVATIONS = ("prelu",)


class DeepTower:
    """A stack of dense layers, ``act(h W_i + b_i)`` over ``hidden``, then ``output_units`` linear
    units (1: the logit, returned as ``[B]``; 0: none, the last hidden activations are returned;
    more: ``[B, output_units]``).

    By default its first layer's product ``h = x W_0`` comes from outside (the substituted first FC
    layer: W&D, DeepFM, DCN-v2's parallel tower), so it starts at ``act(h + b_0)``; with
    ``input_dim`` it holds ``W_0`` itself and is called on its input (DLRM's two MLPs, DCN-v2's
    stacked tower). Weights are named ``{prefix}_kernel_i`` and ``{prefix}_bias_i`` (``prelu``: and
    each hidden layer's slopes ``{prefix}_alpha_i``; row-wise, as every activation here)."""

    def __init__(self, hidden: Sequence[int], activation: str = "relu", *, input_dim: int | None = None,
                 output_units: int = 1, prefix: str = "deep") -> None:
        if not hidden:
            raise ValueError(f"the {prefix} tower needs at least one hidden layer")
        if activation not in ACTIVATIONS and activation not in LEARNED_ACTIVATIONS:
            known = ", ".join([*ACTIVATIONS, *LEARNED_ACTIVATIONS])
            raise ValueError(f"unknown activation {activation!r} (known: {known})")
        if output_units < 0:
            raise ValueError(f"output_units must not be negative, got {output_units}")
        self.hidden = tuple(int(h) for h in hidden)
        if min(self.hidden) < 1:
            raise ValueError(f"the {prefix} tower's widths must be positive, got {list(self.hidden)}")
        self.activation = activation
        self.input_dim = input_dim
        self.output_units = int(output_units)
        self.prefix = prefix

    @property
    def output_dim(self) -> int:
        """Columns of what a call returns (before the logit's squeeze)."""
        return self.output_units or self.hidden[-1]

    def params(self) -> dict[str, ParamSpec]:
        kernel, bias = f"{self.prefix}_kernel_", f"{self.prefix}_bias_"
        specs = {}
        if self.input_dim is not None:
            specs[kernel + "0"] = ParamSpec((self.input_dim, self.hidden[0]), "glorot_uniform", self.input_dim,
                                            self.hidden[0])
        specs[bias + "0"] = ParamSpec(shape=(self.hidden[0],), init="zeros")
        sizes = list(self.hidden) + ([self.output_units] if self.output_units else [])
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
            specs[f"{kernel}{i}"] = ParamSpec((fan_in, fan_out), "glorot_uniform", fan_in, fan_out)
            specs[f"{bias}{i}"] = ParamSpec((fan_out,), init="zeros")
        if self.activation == "prelu":
            specs.update({f"{self.prefix}_alpha_{i}": ParamSpec((h,), init="zeros") for i, h in enumerate(self.hidden)})
        return specs

    def _act(self, params: Mapping[str, tf.Tensor], i: int, x: tf.Tensor) -> tf.Tensor:
        """Hidden layer ``i``'s activation of ``x``."""
        if self.activation == "prelu":
            return tf.nn.relu(x) + params[f"{self.prefix}_alpha_{i}"] * tf.minimum(x, tf.zeros_like(x))
        return ACTIVATIONS[self.activation](x)

    def __call__(self, params: Mapping[str, tf.Tensor], first_layer: tf.Tensor) -> tf.Tensor:
        """``first_layer``: ``x W_0`` (``[B, hidden[0]]``), or with ``input_dim`` the input ``x``."""
        kernel, bias = f"{self.prefix}_kernel_", f"{self.prefix}_bias_"
        if self.input_dim is not None:
            first_layer = tf.matmul(first_layer, params[kernel + "0"])
        h = self._act(params, 0, first_layer + params[bias + "0"])
        depth = len(self.hidden)
        for i in range(1, depth):
            h = self._act(params, i, tf.matmul(h, params[f"{kernel}{i}"]) + params[f"{bias}{i}"])
        if not self.output_units:
            return h
        out = tf.matmul(h, params[f"{kernel}{depth}"]) + params[f"{bias}{depth}"]
        return out[:, 0] if self.output_units == 1 else out
