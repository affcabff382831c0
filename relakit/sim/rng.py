"""xoshiro256** random numbers, owned by each simulation, in independent streams.

Not ``np.random`` inside numba: its state is global per thread, so two fleets in one
process would share a stream. Each fleet carries an ``(n_streams, 4)`` array of states, one
per kind of randomness (the kernel's ``STREAMS``; every draw names its row): runs that
differ in a policy see the same arrivals and demands (common random numbers), and a run
split into many ``advance`` calls is bit-identical to one. Stream 0 is the seed expanded
by splitmix64; stream i + 1 is stream i jumped by 2**128 draws, so streams never overlap.
:class:`XoshiroPy` draws the same streams in pure Python, for reference models.

The draws are ``register_jitable`` with ``forceinline`` (compiled into each kernel that
calls them, inlined at every call site): as ``njit(inline="always")`` or plain ``njit``
they cost seconds of cold compile (docs/performance.md, "Cold start"). They are not
callable from Python as numba code: :class:`XoshiroPy` is the Python side.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from relakit.jit import register_jitable

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


#: xoshiro256**'s jump polynomial: applying it equals 2**128 calls to next (Vigna's reference)
_JUMP = (0x180EC6D33CFD0ABA, 0xD5A61266F0C9392C, 0xA9582618E03FC9AA, 0x39ABDC4529B1661C)


def new_state(seed: int, n_streams: int = 1) -> np.ndarray:
    """The kernel's generator state: one row of four words per stream, row k + 1 being
    row k jumped (:func:`jump_words`)."""
    s = np.zeros((n_streams, 4), dtype=np.uint64)
    s[0] = np.array(seed_words(seed), dtype=np.uint64)
    for k in range(1, n_streams):
        s[k] = jump_words(s[k - 1])
    return s


def jump_words(words: np.ndarray) -> np.ndarray:
    """Four words (uint64) moved on 2**128 draws: :meth:`XoshiroPy.jump`'s words.

    The jump is linear over GF(2) (the generator's step is shifts, rotations and
    xors; the jump xors states the steps reach), so it is a 256 x 256 bit matrix:
    the jumped state is the xor of the jumped unit states (:func:`_jump_table`) of
    the state's set bits, ~10 us in numpy. It ran in numba before (256 steps a
    jump, 2 ms in Python): its compile was ~0.3-0.4 s of every cold start."""
    bits = np.unpackbits(np.ascontiguousarray(words, dtype="<u8").view(np.uint8),
                         bitorder="little").astype(bool)  # bit j: word j // 64, bit j % 64
    return np.bitwise_xor.reduce(_jump_table()[bits], axis=0)


@functools.cache
def _jump_table() -> np.ndarray:
    """(256, 4) uint64: row j is the jump of the state whose only set bit is bit j
    (word j // 64, bit j % 64). Vigna's jump run on the 256 unit states at once, in
    numpy (a column each): the same steps and xors as :meth:`XoshiroPy.jump`. Built
    on first use, ~2 ms."""
    j = np.arange(256)
    s = np.zeros((4, 256), dtype=np.uint64)
    s[j // 64, j] = np.uint64(1) << (j % 64).astype(np.uint64)
    acc = np.zeros_like(s)
    s0, s1, s2, s3 = s  # row views: the updates below write into s
    for word in _JUMP:
        for b in range(64):
            if word >> b & 1:
                acc ^= s
            t = s1 << np.uint64(17)  # one step (the output word is not needed)
            s2 ^= s0
            s3 ^= s1
            s1 ^= s2
            s0 ^= s3
            s2 ^= t
            s3[:] = (s3 << np.uint64(45)) | (s3 >> np.uint64(19))
    table = np.ascontiguousarray(acc.T)
    table.flags.writeable = False  # (shared by every call)
    return table


@register_jitable(error_model="numpy", no_cfunc_wrapper=True, forceinline=True)
def _step(s0, s1, s2, s3):
    """One xoshiro256** step on four words: (64 output bits, the next four words).
    The two rotations (rotl(x, 7), rotl(x, 45)) written out: as a helper, one more
    function for every kernel's cold compile to type and lower (~0.03 s)."""
    x = s1 * np.uint64(5)
    result = ((x << np.uint64(7)) | (x >> np.uint64(57))) * np.uint64(9)
    t = s1 << np.uint64(17)
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    return result, s0, s1, s2, (s3 << np.uint64(45)) | (s3 >> np.uint64(19))


@register_jitable(error_model="numpy", no_cfunc_wrapper=True, forceinline=True)
def next_u64(s, k):
    """The next 64 bits of stream k (row k of the state)."""
    result, s0, s1, s2, s3 = _step(s[k, 0], s[k, 1], s[k, 2], s[k, 3])
    s[k, 0] = s0
    s[k, 1] = s1
    s[k, 2] = s2
    s[k, 3] = s3
    return result


@register_jitable(error_model="numpy", no_cfunc_wrapper=True, forceinline=True)
def uniform(s, k):
    """A double in [0, 1) with 53 random bits, from stream k."""
    # via int64: the value fits in 53 bits, and int64 → double is one instruction
    return float(np.int64(next_u64(s, k) >> np.uint64(11))) * _TWO53


@register_jitable(error_model="numpy", no_cfunc_wrapper=True, forceinline=True)
def uniform_words(s0, s1, s2, s3):
    """:func:`uniform` on a state held in four local words: (u, s0, s1, s2, s3).

    The event loop keeps its busiest streams in locals (registers), not in the
    state array, and writes them back when it returns."""
    result, s0, s1, s2, s3 = _step(s0, s1, s2, s3)
    return float(np.int64(result >> np.uint64(11))) * _TWO53, s0, s1, s2, s3


@register_jitable(error_model="numpy", no_cfunc_wrapper=True, forceinline=True)
def exponential(s, k, mean):
    return -mean * math.log(1.0 - uniform(s, k))


@register_jitable(error_model="numpy", no_cfunc_wrapper=True, forceinline=True)
def normal(s, k):
    """Box–Muller, one normal per two uniforms (no cached spare: less state)."""
    u1 = 1.0 - uniform(s, k)
    u2 = uniform(s, k)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def exponential_py(s: np.ndarray, k: int, mean: float) -> float:
    """:func:`exponential` from Python, on row k of a state array (advanced in place):
    the same words, the same double, without compiling anything. What a run's first
    arrival needs (``kernel.start``): a plain run then compiles no arrival sampler."""
    g = XoshiroPy.from_words(s[k])
    u = g.random()
    s[k] = np.array(g.s, dtype=np.uint64)
    return -mean * math.log(1.0 - u)


def uniform_py(s: np.ndarray, k: int) -> float:
    """:func:`uniform` from Python, on row k of a state array (advanced in place)."""
    g = XoshiroPy.from_words(s[k])
    u = g.random()
    s[k] = np.array(g.s, dtype=np.uint64)
    return u


class XoshiroPy:
    """The same generator in pure Python; ``random()`` matches :func:`uniform`.

    ``XoshiroPy(seed)`` is stream 0 of that seed; ``XoshiroPy(seed, stream=i)``
    is stream i, as the kernel's row i of :func:`new_state`.
    """

    def __init__(self, seed: int, stream: int = 0):
        self.s = seed_words(seed)
        for _ in range(stream):
            self.jump()

    @classmethod
    def from_words(cls, words) -> XoshiroPy:
        """A generator at the state of four words (a row of :func:`new_state`)."""
        g = cls.__new__(cls)
        g.s = [int(w) for w in words]
        return g

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

    def jump(self) -> None:
        """Move on 2**128 draws (xoshiro256**'s jump): the start of the next stream."""
        acc = [0, 0, 0, 0]
        for word in _JUMP:
            for b in range(64):
                if word >> b & 1:
                    acc = [a ^ x for a, x in zip(acc, self.s, strict=True)]
                self.next_u64()
        self.s = acc
