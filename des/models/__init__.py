"""Models: LR, FM, Wide&Deep and DeepFM, plus a registry for user models.

A model declares its embedding blocks, its substitutions and its replicated top network; it has no
distribution code (see :mod:`des.models.base`).
"""

from __future__ import annotations

from des.errors import ConfigError
from des.models.base import CRITEO_NUM_FIELDS, DeepTower, EmbeddingBlock, EmbeddingModel, Model
from des.models.deepfm import DeepFM
from des.models.fm import FM
from des.models.lr import LR
from des.models.wdl import WideAndDeep


def default_models() -> list[type[Model]]:
    return [LR, FM, WideAndDeep, DeepFM]


_user_models: dict[str, type[Model]] = {}


def register_model(cls: type[Model]) -> type[Model]:
    """Add a user model class (usable as a decorator); its ``name`` becomes a ``--model`` value."""
    if not (isinstance(cls, type) and issubclass(cls, Model)) or not getattr(cls, "name", None):
        raise TypeError(f"{cls!r} must be a Model subclass with a `name`")
    _user_models[cls.name] = cls
    return cls


def registered_models() -> dict[str, type[Model]]:
    return {**{m.name: m for m in default_models()}, **_user_models}


def get_model(name: str) -> type[Model]:
    try:
        return registered_models()[name]
    except KeyError:
        known = ", ".join(registered_models())
        raise ConfigError(f"unknown model {name!r} (choose one of: {known})") from None


__all__ = [
    "CRITEO_NUM_FIELDS",
    "FM",
    "LR",
    "DeepFM",
    "DeepTower",
    "EmbeddingBlock",
    "EmbeddingModel",
    "Model",
    "WideAndDeep",
    "default_models",
    "get_model",
    "register_model",
    "registered_models",
]
