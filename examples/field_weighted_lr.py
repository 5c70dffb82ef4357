"""Adding a model to des: one substitution and one model class, no engine change.

A field-weighted logistic regression: each field ``f`` gets a learned importance ``r_f`` that
scales its first-order term,

    logit = b + Σ_f r_f · (Σ_{j ∈ f} w_j x_j)

``r`` is a *field parameter* (one scalar per field, kept by the field's owner rank), so the split
form is ``M(W_i, X_i) = Σ_{f ∈ fields(i)} r_f · lin_f`` (one float per sample) and the combine is the
identity. Train it with any number of ranks:

    mpirun -n 2 .venv/bin/python -m des.train --plugins examples/field_weighted_lr.py --model fwlr

(``--plugins`` imports this file, which registers both classes.)
"""

from __future__ import annotations

import tensorflow as tf

from des.models import EmbeddingBlock, Model, register_model
from des.substitutions import FirstOrderLinear, ParamSpec, Substitution, register_substitution


class FieldWeightedLinear(FirstOrderLinear):
    """``Σ_f r_f · lin_f``: the first-order term with a learned weight per field; width 1.

    Width, output size and the identity combine are inherited from the plain linear term."""

    name = "field_weighted_linear"

    def field_params(self) -> dict[str, ParamSpec]:
        return {"importance": ParamSpec(shape=(1,), init="ones")}

    def local(self, emb, params):
        # emb [B, F_i, 1] times importance [F_i, 1], summed over this rank's fields
        return tf.reduce_sum(emb[:, :, 0] * params["importance"][None, :, 0], axis=1, keepdims=True)

    def reference(self, emb, params):
        return tf.linalg.matvec(emb[:, :, 0], params["importance"][:, 0])[:, None]  # [B, F] · r


register_substitution(FieldWeightedLinear)  # runs check_substitution first


@register_model
class FieldWeightedLR(Model):
    name = "fwlr"

    def blocks(self) -> list[EmbeddingBlock]:
        return [EmbeddingBlock("linear", 1, init="zeros")]

    def substitutions(self) -> list[Substitution]:
        return [FieldWeightedLinear(self.num_fields)]

    def top(self, params, outputs):
        (linear,) = outputs
        return linear[:, 0] + params["bias"][0]
