"""The planner against learning runs that happened (scripts/validate_plan.py; docs/benchmarks.md, "Planning on your
own pool"): for each run folder of `bench_learning.py` records, the probe pass of the base model on each seed's own
pool with the run's own sampling settings, then `plan.py`'s prediction of every method's effective groups and
responses per effective group, against what the runs measured.

Three predictions per method and seed:
- `static`: the pool keeps its probed rates (what `trl-alloc-plan` prints without `--drift_from`);
- `fit_own`: the pool drifts by the amount that makes stock's predicted effective groups match that seed's stock
  run (`fit_drift_to_stock`; the records keep no per-round successes, so the fit matches the total);
- `fit_other`: the drift fitted on another seed's stock run (the first seed), applied to this seed's pool.
"""

from __future__ import annotations

import argparse
import os
import statistics
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import yaml

from ..allocation.config import allocation_field_names
from ..allocation.simulate import DriftingPool, plan_settings_for, simulate
from .probe import pool_rates, probe_pool

RECORD_METHODS = {"stock": "uniform", "sara": "uniform+sara", "cero_sara": "cero+sara", "cero": "cero",
                  "dapo": "uniform+dynamic_sampling"}  # a record's method: the planner's name for it
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIFT_GRID = np.round(np.arange(-2.0, 6.01, 0.25), 2)


def run_settings(record: dict[str, Any], root: str = ROOT) -> dict[str, Any]:
    """A learning run's settings from its record's command: its `--config` file, then the flags after it."""
    cmd = [str(c) for c in record["command"]]
    settings: dict[str, Any] = {}
    if "--config" in cmd:
        path = cmd[cmd.index("--config") + 1]
        with open(path if os.path.isabs(path) else os.path.join(root, path), encoding="utf-8") as f:
            settings.update(yaml.safe_load(f))
    i = 0
    while i < len(cmd):
        if cmd[i] == "--config" or not cmd[i].startswith("--"):
            i += 2 if cmd[i] == "--config" else 1
            continue
        has_value = i + 1 < len(cmd) and not cmd[i + 1].startswith("--")
        settings[cmd[i][2:]] = yaml.safe_load(cmd[i + 1]) if has_value else True
        i += 2 if has_value else 1
    return settings


def run_pool(settings: dict[str, Any], seed: int) -> Any:
    """The prompt pool the run trained on (train.py's `load_train_and_test` with the run's settings and seed)."""
    from ..tasks.data import load_train_and_test

    levels = settings.get("builtin_levels")
    return load_train_and_test(settings["dataset_name"], "train", None, num_builtin=settings["num_builtin_prompts"],
                               seed=seed, levels=tuple(levels) if levels else None).train


def probe_run(settings: dict[str, Any], seed: int, model: str, probe_prompts: int | None = None,
              backend: str = "auto") -> dict[str, Any]:
    """The probe pass on the run's pool at its sampling settings (k = num_generations, its temperature and cap): all
    of the pool, or a seeded sample of `probe_prompts` of it."""
    pool = run_pool(settings, seed)
    if probe_prompts and probe_prompts < len(pool):
        pool = pool.select(sorted(np.random.default_rng(seed).choice(len(pool), probe_prompts, replace=False)))
    probe = probe_pool(model, settings["dataset_name"], k=int(settings["num_generations"]), num_prompts=len(pool),
                       max_tokens=int(settings["max_completion_length"]),
                       temperature=float(settings.get("temperature", 1.0)), seed=seed, backend=backend, pool=pool)
    probe["pool_prompts"] = int(settings["num_builtin_prompts"])
    return probe


def probed_rates(probe: dict[str, Any], seed: int) -> np.ndarray:
    """The pool's success rates: the probed prompts' own, and for a pool larger than the probe, the rest drawn
    (seeded) from the probed rates."""
    rates = np.nan_to_num(pool_rates(probe["successes"], probe["failures"]), nan=0.0)
    extra = int(probe.get("pool_prompts", rates.size)) - rates.size
    if extra > 0:
        rates = np.concatenate([rates, np.random.default_rng(seed).choice(rates, extra)])
    return rates


def plan_args(settings: dict[str, Any], num_prompts: int, seed: int) -> argparse.Namespace:
    """The planner's settings for the run (`allocation.simulate.plan_settings_for`): the run's pool, rounds, budget
    and group size, and every allocation field the run set (the rest: the trainer's defaults, as in the run)."""
    fields = {name: settings[name] for name in allocation_field_names()
              if name in settings and name not in ("pacing", "filling", "pruning", "num_generations", "seed")}
    rounds = int(settings["num_rounds"])
    return plan_settings_for(num_prompts, rounds, rounds * int(settings["per_device_train_batch_size"]),
                             int(settings["num_generations"]), seed, **fields)


