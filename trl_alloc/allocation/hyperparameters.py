"""A method's hyperparameters, declared on its class: each one's name, type, default, help and check.

The config (`trainer.config`) and the command line are built from these declarations: a registered method's
hyperparameters become fields of `AllocGRPOConfig` (and `--name` flags of `TrlParser`), a method named by its import
path takes its own from `pacing_kwargs` / `filling_kwargs`; both are checked by the same `Hyperparameter.check`
(docs/architecture.md#adding-a-method).
"""

from __future__ import annotations

import math
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Rule = Callable[[Any], str | None]  # what is wrong with a value (the words after "`name` must"), or None


@dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter: the config field (and `--name` flag) it becomes, its type annotation, its default, the help
    `--help` and the config's docstring show, and `rule` (the problem with a value, or None)."""

    name: str
    type: Any
    default: Any
    help: str
    rule: Rule | None = None
    none_ok: bool | None = None  # None is a valid value; None here: when the type admits it (`int | None`)

    def check(self, value: Any) -> Any:
        """`value` if it is valid, else a clear error; an integer-valued float for an int becomes an int, a number
        given as a string (the command line, YAML) a float."""
        kinds = typing.get_args(self.type) if isinstance(self.type, types.UnionType) else (self.type,)
        if value is None:
            if self.none_ok if self.none_ok is not None else type(None) in kinds:
                return None
            raise TypeError(f"`{self.name}` must not be None.")
        if float in kinds and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass  # the rule decides (e.g. tau_low's 'auto')
        if int in kinds and bool not in kinds:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value).is_integer():
                raise TypeError(f"`{self.name}` must be an integer, got {value!r} ({type(value).__name__}).")
            value = int(value)
        elif bool in kinds and not isinstance(value, bool):
            raise TypeError(f"`{self.name}` must be true or false, got {value!r}.")
        elif float in kinds and (isinstance(value, bool) or not isinstance(value, numbers.Real)) \
                and not (str in kinds and isinstance(value, str)):
            raise TypeError(f"`{self.name}` must be a number, got {value!r} ({type(value).__name__}).")
        problem = self.rule(value) if self.rule is not None else None
        if problem:
            raise ValueError(f"`{self.name}` must {problem}, got {value!r}.")
        return value


def at_least(low: float) -> Rule:
    """The rule `value >= low`."""
    return lambda value: None if value >= low else f"be >= {low}"


def within(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Rule:
    """The rule `low <= value <= high`, either end excluded when open."""
    def rule(value):
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        ok = above and below and not (isinstance(value, float) and math.isnan(value))
        return None if ok else f"lie in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    return rule


def positive(value: float) -> str | None:
    """The rule `value > 0`."""
    return None if value > 0 else "be positive"


__all__ = ["Hyperparameter", "Rule", "at_least", "within", "positive"]
