#!/usr/bin/env python
"""Plan a run before renting GPUs: the real schedulers, no model, on a pool whose difficulty drifts.

Defaults are the CERO paper's scale: 8,699 prompts, K = 500 rounds, 256,000 responses, 8 per admitted
prompt (g = 4, N_max = 2), C = 132 units. Prints a table per allocator (budget spent, effective
groups, EGR, responses per effective group, pacing gap, scheduler ms/round, selection lift) and
writes plan.json and PNG plots to --output_dir.
"""

import argparse
import json
import os
import time

import numpy as np

from trl_alloc.allocation import make_filler, make_pacer
from trl_alloc.allocation.pipeline import DriftingPool, predicted_success_bins, round_arguments


def build(method, args, reference=None):
    """(pacer, filler, filling) for a method name like 'cero', 'cero+sara', 'uniform+dynamic_sampling'."""
    pacing, _, filling = method.partition("+")
    filling = filling or "full"
    k = args.units_per_group * args.unit_size
    budget_units = args.budget // args.unit_size
    if pacing in ("uniform", "knapsack"):
        extra = {"min_n": 2, "max_n": 4 * k} if pacing == "knapsack" else {}
        pacer = make_pacer(pacing, args.prompts, prompts_per_round=args.budget // (k * args.rounds),
                           group_size=k, budget_responses=args.budget, seed=args.seed, **extra)
    elif pacing == "random_matched":
        pacer = make_pacer(pacing, args.prompts, reference=reference, unit_size=args.unit_size, seed=args.seed)
    else:
        pacer = make_pacer(pacing, args.prompts, rounds=args.rounds, budget=budget_units,
                           round_capacity=args.capacity, max_units=args.units_per_group,
                           unit_size=args.unit_size, seed=args.seed)
    filler = {"full": lambda: make_filler("full", group_size=k),
              "sara": lambda: make_filler("sara", group_size=k, tau_low=args.tau_low),
              "dynamic_sampling": lambda: make_filler("dynamic_sampling", group_size=k,
                                                      max_generation_batches=50)}[filling]()
    return pacer, filler, filling


def simulate(method, args, reference=None):
    pacer, filler, filling = build(method, args, reference)
    pool = DriftingPool(args.prompts, args.rounds, drift=args.drift, seed=args.seed)
    k = args.units_per_group * args.unit_size
    rec = {"spend": [], "groups": [], "effective": [], "expected_effective": [], "alloc_ms": []}
    lifts = []
    while not pacer.finished and pool.t < 4 * args.rounds:
        predicted = pacer.beta.mean.copy() if hasattr(pacer, "beta") else None
        t0 = time.perf_counter()
        units = pacer.propose()
        kw = round_arguments(pacer, units, filling, k, history_decay=args.history_decay)
        rnd = filler.start_round(**kw)
        ms = time.perf_counter() - t0
        p = pool.success_rate()
        while not rnd.done:
            t0 = time.perf_counter()
            ids, counts = rnd.requests()
            ms += time.perf_counter() - t0
            rewards = pool.sample(ids, counts)
            t0 = time.perf_counter()
            rnd.observe(rewards)
            ms += time.perf_counter() - t0
        t0 = time.perf_counter()
        s, f, spent = rnd.outcomes(pacer.num_prompts)
        pacer.update(s, f, spent)
        ms += time.perf_counter() - t0
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


def plot(results, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    per_round = args.budget / args.rounds
    for name, (summary, rec) in results.items():
        spend = np.asarray(rec["spend"])
        ax[0, 0].plot(spend, lw=0.8, label=name)
        ax[0, 1].plot(np.cumsum(spend) - per_round * np.arange(1, spend.size + 1), label=name)
        eff = np.convolve(rec["effective"], np.ones(25) / 25, "valid")
        grp = np.convolve(rec["groups"], np.ones(25) / 25, "valid")
        ax[1, 0].plot(eff / np.maximum(grp, 1e-9), label=name)
        if summary["selection_lift_by_predicted_success"]:
            ax[1, 1].plot(np.linspace(0.1, 0.9, 5), summary["selection_lift_by_predicted_success"], "o-", label=name)
    ax[0, 0].axhline(per_round, color="k", ls="--", lw=0.8)
    ax[0, 0].set(title="responses spent per round (dashed: uniform)", xlabel="round")
    ax[0, 1].set(title="cumulative pacing gap vs uniform spending", xlabel="round", ylabel="responses")
    ax[1, 0].set(title="effective-group rate (25-round mean)", xlabel="round")
    ax[1, 1].axhline(1, color="k", ls="--", lw=0.8)
    ax[1, 1].set(title="selection lift by predicted success (1 = pool share)", xlabel="predicted success bin")
    for a in ax.flat:
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8699)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--budget", type=int, default=256_000, help="global budget in responses")
    parser.add_argument("--unit_size", type=int, default=4, help="g: responses per allocation unit")
    parser.add_argument("--units_per_group", type=int, default=2, help="N_max")
    parser.add_argument("--capacity", type=int, default=132, help="C: units per round")
    parser.add_argument("--tau_low", default=0.45, type=lambda x: x if x == "auto" else float(x))
    parser.add_argument("--history_decay", type=float, default=1.0, help="SARA prior from CERO's Beta state")
    parser.add_argument("--drift", type=float, default=1.5, help="logit drift of the pool over the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="uniform,cero,cero_fixed,cero_preset,cero_greedy,random_matched,"
                        "knapsack,uniform+sara,cero+sara,uniform+dynamic_sampling")
    parser.add_argument("--output_dir", default="outputs/plan")
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    results, reference = {}, None
    methods = args.methods.split(",")
    if "random_matched" in methods and "cero" not in methods:
        methods.insert(0, "cero")
    for method in methods:
        summary, rec, log = simulate(method, args, reference)
        if method == "cero":
            reference = log
        results[method] = (summary, rec)
    cols = ["rounds", "responses_spent", "budget_left", "effective_groups", "egr", "responses_per_effective_group",
            "max_abs_pacing_gap", "scheduler_ms_per_round"]
    print(f"{'method':<26}" + "".join(f"{c[:14]:>15}" for c in cols) + "  selection lift (bins of q)")
    for name, (s, _) in results.items():
        vals = "".join(f"{s[c]:>15.3f}" if isinstance(s[c], float) else f"{s[c]:>15}" for c in cols)
        print(f"{name:<26}{vals}  {s['selection_lift_by_predicted_success']}")
    with open(os.path.join(args.output_dir, "plan.json"), "w") as f:
        json.dump({"settings": vars(args), "results": {k: {"summary": s, "per_round": r}
                                                       for k, (s, r) in results.items()}}, f)
    plot(results, args, os.path.join(args.output_dir, "plan.png"))
    print(f"wrote {args.output_dir}/plan.json and plan.png")


if __name__ == "__main__":
    main()
