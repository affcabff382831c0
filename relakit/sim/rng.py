"""xoshiro256** random numbers, owned by each simulation.

Why not ``np.random`` inside numba: its state is global per thread, so two
fleets stepped in one process would draw from one stream and stop being
reproducible. Each fleet carries its own four-word state instead, which also
makes a run split into many ``advance`` calls bit-identical to one long call.
The pure-Python twin (:class:`XoshiroPy`) draws the same stream, so reference
models in pure Python can be compared with the kernel number for number.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_MASK = (1 << 64) - 1
_TWO53 = 1.0 / 9007199254740992.0


def _splitmix64(x: int) -> tuple[int, int]:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return x, z ^ (z >> 31)


def seed_words(seed: int) -> list[int]:
    """Expand an integer seed into four non-zero 64-bit words (splitmix64)."""
    x = int(seed) & _MASK
    words = []
    for _ in range(4):
        x, z = _splitmix64(x)
        words.append(z)
    return words


def new_state(seed: int) -> np.ndarray:
    return np.array(seed_words(seed), dtype=np.uint64)


@njit(cache=True, error_model="numpy", inline="always")
def _rotl(x, k):
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@njit(cache=True, error_model="numpy", inline="always")
def next_u64(s):
    s0 = s[0]
    s1 = s[1]
    s2 = s[2]
    s3 = s[3]
    result = _rotl(s1 * np.uint64(5), 7) * np.uint64(9)
    t = s1 << np.uint64(17)
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = _rotl(s3, 45)
    s[0] = s0
    s[1] = s1
    s[2] = s2
    s[3] = s3
    return result


@njit(cache=True, error_model="numpy", inline="always")
def uniform(s):
    """A double in [0, 1) with 53 random bits."""
    # via int64: the value fits in 53 bits, and int64 → double is one instruction
    return float(np.int64(next_u64(s) >> np.uint64(11))) * _TWO53


@njit(cache=True, error_model="numpy", inline="always")
def exponential(s, mean):
    return -mean * math.log(1.0 - uniform(s))


@njit(cache=True, error_model="numpy", inline="always")
def normal(s):
    """Box–Muller, one normal per two uniforms (no cached spare: less state)."""
    u1 = 1.0 - uniform(s)
    u2 = uniform(s)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


class XoshiroPy:
    """The same generator in pure Python; ``random()`` matches :func:`uniform`."""

    def __init__(self, seed: int):
        self.s = seed_words(seed)

    def next_u64(self) -> int:
        s0, s1, s2, s3 = self.s
        result = (((((s1 * 5) & _MASK) << 7 | ((s1 * 5) & _MASK) >> 57) & _MASK) * 9) & _MASK
        t = (s1 << 17) & _MASK
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = ((s3 << 45) | (s3 >> 19)) & _MASK
        self.s = [s0, s1, s2, s3]
        return result

    def random(self) -> float:
        return (self.next_u64() >> 11) * _TWO53
