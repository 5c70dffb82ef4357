"""Deterministic, counter-based initialization of embedding rows.

The initial value of a key in column ``c`` of a block is a pure function of
``(seed, field, key, block name, c)``; it does not depend on insertion order, table capacity,
rank or world size (``docs/design.md``, section 1, property 2). Construction:

* ``base = splitmix64(splitmix64(splitmix64(seed) ^ field) ^ H(block name))`` (once per block,
  ``H`` = first 8 bytes of SHA-256 of the UTF-8 name, so adding or reordering blocks changes nothing);
* ``kh = splitmix64(base ^ key)`` (a bijection of the key);
* ``cs(p) = splitmix64(kh + p * gamma)`` (stream seed; ``gamma`` = 0x9E3779B97F4A7C15);
* draw ``j`` of stream ``p``: ``d(p, j) = splitmix64(cs(p) + j * gamma)`` mapped to the open
  interval ``(0, 1)`` as ``((d >> 11) + 0.5) * 2**-53``.

Kinds: ``zeros``; ``uniform``: column ``c`` is ``scale * (2 d(c, 0) - 1)``, i.e. U(-scale, scale);
``normal``: columns ``2p`` and ``2p + 1`` are the two outputs of one Box-Muller transform,
``scale * sqrt(-2 ln d(p, 0)) * (cos, sin)(2 pi d(p, 1))``, each N(0, scale^2) (a trailing odd
column uses the cosine output); ``truncated_normal``: as ``normal``, where attempt ``a`` of pair
``p`` uses ``d(p, 2a), d(p, 2a + 1)`` and each column takes its output of the first attempt with
``|z| <= 2`` (rejection, like ``keras.initializers.TruncatedNormal``; after 64 rejections,
probability 0.0455**64, it clips). The value of a column therefore does not depend on the block's
width either. Values are computed in float64 and rounded once to the table dtype.

``ln`` and ``(cos, sin)(2 pi d)`` are des's own (``_libm.py``: fdlibm's polynomials, within 1 and
2.5 ulp; ``4 d = q + r`` is split exactly and quadrant ``q`` of ``(cos, sin)(r pi/2)`` taken), not
the platform's libm: every machine and libm version computes the same bits, and the pairs of a
row run as SIMD lanes (a libm call per value keeps the loop scalar).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from ._libm import cos_sin_turn, log_unit
from ..splitmix import GOLDEN_GAMMA, name_hash, splitmix64, splitmix64_of

KINDS: tuple[str, ...] = ("zeros", "uniform", "normal", "truncated_normal")
#: the initializers' codes (``ZEROS``: also what a reader gives ``init_row`` for a row it reads as zeros)
ZEROS, _UNIFORM, _NORMAL, _TRUNC = 0, 1, 2, 3
_MAX_ATTEMPTS = 64
_S11 = np.uint64(11)


@njit(cache=True, nogil=True, inline="always")
def _unit(cs: np.uint64, j: int) -> float:
    """Draw ``j`` of a stream, as a float64 in the open interval (0, 1)."""
    u = splitmix64(cs + np.uint64(j) * GOLDEN_GAMMA)
    return (float(u >> _S11) + 0.5) * 1.1102230246251565e-16  # 2**-53


@njit(cache=True, nogil=True, inline="always")
def _stream(kh: np.uint64, p: int) -> np.uint64:
    return splitmix64(kh + np.uint64(p) * GOLDEN_GAMMA)


@njit(cache=True, nogil=True, inline="always")
def _box_muller(cs: np.uint64, attempt: int):
    """Two independent N(0, 1) draws from attempt ``attempt`` of stream ``cs``."""
    radius = math.sqrt(-2.0 * log_unit(_unit(cs, 2 * attempt)))
    cos, sin = cos_sin_turn(_unit(cs, 2 * attempt + 1))
    return radius * cos, radius * sin


@njit(cache=True, nogil=True, inline="always")
def _truncated(cs: np.uint64, which: int, z: float) -> float:
    """Output ``which`` (0 cos, 1 sin) of the first attempt with |z| <= 2; ``z`` is attempt 0's."""
    a = 1
    while abs(z) > 2.0 and a < _MAX_ATTEMPTS:
        z = _box_muller(cs, a)[which]
        a += 1
    return min(2.0, max(-2.0, z))


@njit(cache=True, nogil=True, inline="always")
def key_hash(base: np.uint64, key: np.int64) -> np.uint64:
    return splitmix64(base ^ np.uint64(key))


