"""Shared argument checks for :mod:`relakit.analytic` (private).

The closed forms silently return nonsense (negative probabilities, NaN) for out-of-range
inputs, so every public function validates up front and raises ``ValueError`` with the
offending name and value.
"""

from __future__ import annotations

import math
import operator

import numpy as np


def as_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` as a Python int, requiring a true integer type and ``>= minimum``.

    Floats (even 20.0) and bools are rejected: a count given as a float usually means the
    caller passed the wrong argument.
    """
    if isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be an integer, got bool {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None
    if out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}")
    return out


def as_int_array(name: str, value: object, minimum: int) -> np.ndarray:
    """Array version of :func:`as_int`: real values that are integral and ``>= minimum``."""
    arr = np.asarray(value)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise ValueError(f"{name} must be integer-valued, got {value!r}")
    if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
        raise ValueError(f"{name} must be integer-valued, got {value!r}")
    if np.any(arr < minimum):
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return arr


def as_positive(name: str, value: object, *, allow_inf: bool = False) -> float:
    """Return ``value`` as a float that is ``> 0`` (and finite unless ``allow_inf``)."""
    out = _as_float(name, value)
    if not out > 0 or (math.isinf(out) and not allow_inf):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return out


def as_nonnegative(name: str, value: object) -> float:
    """Return ``value`` as a finite float that is ``>= 0``."""
    out = _as_float(name, value)
    if not (out >= 0 and math.isfinite(out)):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return out


def as_probability(name: str, value: object) -> float:
    """Return ``value`` as a float in the closed interval [0, 1]."""
    out = _as_float(name, value)
    if not 0.0 <= out <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    return out


def as_probability_array(name: str, value: object, *, open_interval: bool = False) -> np.ndarray:
    """Float array with every element in [0, 1] (or (0, 1) if ``open_interval``)."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numeric, got {value!r}") from None
    if open_interval:
        ok = np.all((arr > 0.0) & (arr < 1.0))
        interval = "(0, 1)"
    else:
        ok = np.all((arr >= 0.0) & (arr <= 1.0))
        interval = "[0, 1]"
    if not ok:  # also catches NaN, which fails every comparison
        raise ValueError(f"{name} must lie in {interval}, got {value!r}")
    return arr


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool | np.bool_) or np.ndim(value) != 0:
        raise ValueError(f"{name} must be a real scalar, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None


def scalar_or_array(arr: np.ndarray) -> float | np.ndarray:
    """Unwrap 0-d results to a Python float so scalar calls return scalars."""
    return float(arr) if np.ndim(arr) == 0 else arr
