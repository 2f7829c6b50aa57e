"""Build the pacer and filler an `AllocGRPOConfig` names (each class builds itself: `from_config`, found through
`registry`), and the per-round arguments that join them.

Torch-free: `args` is read by attribute only, so simulators and scripts can drive the same pipeline
with any object that carries the config's fields.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .base import Filler, Pacer, RunContext
from .pipeline import round_arguments
from .registry import method_class


def resolve_num_rounds(args: Any, num_prompts: int) -> int:
    """K: `num_rounds`, else the rounds `max_steps` optimizer steps take, else the rounds of stock GRPO.

    Stock GRPO's RepeatSampler drops the last incomplete batch of prompts each epoch, so it takes
    ceil(epochs × floor(N / P) × steps_per_round) optimizer steps, P = generation_batch_size / k.
    """
    per_round = args.steps_per_round
    if args.num_rounds is not None:
        return int(args.num_rounds)
    if args.max_steps and args.max_steps > 0:
        return math.ceil(args.max_steps / per_round)
    stock_steps = math.ceil(args.num_train_epochs * (num_prompts // args.nominal_prompts_per_round) * per_round)
    return max(1, math.ceil(stock_steps / per_round))


def run_context(args: Any, num_prompts: int, num_rounds: int, pacer: Pacer | None = None,
                reference: list | None = None) -> RunContext:
    """The `RunContext` of a run: its pool, horizon, budget (`args.budget_for`) and allocation seed."""
    seed = args.seed if args.allocation_seed is None else args.allocation_seed
    return RunContext(num_prompts=num_prompts, num_rounds=num_rounds, budget=args.budget_for(num_rounds), seed=seed,
                      pacer=pacer, reference=reference)


def build_stages(args: Any, num_prompts: int, num_rounds: int,
                 reference: list | None = None) -> tuple[Pacer, Filler]:
    """(pacer, filler): the stages `args.pacing` and `args.filling` name (registry), each built from the config;
    the filler is built knowing its pacer. `reference`: a CERO run's allocation log, for a pacer that replays one
    (random_matched in the planner)."""
    context = run_context(args, num_prompts, num_rounds, reference=reference)
    pacer = method_class("pacing", args.pacing).from_config(args, context)
    return pacer, method_class("filling", args.filling).from_config(args, dataclasses.replace(context, pacer=pacer))


def round_kwargs(args: Any, filler: Filler, pacer: Pacer, units: np.ndarray, carry: dict[int, dict] | None = None,
                 wait_for_groups: bool = False) -> dict:
    """Arguments of `filler.start_round` for the pacer's proposal `units` (how the stages compose:
    docs/architecture.md#one-round-through-the-code)."""
    return round_arguments(pacer, filler, units, target_groups=args.target_groups,
                           carry=carry, wait_for_groups=wait_for_groups)


__all__ = ["resolve_num_rounds", "run_context", "build_stages", "round_kwargs"]
