"""The substitution registry: an explicit default list plus user additions.

>>> from des.substitutions import register_substitution, get_substitution
>>> get_substitution("fm2").__name__
'FMOrder2'

A user adds a substitution by subclassing :class:`des.substitutions.Substitution` and calling
:func:`register_substitution` (usable as a decorator); registration runs
:func:`check_substitution` first, so a substitution that is not exact never enters the registry.
"""

from __future__ import annotations

from des.errors import ConfigError
from des.substitutions.base import Substitution
from des.substitutions.conformance import check_substitution
from des.substitutions.first_fc import FirstFC
from des.substitutions.fm import FMOrder2
from des.substitutions.linear import FirstOrderLinear


def default_substitutions() -> list[type[Substitution]]:
    """The built-ins, in a fixed order."""
    return [FirstOrderLinear, FMOrder2, FirstFC]


_user_substitutions: dict[str, type[Substitution]] = {}


def register_substitution(
    cls: type[Substitution], *, check: bool = True, replace: bool = False
) -> type[Substitution]:
    """Add ``cls`` to the registry under ``cls.name`` (after it passes the conformance check)."""
    if not (isinstance(cls, type) and issubclass(cls, Substitution)):
        raise TypeError(f"{cls!r} is not a Substitution subclass")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} must set a class attribute `name`")
    if not replace and name in registered_substitutions():
        raise ValueError(f"a substitution named {name!r} is already registered")
    if check:
        check_substitution(cls)
    _user_substitutions[name] = cls
    return cls


def registered_substitutions() -> dict[str, type[Substitution]]:
    """Name -> class for the defaults and every user addition."""
    return {**{c.name: c for c in default_substitutions()}, **_user_substitutions}


def get_substitution(name: str) -> type[Substitution]:
    try:
        return registered_substitutions()[name]
    except KeyError:
        known = ", ".join(sorted(registered_substitutions()))
        raise ConfigError(f"unknown substitution {name!r} (known: {known})") from None


def unregister_substitution(name: str) -> None:
    """Remove a user addition (the defaults stay)."""
    _user_substitutions.pop(name, None)
