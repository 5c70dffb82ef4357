"""Substitutions: weight-rich operators rewritten as local partials, a sum, and a cheap combine.

Public: :class:`Substitution` (the base class), :class:`FieldParam`, the built-ins
:class:`FirstOrderLinear`, :class:`FMOrder2`, :class:`FirstFC`, :class:`FieldEmbeddings`,
:class:`TargetAttention` (DIN), :class:`FieldSubset`, :class:`Uncombined`, the registry
(:func:`register_substitution`, :func:`get_substitution`, :func:`default_substitutions`,
:func:`registered_substitutions`) and the conformance checker :func:`check_substitution`.
"""

from des.substitutions.attention import FieldSubset, TargetAttention, Uncombined
from des.substitutions.base import FieldParam, ParamSpec, Substitution, draw_param, stable_id
from des.substitutions.conformance import (
    ConformanceReport,
    SubstitutionConformanceError,
    check_substitution,
)
from des.substitutions.embeddings import FieldEmbeddings
from des.substitutions.first_fc import FirstFC
from des.substitutions.fm import FMOrder2
from des.substitutions.linear import FirstOrderLinear
from des.substitutions.registry import (
    default_substitutions,
    get_substitution,
    register_substitution,
    registered_substitutions,
    unregister_substitution,
)

__all__ = [
    "ConformanceReport",
    "FMOrder2",
    "FieldEmbeddings",
    "FieldParam",
    "FieldSubset",
    "ParamSpec",
    "draw_param",
    "FirstFC",
    "FirstOrderLinear",
    "Substitution",
    "SubstitutionConformanceError",
    "TargetAttention",
    "Uncombined",
    "check_substitution",
    "default_substitutions",
    "get_substitution",
    "register_substitution",
    "registered_substitutions",
    "stable_id",
    "unregister_substitution",
]
