"""Training strategies behind one protocol (:class:`des.strategies.base.Strategy`), with a registry:
an explicit default list plus user additions, as for models and substitutions.

* ``des`` -- :class:`des.strategies.des.DES`: partials of the substituted operators reduced over
  the ranks, or (``--plan``) their pooled inputs exchanged, per operator.
* ``alltoall`` -- :class:`des.strategies.alltoall.AllToAll`: ``des --plan exchange``: embeddings
  sent to the row owners and their gradients back (Alltoallv), dense gradients AllReduced.
* ``persia`` -- :class:`des.strategies.persia.Persia`: Persia's hybrid training, ``alltoall``
  with its sparse updates applied ``--staleness`` steps late.
* ``hierarchical`` -- :class:`des.strategies.hierarchical.Hierarchical`: Hierarchical Training,
  groups of ranks each with its own replica of the upper network, reconciled by EASGD.
* ``ps`` -- :class:`des.strategies.ps.ParameterServer`: an asynchronous parameter server.

A user strategy subclasses :class:`Strategy`, calls :func:`register_strategy` (e.g. in a file loaded
with ``--plugins``) and is checked with ``python -m des.check --strategy NAME``. This module loads
no TensorFlow: the defaults are imported on first use.
"""

from __future__ import annotations

import importlib

from des.builtin_names import STRATEGIES, default_strategy_names
from des.registry import Registry
from des.strategies.base import CATEGORIES, PhaseTimer, ShardState, Strategy, StrategyContext


def default_strategies() -> list[type[Strategy]]:
    """The built-in strategy classes, in a fixed order (imported on first use)."""
    return [getattr(importlib.import_module(module), cls) for module, cls in STRATEGIES.values()]


def _check_categories(cls: type[Strategy]) -> None:
    unknown = sorted(set(cls.phases.values()) - set(CATEGORIES))
    if unknown:
        raise ValueError(f"strategy {cls.name}: phase categories {unknown} are not among {', '.join(CATEGORIES)}")


STRATEGY_REGISTRY: Registry[type[Strategy]] = Registry("strategy", Strategy, default_strategies,
                                                       check=_check_categories)


def register_strategy(cls: type[Strategy], *, replace: bool = False) -> type[Strategy]:
    """Add a user strategy class (usable as a decorator); its ``name`` becomes a ``--strategy`` value."""
    return STRATEGY_REGISTRY.register(cls, replace=replace)


def registered_strategies() -> dict[str, type[Strategy]]:
    """Name -> class for the defaults and every user addition."""
    return STRATEGY_REGISTRY.all()


def get_strategy(name: str) -> type[Strategy]:
    return STRATEGY_REGISTRY.get(name)


__all__ = ["CATEGORIES", "PhaseTimer", "ShardState", "Strategy", "StrategyContext", "default_strategies",
           "default_strategy_names", "get_strategy", "register_strategy", "registered_strategies",
           "STRATEGY_REGISTRY"]
