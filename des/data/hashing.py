"""SplitMix64, the counter-based mixer behind the split assignment and the synthetic generator.

``splitmix64(x)`` is the finalizer of Steele, Lea and Flood's SplitMix64; the i-th output (0-based)
of a SplitMix64 stream seeded with ``s`` is ``splitmix64(s + (i + 1) * GOLDEN_GAMMA)`` (mod 2^64).
Everything here works on unsigned 64-bit integers with wrap-around arithmetic.
"""

from __future__ import annotations

import numba
import numpy as np

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TWO_POW_MINUS_53 = 1.0 / 9007199254740992.0


@numba.njit(cache=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """Mix a 64-bit integer into a well-distributed 64-bit hash (bijective)."""
    z = np.uint64(x)
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, inline="always")
def stream_value(seed: np.uint64, index: np.uint64) -> np.uint64:
    """The ``index``-th (0-based) output of a SplitMix64 stream seeded with ``seed``."""
    return splitmix64(np.uint64(seed) + (np.uint64(index) + np.uint64(1)) * GOLDEN_GAMMA)


@numba.njit(cache=True, inline="always")
def unit_float(h: np.uint64) -> float:
    """The top 53 bits of a hash as a float in [0, 1)."""
    return float(h >> np.uint64(11)) * _TWO_POW_MINUS_53


def seed_to_uint64(seed: int) -> np.uint64:
    """A user seed (any Python int, negative allowed) as an unsigned 64-bit integer."""
    return np.uint64(int(seed) % (1 << 64))
