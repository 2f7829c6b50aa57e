"""Build the pacer and filler an `AllocGRPOConfig` names (through `registry`), and the per-round
arguments that join them.

Torch-free: `args` is read by attribute only, so simulators and scripts can drive the same pipeline
with any object that carries the config's fields.
"""

import json
import math

from . import make_filler, make_pacer
from .pipeline import round_arguments


def resolve_num_rounds(args, num_prompts):
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


def build_pacer(args, num_prompts, num_rounds):
    """The across-round stage named by `args.pacing`."""
    seed = args.seed if args.allocation_seed is None else args.allocation_seed
    budget = args.budget_for(num_rounds)
    k = args.num_generations
    if args.pacing in ("uniform", "knapsack"):
        ppr = args.nominal_prompts_per_round
        if ppr > num_prompts:
            raise ValueError(f"`prompts_per_round` ({ppr}) exceeds the {num_prompts} prompts of the training dataset; "
                             "lower it (or `per_device_train_batch_size`), or use a larger dataset.")
        if args.pacing == "uniform":
            return make_pacer("uniform", num_prompts, prompts_per_round=ppr, group_size=k,
                              budget_responses=budget, seed=seed)
        return make_pacer("knapsack", num_prompts, prompts_per_round=ppr, group_size=k, budget_responses=budget,
                          min_n=args.knapsack_min_n, max_n=args.knapsack_max_n, seed=seed)
    if args.pacing == "random_matched":
        return make_pacer("random_matched", num_prompts, reference=load_reference(args.random_matched_reference),
                          unit_size=args.unit_size, seed=seed)
    return make_pacer(args.pacing, num_prompts, rounds=num_rounds, budget=budget // args.unit_size,
                      round_capacity=args.capacity_for(num_rounds), max_units=args.max_units,
                      saturation=args.saturation, forgetting=args.forgetting,
                      prior=(args.prior_alpha, args.prior_beta), init_price=args.init_price,
                      step_size=args.step_size, seed=seed, unit_size=args.unit_size, catch_up=args.catch_up)


def build_filler(args, num_prompts, pacer=None):
    """The within-round stage named by `args.filling`."""
    k = args.num_generations
    if args.filling == "full":
        return make_filler("full", group_size=k)
    if args.filling == "dynamic_sampling":
        return make_filler("dynamic_sampling", group_size=k, max_generation_batches=args.max_generation_batches)
    # SARA keeps its own history only when the pacer has no Beta states to lend it.
    own_history = args.history_decay and not hasattr(pacer, "beta")
    return make_filler("sara", group_size=k, probe=args.probe, tau_low=args.tau_low, commit_min=args.commit_min,
                       prior=(args.prior_alpha, args.prior_beta), safety_factor=args.sara_safety_factor,
                       warm_start_decay=args.history_decay if own_history else None,
                       num_prompts=num_prompts if own_history else None,
                       overcommit=getattr(args, "sara_overcommit", 1.5))


def round_kwargs(args, pacer, units, carry=None, wait_for_groups=False):
    """Arguments of `filler.start_round` for the pacer's proposal `units` (how the stages compose:
    docs/architecture.md#one-round-through-the-code)."""
    oversample = args.max_generation_batches if args.filling == "dynamic_sampling" else args.sara_safety_factor
    return round_arguments(pacer, units, args.filling, args.num_generations, target_groups=args.target_groups,
                           oversample=oversample, history_decay=args.history_decay, carry=carry,
                           wait_for_groups=wait_for_groups)


def load_reference(path):
    """A CERO allocation log from an allocation_state.json, a pacer state or a bare log."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict):
        data = data.get("pacer", data)
        if "allocation_log" not in data:
            raise ValueError(f"{path} holds no `allocation_log`; point `random_matched_reference` at the "
                             "allocation_state.json of a pacing='cero' run.")
        data = data["allocation_log"]
    return data


__all__ = ["resolve_num_rounds", "build_pacer", "build_filler", "round_kwargs", "load_reference"]
