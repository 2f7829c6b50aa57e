"""The method benchmark's table and plots, from its runs (or an earlier run's bench.json)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .methods import METHODS, PRUNING_METHODS, method_recipe

if TYPE_CHECKING:
    import argparse


def _fmt(v, spec, scale=1.0, sign=False):
    if v is None:
        return "-"
    mean, std = v
    s = f"{mean * scale:{'+' if sign else ''}{spec}}"
    return s + (f" ± {std * scale:{spec}}" if std else "")


def markdown_table(rows: dict[str, dict[str, Any]], opts: argparse.Namespace,
                   start: dict[str, tuple[float, float]] | None = None) -> str:
    k = opts.eval_k
    head = (f"| method | seeds | avg@{k} % | pass@{k} % | Δavg@{k} vs start (pp) | Δavg@{k} vs stock (pp) | "
            f"Δpass@{k} vs stock (pp) | "
            "eff. group rate % | responses / eff. group | ratio to DAPO | tokens / eff. group | responses | "
            "optimizer steps | wall s | s / eff. group | allocator share % |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for m, r in rows.items():
        lines.append(
            f"| {method_recipe(m)[0]} | {r['runs']} | {_fmt(r['avg'], '.1f', 100)} | {_fmt(r['pass'], '.1f', 100)} | "
            f"{_fmt(r['d_avg_vs_start'], '.1f', 100, True)} | {_fmt(r['d_avg_vs_stock'], '.1f', 100, True)} | "
            f"{_fmt(r['d_pass_vs_stock'], '.1f', 100, True)} | "
            f"{_fmt(r['egr'], '.1f', 100)} | {_fmt(r['responses_per_eff'], '.1f')} | "
            f"{_fmt(r['rpe_ratio_vs_dapo'], '.2f')} | {_fmt(r['tokens_per_eff'], '.1f')} | "
            f"{_fmt(r['responses'], '.0f')} | {_fmt(r['rounds'], '.1f')} | {_fmt(r['wall_s'], '.1f')} | "
            f"{_fmt(r['seconds_per_eff'], '.1f')} | {_fmt(r['allocator_share'], '.2f', 100)} |")
    note = (f"\nBudget {opts.budget} responses ({opts.rounds} rounds × {opts.batch}; stock: "
            f"{opts.budget // opts.batch} steps), k={opts.num_generations}, "
            f"max_completion_length={opts.max_completion_length}, prompt pool {opts.num_prompts}, "
            f"held-out: {opts.eval_prompts} test prompts × {opts.eval_k} samples (T={opts.temperature:g}). "
            "Eff. group = a group with mixed rewards; rate = effective / groups touched. Ratio to DAPO = responses "
            "per effective group ÷ DAPO dynamic sampling's (paired per seed). Δ = method − stock GRPOTrainer, or "
            "− the untrained start checkpoint (paired per seed), percentage points. s / eff. group = train() "
            "wall-clock ÷ effective groups. Allocator share = allocator "
            "seconds ÷ train() wall-clock.")
    survivors = [f"{method_recipe(m)[0]} {_fmt(rows[m]['survivor_positive_ratio'], '.3f')}" for m in PRUNING_METHODS
                 if m in rows and rows[m]["survivor_positive_ratio"] is not None]
    if survivors:
        note += " Survivors' positive ratio (mean over rounds after the cold start): " + ", ".join(survivors) + "."
    aucs = [f"{method_recipe(m)[0]} {_fmt(rows[m]['head_auc'], '.3f')}" for m in PRUNING_METHODS
            if m in rows and rows[m].get("head_auc") is not None]
    if aucs:
        note += (" Quality head AUC (mean over rounds, on each round's completed rollouts before the head trains on "
                 "them): " + ", ".join(aucs) + ".")
    if start:
        note += (f" Start checkpoint: avg@{k} {_fmt(start['avg'], '.1f', 100)} %, "
                 f"pass@{k} {_fmt(start['pass'], '.1f', 100)} %.")
    return "\n".join(lines) + "\n" + note


def plots(runs: list[dict[str, Any]], rows: dict[str, dict[str, Any]], methods: Sequence[str], out_dir: str,
          opts: argparse.Namespace) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = {}

    def save(fig, key, fname):
        fig.tight_layout()
        paths[key] = os.path.join(out_dir, fname)
        fig.savefig(paths[key], dpi=120)
        plt.close(fig)

    # one colour and line style per method everywhere (matplotlib's 10-colour cycle would repeat)
    names = list(METHODS) + [m for m in methods if m not in METHODS]
    style = {m: dict(label=method_recipe(m)[0], color=plt.get_cmap("tab10")(i % 10), ls="-" if i < 10 else "--")
             for i, m in enumerate(names)}
    seed0 = min(r["seed"] for r in runs)
    first = {r["method"]: r for r in runs if r["seed"] == seed0}

    for key, fname, ylabel, title in (
            ("curve_egr", "egr_vs_budget.png", "effective-group rate (cumulative)",
             "Effective-group rate vs budget consumed"),
            ("curve_pacing_gap", "pacing_gap.png", "cumulative spend − uniform (responses)",
             "Cumulative pacing gap vs uniform spending")):
        fig, ax = plt.subplots(figsize=(8, 5))
        for m in methods:
            r = first.get(m)
            if r and r["curve_cum_responses"]:
                ax.plot(r["curve_cum_responses"], r[key], marker=".", **style[m])
        if key == "curve_pacing_gap":
            ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("cumulative responses (budget consumed)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} (seed {seed0})")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        save(fig, key, fname)

    for key, fname, ylabel, scale in (("responses_per_eff", "responses_per_effective_group.png",
                                       "responses per effective group", 1.0),
                                      ("avg", "heldout_avg_at_k.png", f"held-out avg@{opts.eval_k} (%)", 100.0)):
        ms = [m for m in methods if m in rows and rows[m][key] is not None]
        means = [rows[m][key][0] * scale for m in ms]
        stds = [rows[m][key][1] * scale for m in ms]
        fig, ax = plt.subplots(figsize=(9, 5))
        ax.bar(np.arange(len(ms)), means, yerr=stds, capsize=3, color="tab:blue")
        ax.set_xticks(np.arange(len(ms)))
        ax.set_xticklabels([method_recipe(m)[0] for m in ms], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} by method ({rows[ms[0]]['runs'] if ms else 0} seed(s))")
        ax.grid(axis="y", alpha=0.3)
        save(fig, key, fname)

    # selection lift by predicted-success bin, mean over seeds
    fig, ax = plt.subplots(figsize=(8, 5))
    edges = np.asarray(runs[0]["selection"]["lift_edges"])
    centers = (edges[:-1] + edges[1:]) / 2
    for m in methods:
        lifts = np.array([r["selection"]["lift"] for r in runs if r["method"] == m], float)
        if lifts.size:
            ax.plot(centers, np.nanmean(lifts, axis=0), marker="o", **style[m])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xlabel="predicted success rate before the round (observer's Beta mean)",
           ylabel="chosen share / pool share", title="Selection lift by predicted-success bin")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, "selection_lift", "selection_lift.png")

    # q̂ vs observed within-group variance, pooled over seeds
    fig, ax = plt.subplots(figsize=(6, 5))
    for m in methods:
        pts = [b for r in runs if r["method"] == m for b in r["selection"]["variance"]]
        by_bin = {}  # the observer's q̂ bins, pooled over seeds and weighted by groups
        for b in pts:
            by_bin.setdefault(b["bin"], []).append(b)
        xs = [np.average([b["q_hat"] for b in bs], weights=[b["groups"] for b in bs])
              for _, bs in sorted(by_bin.items())]
        ys = [np.average([b["observed"] for b in bs], weights=[b["groups"] for b in bs])
              for _, bs in sorted(by_bin.items())]
        if xs:
            ax.plot(xs, ys, marker="o", **style[m])
    ax.plot([0, 0.25], [0, 0.25], "k--", lw=0.8, label="calibrated")
    ax.set(xlabel="q̂ before the round (eq. 6)", ylabel="observed within-group variance",
           title="q̂ vs observed group variance")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, "qhat_vs_variance", "qhat_vs_variance.png")

    pruned = [m for m in methods
              if m in PRUNING_METHODS and first.get(m) and first[m]["curve_survivor_positive_ratio"]]
    if pruned:
        fig, ax = plt.subplots(figsize=(7, 4))
        for m in pruned:
            ys = first[m]["curve_survivor_positive_ratio"]
            ax.plot(np.arange(1, len(ys) + 1), ys, marker=".", **style[m])
        ax.set(xlabel="round (after the cold start)", ylabel="positive share of survivors",
               title=f"Survivors' positive ratio (seed {seed0})")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        save(fig, "survivor_positive_ratio", "survivor_positive_ratio.png")
    return paths


def load_earlier_run(path: str) -> dict[str, Any]:
    """A finished run's bench.json, or a SystemExit naming what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f)
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or not JSON
        raise SystemExit(f"--from_json {path!r}: cannot read it as a bench.json ({exc})") from None
    missing = [k for k in ("runs", "settings", "model_dir") if k not in earlier]
    if missing or any("bin" not in v for r in earlier["runs"]
                      for v in r.get("selection", {"variance": [{}]})["variance"]):
        raise SystemExit(f"--from_json {path!r}: not a bench.json of this version of scripts/bench.py (missing "
                         f"{missing or ['per-run selection figures']}); re-run the benchmark")
    return earlier
