"""The two stage protocols every allocator implements, so the trainer drives them all the same way.

A **pacer** (across rounds) says which prompts are admitted this round and with how many
allocation units (``propose``), ranks the round's prompts (``ranked_prompts``: a filler's stream),
and learns from the round's per-prompt outcomes (``update``). A **filler** (within a round) turns
a stream, a response budget and a target number of groups into generation requests and decides
which groups reach the loss. Each filler has one round (`event_rounds.EventRound`); deterministic mode
drives it over a synchronous backend (`event_rounds.SynchronousRound`).

Driving loop (the trainer and every simulator use exactly this)::

    units = pacer.propose()
    rnd = filler.start_round(pacer.ranked_prompts, budget=units.sum() * pacer.unit_size,
                             target_groups=..., counts=units[pacer.ranked_prompts] * pacer.unit_size)
    while not rnd.done:
        prompt_ids, counts = rnd.requests()      # one batched generation call
        rnd.observe(rewards, pruned=None)        # reward arrays aligned with the request (+ ARROL's pruned masks)
    pacer.update(*rnd.outcomes(pacer.num_prompts))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .event_rounds import EventRound, SynchronousRound
from .hyperparameters import Hyperparameter

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from .beta import BetaState

@dataclass(frozen=True)
class RunContext:
    """What a method is built from besides the config: the prompt pool, the horizon K, the global budget in
    responses, the allocation seed, and (for a filler) the pacer it is paired with. `reference`: an allocation log
    to replay, when the caller holds one in memory (`RandomMatched`)."""

    num_prompts: int
    num_rounds: int
    budget: int
    seed: int = 0
    pacer: Pacer | None = None
    reference: list | None = None


class ConfiguredMethod:
    """What every registered method shares: its name, its own hyperparameters (declared once, here; the config's
    fields and `--help` are built from them), and how it is built from and checked against the config
    (docs/architecture.md#adding-a-method)."""

    method_name = None  # set by `registry.register`
    stage: str  # "pacing", "filling" or "pruning"
    hyperparameters: tuple[Hyperparameter, ...] = ()

    @classmethod
    def settings(cls, args: Any) -> dict[str, Any]:
        """This method's hyperparameters in `args`: the config's `<stage>_kwargs` entry (how a method named by its
        import path gets its own), else the config field of that name (a registered method's), else the default."""
        own = getattr(args, f"{cls.stage}_kwargs", None) or {}
        return {h.name: own[h.name] if h.name in own else getattr(args, h.name, h.default)
                for h in cls.hyperparameters}

    @classmethod
    def from_config(cls, args: Any, context: RunContext) -> ConfiguredMethod:
        """The method `args` configures for `context` (a filler's `context.pacer`: the pacer it is paired with)."""
        raise NotImplementedError(f"{cls.__name__} must define from_config(args, context) to be named in a config "
                                  "(docs/architecture.md#adding-a-method).")

    @classmethod
    def check_config(cls, args: Any) -> None:
        """Refuse settings this method cannot run with (called when the config is validated)."""


class Pacer(ConfiguredMethod):
    """Across-round stage. Subclasses set ``num_prompts``, ``unit_size`` and ``remaining_responses``.

    A registered pacer builds itself with ``from_config(args, context)`` (`args`: an `AllocGRPOConfig` or any
    object with its fields) and answers the config's budget questions through the class methods below, so the
    config never branches on its name."""

    stage = "pacing"
    num_prompts: int
    unit_size: int
    remaining_responses: int
    paces_budget = False    # True: the proposal's units × unit_size is the round's spend (CERO family)
    budget_in_units = False  # True: `rollout_budget` must be a whole number of `unit_size` responses
    round_limit_field = "prompts_per_round"  # the config field that bounds one round's spend

    @classmethod
    def budget_for(cls, args: Any, num_rounds: int) -> int:
        """The global response budget when `rollout_budget` is not set: stock GRPO's generation batch per round."""
        return num_rounds * args.generation_batch_size

    @classmethod
    def max_round_responses(cls, args: Any, num_rounds: int, filler_cls: type[Filler]) -> int | None:
        """Most responses one round may spend (None: not bounded by the config alone)."""
        return None

    # Capabilities, declared here so a caller never tests for attributes (a pacer that has one overrides it):
    seeds_from_probe = False  # True: `seed_counts` starts it from a probe pass's outcomes (`probe_counts`)

    @property
    def posterior(self) -> BetaState | None:
        """Per-prompt Beta success posteriors, when the pacer keeps them (CERO eq. 5); SARA takes its priors from
        them (`Filler.round_arguments`, `history_decay`). None: it keeps none."""
        return None

    def pacing_gap(self) -> float | None:
        """Cumulative spend minus its plan so far, in units, for a pacer that plans spend; None otherwise."""
        return None

    def seed_counts(self, successes: ArrayLike, failures: ArrayLike) -> None:
        """Start from a probe pass's per-prompt outcomes, before the first round (`seeds_from_probe`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot start from a probe pass (seeds_from_probe=False).")

    def propose(self) -> np.ndarray:
        """Executed units per prompt for this round (int array of length ``num_prompts``)."""
        raise NotImplementedError

    @property
    def ranked_prompts(self) -> np.ndarray:
        """This round's admission order; the proposed prompts come first."""
        raise NotImplementedError

    def update(self, successes: ArrayLike, failures: ArrayLike, responses: ArrayLike | None = None,
               prepaid: ArrayLike | None = None) -> None:
        """Consume the round's per-prompt success/failure counts; ``responses`` (default S + F) is what
        was spent per prompt, pruned responses included. ``prepaid`` (stream mode): per prompt, the
        observed rollouts an earlier round spent (carried over), so S + F <= responses + prepaid."""
        raise NotImplementedError

    @property
    def remaining_budget(self) -> int:
        """Whole allocation units left in the global budget."""
        return self.remaining_responses // self.unit_size

    @property
    def finished(self) -> bool:
        return self.remaining_budget <= 0

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError


class Filler(ConfiguredMethod):
    """Within-round stage: `start_event_round` opens the filler's one round over a stream of prompts (an
    `event_rounds.EventRound`, fed one rollout at a time); `start_round` is that round over a synchronous
    backend. `group_size` is k; `oversample` is the round's response cap, in groups of the target, when the pacer
    does not pace spend."""

    stage = "filling"
    group_size: int
    oversample = 1
    adaptive = True  # False: every admitted prompt gets its full group, nothing is decided within the round

    @classmethod
    def smallest_group(cls, args: Any) -> int:
        """The fewest responses that can make a trained group."""
        return args.num_generations

    @classmethod
    def max_round_responses(cls, args: Any, prompts: int) -> int:
        """Most responses a round over `prompts` admitted prompts may spend when the pacer does not pace spend."""
        return prompts * args.num_generations

    def round_arguments(self, pacer: Pacer, units: np.ndarray, spend: int, target_groups: int | None = None) -> dict:
        """Keyword arguments of `start_round` for the pacer's proposal `units`, whose spend is `spend` responses (a
        filler adds its own, e.g. SARA's priors, and takes them in its `start_event_round`).

        A pacer that paces spend (CERO) fixes the round's budget; otherwise the filler may spend up to `oversample`
        × target × k (what DAPO's and SARA's caps allow). The target is the number of admitted prompts unless
        `target_groups` is set."""
        stream = np.asarray(pacer.ranked_prompts, np.int64)
        admitted = int((units > 0).sum())
        target = admitted if target_groups is None or admitted == 0 else int(target_groups)
        if not pacer.paces_budget:
            spend = min(self.oversample * target * self.group_size, pacer.remaining_responses)
        return {"stream": stream, "budget": spend, "target_groups": target}

    def start_round(self, stream: ArrayLike, *args: Any, **kwargs: Any) -> SynchronousRound:
        """`start_event_round`'s round (same arguments, without `carry`) over a synchronous backend: deterministic
        mode (`event_rounds.SynchronousRound`)."""
        return SynchronousRound(self.start_event_round(stream, *args, **kwargs))

    def start_event_round(self, stream: ArrayLike, budget: int, target_groups: int | None = None,
                          counts: ArrayLike | None = None, carry: dict[int, dict] | None = None,
                          wait_for_groups: bool = False) -> EventRound:
        """The filler's one round (an `event_rounds.EventRound`) over `stream`, spending at most `budget` responses
        toward `target_groups` groups; `carry` and `wait_for_groups`: stream mode, see `event_rounds`."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
