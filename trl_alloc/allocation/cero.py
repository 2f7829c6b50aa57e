"""CERO (arXiv 2610.09679): online primal–dual pacing of one finite rollout budget over the whole run.

Units: one allocation unit = `unit_size` (g) responses. Notation follows Algorithm 1:
R = B/M, Z = K·N_max, c̄ = λ/R, B̄ = B/K, G_B = max(B̄, C − B̄).
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._checks import check_int, check_open_unit
from .base import Filler, Pacer, RunContext
from .baselines import _BudgetedPacer
from .beta import PRIOR_ALPHA, PRIOR_BETA, BetaState
from .hyperparameters import Hyperparameter, at_least, positive, within
from .registry import register

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def utility(q: ArrayLike, z: ArrayLike, R: float, saturation: float = 1.0) -> np.ndarray:
    """U(q, z) = 1 − exp(−4λ q z / R), the value-capture utility of §2.2."""
    return 1.0 - np.exp(-4.0 * saturation * np.asarray(q, float) * np.asarray(z, float) / R)


def supporting_exposure(theta: ArrayLike, c: ArrayLike, Z: float) -> np.ndarray:
    """z*(θ; c) = argmin_{0≤z≤Z} θz − U(z) in closed form (eq. 9), elementwise.

    0 if c = 0 or θ ≥ c;  Z if θ ≤ c·e^(−cZ);  else (1/c)·log(c/θ).
    """
    theta, c = np.broadcast_arrays(np.asarray(theta, float), np.asarray(c, float))
    z = np.zeros(theta.shape)
    pos = c > 0
    full = pos & (theta <= c * np.exp(-c * Z))
    mid = pos & ~full & (theta < c)
    z[full] = Z
    z[mid] = np.log(c[mid] / theta[mid]) / c[mid]
    return z


def even_quota(budget: int, rounds: int, k: int) -> int:
    """Units for round k (0-based) when `budget` is spread as evenly as integers allow over `rounds`."""
    return (k + 1) * budget // rounds - k * budget // rounds


UNIT_SIZE = Hyperparameter("unit_size", int, 4, "CERO allocation unit g, in responses.", at_least(1))


@register("pacing", "cero")
class CEROScheduler(_BudgetedPacer):
    """Algorithm 1 of CERO (arXiv 2610.09679), in allocation units.

    `propose()` gives the executed units per prompt (the virtual proposal of eq. 8 clipped by the
    remaining budget); `update(successes, failures)` applies eq. 5, eq. 9 and the dual steps of
    eq. 10. `ranked_prompts` is the round's positive-margin list in decreasing order (SARA's stream).
    With `catch_up` (reserve-aware catch-up, Appendix G) a round spends at least what the remaining
    rounds could not absorb at full capacity, so a budget B ≤ K·C is always spent by round K.
    """

    paces_budget = True
    budget_in_units = True  # B in units of `unit_size` responses, at most C units per round
    round_limit_field = "round_capacity"
    capacity_headroom = 33 / 32  # default C over the mean per-round spend B/K (132 vs 128 units at paper scale)
    hyperparameters = (  # Appendix G's defaults
        UNIT_SIZE,
        Hyperparameter("max_units", int, 2, "CERO per-prompt per-round cap N_max in units (2 × 4 = one 8-response "
                       "group).", at_least(1)),
        Hyperparameter("round_capacity", int | None, None, "CERO round capacity C in units. None = ceil(33/32 × "
                       "budget / (num_rounds × unit_size)), the paper's 132-vs-128 headroom.", at_least(1)),
        Hyperparameter("saturation", float, 1.0, "CERO saturation λ of the utility 1 − exp(−4λq̂z/R).", positive),
        Hyperparameter("forgetting", float, 1.0, "Forgetting ρ in (0, 1] of the per-prompt Beta states.",
                       within(0, 1, low_open=True)),
        PRIOR_ALPHA, PRIOR_BETA,
        Hyperparameter("init_price", float, 0.5, "CERO initial budget price ν1 in [0, 1].", within(0, 1)),
        Hyperparameter("step_size", float | None, None, "CERO dual step sizes γ_ϑ = γ_ν. None = 1/sqrt(num_rounds).",
                       positive),
        Hyperparameter("catch_up", bool, True, "CERO reserve-aware catch-up: spend what later rounds could not "
                       "absorb, so the budget is used up."),
    )

    @classmethod
    def from_config(cls, args: Any, context: RunContext) -> Pacer:
        own = cls.settings(args)
        return cls(context.num_prompts, rounds=context.num_rounds, budget=context.budget // own["unit_size"],
                   round_capacity=cls.capacity_for(args, context.num_rounds, context.budget),
                   max_units=own["max_units"], saturation=own["saturation"], forgetting=own["forgetting"],
                   prior=(own["prior_alpha"], own["prior_beta"]), init_price=own["init_price"],
                   step_size=own["step_size"], seed=context.seed, unit_size=own["unit_size"], catch_up=own["catch_up"])

    @classmethod
    def capacity_for(cls, args: Any, num_rounds: int, budget: int) -> int:
        """Round capacity C in units: `round_capacity`, else the mean per-round spend plus `capacity_headroom`."""
        own = cls.settings(args)
        if own["round_capacity"] is not None:
            return int(own["round_capacity"])
        return max(own["max_units"], math.ceil(cls.capacity_headroom * (budget // own["unit_size"]) / num_rounds))

    @classmethod
    def check_config(cls, args: Any) -> None:
        if args.rollout_budget is not None and args.rollout_budget % args.unit_size:
            raise ValueError(f"`rollout_budget` ({args.rollout_budget}) must be a whole number of CERO units; use a "
                             f"multiple of `unit_size` ({args.unit_size}).")
        if args.round_capacity is not None and args.round_capacity < args.max_units:
            raise ValueError(f"`round_capacity` ({args.round_capacity} units) is below one group (`max_units` = "
                             f"{args.max_units}); raise it to at least {args.max_units}.")

    @classmethod
    def budget_for(cls, args: Any, num_rounds: int) -> int:
        budget, unit = super().budget_for(args, num_rounds), cls.settings(args)["unit_size"]
        return budget - budget % unit

    @classmethod
    def max_round_responses(cls, args: Any, num_rounds: int, filler_cls: type[Filler]) -> int:
        return cls.capacity_for(args, num_rounds, args.budget_for(num_rounds)) * cls.settings(args)["unit_size"]

    def __init__(self, num_prompts: int, rounds: int, budget: int, round_capacity: int, max_units: int = 2,
                 saturation: float = 1.0, forgetting: float = 1.0, prior: Sequence[float] = (1.0, 1.0),
                 init_price: float = 0.5, step_size: float | None = None, seed: int = 0, unit_size: int = 4,
                 catch_up: bool = True) -> None:
        budget = check_int("budget", budget, 1)
        super().__init__(num_prompts, unit_size, budget * check_int("unit_size", unit_size, 1))
        self.rounds = check_int("rounds", rounds, 1)
        self.max_units = check_int("max_units", max_units, 1)
        self.capacity = check_int("round_capacity", round_capacity, 0)
        if self.capacity < self.max_units:
            raise ValueError(f"`round_capacity` ({self.capacity} units) is below one group "
                             f"(`max_units` = {self.max_units}); raise it to at least {self.max_units}.")
        usable = min(self.capacity, self.num_prompts * self.max_units)
        if budget > self.rounds * usable:
            raise ValueError(f"`budget` ({budget} units) exceeds what {self.rounds} rounds can spend "
                             f"(rounds × min(round_capacity, num_prompts × max_units) = {self.rounds * usable}); "
                             "lower the budget or raise `rounds` / `round_capacity`.")
        self.budget, self.usable_capacity = budget, usable
        self.saturation = float(saturation)
        if not self.saturation > 0:
            raise ValueError(f"`saturation` (λ) must be positive, got {saturation}.")
        self.step_size = 1.0 / np.sqrt(self.rounds) if step_size is None else float(step_size)
        self.seed, self.catch_up = int(seed), bool(catch_up)
        self.beta = BetaState(self.num_prompts, prior, forgetting)
        self.R = budget / self.num_prompts
        self.Z = self.rounds * self.max_units
        self.c_bar = self.saturation / self.R
        self.B_bar = budget / self.rounds
        self.G_B = max(self.B_bar, self.capacity - self.B_bar)
        self.vartheta = 4.0 * self.beta.proxy()
        self.nu = check_open_unit("init_price", init_price, low_closed=True, high_closed=True)
        self.exposure = np.zeros(self.num_prompts)
        self.virtual = np.zeros(self.num_prompts, np.int64)
        self._perm = np.random.default_rng(self.seed).permutation(self.num_prompts)
        self._ranked = None
        self.allocation_log = []

    # -- the stage hooks that the ablations override ------------------------------------------
    def scores(self) -> np.ndarray:
        """Normalised margins d_i = ϑ_i − ν (admission needs d_i > 0)."""
        return self.vartheta - self.nu

    def round_capacity(self) -> int:
        """Units the virtual proposal may use this round (C for CERO)."""
        return self.capacity

    def update_duals(self, z_star: np.ndarray) -> None:
        """Projected OGD steps of eq. 10 on ϑ and ν, both with the virtual proposal Ñ."""
        g = self.step_size
        self.vartheta = np.clip(self.vartheta - g * (self.virtual - z_star / self.rounds) / self.max_units, 0, 1)
        self.nu = float(np.clip(self.nu - g * (self.B_bar - self.virtual.sum()) / self.G_B, 0, 1))

    # -- Algorithm 1 ----------------------------------------------------------------------------
    def _top(self, scores, n):
        """The n best prompts with positive score, ties broken by the seeded permutation."""
        key = scores[self._perm]
        n = min(n, int((key > 0).sum()))
        if n <= 0:
            return np.zeros(0, np.int64)
        if n < key.size:
            t = np.partition(key, key.size - n)[key.size - n]
            above = np.flatnonzero(key > t)
            cand = np.concatenate([above, np.flatnonzero(key == t)[: n - above.size]])
        else:
            cand = np.arange(key.size)
        cand = cand[np.lexsort((cand, -key[cand]))]
        return self._perm[cand]

    @property
    def ranked_prompts(self) -> np.ndarray:
        """All positive-score prompts in decreasing order (then catch-up extras), computed on demand."""
        if self._ranked is None:
            self._ranked = self._top(self.scores(), self.num_prompts)
        return self._ranked

    def propose(self) -> np.ndarray:
        """Virtual proposal Ñ (eq. 8), executed in order up to the remaining budget (Alg. 1, l. 5–6)."""
        cap = self.round_capacity()
        scores = self.scores()
        order = self._top(scores, -(-cap // self.max_units))
        give = np.clip(cap - self.max_units * np.arange(order.size), 0, self.max_units)
        self.virtual = np.zeros(self.num_prompts, np.int64)
        self.virtual[order] = give
        budget = self.remaining_budget
        executed = np.clip(budget - (np.cumsum(give) - give), 0, give)
        self._ranked = None
        rounds_after = max(self.rounds - self.round - 1, 0)
        need = min(budget - rounds_after * self.usable_capacity, self.usable_capacity) if self.catch_up else 0
        if need > executed.sum():
            order, executed = self._catch_up(scores, order, executed, need)
        units = np.zeros(self.num_prompts, np.int64)
        units[order] = executed
        self.last_units = units
        self.allocation_log.append([order[executed > 0].tolist(), executed[executed > 0].tolist()])
        return units

    def _catch_up(self, scores, order, executed, need):
        """Top up this round to `need` units with the next prompts by score (positive or not)."""
        extra_total = need - int(executed.sum())
        rest = np.setdiff1d(np.argsort(-scores, kind="stable"), order, assume_unique=True)
        room = np.concatenate([self.max_units - executed, np.full(rest.size, self.max_units)])
        full_order = np.concatenate([order, rest])
        add = np.clip(extra_total - (np.cumsum(room) - room), 0, room)
        executed = np.concatenate([executed, np.zeros(rest.size, np.int64)]) + add
        keep = executed > 0
        self._ranked = np.concatenate([self.ranked_prompts,
                                       full_order[keep & ~np.isin(full_order, self.ranked_prompts)]])
        return full_order[keep], executed[keep]

    def update(self, successes: ArrayLike, failures: ArrayLike, responses: ArrayLike | None = None,
               prepaid: ArrayLike | None = None) -> None:
        """Eq. 5 (all prompts), eq. 6, eq. 9 at θ = c̄ϑ, then eq. 10; budget falls by what was spent.

        Under delayed feedback (stream mode) the round's update sees exactly: the outcomes of the rollouts
        that *ended* during the round (those it carried in from the previous round included, `prepaid`),
        and the spend of every rollout it *started*, in flight ones included (reserved). A carried rollout's
        outcome reaches eq. 5 in the update of the round in which it ends; eq. 10 is unchanged (it uses the
        virtual proposal Ñ, known at proposal time). Exposure counts spend, so it is reserved likewise."""
        if responses is None:
            responses = self.last_units * self.unit_size
        s, f, spent = self._consume(successes, failures, responses, prepaid)
        self.exposure += spent / self.unit_size
        self.beta.update(s, f)
        c = 4.0 * self.saturation * self.beta.proxy() / self.R
        z_star = supporting_exposure(self.c_bar * self.vartheta, c, self.Z)
        self.update_duals(z_star)
        self._ranked = None

    seeds_from_probe = True

    @property
    def posterior(self) -> BetaState:
        """The Beta states of eq. 5 (SARA's priors come from them)."""
        return self.beta

    def seed_counts(self, successes: ArrayLike, failures: ArrayLike) -> None:
        """Start from a probe pass's outcomes, before the first round: eq. 5 once with its counts, then ϑ from the
        posterior's eq. 6 proxy as at initialisation (ϑ = 4 q̂). The probe's responses are not this budget's."""
        if self.round:
            raise ValueError("seed_counts seeds the Beta states before the first round; this run has started.")
        self.beta.update(successes, failures)
        self.vartheta = 4.0 * self.beta.proxy()
        self._ranked = None

    @property
    def finished(self) -> bool:
        return self.remaining_budget <= 0 or self.round >= self.rounds

    def pacing_gap(self) -> float:
        """Cumulative spend minus uniform spending (B̄ per round) so far, in units."""
        return (self.budget_responses - self.remaining_responses) / self.unit_size - self.B_bar * self.round

    def state_dict(self) -> dict:
        return {**self._base_state(), "beta": self.beta.state_dict(), "vartheta": self.vartheta.tolist(),
                "nu": self.nu, "exposure": self.exposure.tolist(), "virtual": self.virtual.tolist(),
                "seed": self.seed, "allocation_log": self.allocation_log}

    def load_state_dict(self, state: dict) -> None:
        if len(state["vartheta"]) != self.num_prompts:
            raise ValueError(f"allocator state is for {len(state['vartheta'])} prompts, this pool has "
                             f"{self.num_prompts}; resume with the same dataset.")
        self._load_base_state(state)
        self.beta.load_state_dict(state["beta"])
        self.vartheta = np.asarray(state["vartheta"], float)
        self.nu = float(state["nu"])
        self.exposure = np.asarray(state["exposure"], float)
        self.virtual = np.asarray(state["virtual"], np.int64)
        self.seed = int(state["seed"])
        self._perm = np.random.default_rng(self.seed).permutation(self.num_prompts)
        self.allocation_log = [list(x) for x in state["allocation_log"]]
        self._ranked = None


@register("pacing", "cero_fixed")
class CEROFixed(CEROScheduler):
    """Ablation `cero_fixed`: price ν fixed at 0 and a fixed per-round quota (B spread evenly)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["init_price"] = 0.0
        super().__init__(*args, **kwargs)

    def round_capacity(self) -> int:
        return min(self.capacity, even_quota(self.budget, self.rounds, self.round))

    def update_duals(self, z_star: np.ndarray) -> None:
        nu = self.nu
        super().update_duals(z_star)
        self.nu = nu


@register("pacing", "cero_preset")
class CEROPreset(CEROFixed):
    """Ablation `cero_preset`: a predetermined front-loaded schedule — C units per round for the first
    half, the rest of the budget spread evenly over the second half (528 / 496 responses at paper scale)."""

    def round_capacity(self) -> int:
        first = self.rounds // 2 + self.rounds % 2
        head = min(self.capacity, self.budget // first)
        if self.round < first:
            return head
        return min(self.capacity, even_quota(self.budget - head * first, self.rounds - first, self.round - first))


@register("pacing", "cero_greedy")
class CEROGreedy(CEROFixed):
    """Ablation `cero_greedy`: rank by the marginal utility of one more group,
    U(q̂, z + N_max) − U(q̂, z), with the fixed quota of `cero_fixed`."""

    def scores(self) -> np.ndarray:
        q = self.beta.proxy()
        return (utility(q, self.exposure + self.max_units, self.R, self.saturation)
                - utility(q, self.exposure, self.R, self.saturation))


@register("pacing", "random_matched")
class RandomMatched(_BudgetedPacer):
    """Ablation `random_matched`: a reference CERO run's allocation (sizes and timing, round by round)
    assigned to a fixed random permutation of the prompts. `reference` is a CERO `allocation_log`."""

    paces_budget = True
    replays = "cero"  # the pacing whose `allocation_log` it replays (benchmarks run that one first)
    hyperparameters = (
        UNIT_SIZE,
        Hyperparameter("random_matched_reference", str | None, None, "pacing='random_matched': path to a CERO run's "
                       "allocation_state.json (or a JSON allocation log) whose per-round allocation sizes are "
                       "replayed on a random permutation of prompts."),
    )

    @classmethod
    def from_config(cls, args: Any, context: RunContext) -> Pacer:
        own = cls.settings(args)
        reference = context.reference
        if reference is None:
            reference = load_reference(own["random_matched_reference"])
        return cls(context.num_prompts, reference=reference, unit_size=own["unit_size"], seed=context.seed)

    @classmethod
    def check_config(cls, args: Any) -> None:
        if not args.random_matched_reference:
            raise ValueError("pacing='random_matched' replays a CERO run's allocation sizes: set "
                             "`random_matched_reference` to that run's allocation_state.json.")

    def __init__(self, num_prompts: int, reference: Sequence[Sequence[Sequence[int]]], unit_size: int = 4,
                 seed: int = 0) -> None:
        total = sum(int(np.sum(u)) for _, u in reference)
        super().__init__(num_prompts, unit_size, total * unit_size)
        ids = [np.asarray(i, np.int64) for i, _ in reference]
        if any(i.size and (i.max() >= self.num_prompts or i.min() < 0) for i in ids):
            raise ValueError("`reference` names prompts outside this pool; use the log of a CERO run "
                             "on the same dataset.")
        self.reference = [[list(map(int, i)), list(map(int, u))] for i, u in reference]
        self.rounds, self.seed = len(self.reference), int(seed)
        self._perm = np.random.default_rng(self.seed).permutation(self.num_prompts)

    @property
    def ranked_prompts(self) -> np.ndarray:
        ids = self.reference[min(self.round, self.rounds - 1)][0]
        return self._perm[np.asarray(ids, np.int64)]

    def propose(self) -> np.ndarray:
        units = np.zeros(self.num_prompts, np.int64)
        if self.round < self.rounds:
            ids, u = self.reference[self.round]
            u = np.asarray(u, np.int64)
            units[self._perm[np.asarray(ids, np.int64)]] = np.clip(
                self.remaining_budget - (np.cumsum(u) - u), 0, u)
        self.last_units = units
        return units

    def update(self, successes: ArrayLike, failures: ArrayLike, responses: ArrayLike | None = None,
               prepaid: ArrayLike | None = None) -> None:
        self._consume(successes, failures, self.last_units * self.unit_size if responses is None else responses,
                      prepaid)

    @property
    def finished(self) -> bool:
        return self.remaining_budget <= 0 or self.round >= self.rounds

    def state_dict(self) -> dict:
        return {**self._base_state(), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Restores the permutation too: the saved seed, not the constructor's, fixes which prompts replay."""
        self._load_base_state(state)
        self.seed = int(state["seed"])
        self._perm = np.random.default_rng(self.seed).permutation(self.num_prompts)


def load_reference(path: str) -> list:
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


def oracle_exposure(q: ArrayLike, budget: int, max_exposure: int, R: float, saturation: float = 1.0) -> np.ndarray:
    """Full-information oracle (Appendix C.2): greedy max-heap over Δ_i(ℓ) = (1 − e^(−c_i)) e^(−c_i(ℓ−1)),
    c_i = 4λq_i/R; returns the optimal integer terminal exposure (units per prompt)."""
    c = 4.0 * saturation * np.asarray(q, float) / R
    z = np.zeros(c.size, np.int64)
    first = 1.0 - np.exp(-c)
    heap = [(-first[i], i) for i in range(c.size) if max_exposure > 0]
    heapq.heapify(heap)
    for _ in range(int(budget)):
        if not heap:
            break
        _, i = heapq.heappop(heap)
        z[i] += 1
        if z[i] < max_exposure:
            heapq.heappush(heap, (-first[i] * np.exp(-c[i] * z[i]), i))
    return z
