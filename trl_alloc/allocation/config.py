"""The allocation's config, torch-free: every field the pacers, fillers and pruners read, declared once.

`ALLOCATION_FIELDS` (the stages, the budget and rounds, the stream's staleness bound) and each registered method's
hyperparameters (`registry.registered_hyperparameters`) are the fields of both `AllocationConfig` (here: what the
planner and `allocation.simulate` build) and `AllocGRPOConfig` (trl_alloc/trainer/config.py, which adds TRL's
`GRPOConfig` and the trainer's own). So a planner built with no arguments runs the trainer's defaults
(tests/allocation/test_allocation_config.py checks it field by field). `AllocationRules` holds what both do with
those fields: the methods' settings and checks, and the budget questions.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from .registry import STAGES, method_class, method_names, registered_hyperparameters

# the stage names, as the registry holds them
PACINGS, FILLINGS, PRUNINGS = method_names("pacing"), method_names("filling"), method_names("pruning")

ALLOCATION_FIELDS = [  # (name, type, field): the run's allocation settings; the methods' own come from their classes
    ("pacing", str, field(default="cero", metadata={
        "help": "Across-round stage: which prompts get a group this round. One of " + ", ".join(PACINGS) + ", or "
        "the import path of your own registered class (docs/architecture.md#adding-a-method)."})),
    ("filling", str, field(default="sara", metadata={
        "help": "Within-round stage: how each admitted prompt's responses are collected. One of "
        + ", ".join(FILLINGS) + ", or the import path of your own registered class."})),
    ("pruning", str, field(default="none", metadata={
        "help": "Within-rollout stage: 'arrol' (score partial rollouts at `detect_length` with the quality head and "
        "prune toward correctness-balanced survivors), 'random' (prune at the same keep ratio without the head: the "
        "paper's control) or 'none'."})),
    ("pacing_kwargs", dict | str | None, field(default=None, metadata={
        "help": "Keyword arguments of the pacing method beyond the fields below (a method's own hyperparameters, e.g. "
        "GRESO's `target_zero_variance`; docs/allocation.md), as a dict or a JSON object."})),
    ("filling_kwargs", dict | str | None, field(default=None, metadata={
        "help": "Keyword arguments of the filling method beyond the fields below, as a dict or a JSON object."})),
    ("rollout_budget", int | None, field(default=None, metadata={
        "help": "Global budget in responses for the whole run (probes, abandoned and pruned responses included). "
        "None = num_rounds × generation_batch_size (the responses stock GRPO would generate)."})),
    ("num_rounds", int | None, field(default=None, metadata={
        "help": "Scheduler rounds K, the horizon the budget is paced over (one generation batch and `steps_per_round` "
        "optimizer steps each). None = the rounds `max_steps` takes if set, else the steps stock GRPO would take for "
        "`num_train_epochs` over the dataset. A `max_steps` below K × steps_per_round stops the run early."})),
    ("prompts_per_round", int | None, field(default=None, metadata={
        "help": "Prompts per round for pacing='uniform'/'knapsack'. None = generation_batch_size // num_generations "
        "(stock GRPO)."})),
    ("target_groups", int | None, field(default=None, metadata={
        "help": "Groups a SARA / dynamic-sampling round tries to commit (B). None = the number of prompts the pacer "
        "admitted this round."})),
    ("allocation_seed", int | None, field(default=None, metadata={
        "help": "Seed of the allocator's own randomness (tie-breaking permutations, epoch orders). None = `seed`."})),
    ("max_staleness", int, field(default=2, metadata={
        "help": "Stream mode: the most policy versions a trained token may be older than the policy that trains it; "
        "an open group that would exceed it is dropped (its rollouts aborted and counted). Stale tokens get TRL's "
        "vLLM importance-sampling correction (`vllm_importance_sampling_correction`)."})),
    ("rollout_max_inflight", int | None, field(default=None, metadata={
        "help": "Events and stream modes: most rollouts running at once (the window). None = the generation batch "
        "(what stock TRL runs). In a stream, a window larger than the generation batch starts later rounds' "
        "rollouts before earlier ones train, so the first rounds close with nothing to train "
        "(docs/choosing-settings.md)."})),
]


def allocation_field_specs() -> list[tuple[str, Any, Any]]:
    """`ALLOCATION_FIELDS` and every registered method's hyperparameters, as `dataclasses.make_dataclass` takes
    them (fresh `field` objects: each dataclass built from them owns its own)."""
    own = [(name, kind, field(default=f.default, metadata=f.metadata)) for name, kind, f in ALLOCATION_FIELDS]
    return own + [(h.name, h.type, field(default=h.default, metadata={"help": h.help}))
                  for group in registered_hyperparameters().values() for h in group]


def allocation_field_names() -> list[str]:
    return [name for name, _, _ in allocation_field_specs()]


class AllocationRules:
    """What a config with the allocation's fields does with them (shared by `AllocationConfig` and
    `AllocGRPOConfig`): each chosen method's settings checked by its declarations, and the budget questions."""

    def _take_method_settings(self) -> None:
        """Each chosen method's hyperparameters (`hyperparameters` on its class), checked by their declarations. A
        `<stage>_kwargs` key names one of the method's own: it sets the config field of that name where one exists
        (a registered method's), else it stays in `<stage>_kwargs`, with the defaults of those not given."""
        fields = {f.name for f in dataclasses.fields(self)}
        methods_own = {h.name for group in registered_hyperparameters().values() for h in group}
        for stage in STAGES:
            cls = method_class(stage, getattr(self, stage))  # an unknown name lists the registered ones
            declared = {h.name: h for h in getattr(cls, "hyperparameters", ())}
            clash = sorted(set(declared) & fields - methods_own)
            if clash:
                raise ValueError(f"{stage}={getattr(self, stage)!r} declares the hyperparameter(s) {clash}, which are "
                                 "the config's own fields; give them other names.")
            has_kwargs = f"{stage}_kwargs" in fields
            kwargs = as_kwargs(f"{stage}_kwargs", getattr(self, f"{stage}_kwargs")) if has_kwargs else {}
            unknown = sorted(set(kwargs) - set(declared))
            if unknown:
                raise ValueError(f"`{stage}_kwargs` has {unknown}, which {stage}={getattr(self, stage)!r} does "
                                 f"not take; it takes {', '.join(declared) if declared else 'none'}.")
            for name, h in declared.items():
                if name in fields:
                    setattr(self, name, h.check(kwargs.pop(name) if name in kwargs else getattr(self, name)))
                else:
                    kwargs[name] = h.check(kwargs.get(name, h.default))
            if has_kwargs:
                setattr(self, f"{stage}_kwargs", kwargs)
        chosen = {h.name for cls in self.method_classes for h in cls.hyperparameters}
        unread = [f"{h.name}={getattr(self, h.name)!r} ({label})"
                  for label, group in registered_hyperparameters().items()
                  for h in group if h.name not in chosen and getattr(self, h.name) != h.default]
        if unread:
            warnings.warn(f"{', '.join(unread)} set, but the chosen methods (pacing={self.pacing!r}, filling="
                          f"{self.filling!r}, pruning={self.pruning!r}) do not read them: they have no effect.",
                          UserWarning, stacklevel=4)

    def allocation_settings(self) -> dict[str, Any]:
        """Every allocation field's value (`allocation_field_names`): what a planner needs to run this config."""
        return {name: getattr(self, name) for name in allocation_field_names()}

    @property
    def method_classes(self) -> list[type]:
        """The classes `pacing`, `filling` and `pruning` name (pruning='none': none)."""
        return [c for c in (method_class(stage, getattr(self, stage)) for stage in STAGES) if c is not None]

    @property
    def prunes(self) -> bool:
        """A pruning method is chosen (pruning='none' registers no class)."""
        return method_class("pruning", self.pruning) is not None

    @property
    def rollout_window(self) -> int:
        """Most rollouts in flight at once in events and stream modes: `rollout_max_inflight`, else the generation
        batch (the trainer's rule; the engine model and the rollout bench read it here)."""
        return int(self.rollout_max_inflight or self.generation_batch_size)

    @property
    def nominal_prompts_per_round(self) -> int:
        """Prompts per round of stock GRPO (and of pacing='uniform' by default)."""
        return self.prompts_per_round or max(1, self.generation_batch_size // self.num_generations)

    @property
    def pacer_class(self) -> type:
        """The class `pacing` names (allocation.registry)."""
        return method_class("pacing", self.pacing)

    @property
    def filler_class(self) -> type:
        """The class `filling` names (allocation.registry)."""
        return method_class("filling", self.filling)

    def budget_for(self, num_rounds: int) -> int:
        """The global response budget of a run of `num_rounds` rounds (`rollout_budget`, else the pacer's default)."""
        if self.rollout_budget is not None:
            return int(self.rollout_budget)
        return self.pacer_class.budget_for(self, num_rounds)

    def max_round_responses(self, num_rounds: int) -> int | None:
        """Most responses one round can spend, or None when unbounded by the config alone."""
        return self.pacer_class.max_round_responses(self, num_rounds, self.filler_class)

    def check_budget(self, num_rounds: int) -> None:
        """Reject a budget the run cannot spend in `num_rounds` rounds."""
        if int(num_rounds) < 1:
            raise ValueError(f"`num_rounds` must be >= 1, got {num_rounds}.")
        budget, per_round = self.budget_for(num_rounds), self.max_round_responses(num_rounds)
        smallest = self.filler_class.smallest_group(self)  # one group's responses
        if budget < smallest:
            raise ValueError(f"`rollout_budget` ({budget} responses) is smaller than one group ({smallest} responses: "
                             f"num_generations={self.num_generations}, commit_min={self.commit_min}, filling="
                             f"{self.filling!r}): nothing could ever be trained; raise `rollout_budget`.")
        if per_round is not None and budget > num_rounds * per_round:
            raise ValueError(
                f"`rollout_budget` ({budget} responses) exceeds what {num_rounds} rounds can spend "
                f"({num_rounds} × {per_round} responses per round); lower `rollout_budget` or raise `num_rounds`"
                + f" / `{self.pacer_class.round_limit_field}`.")


_AllocationFields = dataclasses.make_dataclass("_AllocationFields", allocation_field_specs())
_AllocationFields.__module__ = __name__


@dataclass
class AllocationConfig(_AllocationFields, AllocationRules):
    """The allocation fields with the trainer's defaults, without TRL or torch (what `scripts/plan.py` and
    `allocation.simulate` run), plus the few `GRPOConfig` fields the methods read, at TRL's defaults for one
    process. `AllocGRPOConfig.allocation_config()` gives a trainer config's own."""

    num_generations: int = 8  # TRL's GRPOConfig: k, responses per prompt
    generation_batch_size: int = 8  # TRL's: per_device_train_batch_size × steps_per_generation × processes
    max_completion_length: int = 512  # TRL's
    seed: int = 42  # transformers' TrainingArguments

    def __post_init__(self) -> None:
        self._take_method_settings()
        if self.commit_min is None:
            self.commit_min = self.num_generations


def as_kwargs(name: str, value: Any) -> dict:
    """A `*_kwargs` field as a dict (the command line and YAML may give a JSON string)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"`{name}` must be a JSON object, e.g. '{{\"target_zero_variance\": 0.25}}'; got "
                             f"{value!r} ({err}).") from None
    if not isinstance(value, dict):
        raise ValueError(f"`{name}` must be a dict (or a JSON object), got {value!r}.")
    return dict(value)


__all__ = ["ALLOCATION_FIELDS", "AllocationConfig", "AllocationRules", "allocation_field_names",
           "allocation_field_specs", "as_kwargs", "PACINGS", "FILLINGS", "PRUNINGS"]
