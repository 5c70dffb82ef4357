"""The substitution registry: an explicit default list plus user additions.

>>> from des.substitutions import register_substitution, get_substitution
>>> get_substitution("fm2").__name__
'FMOrder2'

A user adds a substitution by subclassing :class:`des.substitutions.Substitution` and calling
:func:`register_substitution` (usable as a decorator); registration runs
:func:`check_substitution` first, so a substitution that is not exact never enters the registry.
"""

from __future__ import annotations

from des.registry import Registry
from des.substitutions.attention import FieldSubset, TargetAttention, Uncombined
from des.substitutions.base import Substitution
from des.substitutions.conformance import check_substitution
from des.substitutions.embeddings import FieldEmbeddings
from des.substitutions.first_fc import FirstFC
from des.substitutions.fm import FMOrder2
from des.substitutions.linear import FirstOrderLinear


def default_substitutions() -> list[type[Substitution]]:
    """The built-ins, in a fixed order."""
    return [FirstOrderLinear, FMOrder2, FirstFC, FieldEmbeddings, FieldSubset, TargetAttention, Uncombined]


SUBSTITUTION_REGISTRY: Registry[type[Substitution]] = Registry(
    "substitution", Substitution, default_substitutions, check=check_substitution)


def register_substitution(
    cls: type[Substitution], *, check: bool = True, replace: bool = False
) -> type[Substitution]:
    """Add ``cls`` to the registry under ``cls.name`` (after it passes the conformance check)."""
    return SUBSTITUTION_REGISTRY.register(cls, replace=replace, check=check)


def registered_substitutions() -> dict[str, type[Substitution]]:
    """Name -> class for the defaults and every user addition."""
    return SUBSTITUTION_REGISTRY.all()


def get_substitution(name: str) -> type[Substitution]:
    return SUBSTITUTION_REGISTRY.get(name)


def unregister_substitution(name: str) -> None:
    """Remove a user addition (the defaults stay)."""
    SUBSTITUTION_REGISTRY.unregister(name)