def predict(method: str, rates: np.ndarray, settings: dict[str, Any], drift: float,
            seeds: Sequence[int]) -> dict[str, float]:
    """The planner's effective groups, responses and responses per effective group for `method` (a planner name)
    on a pool starting at `rates` and drifting by `drift` over the run: means over `seeds`."""
    runs = []
    for seed in seeds:
        args = plan_args(settings, rates.size, seed)
        pool = DriftingPool.from_rates(rates, args.rounds, drift=drift, group_size=args.unit_size * 2, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            summary, _, _ = simulate(method, args, pool=pool)
        runs.append(summary)
    eff = statistics.fmean(r["effective_groups"] for r in runs)
    responses = statistics.fmean(r["responses_spent"] for r in runs)
    return {"effective_groups": eff, "responses": responses, "responses_per_effective_group": responses / max(eff, 1)}


def fit_drift_to_stock(rates: np.ndarray, settings: dict[str, Any], measured: float, seeds: Sequence[int],
                       grid: Sequence[float] = tuple(DRIFT_GRID)) -> float:
    """The drift (on `grid`) whose predicted stock effective groups come closest to `measured`."""
    errors = [abs(predict("uniform", rates, settings, d, seeds)["effective_groups"] - measured) for d in grid]
    return float(grid[int(np.argmin(errors))])


def validate(records: Sequence[dict[str, Any]], probes: dict[int, dict[str, Any]], plan_seeds: int = 5,
             root: str = ROOT) -> dict[str, Any]:
    """Predicted against measured for every record (`probes`: each seed's probe pass); the fits use stock only."""
    by = {(r["method"], int(r["seed"])): r for r in records if r["method"] in RECORD_METHODS}
    seeds = sorted({s for _, s in by})
    settings = {s: run_settings(by[next(m for m, ss in by if ss == s), s], root) for s in seeds}
    rates = {s: probed_rates(probes[s], s) for s in seeds}
    plan = range(plan_seeds)
    drift = {s: fit_drift_to_stock(rates[s], settings[s], by["stock", s]["effective_groups"], plan)
             for s in seeds if ("stock", s) in by}
    donor = min(drift) if drift else None
    rows = []
    for (method, seed), record in sorted(by.items()):
        row = {"method": method, "seed": seed, "measured": {
            "effective_groups": record["effective_groups"], "responses": record["responses_spent"],
            "responses_per_effective_group": record["responses_spent"] / max(record["effective_groups"], 1)}}
        for name, d in (("static", 0.0), ("fit_own", drift.get(seed)),
                        ("fit_other", None if donor in (None, seed) else drift[donor])):
            if d is not None:
                row[name] = {**predict(RECORD_METHODS[method], rates[seed], settings[seed], d, plan), "drift": d}
        rows.append(row)
    return {"rows": rows, "drift": drift, "donor_seed": donor, "plan_seeds": plan_seeds,
            "probes": {s: {k: v for k, v in p.items() if k not in ("prompts", "successes", "failures")}
                       for s, p in probes.items()}}


def by_method(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per method, means over seeds of the measured and predicted figures, each prediction's relative error in
    effective groups, and whether the methods' order by responses per effective group matches."""
    out: dict[str, dict[str, Any]] = {}
    for row in result["rows"]:
        out.setdefault(row["method"], []).append(row)
    table = {}
    for method, rows in out.items():
        entry: dict[str, Any] = {"seeds": [r["seed"] for r in rows]}
        for kind in ("measured", "static", "fit_own", "fit_other"):
            have = [r[kind] for r in rows if kind in r]
            if have:
                entry[kind] = {key: statistics.fmean(h[key] for h in have)
                               for key in ("effective_groups", "responses_per_effective_group")}
                entry[kind]["n"] = len(have)
        measured = [r["measured"]["effective_groups"] for r in rows]
        entry["measured"].update(min=min(measured), max=max(measured))
        for kind in ("static", "fit_own", "fit_other"):
            if kind in entry:
                entry[kind]["error"] = entry[kind]["effective_groups"] / entry["measured"]["effective_groups"] - 1
        table[method] = entry
    return table


def order_matches(table: dict[str, dict[str, Any]], kind: str) -> bool | None:
    """Whether the methods' order by responses per effective group is the measured one under prediction `kind`."""
    methods = [m for m in table if kind in table[m]]
    if len(methods) < 2:
        return None

    def order(key: str) -> list[str]:
        return sorted(methods, key=lambda m: table[m][key]["responses_per_effective_group"])
    return order("measured") == order(kind)


def markdown(result: dict[str, Any], label: str) -> str:
    """The table docs/benchmarks.md shows: per method, measured and predicted effective groups (relative error)
    and responses per effective group, means over seeds."""
    table = by_method(result)
    lines = [f"**{label}** (drift fitted to stock: " + ", ".join(f"seed {s}: {d:+.2f}" for s, d in
                                                                   sorted(result["drift"].items())) + ")", "",
             "| method | seeds | measured eff. groups (min–max) | static | fitted on its seed's stock | "
             f"fitted on seed {result['donor_seed']}'s stock | measured resp./eff. | "
             "predicted resp./eff. (static / own / other) |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(entry: dict[str, Any], kind: str) -> str:
        if kind not in entry:
            return "–"
        return f"{entry[kind]['effective_groups']:.1f} ({100 * entry[kind]['error']:+.0f}%)"
    for method, e in table.items():
        rpe = " / ".join(f"{e[k]['responses_per_effective_group']:.1f}" if k in e else "–"
                         for k in ("static", "fit_own", "fit_other"))
        m = e["measured"]
        lines.append(f"| {method} | {len(e['seeds'])} | {m['effective_groups']:.1f} ({m['min']:g}–{m['max']:g}) | "
                     f"{cell(e, 'static')} "
                     f"| {cell(e, 'fit_own')} | {cell(e, 'fit_other')} | "
                     f"{e['measured']['responses_per_effective_group']:.1f} | {rpe} |")
    lines += ["", "Order of the methods by responses per effective group, as measured: " + ", ".join(
        f"{kind} {'right' if ok else 'wrong'}" for kind in ("static", "fit_own", "fit_other")
        if (ok := order_matches(table, kind)) is not None) + "."]
    return "\n".join(lines)


__all__ = ["RECORD_METHODS", "by_method", "fit_drift_to_stock", "markdown", "order_matches", "plan_args", "predict",
           "probe_run", "probed_rates", "run_pool", "run_settings", "validate"]
