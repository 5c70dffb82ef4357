"""SplitMix64 (Steele, Lea & Flood; Java 8 ``SplittableRandom``), the one 64-bit mixer of des: the
hash tables' index hash and initial values (``des/hashtable``), the data's keys, split and
synthetic generators (``des/data``).

Two functions, two names:

* :func:`mix64` is the generator's output function (the finalizer): two xor-shift-multiply rounds, a
  bijection on 64-bit words with good avalanche, so distinct inputs stay distinct;
* :func:`splitmix64` is one step of the generator: the state advanced by the golden gamma, then
  mixed, ``mix64(z + GOLDEN_GAMMA)``: the first output of a stream seeded with ``z``. The i-th output
  (0-based) of a stream seeded with ``s`` is :func:`stream_value` ``(s, i)`` =
  ``mix64(s + (i + 1) * GOLDEN_GAMMA)``.

All arithmetic is on ``uint64`` with wrap-around (numba wraps on overflow, as C does); the kernels
inline these functions (``des/_numba_cache.py`` resets their caches when this file changes).
:func:`splitmix64_of` is :func:`splitmix64` of a Python int, for values computed once outside
kernels. The TensorFlow twins, for served models, are ``des.data.features.tf_mix64`` and
``des.hashtable.tf_init.tf_splitmix64``.
"""

from __future__ import annotations

import hashlib

import numba
import numpy as np

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
MASK64 = (1 << 64) - 1
_M1 = np.uint64(MIX1)
_M2 = np.uint64(MIX2)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_TWO_POW_MINUS_53 = 1.0 / 9007199254740992.0


@numba.njit(cache=True, nogil=True, inline="always")
def mix64(z: np.uint64) -> np.uint64:
    """SplitMix64's output function: a 64-bit word mixed into a well-distributed hash (bijective)."""
    z = np.uint64(z)
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@numba.njit(cache=True, nogil=True, inline="always")
def splitmix64(z: np.uint64) -> np.uint64:
    """One SplitMix64 step from state ``z``: ``mix64(z + GOLDEN_GAMMA)``."""
    return mix64(np.uint64(z) + GOLDEN_GAMMA)


@numba.njit(cache=True, nogil=True, inline="always")
def stream_value(seed: np.uint64, index: np.uint64) -> np.uint64:
    """The ``index``-th (0-based) output of a SplitMix64 stream seeded with ``seed``."""
    return mix64(np.uint64(seed) + (np.uint64(index) + np.uint64(1)) * GOLDEN_GAMMA)


@numba.njit(cache=True, nogil=True, inline="always")
def unit_float(h: np.uint64) -> float:
    """The top 53 bits of a hash as a float in [0, 1)."""
    return float(h >> np.uint64(11)) * _TWO_POW_MINUS_53


def splitmix64_of(z: int) -> int:
    """:func:`splitmix64` of a Python int (taken mod 2^64), as a Python int."""
    return int(splitmix64(np.uint64(int(z) & MASK64)))


def seed_to_uint64(seed: int) -> np.uint64:
    """A user seed (any Python int, negative allowed) as an unsigned 64-bit integer."""
    return np.uint64(int(seed) % (1 << 64))


def name_hash(name: str) -> int:
    """Stable 64-bit hash of a string (first 8 bytes of its SHA-256), independent of PYTHONHASHSEED."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")
