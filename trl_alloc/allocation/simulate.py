"""A prompt-level simulator of whole runs (what `scripts/plan.py` prints): the real pacers and fillers, no
model, on a synthetic pool whose success rates drift as a policy would learn (the planning prior of
docs/benchmarks.md#planning-at-paper-scale-scriptsplanpy-no-model). numpy only.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .allocator import Allocator
from .event_rounds import Round
from .rounds import Rounds

if TYPE_CHECKING:
    from .config import AllocationConfig  # (imported when called: config asks the registry for every method)


class DriftingPool:
    """A synthetic prompt pool whose success rates drift as a policy would learn: logit_i(t) =
    logit_i(0) + drift · t/K + gain · (responses trained on prompt i)/k (docs/benchmarks.md, planning at paper
    scale)."""

    def __init__(self, num_prompts: int, rounds: int, mean_logit: float = -1.0, spread: float = 2.5,
                 drift: float = 1.5, gain: float = 0.05, group_size: int = 8, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.logit0 = self.rng.normal(mean_logit, spread, num_prompts)
        self.rounds, self.drift, self.gain, self.k = rounds, drift, gain, group_size
        self.trained = np.zeros(num_prompts)
        self.t = 0

    @classmethod
    def from_rates(cls, rates: np.ndarray, rounds: int, drift: float = 0.0, gain: float = 0.0, group_size: int = 8,
                   seed: int = 0) -> DriftingPool:
        """A pool that starts at the given success rates (e.g. a probe pass's); drift = gain = 0 keeps them."""
        pool = cls(len(rates), rounds, drift=drift, gain=gain, group_size=group_size, seed=seed)
        p = np.clip(np.asarray(rates, float), 1e-4, 1 - 1e-4)
        pool.logit0 = np.log(p / (1 - p))
        return pool

    def success_rate(self) -> np.ndarray:
        z = self.logit0 + self.drift * self.t / self.rounds + self.gain * self.trained / self.k
        return 1.0 / (1.0 + np.exp(-z))

    def sample(self, ids: Iterable[int], counts: Iterable[int]) -> list[np.ndarray]:
        p = self.success_rate()
        return [(self.rng.random(n) < p[i]).astype(float) for i, n in zip(ids, counts)]

    def step(self, rnd: Round) -> None:
        """Advance one round: the groups that reached the loss are 'trained on'."""
        for pid in rnd.groups:
            self.trained[pid] += rnd.successes.get(pid, 0) + rnd.failures.get(pid, 0)
        self.t += 1


def fit_drift(rates: np.ndarray, successes: np.ndarray, scored: np.ndarray, rounds: int | None = None) -> float:
    """The `DriftingPool` drift that best explains a uniformly paced run's per-round success rates: least squares
    over rounds t (weighted by their scored responses) between successes_t / scored_t and the pool's mean success
    rate at t, mean_i sigmoid(logit(rate_i) + drift · t / K), starting from `rates` (a probe pass's). Under uniform
    pacing every prompt is trained alike, so the pool-wide drift and the per-prompt gain both grow linearly with t
    and cannot be told apart: the fit returns their sum as drift (gain 0)."""
    from scipy.optimize import minimize_scalar
    from scipy.special import expit, logit

    successes, scored = np.asarray(successes, float), np.asarray(scored, float)
    rounds = int(rounds or successes.size)
    t = np.arange(successes.size, dtype=float)
    keep = scored > 0
    if keep.sum() < 2:
        raise ValueError("fitting a drift needs at least two rounds with scored responses (`successes` and "
                         "`scored` in the run's allocation/summary.json per_round: a run from 2026-12-06 on).")
    z0 = logit(np.clip(np.asarray(rates, float), 1e-4, 1 - 1e-4))
    observed, weight = successes[keep] / scored[keep], scored[keep]

    def loss(drift: float) -> float:
        predicted = expit(z0[None, :] + drift * t[keep, None] / rounds).mean(axis=1)
        return float(np.sum(weight * (predicted - observed) ** 2))

    return float(minimize_scalar(loss, bounds=(-10.0, 10.0), method="bounded", options={"xatol": 1e-4}).x)


def predicted_success_bins(predicted: np.ndarray, admitted: np.ndarray, bins: int = 5) -> np.ndarray:
    """Selection lift by predicted-success bin: the admitted prompts' share in each bin of the
    pre-decision predicted success rate, over the pool's share in that bin (1 = no preference)."""
    edges = np.linspace(0, 1, bins + 1)
    pool = np.histogram(predicted, edges)[0] / max(predicted.size, 1)
    chosen = np.histogram(predicted[admitted], edges)[0] / max(len(admitted), 1)
    return np.divide(chosen, pool, out=np.full(bins, np.nan), where=pool > 0)


def in_workers(tasks: dict[str, tuple[Callable[..., Any], tuple]], workers: int) -> dict[str, Any]:
    """Each task's `fn(*args)`, by name, over `workers` processes (1: here, one after another). Every run is seeded on
    its own, so the results do not depend on `workers`; only the scheduler's milliseconds are timed, and each
    process runs on a core of its own."""
    if workers <= 1 or len(tasks) <= 1:
        return {name: fn(*call) for name, (fn, call) in tasks.items()}
    with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {name: pool.submit(fn, *call) for name, (fn, call) in tasks.items()}
        return {name: future.result() for name, future in futures.items()}


PLAN_SHAPE = {"unit_size": "unit_size", "units_per_group": "max_units", "capacity": "round_capacity"}  # plan: config


def plan_settings_for(prompts: int, rounds: int, budget: int, group_size: int = 8, seed: int = 0,
                      **fields: Any) -> argparse.Namespace:
    """A plan's settings (`simulate`'s `args`, as scripts/plan.py gives them): the pool, rounds, budget, seed and
    group shape (units of 4 where the group size allows), a static synthetic drift, and the allocation `fields` a
    run set; every other field is the trainer's default (`plan_config`)."""
    unit = 4 if group_size % 4 == 0 else group_size
    return argparse.Namespace(prompts=prompts, rounds=rounds, budget=budget, seed=seed, unit_size=unit,
                              units_per_group=group_size // unit, capacity=None, drift=0.0, **fields)


def plan_config(method: str, plan: Any) -> AllocationConfig:
    """The config of a run of `method` ('pacing+filling'; 'cero' alone: full groups) over a plan's pool: the plan's
    budget, rounds and group shape (`plan.budget`, `.rounds`, `.seed`, and `PLAN_SHAPE`'s CERO fields), and every
    other allocation field as `plan` gives it (scripts/plan.py's flags are generated from those fields), else the
    trainer's default. A plain pacer admits budget / (K·k) prompts per round, so every method spends the same budget
    over K rounds."""
    from .config import AllocationConfig, allocation_field_names

    pacing, _, filling = method.partition("+")
    given = {name: getattr(plan, name) for name in allocation_field_names() if getattr(plan, name, None) is not None}
    given.update({field: getattr(plan, name) for name, field in PLAN_SHAPE.items()
                  if getattr(plan, name, None) is not None})
    k = given.get("unit_size", 4) * given.get("max_units", 2)
    with warnings.catch_warnings():  # (one plan's settings serve every method; each reads its own)
        warnings.simplefilter("ignore", UserWarning)
        return AllocationConfig(**{**given, "pacing": pacing, "filling": filling or "full", "num_generations": k,
                                   "rollout_budget": plan.budget, "num_rounds": plan.rounds,
                                   "generation_batch_size": plan.budget // plan.rounds, "seed": plan.seed})


def plan_allocator(method: str, plan: Any, reference: list | None = None,
                   round_log_path: str | None = None) -> tuple[Allocator, AllocationConfig]:
    """The `Allocator` of a run of `method` over a plan's pool, built as the trainer builds its own
    (`Allocator.from_config` on `plan_config`), and that config."""
    config = plan_config(method, plan)
    return Allocator.from_config(config, plan.prompts, plan.rounds, plan={}, reference=reference,
                                 round_log_path=round_log_path), config


def simulate(method: str, args: Any, reference: list | None = None, pool: DriftingPool | None = None,
             seed_counts: tuple | None = None) -> tuple[dict, dict[str, list], list | None]:
    """Run `method` (e.g. 'cero+sara') over `args.rounds` rounds of a `DriftingPool` (`pool`, else one drawn from
    `args`); returns (summary, per-round record, the pacer's allocation log or None). `args`: plan.py's settings;
    `seed_counts`: (successes, failures) per prompt of a probe pass, for a pacer with `seed_counts` (CERO)."""
    allocator, config = plan_allocator(method, args, reference)
    pacer = allocator.pacer
    pool = pool or DriftingPool(args.prompts, args.rounds, drift=args.drift, seed=args.seed)
    if seed_counts is not None:
        pacer.seed_counts(*seed_counts)
    k = config.num_generations
    rec = {"spend": [], "groups": [], "effective": [], "expected_effective": [], "alloc_ms": []}
    lifts = []
    clock = [0.0]

    def timed(method, *call_args):  # the allocator's own time, without the pool's sampling
        t0 = time.perf_counter()
        out = method(*call_args)
        clock[0] += time.perf_counter() - t0
        return out

    def generate(ids, counts):
        return [{"pid": pid, "success": float(x)} for pid, got in zip(ids, pool.sample(ids, counts)) for x in got]

    def before_round() -> tuple[np.ndarray | None, np.ndarray]:  # what the pacer predicts, what the pool holds
        clock[0] = 0.0
        return None if pacer.posterior is None else pacer.posterior.mean.copy(), pool.success_rate()

    # the trainer's deterministic round (trainer/grpo.py); a filler that spends less than planned may run past
    # `rounds` until the budget is spent, up to 4x; a remainder smaller than one group ends the run
    predicted, p = before_round()
    rounds = Rounds.driven(allocator, 4 * args.rounds - pool.t, lambda i: allocator.drive_requests(generate, timed),
                           step=timed, min_responses=k)
    for _ in rounds:
        rnd, ms = allocator.closed_round, clock[0]
        spent = rnd.outcomes(pacer.num_prompts)[2]
        admitted = np.asarray(rnd.groups, np.int64)
        if predicted is not None and pool.t >= args.rounds // 10:      # after the first visits
            lifts.append(predicted_success_bins(predicted, np.flatnonzero(spent)))
        sizes = spent[admitted] if admitted.size else np.zeros(0)
        rec["expected_effective"].append(float(np.sum(1 - p[admitted] ** sizes - (1 - p[admitted]) ** sizes)))
        rec["spend"].append(int(spent.sum()))
        rec["groups"].append(len(rnd.groups))
        rec["effective"].append(int(rnd.effective))
        rec["alloc_ms"].append(1e3 * ms)
        pool.step(rnd)
        predicted, p = before_round()
    total_groups = sum(rec["groups"])
    summary = {
        "method": method, "rounds": pool.t, "responses_spent": int(sum(rec["spend"])),
        "budget_left": int(pacer.remaining_responses), "groups": total_groups,
        "effective_groups": int(sum(rec["effective"])),
        "egr": sum(rec["effective"]) / max(total_groups, 1),
        "responses_per_effective_group": sum(rec["spend"]) / max(sum(rec["effective"]), 1),
        "max_abs_pacing_gap": float(np.max(np.abs(np.cumsum(rec["spend"]) - args.budget / args.rounds
                                                  * np.arange(1, len(rec["spend"]) + 1)))),
        "scheduler_ms_per_round": float(np.median(rec["alloc_ms"])),
        "selection_lift_by_predicted_success": (np.nanmean(lifts, axis=0).round(2).tolist() if lifts else None),
    }
    return summary, rec, getattr(pacer, "allocation_log", None)


__all__ = ["DriftingPool", "PLAN_SHAPE", "fit_drift", "in_workers", "predicted_success_bins", "plan_config",
           "plan_settings_for", "plan_allocator", "simulate"]
