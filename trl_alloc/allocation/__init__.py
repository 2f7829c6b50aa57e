"""The allocation layer: CERO, SARA, ARROL and the papers' baselines, numpy/scipy only.

Importing this package never imports torch or TRL. Every stateful object has `state_dict()` /
`load_state_dict()` returning JSON-serialisable data.
"""

from __future__ import annotations

from typing import Any

from .base import Filler, Pacer, RunContext
from .baselines import DynamicSamplingFiller, FullFiller, KnapsackPacer, UniformPacer
from .beta import BetaState, variance_proxy
from .event_rounds import Round
from .cero import (CEROFixed, CEROGreedy, CEROPreset, CEROScheduler, RandomMatched, oracle_exposure,
                   supporting_exposure, utility)
from .sara import SARAFiller, decide, effective_probability
from .success import SUCCESS_THRESHOLD, is_success

from .registry import method_class, method_names, register


def make_pacer(name: str, num_prompts: int, **kwargs: Any) -> Pacer:
    """Build a pacer by its config name (`pacing=`)."""
    return method_class("pacing", name)(num_prompts, **kwargs)


def make_filler(name: str, **kwargs: Any) -> Filler:
    """Build a filler by its config name (`filling=`)."""
    return method_class("filling", name)(**kwargs)


__all__ = ["Pacer", "Filler", "Round", "RunContext", "UniformPacer", "KnapsackPacer", "FullFiller",
           "DynamicSamplingFiller", "BetaState", "variance_proxy", "CEROScheduler", "CEROFixed", "CEROPreset",
           "CEROGreedy", "RandomMatched", "oracle_exposure", "supporting_exposure", "utility", "SARAFiller", "decide",
           "effective_probability", "is_success", "SUCCESS_THRESHOLD", "register", "method_names", "method_class",
           "make_pacer", "make_filler"]
