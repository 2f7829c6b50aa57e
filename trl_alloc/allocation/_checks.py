"""Argument checks shared by the allocators: each error names the argument and the fix."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def check_int(name: str, value: numbers.Real, minimum: int = 0) -> int:
    """A non-negative (or >= minimum) integer, bools excluded."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer() and not isinstance(value, bool):
            value = int(value)
        else:
            raise ValueError(f"`{name}` must be an integer, got {value!r}.")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}.")
    return int(value)


def check_open_unit(name: str, value: float, low_closed: bool = False, high_closed: bool = False) -> float:
    """A float in (0, 1), optionally including either end."""
    value = float(value)
    ok_low = value >= 0 if low_closed else value > 0
    ok_high = value <= 1 if high_closed else value < 1
    if not (ok_low and ok_high) or np.isnan(value):
        lo, hi = ("[" if low_closed else "("), ("]" if high_closed else ")")
        raise ValueError(f"`{name}` must lie in {lo}0, 1{hi}, got {value}.")
    return value


def check_prior(name: str, prior: Sequence[float]) -> tuple[float, float]:
    a0, b0 = (float(x) for x in prior)
    if not (a0 > 0 and b0 > 0):
        raise ValueError(f"`{name}` must be two positive Beta parameters (a0, b0), got {prior!r}.")
    return a0, b0


def check_counts(name: str, values: ArrayLike, length: int) -> np.ndarray:
    """Per-prompt counts: an array of `length` non-negative integers."""
    arr = np.asarray(values)
    if arr.shape != (length,):
        raise ValueError(f"`{name}` must have shape ({length},) (one entry per prompt), got {arr.shape}.")
    if arr.size and (np.isnan(arr.astype(float)).any() or (arr < 0).any()):
        raise ValueError(f"`{name}` must be non-negative counts; found negative or NaN entries.")
    if arr.size and not np.all(np.asarray(arr, dtype=float) == np.round(arr.astype(float))):
        raise ValueError(f"`{name}` must hold whole numbers of responses.")
    return arr.astype(np.int64)


def check_finite(name: str, values: ArrayLike) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if np.isnan(arr).any():
        raise ValueError(f"`{name}` contains NaN; drop or fix those entries before calling.")
    return arr
