"""64-bit mixing functions shared by the index hash and the counter-based initializer.

All arithmetic is on ``uint64`` (numba wraps on overflow, like C). ``splitmix64`` is the output
function of Steele, Lea & Flood's SplitMix64 generator (Java 8 ``SplittableRandom``); it is a
bijection on 64-bit words with good avalanche, so distinct inputs stay distinct.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numba import njit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_MASK64 = (1 << 64) - 1


@njit(cache=True, nogil=True, inline="always")
def splitmix64(z: np.uint64) -> np.uint64:
    """SplitMix64 step: add the golden gamma, then two xor-shift-multiply rounds."""
    z = np.uint64(z) + GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def splitmix64_py(z: int) -> int:
    """Pure-Python twin of :func:`splitmix64` (for seeds computed once, outside kernels)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def name_hash(name: str) -> int:
    """Stable 64-bit hash of a string (first 8 bytes of its SHA-256), independent of PYTHONHASHSEED."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")
