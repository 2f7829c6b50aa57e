"""TRL-style configs: `AllocGRPOConfig(GRPOConfig)` and `AllocDAPOConfig`, parsed by `TrlParser`.

One optimizer step is one scheduler round. The stage fields (`pacing`, `filling`, `pruning`) pick
the sampling pipeline. Each method declares its own hyperparameters on its class (CERO arXiv 2610.09679,
SARA "Early Verdicts, Better Budgets", ARROL arXiv 2603.24840, the baselines of docs/allocation.md), and
the fields, `--help` and docstring below are generated from those declarations (`_MethodFields`).
"""

import dataclasses
import numbers
import os
import textwrap
import warnings
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from ..allocation.config import (FILLINGS, PACINGS, AllocationConfig, AllocationRules,
                                 allocation_field_names, allocation_field_specs)
from ..allocation.registry import method_class, registered_hyperparameters
from .rollout_mode import choose_rollout_mode


@dataclass
class _RunFields(GRPOConfig):
    """The run's own fields; each method's hyperparameters come from its class (`_MethodFields`)."""

    # The trainer's own (the allocation's fields, shared with the planner, are allocation/config.py's)
    success_reward_funcs: list[str] | None = field(default=None, metadata={
        "help": "Names of the reward functions whose unweighted sum is a response's success score (what the "
        "allocators count as a success). None = trl-alloc's verifiers among the reward functions (math, math_number, "
        "arithmetic, countdown), else the first reward function."})
    success_threshold: float = field(default=0.5, metadata={
        "help": "A response succeeds when its success score is >= this (0.5 for 0/1 verifiers; e.g. 0 for rewards "
        "in {-1, 1})."})
    no_signal_warning_rounds: int = field(default=5, metadata={
        "help": "Warn after this many rounds in a row without one mixed group (nothing is trained), naming the "
        "likely cause."})
    probe_counts: str | None = field(default=None, metadata={
        "help": "CERO: start each prompt's Beta state from a probe pass's successes and failures (arXiv 2610.09679 "
        "eq. 5 applied once with them), a JSON file `scripts/arrol_study.py` writes (`probe_counts.json`, prompts "
        "matched by text). The probe's responses are not counted in `rollout_budget`."})

    loss_normalization: str = field(default="trained", metadata={
        "help": "'trained': TRL's loss normalisation (`loss_type`) over the rows the round trains, its committed "
        "groups; at one learning rate a round that trains fewer rows than stock's batch then moves each informative "
        "token further than stock does (its batch also counts flat groups, whose advantage is 0). 'nominal': the "
        "loss is scaled by trained rows / generation_batch_size (at most 1), as if the rows not trained were there "
        "with zero advantage, so the step per informative token is stock GRPO's at the same learning rate "
        "(docs/benchmarks.md, the learning regime)."})
    # Rollouts (docs/architecture.md: the event-driven round)
    rollout_mode: str = field(default="auto", metadata={
        "help": "'auto': the mode measured faster for this run (trainer/rollout_mode.py: deterministic without a GPU "
        "vLLM engine, stream on a vLLM server or colocate GPU with an adaptive filler, events with sleep mode). "
        "'deterministic': each round is a sequence of batched generation calls (bit-exact for a seed). "
        "'events': rollouts are started within a window and decided on one at a time as they end, the surplus "
        "aborted (vLLM server mode streams them; transformers generation batches what is pending). 'stream': one "
        "stream across rounds: a round closes once it has its groups or has started its budget, its unfinished "
        "rollouts go on into the next round, whose rollouts start before this one trains (docs/benchmarks.md)."})
    vllm_enforce_eager: bool | None = field(default=None, metadata={
        "help": "vLLM colocate: run the engine eagerly (no torch.compile, no CUDA graphs). None: eager on CPU, as "
        "trl-alloc-serve's CPU server (compiling costs ~30 s at each engine start on a 2-core CPU), vLLM's default "
        "(compiled, CUDA graphs) on a GPU, as TRL."})
    vllm_dtype: str | None = field(default=None, metadata={
        "help": "vLLM colocate: the engine's dtype (auto, float32, bfloat16, float16). None: the dtype the trainer "
        "computes in (bfloat16 / float16 with `bf16` / `fp16`, else the model's), so the engine samples from the "
        "policy the trainer scores and TRL's importance-sampling ratio is 1 on-policy. 'auto' is TRL's behaviour "
        "(vLLM's auto: a float32 model generates in bfloat16); the run warns where the engine's dtype differs from "
        "the trainer's (docs/choosing-settings.md)."})


