"""A plan on the user's own pool (`scripts/plan.py --model M --dataset D`): the real schedulers and the engine model,
the trainer's config (`allocation/config.py`), on a pool whose success rates are the probe pass's
(`benchmarks/probe.py`), each method over several seeds; a table with the spread and one recommendation.

By default the pool is static: a prompt keeps its probed rate through the run, so the figures say what each method
buys from the pool as it is at the start. `--drift_from RUN_DIR` fits the pool's drift to a previous stock run's
per-round successes (`allocation.simulate.fit_drift`; docs/benchmarks.md, "Planning on your own pool").
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ..allocation.simulate import DriftingPool, fit_drift, in_workers, simulate
from .probe import pool_rates


def pool_shape(args: argparse.Namespace, num_prompts: int, k: int) -> None:
    """The planned run on a pool of `num_prompts`: what the user gave, else 40 rounds of max(1, prompts / 16)
    prompts × k responses (the learning benchmark's 64-prompt pool: 4 × 8 a round, 2.5 passes)."""
    args.prompts = num_prompts
    args.rounds = args.rounds or 40
    args.budget = args.budget or args.rounds * max(1, num_prompts // 16) * k
    args.engine_rounds = args.rounds


def drift_from_run(run_dir: str, rates: np.ndarray, rounds: int) -> dict[str, Any]:
    """The drift of a previous run on this pool (its `allocation/summary.json` per-round successes; a stock run:
    uniform pacing), fitted from the probe's `rates` (`allocation.simulate.fit_drift`) and rescaled to this plan's
    `rounds` (the same movement a round)."""
    import json
    import os

    path = os.path.join(run_dir, "allocation", "summary.json")
    if not os.path.isfile(path):
        raise ValueError(f"--drift_from {run_dir!r}: no allocation/summary.json there; give the output_dir of a "
                         "finished train.py run on this pool.")
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    per_round = summary.get("per_round") or []
    if not all("successes" in h and "scored" in h for h in per_round):
        raise ValueError(f"--drift_from {run_dir!r}: its rounds record no successes (runs before 2026-12-06 do "
                         "not); run stock GRPO (pacing uniform, filling full) on this pool again.")
    methods = summary.get("methods", {})
    drift = fit_drift(rates, [h["successes"] for h in per_round], [h["scored"] for h in per_round])
    return {"run": run_dir, "run_rounds": len(per_round), "run_drift": drift, "drift": drift * rounds / len(per_round),
            "uniform": methods.get("pacing") == "uniform"}


def _spread(values: list[float]) -> dict[str, float]:
    values = [float(v) for v in values]
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def _on_pool(run: Callable[..., Any], run_args: tuple, rates: np.ndarray, rounds: int, drift: float, k: int,
             seed: int) -> Any:
    """`run(*run_args, pool=...)` (`simulate`, `simulate_engine`) on seed `seed`'s pool of the probe's `rates`."""
    pool = DriftingPool.from_rates(rates, rounds, drift=drift, group_size=k, seed=seed)
    with warnings.catch_warnings():  # (a short run's selection lift has empty bins)
        warnings.simplefilter("ignore", RuntimeWarning)
        return run(*run_args, pool=pool)


def plan_on_pool(args: argparse.Namespace, probe: dict[str, Any], seeds: int) -> dict[str, Any]:
    """Every method of `args.methods` through `allocation.simulate`, and of `args.engine_methods` on the engine
    model as the user could run it (sync, events, stream), on the probe's pool, seeds 0..`seeds`-1; the runs over
    `args.workers` processes (`allocation.simulate.in_workers`: the figures do not depend on them)."""
    from ..rollout.engine_model import simulate_engine

    rates = np.nan_to_num(pool_rates(probe["successes"], probe["failures"]), nan=0.0)
    k = args.unit_size * args.units_per_group
    fitted = drift_from_run(args.drift_from, rates, args.rounds) if args.drift_from else None
    drift = fitted["drift"] if fitted else 0.0

    methods = [m for m in args.methods.split(",") if m and m.partition("+")[0] != "random_matched"]
    engine_runs = [(m, mode) for m in args.engine_methods.split(",") if m
                   for mode in (("sync", "events", "stream") if "+" in m else ("sync", "stream"))]
    tasks, pool = {}, (rates, args.rounds, drift, k)
    for seed in range(seeds):
        plan = argparse.Namespace(**{**vars(args), "seed": seed})
        for method in methods:
            tasks[method, seed] = (_on_pool, (simulate, (method, plan), *pool, seed))
        plan = argparse.Namespace(**{**vars(args), "seed": seed, "max_staleness": None})
        for method, mode in engine_runs:
            tasks[(method, mode), seed] = (_on_pool, (simulate_engine, (method, mode, plan, args.rounds), *pool,
                                                      seed))
    done = in_workers(tasks, getattr(args, "workers", 1))
    rows: dict[str, dict[str, Any]] = {}
    for method in methods:
        runs = [done[method, seed][0] for seed in range(seeds)]
        rows[method] = {"kind": "responses", "effective_groups": _spread([r["effective_groups"] for r in runs]),
                        "responses": _spread([r["responses_spent"] for r in runs]),
                        "responses_per_effective_group": _spread([r["responses_per_effective_group"] for r in runs])}
    engine = {}
    gpus = 1 if args.colocate else args.gpus_per_engine + args.train_gpus
    for method, mode in engine_runs:
        runs = [done[(method, mode), seed] for seed in range(seeds)]
        engine[f"{method} {mode}"] = {
            "kind": "engine", "method": method, "mode": mode,
            "effective_groups": _spread([r["effective_groups"] for r in runs]),
            "responses_per_effective_group": _spread([r["responses"] / max(r["effective_groups"], 1)
                                                      for r in runs]),
            "gpu_s_per_effective_group": _spread([r["engine_s"] * gpus / max(r["effective_groups"], 1)
                                                  for r in runs]),
            "gpu_s_per_signal": _spread([r["engine_s"] * gpus / r["signal"] if r["signal"] else float("inf")
                                         for r in runs])}
    return {"rows": rows, "engine": engine, "recommendation": recommend(rows, engine), "drift": fitted}


def recommend(rows: dict[str, dict], engine: dict[str, dict]) -> dict[str, Any]:
    """The setting with the fewest GPU-seconds per unit of learning signal on the engine model (else the fewest
    responses per effective group), against stock TRL's (uniform, full groups, synchronous), and why."""
    table, key, figure, stock = ((engine, "gpu_s_per_signal", "GPU-s per unit of learning signal", "uniform sync")
                                 if engine else
                                 (rows, "responses_per_effective_group", "responses per effective group", "uniform"))
    best = min(table, key=lambda n: table[n][key]["mean"])
    spread = table[best][key]
    ratio = spread["mean"] / table[stock][key]["mean"] if stock in table else float("nan")
    return {"setting": best, "figure": figure, "value": spread["mean"], "ratio_to_stock": ratio,
            "why": f"{best}: {spread['mean']:.2f} {figure} (seeds {spread['min']:.2f}-{spread['max']:.2f}), "
                   f"{ratio:.2f}x stock TRL's (uniform, full groups{', synchronous' if engine else ''}); the cheapest "
                   "setting on this pool's probed success rates"}


def markdown(probe: dict[str, Any], summary: dict[str, Any], plan: dict[str, Any], args: argparse.Namespace) -> str:
    """The probe, the pool and the plan's table, as the planner prints them."""
    q = {key: summary["quantiles"].get(key, float("nan")) for key in (0.1, 0.5, 0.9)}
    lines = [
        f"probe: {probe['responses']} responses ({summary['prompts']} prompts x {probe['k']}) of {probe['model']} "
        f"through {probe['backend']}, {probe['tokens']} tokens, {probe['seconds']:.0f} s; median response "
        f"{probe['length_median']:.0f} tokens, {100 * probe['truncated_share']:.0f}% cut at {probe['max_tokens']}",
        f"pool: mean success rate {summary['mean_rate']:.3f}; all-fail {100 * summary['all_fail']:.0f}%, all-pass "
        f"{100 * summary['all_pass']:.0f}%, mixed {100 * summary['mixed']:.0f}% of prompts at k = {probe['k']}; "
        f"rate quantiles 10/50/90%: {q[0.1]:.2f} / {q[0.5]:.2f} / {q[0.9]:.2f}",
        f"plan: {args.rounds} rounds, {args.budget} responses, {args.prompts} prompts; " + (
            f"the pool drifts by {plan['drift']['drift']:+.2f} in logit over the plan (fitted to "
            f"{plan['drift']['run']}, {plan['drift']['run_rounds']} rounds"
            + ("" if plan["drift"]["uniform"] else "; not a uniformly paced run: its prompts were chosen, so the fit "
               "is biased") + ")" if plan["drift"] else
            "a static pool (each prompt keeps its probed rate; --drift_from fits a drift to a stock run)")
        + f", the trainer's defaults; mean (min-max) over {args.plan_seeds} seeds", "",
        "| method | effective groups | responses | responses / effective group |", "|---|---|---|---|"]

    def cell(spread, spec=".1f"):
        return f"{spread['mean']:{spec}} ({spread['min']:{spec}}-{spread['max']:{spec}})"
    for name, r in plan["rows"].items():
        lines.append(f"| {name} | {cell(r['effective_groups'])} | {cell(r['responses'], '.0f')} | "
                     f"{cell(r['responses_per_effective_group'], '.2f')} |")
    if plan["engine"]:
        lines += ["", "| method and mode (engine model) | effective groups | responses / eff | GPU-s / eff | "
                      "GPU-s / signal |", "|---|---|---|---|---|"]
        for name, r in plan["engine"].items():
            lines.append(f"| {name} | {cell(r['effective_groups'])} | "
                         f"{cell(r['responses_per_effective_group'], '.2f')} | "
                         f"{cell(r['gpu_s_per_effective_group'], '.2f')} | {cell(r['gpu_s_per_signal'], '.2f')} |")
    lines += ["", f"recommended: {plan['recommendation']['why']}."]
    return "\n".join(lines)


__all__ = ["markdown", "plan_on_pool", "pool_shape", "recommend"]
