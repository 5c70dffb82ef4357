"""Models: LR, FM, Wide&Deep, DeepFM, DCN-v2, DLRM, FinalMLP, xDeepFM and DIN, plus a registry for user models.

A model declares its embedding blocks, its substitutions and its replicated top network; it has no
distribution code (see :mod:`des.models.base`).
"""

from __future__ import annotations

from des.registry import Registry
from des.layers import DeepTower
from des.models.base import CRITEO_NUM_FIELDS, EmbeddingBlock, EmbeddingModel, Model, ModelDefaults
from des.models.conformance import ModelConformanceError, check_model
from des.models.dcnv2 import DCNv2
from des.models.deepfm import DeepFM
from des.models.din import DIN
from des.models.dlrm import DLRM
from des.models.finalmlp import FinalMLP
from des.models.fm import FM
from des.models.lr import LR
from des.models.wdl import WideAndDeep
from des.models.xdeepfm import XDeepFM


def default_models() -> list[type[Model]]:
    return [LR, FM, WideAndDeep, DeepFM, DCNv2, DLRM, FinalMLP, XDeepFM, DIN]


MODEL_REGISTRY: Registry[type[Model]] = Registry("model", Model, default_models)


def register_model(cls: type[Model]) -> type[Model]:
    """Add a user model class (usable as a decorator); its ``name`` becomes a ``--model`` value."""
    return MODEL_REGISTRY.register(cls, replace=True)


def registered_models() -> dict[str, type[Model]]:
    return MODEL_REGISTRY.all()


def get_model(name: str) -> type[Model]:
    return MODEL_REGISTRY.get(name)


__all__ = [
    "CRITEO_NUM_FIELDS",
    "DCNv2",
    "DIN",
    "DLRM",
    "FM",
    "FinalMLP",
    "LR",
    "DeepFM",
    "DeepTower",
    "EmbeddingBlock",
    "EmbeddingModel",
    "Model",
    "ModelConformanceError",
    "ModelDefaults",
    "check_model",
    "WideAndDeep",
    "XDeepFM",
    "default_models",
    "get_model",
    "register_model",
    "registered_models",
]
