"""TRL-style configs: `AllocGRPOConfig(GRPOConfig)` and `AllocDAPOConfig`, parsed by `TrlParser`.

One optimizer step is one scheduler round. The stage fields (`pacing`, `filling`, `pruning`) pick
the sampling pipeline; the rest are the stages' hyperparameters (CERO arXiv 2610.09679, SARA "Early
Verdicts, Better Budgets", ARROL arXiv 2603.24840, and the baselines of docs/allocation.md).
"""

import dataclasses
import json
import numbers
import os
import textwrap
import warnings
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from ..allocation.base import Filler, Pacer
from ..allocation.registry import method_class, method_names
from .rollout_mode import choose_rollout_mode

# the stage names, as the registry holds them (allocation.registry)
PACINGS, FILLINGS, PRUNINGS = method_names("pacing"), method_names("filling"), method_names("pruning")


@dataclass
class AllocGRPOConfig(GRPOConfig):
    r"""GRPOConfig plus the rollout-allocation pipeline.

    The training dataset is the prompt pool. Each round the pacer admits prompts, the filler turns
    them into generation requests, and only the round's committed groups reach the loss, over
    `steps_per_round` optimizer steps (`steps_per_generation` micro-batches, each seen
    `num_iterations` times). The responses per round vary, so `per_device_train_batch_size` only
    sets TRL's nominal batch, `generation_batch_size`, from which the defaults below derive).
    """

    # Stages
    pacing: str = field(default="cero", metadata={
        "help": "Across-round stage: which prompts get a group this round. One of " + ", ".join(PACINGS) + ", or "
        "the import path of your own registered class (docs/architecture.md#adding-a-method)."})
    filling: str = field(default="sara", metadata={
        "help": "Within-round stage: how each admitted prompt's responses are collected. One of "
        + ", ".join(FILLINGS) + ", or the import path of your own registered class."})
    pruning: str = field(default="none", metadata={
        "help": "Within-rollout stage: 'arrol' (score partial rollouts at `detect_length` with the quality head and "
        "prune toward correctness-balanced survivors), 'random' (prune at the same keep ratio without the head: the "
        "paper's control) or 'none'."})

    pacing_kwargs: dict | str | None = field(default=None, metadata={
        "help": "Keyword arguments of the pacing method beyond the fields below (a method's own hyperparameters, e.g. "
        "GRESO's `target_zero_variance`; docs/allocation.md), as a dict or a JSON object."})
    filling_kwargs: dict | str | None = field(default=None, metadata={
        "help": "Keyword arguments of the filling method beyond the fields below, as a dict or a JSON object."})

    # Budget and rounds
    rollout_budget: int | None = field(default=None, metadata={
        "help": "Global budget in responses for the whole run (probes, abandoned and pruned responses included). "
        "None = num_rounds × generation_batch_size (the responses stock GRPO would generate)."})
    num_rounds: int | None = field(default=None, metadata={
        "help": "Scheduler rounds K, the horizon the budget is paced over (one generation batch and `steps_per_round` "
        "optimizer steps each). None = the rounds `max_steps` takes if set, else the steps stock GRPO would take for "
        "`num_train_epochs` over the dataset. A `max_steps` below K × steps_per_round stops the run early."})
    prompts_per_round: int | None = field(default=None, metadata={
        "help": "Prompts per round for pacing='uniform'/'knapsack'. None = generation_batch_size // num_generations "
        "(stock GRPO)."})
    success_reward_funcs: list[str] | None = field(default=None, metadata={
        "help": "Names of the reward functions whose unweighted sum is a response's success score (what the "
        "allocators count as a success). None = trl-alloc's verifiers among the reward functions (math, arithmetic, "
        "countdown), else the first reward function."})
    success_threshold: float = field(default=0.5, metadata={
        "help": "A response succeeds when its success score is >= this (0.5 for 0/1 verifiers; e.g. 0 for rewards "
        "in {-1, 1})."})
    no_signal_warning_rounds: int = field(default=5, metadata={
        "help": "Warn after this many rounds in a row without one mixed group (nothing is trained), naming the "
        "likely cause."})
    allocation_seed: int | None = field(default=None, metadata={
        "help": "Seed of the allocator's own randomness (tie-breaking permutations, epoch orders). None = `seed`."})

    # CERO (arXiv 2610.09679, Appendix G)
    unit_size: int = field(default=4, metadata={"help": "CERO allocation unit g, in responses."})
    max_units: int = field(default=2, metadata={
        "help": "CERO per-prompt per-round cap N_max in units (2 × 4 = one 8-response group)."})
    round_capacity: int | None = field(default=None, metadata={
        "help": "CERO round capacity C in units. None = ceil(33/32 × budget / (num_rounds × unit_size)), the paper's "
        "132-vs-128 headroom."})
    saturation: float = field(default=1.0, metadata={"help": "CERO saturation λ of the utility 1 − exp(−4λq̂z/R)."})
    forgetting: float = field(default=1.0, metadata={"help": "Forgetting ρ in (0, 1] of the per-prompt Beta states."})
    prior_alpha: float = field(default=1.0, metadata={"help": "Beta prior a0 of every prompt's success rate."})
    prior_beta: float = field(default=1.0, metadata={"help": "Beta prior b0 of every prompt's success rate."})
    init_price: float = field(default=0.5, metadata={"help": "CERO initial budget price ν1 in [0, 1]."})
    step_size: float | None = field(default=None, metadata={
        "help": "CERO dual step sizes γ_ϑ = γ_ν. None = 1/sqrt(num_rounds)."})
    catch_up: bool = field(default=True, metadata={
        "help": "CERO reserve-aware catch-up: spend what later rounds could not absorb, so the budget is used up."})
    random_matched_reference: str | None = field(default=None, metadata={
        "help": "pacing='random_matched': path to a CERO run's allocation_state.json (or a JSON allocation log) whose "
        "per-round allocation sizes are replayed on a random permutation of prompts."})
    knapsack_min_n: int = field(default=2, metadata={"help": "KnapsackRL minimum responses per prompt."})
    knapsack_max_n: int | None = field(default=None, metadata={
        "help": "KnapsackRL maximum responses per prompt. None = 4 × num_generations."})
    probe_counts: str | None = field(default=None, metadata={
        "help": "CERO: start each prompt's Beta state from a probe pass's successes and failures (arXiv 2610.09679 "
        "eq. 5 applied once with them), a JSON file `scripts/arrol_study.py` writes (`probe_counts.json`, prompts "
        "matched by text). The probe's responses are not counted in `rollout_budget`."})

    # SARA ("Early Verdicts, Better Budgets") and DAPO's dynamic sampling (docs/allocation.md#baselines)
    target_groups: int | None = field(default=None, metadata={
        "help": "Groups a SARA / dynamic-sampling round tries to commit (B). None = the number of prompts the pacer "
        "admitted this round."})
    probe: int = field(default=2, metadata={"help": "SARA probe size n0 (first rollouts per prompt)."})
    tau_low: float | str | None = field(default=0.45, metadata={
        "help": "SARA abandonment threshold: abandon a prompt when P(group ends mixed) < tau_low; a number in (0, 1) "
        "or 'auto' (the break-even threshold from the measured yield, docs/allocation.md)."})
    commit_min: int | None = field(default=None, metadata={
        "help": "SARA commits a mixed group once it has this many responses. None = num_generations (k)."})
    sara_safety_factor: int = field(default=6, metadata={
        "help": "SARA safety budget per round, in units of target_groups × k (pacing='uniform' only)."})
    history_decay: float | None = field(default=0.5, metadata={
        "help": "SARA prior = the prompt's Beta state shrunk toward the prior by this factor in [0, 1] "
        "(a0 + decay·(a − a0)). None = flat prior Beta(prior_alpha, prior_beta)."})
    max_generation_batches: int = field(default=10, metadata={
        "help": "Dynamic sampling: generation batches allowed per round before the run fails (DAPO's cap)."})

    # Rollouts (docs/architecture.md: the event-driven round)
    rollout_mode_reason = None  # why rollout_mode="auto" chose what it did (set by __post_init__)
    rollout_mode: str = field(default="auto", metadata={
        "help": "'auto': the mode measured faster for this run (trainer/rollout_mode.py: deterministic without a GPU "
        "vLLM engine, stream on a vLLM server or colocate GPU with an adaptive filler, events with sleep mode). "
        "'deterministic': each round is a sequence of batched generation calls (bit-exact for a seed). "
        "'events': rollouts are started within a window and decided on one at a time as they end, the surplus "
        "aborted (vLLM server mode streams them; transformers generation batches what is pending). 'stream': one "
        "stream across rounds: a round closes once it has its groups or has started its budget, its unfinished "
        "rollouts go on into the next round, whose rollouts start before this one trains (docs/benchmarks.md)."})
    max_staleness: int = field(default=2, metadata={
        "help": "Stream mode: the most policy versions a trained token may be older than the policy that trains it; "
        "an open group that would exceed it is dropped (its rollouts aborted and counted). Stale tokens get TRL's "
        "vLLM importance-sampling correction (`vllm_importance_sampling_correction`)."})
    rollout_max_inflight: int | None = field(default=None, metadata={
        "help": "Events mode: most rollouts running at once. None = the generation batch (what stock TRL runs)."})
    vllm_enforce_eager: bool | None = field(default=None, metadata={
        "help": "vLLM colocate: run the engine eagerly (no torch.compile, no CUDA graphs). None: eager on CPU, as "
        "trl-alloc-serve's CPU server (compiling costs ~30 s at each engine start on a 2-core CPU), vLLM's default "
        "(compiled, CUDA graphs) on a GPU, as TRL."})
    sara_overcommit: float = field(default=1.5, metadata={
        "help": "SARA in events and stream mode: admit prompts into the free window while committed + expected "
        "groups (sum of p_eff) < this × target_groups. Higher fills the engine sooner and aborts (events) or carries "
        "(stream) more; 3 suits a stream whose round budget exceeds the window (docs/choosing-settings.md)."})

    # ARROL (arXiv 2603.24840; docs/arrol.md)
    detect_length: int = field(default=512, metadata={
        "help": "ARROL detection length L_detect in tokens: every rollout generates up to this many tokens, then the "
        "unfinished ones are scored once and pruned or continued. Must be below max_completion_length."})
    prune_undecided: bool = field(default=True, metadata={
        "help": "Events mode: True (docs/arrol.md) = ARROL may prune any eligible rollout; False = only rollouts of "
        "prompts "
        "already known to be mixed (a success and a failure observed), so SARA's probes, whose outcomes decide "
        "a prompt, are never cut (with full groups that leaves almost nothing to prune)."})
    keep_ratio: float = field(default=0.5, metadata={
        "help": "ARROL keep ratio κ: expected fraction of the rollouts reaching detect_length that survive."})
    target_ratio: float = field(default=0.5, metadata={
        "help": "ARROL target positive ratio ρ that pruning steers each group's survivors toward."})
    survival_slope: float = field(default=0.5, metadata={
        "help": "ARROL slope λ of the survival probability p = clip(κ + δ + λ(ρ − q), p_min, p_max)."})
    survival_min: float = field(default=0.1, metadata={"help": "ARROL lower clip p_min of survival probabilities."})
    survival_max: float = field(default=0.9, metadata={"help": "ARROL upper clip p_max of survival probabilities."})
    cold_start_rounds: int = field(default=20, metadata={
        "help": "ARROL rounds without pruning at the start (the head and calibrator learn from every rollout)."})
    cold_start_steps: int | None = field(default=None, metadata={
        "help": "Deprecated name of `cold_start_rounds` (it counts rounds, not optimizer steps)."})
    head_hidden_size: int = field(default=256, metadata={
        "help": "Width of the quality head's hidden layer (2-layer MLP on the policy's last hidden state)."})
    head_learning_rate: float = field(default=1e-3, metadata={
        "help": "Learning rate of the quality head's own Adam optimizer (one step per round)."})
    calibration_bins: int = field(default=10, metadata={
        "help": "Bins B of the quality head's score calibrator (sigmoid(logit) binned on [0, 1])."})
    calibration_buffer: int = field(default=2048, metadata={
        "help": "Sliding buffer of completed rollouts (bin, label) behind the calibrator's per-bin counts."})
    calibration_alpha: float = field(default=1.0, metadata={
        "help": "Laplace smoothing α of the calibrator's per-bin counts."})
    pruning_min_auc: float = field(default=0.7, metadata={
        "help": "ARROL's gate (docs/arrol.md, 'The gate'): prune only while the quality head ranks a group's "
        "held-out rollouts with AUC at least this (within groups, significantly above 0.5: one-sided p <= 0.001); "
        "otherwise rollouts run to the end. 0 turns the gate off. Not in the paper: at small scale the head can rank "
        "no better than a coin."})
    pruning_heldout_fraction: float = field(default=0.2, metadata={
        "help": "Share of the groups whose eligible rollouts the gate holds out, whole: never pruned, never trained "
        "on, scored by the head before it sees them."})
    pruning_gate_window: int = field(default=512, metadata={
        "help": "The gate's AUC is measured over this many of the latest held-out rollouts."})
    quality_head_init: str | None = field(default=None, metadata={
        "help": "Start the quality head from this QualityHead folder (e.g. `scripts/arrol_study.py --save_head` on a "
        "probe pass of the base model) instead of a random head; its hidden size must be the policy's."})

    def __post_init__(self):
        for name in ("save_strategy", "eval_strategy", "logging_strategy"):  # YAML reads a bare `no` as false
            if getattr(self, name, None) is False:
                setattr(self, name, "no")
        if isinstance(self.max_completion_length, int) and self.max_completion_length < 1:
            raise ValueError(f"`max_completion_length` must be >= 1, got {self.max_completion_length}: a response "
                             "needs at least one token.")
        super().__post_init__()
        for stage in ("pacing", "filling", "pruning"):
            method_class(stage, getattr(self, stage))  # an unknown name lists the registered ones
        for stage in ("pacing", "filling"):
            kwargs = _as_kwargs(f"{stage}_kwargs", getattr(self, f"{stage}_kwargs"))
            accepted = method_class(stage, getattr(self, stage)).config_kwargs
            if set(kwargs) - set(accepted):
                raise ValueError(f"`{stage}_kwargs` has {sorted(set(kwargs) - set(accepted))}, which "
                                 f"{stage}={getattr(self, stage)!r} does not take; it takes "
                                 f"{', '.join(accepted) if accepted else 'none'}.")
            setattr(self, f"{stage}_kwargs", kwargs)
        self._check_pruning()
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
        for name, lo in (("unit_size", 1), ("max_units", 1), ("probe", 1), ("commit_min", 2),
                         ("sara_safety_factor", 1), ("max_generation_batches", 1), ("knapsack_min_n", 1)):
            if int(getattr(self, name)) < lo:
                raise ValueError(f"`{name}` must be >= {lo}, got {getattr(self, name)}.")
        _check_choice("rollout_mode", self.rollout_mode, ("auto", "deterministic", "events", "stream"))
        if self.rollout_mode == "auto":  # the choice and its reason go to the log and the model card
            cuda = torch.cuda.is_available() and not self.use_cpu
            self.rollout_mode, self.rollout_mode_reason = choose_rollout_mode(self, cuda)
        if int(self.max_staleness) < 1:
            raise ValueError(f"`max_staleness` must be >= 1, got {self.max_staleness}: a stream's rollouts started "
                             "while a round trains are one version old (rollout_mode='events' stays on-policy).")
        if self.rollout_mode == "stream" and self.pruning != "none" and not self.use_vllm:
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
        if not self.sara_overcommit >= 1:
            raise ValueError(f"`sara_overcommit` must be >= 1, got {self.sara_overcommit}.")
        if self.probe > k:
            raise ValueError(f"`probe` ({self.probe}) must not exceed `num_generations` (k = {k}); lower `probe`.")
        if self.commit_min > k:
            raise ValueError(f"`commit_min` ({self.commit_min}) must not exceed `num_generations` (k = {k}); lower "
                             "`commit_min` or raise `num_generations`.")
        if self.tau_low != "auto" and not 0 < self.tau_low < 1:
            raise ValueError(f"`tau_low` must lie in (0, 1) or be 'auto', got {self.tau_low}.")
        if not 0 < self.forgetting <= 1:
            raise ValueError(f"`forgetting` must lie in (0, 1], got {self.forgetting}.")
        if not (self.prior_alpha > 0 and self.prior_beta > 0):
            raise ValueError(f"`prior_alpha` and `prior_beta` must be positive, got ({self.prior_alpha}, "
                             f"{self.prior_beta}).")
        if not 0 <= self.init_price <= 1:
            raise ValueError(f"`init_price` must lie in [0, 1], got {self.init_price}.")
        if self.saturation <= 0:
            raise ValueError(f"`saturation` must be positive, got {self.saturation}.")
        if self.step_size is not None and self.step_size <= 0:
            raise ValueError(f"`step_size` must be positive (or None for 1/sqrt(num_rounds)), got {self.step_size}.")
        if self.history_decay is not None and not 0 <= self.history_decay <= 1:
            raise ValueError(f"`history_decay` must lie in [0, 1] (or None for a flat prior), "
                             f"got {self.history_decay}.")
        for name in ("num_rounds", "rollout_budget", "prompts_per_round", "round_capacity", "target_groups"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise ValueError(f"`{name}` must be a positive integer (or None), got {value}.")
        self.pacer_class.check_config(self)
        self.filler_class.check_config(self)
        if self.round_capacity is not None and self.round_capacity < self.max_units:
            raise ValueError(f"`round_capacity` ({self.round_capacity} units) is below one group (`max_units` = "
                             f"{self.max_units}); raise it to at least {self.max_units}.")
        if self.num_rounds is not None and self.max_steps > self.num_rounds * self.steps_per_round:
            raise ValueError(f"`max_steps` ({self.max_steps}) is more optimizer steps than `num_rounds` "
                             f"({self.num_rounds}) rounds of {self.steps_per_round} step(s) take; raise `num_rounds` "
                             "or lower `max_steps` (a smaller max_steps stops the run early).")
        if self.num_rounds is not None:
            self.check_budget(self.num_rounds)

    def _check_colocate_rollouts(self):
        """Events and stream on TRL's colocate engine (`rollout.colocate`): what is not built or cannot hold."""
        if self.world_size > 1 and self.pruning != "none":
            raise ValueError(f"pruning={self.pruning!r} inside the rollouts (rollout_mode={self.rollout_mode!r}) with "
                             f"vllm_mode='colocate' runs on one process for now; with {self.world_size} processes use "
                             "rollout_mode='deterministic' (two-phase pruning) or vllm_mode='server'.")
        if self.rollout_mode == "stream" and self.vllm_enable_sleep_mode:
            raise ValueError("rollout_mode='stream' keeps rollouts in the colocate engine while the trainer trains, "
                             "and vllm_enable_sleep_mode discards their KV cache at every sleep; use "
                             "rollout_mode='events' with sleep mode, or vllm_enable_sleep_mode=False.")

    def _check_types(self):
        """Clear errors for values of the wrong type given through the Python API."""
        for name in ("num_rounds", "rollout_budget", "prompts_per_round", "round_capacity", "target_groups",
                     "unit_size", "max_units", "probe", "commit_min", "detect_length", "no_signal_warning_rounds"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
                raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__}).")
        if isinstance(self.tau_low, str) and self.tau_low != "auto":
            try:
                self.tau_low = float(self.tau_low)  # from the command line or YAML
            except ValueError:
                raise ValueError(f"`tau_low` must be a number in (0, 1) or 'auto', got {self.tau_low!r}.") from None
        if self.tau_low is None or isinstance(self.tau_low, bool) or not isinstance(self.tau_low, (numbers.Real, str)):
            raise TypeError(f"`tau_low` must be a number in (0, 1) or 'auto', got {self.tau_low!r}.")
        for name in ("success_threshold", "tau_low", "keep_ratio", "learning_rate"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) and value != "auto":
                raise TypeError(f"`{name}` must be a number, got {value!r} ({type(value).__name__}).")

    @property
    def steps_per_round(self) -> int:
        """Optimizer steps per round: steps_per_generation / gradient_accumulation_steps × num_iterations."""
        return self.steps_per_generation // self.gradient_accumulation_steps * self.num_iterations

    def _check_pruning(self):
        if self.cold_start_steps is not None:
            warnings.warn("`cold_start_steps` is renamed `cold_start_rounds` (it counts rounds); using "
                          f"cold_start_rounds={self.cold_start_steps}.", FutureWarning, stacklevel=3)
            self.cold_start_rounds, self.cold_start_steps = self.cold_start_steps, None
        for name, lo in (("detect_length", 1), ("head_hidden_size", 1), ("calibration_bins", 1),
                         ("calibration_buffer", 1), ("cold_start_rounds", 0), ("pruning_gate_window", 1)):
            if int(getattr(self, name)) < lo:
                raise ValueError(f"`{name}` must be >= {lo}, got {getattr(self, name)}.")
        for name in ("target_ratio", "survival_min", "survival_max", "pruning_min_auc"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"`{name}` must lie in [0, 1], got {getattr(self, name)}.")
        if not 0 < self.keep_ratio <= 1:
            raise ValueError(f"`keep_ratio` must lie in (0, 1] (1 keeps every rollout), got {self.keep_ratio}.")
        if self.pruning_min_auc > 0 and not 0 < self.pruning_heldout_fraction < 1:
            raise ValueError(f"`pruning_heldout_fraction` must lie in (0, 1) while the gate is on (pruning_min_auc="
                             f"{self.pruning_min_auc}), got {self.pruning_heldout_fraction}: the gate measures the "
                             "head on rollouts it never trained on. Set pruning_min_auc=0 to turn the gate off.")
        if self.quality_head_init is not None and not os.path.isfile(
                os.path.join(self.quality_head_init, "model.safetensors")):
            raise ValueError(f"quality_head_init={self.quality_head_init!r} is not a QualityHead folder (no "
                             "model.safetensors): give the folder `scripts/arrol_study.py --save_head` or a run's "
                             "`quality_head/` wrote.")
        if self.survival_min > self.survival_max:
            raise ValueError(f"`survival_min` ({self.survival_min}) must not exceed `survival_max` "
                             f"({self.survival_max}).")
        if self.keep_ratio < 1 and not self.survival_min <= self.keep_ratio <= self.survival_max:
            raise ValueError(f"`keep_ratio` ({self.keep_ratio}) must lie in [survival_min, survival_max] = "
                             f"[{self.survival_min}, {self.survival_max}]: the mean survival probability is κ and "
                             "each one is clipped to that range; widen the range or change `keep_ratio`.")
        if self.survival_slope < 0:
            raise ValueError(f"`survival_slope` must be >= 0 (0 disables the tilt toward ρ), got "
                             f"{self.survival_slope}.")
        if self.head_learning_rate <= 0 or self.calibration_alpha <= 0:
            raise ValueError(f"`head_learning_rate` ({self.head_learning_rate}) and `calibration_alpha` "
                             f"({self.calibration_alpha}) must be positive.")
        if self.pruning != "none" and self.detect_length >= (self.max_completion_length or 0):
            raise ValueError(f"pruning={self.pruning!r} needs `detect_length` ({self.detect_length}) below "
                             f"`max_completion_length` ({self.max_completion_length}): a rollout is scored when it "
                             "reaches detect_length and survivors continue up to max_completion_length. Lower "
                             "`detect_length` (ARROL arXiv 2603.24840: 512 for long reasoning; a few tokens for tiny "
                             "models) or set "
                             "pruning='none'.")

    # -- derived quantities (the trainer calls these once it knows the dataset) ------------------
    @property
    def nominal_prompts_per_round(self) -> int:
        """Prompts per round of stock GRPO (and of pacing='uniform' by default)."""
        return self.prompts_per_round or max(1, self.generation_batch_size // self.num_generations)

    @property
    def pacer_class(self) -> type[Pacer]:
        """The class `pacing` names (allocation.registry)."""
        return method_class("pacing", self.pacing)

    @property
    def filler_class(self) -> type[Filler]:
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


# The `Parameters:` block of the configs' docstrings, grouped as GRPOConfig's is, rendered from the fields' `help`
# (one text per field: `--help`, the docstring and the docs read the same words).
PARAMETER_GROUPS = {
    "Stages of the sampling pipeline (allocation.registry)": (
        "pacing", "filling", "pruning", "pacing_kwargs", "filling_kwargs"),
    "Budget and rounds": ("rollout_budget", "num_rounds", "prompts_per_round", "success_reward_funcs",
                          "success_threshold", "no_signal_warning_rounds", "allocation_seed"),
    "CERO (arXiv 2610.09679) and the pacing baselines": (
        "unit_size", "max_units", "round_capacity", "saturation", "forgetting", "prior_alpha", "prior_beta",
        "init_price", "step_size", "catch_up", "random_matched_reference", "knapsack_min_n", "knapsack_max_n",
        "probe_counts"),
    "SARA (\"Early Verdicts, Better Budgets\") and DAPO's dynamic sampling": (
        "target_groups", "probe", "tau_low", "commit_min", "sara_safety_factor", "history_decay",
        "max_generation_batches"),
    "Rollouts: deterministic, event-driven or one stream across rounds": (
        "rollout_mode", "max_staleness", "rollout_max_inflight", "vllm_enforce_eager", "sara_overcommit"),
    "ARROL (arXiv 2603.24840)": (
        "detect_length", "prune_undecided", "keep_ratio", "target_ratio", "survival_slope", "survival_min",
        "survival_max", "cold_start_rounds", "cold_start_steps", "head_hidden_size", "head_learning_rate",
        "calibration_bins", "calibration_buffer", "calibration_alpha", "pruning_min_auc", "pruning_heldout_fraction",
        "pruning_gate_window", "quality_head_init"),
}


def parameters_doc(cls: type, groups: dict[str, tuple[str, ...]]) -> str:
    """TRL's `Parameters:` docstring block for `cls`'s fields named in `groups` ({title: field names})."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    lines = ["", "    Parameters:"]
    for title, names in groups.items():
        lines += [f"        > {title}", ""]
        for name in names:
            f = fields[name]
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            default = "" if f.default is None else f", defaults to `{f.default!r}`"
            lines.append(f"        {name} (`{kind}`, *optional*{default}):")
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

    def __post_init__(self):
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


def _as_kwargs(name, value):
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


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"unknown `{name}={value!r}`; choose one of {', '.join(choices)}.")
