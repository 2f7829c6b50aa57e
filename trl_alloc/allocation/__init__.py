"""The allocation layer: CERO, SARA, ARROL and the seeds' baselines, numpy/scipy only.

Importing this package never imports torch or TRL. Every stateful object has `state_dict()` /
`load_state_dict()` returning JSON-serialisable data.
"""

from .base import Pacer, Round
from .baselines import DynamicSamplingFiller, FullFiller, KnapsackPacer, UniformPacer
from .beta import BetaState, variance_proxy
from .cero import (CEROFixed, CEROGreedy, CEROPreset, CEROScheduler, RandomMatched, oracle_exposure,
                   supporting_exposure, utility)
from .sara import SARAFiller, decide, effective_probability

PACERS = {"cero": CEROScheduler, "cero_fixed": CEROFixed, "cero_preset": CEROPreset,
          "cero_greedy": CEROGreedy, "random_matched": RandomMatched, "uniform": UniformPacer,
          "knapsack": KnapsackPacer}
FILLERS = {"sara": SARAFiller, "full": FullFiller, "dynamic_sampling": DynamicSamplingFiller}


def make_pacer(name, num_prompts, **kwargs):
    """Build a pacer by its config name (`pacing=`)."""
    if name not in PACERS:
        raise ValueError(f"unknown pacing {name!r}; choose one of {sorted(PACERS)}.")
    return PACERS[name](num_prompts, **kwargs)


def make_filler(name, **kwargs):
    """Build a filler by its config name (`filling=`)."""
    if name not in FILLERS:
        raise ValueError(f"unknown filling {name!r}; choose one of {sorted(FILLERS)}.")
    return FILLERS[name](**kwargs)