# The allocation's fields (allocation/config.py: the stages, budget and rounds, and every registered method's
# hyperparameters, declared on its class as a method from outside the package declares its own), shared with the
# planner's `AllocationConfig`; `TrlParser` makes each a `--name` flag.
_MethodFields = dataclasses.make_dataclass("_MethodFields", allocation_field_specs(),
                                           bases=(_RunFields, AllocationRules))
_MethodFields.__module__ = __name__


@dataclass
class AllocGRPOConfig(_MethodFields):
    r"""GRPOConfig plus the rollout-allocation pipeline.

    The training dataset is the prompt pool. Each round the pacer admits prompts, the filler turns
    them into generation requests, and only the round's committed groups reach the loss, over
    `steps_per_round` optimizer steps (`steps_per_generation` micro-batches, each seen
    `num_iterations` times). The responses per round vary, so `per_device_train_batch_size` only
    sets TRL's nominal batch, `generation_batch_size`, from which the defaults below derive).
    """

    rollout_mode_reason = None  # why rollout_mode="auto" chose what it did (set by __post_init__)

    def __post_init__(self) -> None:
        for name in ("save_strategy", "eval_strategy", "logging_strategy"):  # YAML reads a bare `no` as false
            if getattr(self, name, None) is False:
                setattr(self, name, "no")
        if isinstance(self.max_completion_length, int) and self.max_completion_length < 1:
            raise ValueError(f"`max_completion_length` must be >= 1, got {self.max_completion_length}: a response "
                             "needs at least one token.")
        super().__post_init__()
        if self.cold_start_steps is not None:
            warnings.warn("`cold_start_steps` is renamed `cold_start_rounds` (it counts rounds); using "
                          f"cold_start_rounds={self.cold_start_steps}.", FutureWarning, stacklevel=3)
            self.cold_start_rounds, self.cold_start_steps = self.cold_start_steps, None
        self._take_method_settings()
        self._check_types()
        if self.probe_counts is not None:
            if not method_class("pacing", self.pacing).seeds_from_probe:
                raise ValueError(f"probe_counts seeds CERO's Beta states; pacing={self.pacing!r} keeps none. Use "
                                 "pacing='cero' (or a CERO ablation), or drop probe_counts.")
            if not os.path.isfile(self.probe_counts):
                raise ValueError(f"probe_counts={self.probe_counts!r} is not a file; give the probe_counts.json "
                                 "that scripts/arrol_study.py wrote.")
        if self.steps_per_generation % self.gradient_accumulation_steps:
            raise ValueError(
                f"a round is a whole number of optimizer steps, so `steps_per_generation` "
                f"({self.steps_per_generation}) must be a multiple of `gradient_accumulation_steps` "
                f"({self.gradient_accumulation_steps}).")
        k = self.num_generations
        if self.commit_min is None:
            self.commit_min = k
        _check_choice("rollout_mode", self.rollout_mode, ("auto", "deterministic", "events", "stream"))
        _check_choice("loss_normalization", self.loss_normalization, ("trained", "nominal"))
        if self.vllm_dtype is not None:
            _check_choice("vllm_dtype", self.vllm_dtype, ("auto", "float32", "bfloat16", "float16"))
        colocate_only = [f"{name}={getattr(self, name)!r}" for name in ("vllm_enforce_eager", "vllm_dtype")
                         if getattr(self, name) is not None]
        if colocate_only and not (self.use_vllm and self.vllm_mode == "colocate"):
            warnings.warn(f"{', '.join(colocate_only)} set, but only the colocate engine reads it (use_vllm="
                          f"{self.use_vllm}, vllm_mode={self.vllm_mode!r}): it has no effect. A vLLM server takes "
                          "its own `--dtype` / `--enforce-eager` on its command line.", UserWarning, stacklevel=3)
        if self.rollout_mode == "auto":  # the choice and its reason go to the log and the model card
            cuda = torch.cuda.is_available() and not self.use_cpu
            self.rollout_mode, self.rollout_mode_reason = choose_rollout_mode(self, cuda)
        if int(self.max_staleness) < 1:
            raise ValueError(f"`max_staleness` must be >= 1, got {self.max_staleness}: a stream's rollouts started "
                             "while a round trains are one version old (rollout_mode='events' stays on-policy).")
        if self.rollout_mode == "stream" and self.prunes and not self.use_vllm:
            raise ValueError(f"rollout_mode='stream' prunes (pruning={self.pruning!r}) inside a vLLM engine, at the "
                             "detection point; without vLLM use rollout_mode='events' or 'deterministic' (two-phase "
                             "pruning), or --use_vllm.")
        if self.rollout_mode == "stream" and self.steps_per_round > 1:
            raise ValueError("rollout_mode='stream' trains each round in one optimizer step (steps_per_round=1): "
                             "the next round's rollouts are already running on its weights.")
        if self.use_vllm and self.vllm_mode == "colocate" and self.rollout_mode != "deterministic":
            self._check_colocate_rollouts()
        if self.rollout_max_inflight is not None and self.rollout_max_inflight < k:
            raise ValueError(f"`rollout_max_inflight` ({self.rollout_max_inflight}) must hold at least one group "
                             f"(num_generations = {k}).")
        for name in ("num_rounds", "rollout_budget", "prompts_per_round", "target_groups"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise ValueError(f"`{name}` must be a positive integer (or None), got {value}.")
        for cls in self.method_classes:
            cls.check_config(self)
        if self.num_rounds is not None and self.max_steps > self.num_rounds * self.steps_per_round:
            raise ValueError(f"`max_steps` ({self.max_steps}) is more optimizer steps than `num_rounds` "
                             f"({self.num_rounds}) rounds of {self.steps_per_round} step(s) take; raise `num_rounds` "
                             "or lower `max_steps` (a smaller max_steps stops the run early).")
        if self.num_rounds is not None:
            self.check_budget(self.num_rounds)

    def _check_colocate_rollouts(self) -> None:
        """Events and stream on TRL's colocate engine (`rollout.colocate`): what is not built or cannot hold."""
        if self.world_size > 1 and self.prunes:
            raise ValueError(f"pruning={self.pruning!r} inside the rollouts (rollout_mode={self.rollout_mode!r}) with "
                             f"vllm_mode='colocate' runs on one process for now; with {self.world_size} processes use "
                             "rollout_mode='deterministic' (two-phase pruning) or vllm_mode='server'.")
        if self.rollout_mode == "stream" and self.vllm_enable_sleep_mode:
            raise ValueError("rollout_mode='stream' keeps rollouts in the colocate engine while the trainer trains, "
                             "and vllm_enable_sleep_mode discards their KV cache at every sleep; use "
                             "rollout_mode='events' with sleep mode, or vllm_enable_sleep_mode=False.")

    def _check_types(self) -> None:
        """Clear errors for values of the wrong type given through the Python API (the methods' own: their
        `Hyperparameter.check`)."""
        for name in ("num_rounds", "rollout_budget", "prompts_per_round", "target_groups", "no_signal_warning_rounds"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
                raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__}).")
        for name in ("success_threshold", "learning_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"`{name}` must be a number, got {value!r} ({type(value).__name__}).")

    @property
    def steps_per_round(self) -> int:
        """Optimizer steps per round: steps_per_generation / gradient_accumulation_steps × num_iterations."""
        return self.steps_per_generation // self.gradient_accumulation_steps * self.num_iterations

    def allocation_config(self) -> AllocationConfig:
        """This config's allocation fields, and the `GRPOConfig` fields the methods read, as the torch-free
        `AllocationConfig` the planner runs."""
        extra = {f.name: getattr(self, f.name) for f in dataclasses.fields(AllocationConfig)
                 if f.name not in allocation_field_names()}
        return AllocationConfig(**self.allocation_settings(), **extra)


# The `Parameters:` block of the configs' docstrings, grouped as GRPOConfig's is, rendered from the fields' `help`
# (one text per field: `--help`, the docstring and the docs read the same words). Google style, `name (type): help`,
# so the API reference (docs/api.md, mkdocstrings) shows the type in its Type column and the default in its Default
# column, read from the signature.
PARAMETER_GROUPS = {  # the run's own fields; then one group per method, from its class's declarations
    "Stages of the sampling pipeline (allocation.registry)": (
        "pacing", "filling", "pruning", "pacing_kwargs", "filling_kwargs"),
    "Budget and rounds": ("rollout_budget", "num_rounds", "prompts_per_round", "success_reward_funcs",
                          "success_threshold", "no_signal_warning_rounds", "allocation_seed", "probe_counts",
                          "target_groups", "loss_normalization"),
    "Rollouts: deterministic, event-driven or one stream across rounds": (
        "rollout_mode", "max_staleness", "rollout_max_inflight", "vllm_enforce_eager", "vllm_dtype"),
    **{f"The hyperparameters of {label} (on its class)": tuple(h.name for h in group)
       for label, group in registered_hyperparameters().items()},
}


def parameters_doc(cls: type, groups: dict[str, tuple[str, ...]]) -> str:
    """The `Parameters:` docstring block for `cls`'s fields named in `groups` ({title: field names})."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    lines = ["", "    Parameters:"]
    for title, names in groups.items():
        lines += [f"        > {title}", ""]
        for name in names:
            f = fields[name]
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            lines.append(f"        {name} ({kind}):")
            lines += [f"            {line}" for line in textwrap.wrap(f.metadata.get("help", ""), 105)]
        lines.append("")
    return "\n".join(lines)


AllocGRPOConfig.__doc__ += parameters_doc(AllocGRPOConfig, PARAMETER_GROUPS)


@dataclass
class AllocDAPOConfig(AllocGRPOConfig):
    r"""AllocGRPOConfig with DAPO's defaults: clip-higher (ε_low 0.2, ε_high 0.28), token-level loss
    (`loss_type='dapo'`), overlong reward shaping and dynamic sampling. With `pacing='uniform'` (the
    default here) this is plain DAPO; set `pacing='cero', filling='sara'` for the method on DAPO.
    """

    pacing: str = field(default="uniform", metadata={
        "help": "Across-round stage. One of " + ", ".join(PACINGS) + ". Default 'uniform' (plain DAPO)."})
    filling: str = field(default="dynamic_sampling", metadata={
        "help": "Within-round stage. One of " + ", ".join(FILLINGS) + ". Default 'dynamic_sampling' (DAPO)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping ε_low."})
    epsilon_high: float | None = field(default=0.28, metadata={"help": "Upper clipping ε_high (clip-higher)."})
    loss_type: str = field(default="dapo", metadata={"help": "Token-level loss normalisation (DAPO)."})
    overlong_buffer: int | None = field(default=None, metadata={
        "help": "Overlong reward shaping: the penalty ramps from 0 to −1 over the last `overlong_buffer` tokens "
        "before max_completion_length. None = max_completion_length // 5 (DAPO: 4096 of 20480); 0 disables it."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.overlong_buffer is None:
            self.overlong_buffer = (self.max_completion_length or 0) // 5
        cap = self.max_completion_length
        if self.overlong_buffer < 0 or (cap and self.overlong_buffer > cap):
            raise ValueError(f"`overlong_buffer` ({self.overlong_buffer}) must lie in [0, max_completion_length "
                             f"({self.max_completion_length})].")


AllocDAPOConfig.__doc__ += parameters_doc(AllocDAPOConfig, {  # the rest: AllocGRPOConfig's
    "DAPO's defaults (arXiv 2503.14476)": ("pacing", "filling", "epsilon", "epsilon_high", "loss_type",
                                           "overlong_buffer")})


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown `{name}={value!r}`; choose one of {', '.join(choices)}.")