# Compiled once and called, not inlined: the gather kernels call it for unknown keys only, and its
# SIMD math inlined into each of them made every kernel's cold-cache compilation several times longer.
@njit(cache=True, nogil=True)
def init_row(out, i: int, dim: int, key: np.int64, base: np.uint64, kind: int, scale: float) -> None:
    """Write the initial vector of ``key`` into ``out[i, :dim]`` (rounded to out's dtype)."""
    if kind == ZEROS:
        for c in range(dim):
            out[i, c] = 0.0
        return
    kh = key_hash(base, key)
    if kind == _UNIFORM:
        for c in range(dim):
            out[i, c] = scale * (2.0 * _unit(_stream(kh, c), 0) - 1.0)
        return
    # attempt 0 of every pair, with no branch in the loop (the pairs run as SIMD lanes); a
    # truncated normal redoes the rows where an output fell beyond 2 (31 % of 8-wide rows)
    wild = False
    for p in range(dim // 2):
        z0, z1 = _box_muller(_stream(kh, p), 0)
        out[i, 2 * p] = scale * z0
        out[i, 2 * p + 1] = scale * z1
        wild |= max(abs(z0), abs(z1)) > 2.0
    if dim % 2:
        z0 = _box_muller(_stream(kh, dim // 2), 0)[0]
        out[i, dim - 1] = scale * z0
        wild |= abs(z0) > 2.0
    if kind == _TRUNC and wild:
        for p in range((dim + 1) // 2):
            cs = _stream(kh, p)
            z0, z1 = _box_muller(cs, 0)
            out[i, 2 * p] = scale * _truncated(cs, 0, z0)
            if 2 * p + 1 < dim:
                out[i, 2 * p + 1] = scale * _truncated(cs, 1, z1)


@njit(cache=True, nogil=True)
def init_rows(out, keys, base: np.uint64, kind: int, scale: float) -> None:
    """``out[i, :] = init(keys[i])`` for every i; ``out`` may be a strided view."""
    for i in range(keys.shape[0]):
        init_row(out, i, out.shape[1], keys[i], base, kind, scale)


@njit(nogil=True)
def init_block_rows(data, dim, steps, keys, start, stop, base, kind, scale, slot_init) -> None:
    """New rows ``[start, stop)`` of a block's co-located array ``data[R, dim + slot columns]``:
    initial values of ``keys[r]``, slot column ``c`` = ``slot_init[c]`` (``BlockSpec.slot_column_values``),
    ``steps[r]`` = 0 (``steps`` is empty for optimizers without a step count). One pass: each new
    row's line is written once."""
    for r in range(start, stop):
        init_row(data, r, dim, keys[r], base, kind, scale)
        for c in range(slot_init.shape[0]):
            data[r, dim + c] = slot_init[c]
        if steps.shape[0] > 0:
            steps[r] = 0


@dataclass(frozen=True)
class Initializer:
    """How new rows of a block are initialized (see the module docstring for the exact streams).

    ``kind``: one of ``"zeros"``, ``"uniform"`` (U(-scale, scale)), ``"normal"`` (N(0, scale^2)),
    ``"truncated_normal"`` (N(0, scale^2) resampled beyond 2 scale).
    """

    kind: str = "zeros"
    scale: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown initializer kind {self.kind!r}; expected one of {KINDS}")
        scale = float(self.scale)
        if not math.isfinite(scale) or scale < 0.0:
            raise ValueError(f"initializer scale must be finite and >= 0, got {self.scale!r}")
        object.__setattr__(self, "scale", scale)

    @property
    def code(self) -> int:
        return KINDS.index(self.kind)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "scale": self.scale}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Initializer":
        return cls(kind=str(d["kind"]), scale=float(d["scale"]))

    @staticmethod
    def stream_base(seed: int, field: int, block: str) -> np.uint64:
        """The per-(seed, field, block) 64-bit base of all key streams."""
        h = splitmix64_of(seed)
        h = splitmix64_of(h ^ field)
        return np.uint64(splitmix64_of(h ^ name_hash(block)))

    def values(self, keys: np.ndarray, dim: int, *, seed: int, field: int, block: str,
               dtype: np.dtype | type = np.float32) -> np.ndarray:
        """Initial values ``[len(keys), dim]`` of these keys (vectorized numba kernel)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        out = np.zeros((keys.shape[0], int(dim)), dtype=dtype)
        if self.kind != "zeros" and keys.shape[0]:
            init_rows(out, keys, self.stream_base(seed, field, block), self.code, self.scale)
        return out
