"""Plan a run before renting GPUs: the real schedulers, no model, on a pool whose difficulty drifts.

Defaults are the CERO paper's scale: 8,699 prompts, K = 500 rounds, 256,000 responses, 8 per admitted
prompt (g = 4, N_max = 2), C = 132 units. Prints a table per allocator (budget spent, effective
groups, EGR, responses per effective group, pacing gap, scheduler ms/round, selection lift) and
writes plan.json and PNG plots to --output_dir.
"""

import argparse
import json
import os

import numpy as np

from trl_alloc.allocation.simulate import simulate


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


def main(argv=None):
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
    args = parser.parse_args(argv)
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
