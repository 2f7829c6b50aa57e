#!/usr/bin/env python
"""Method benchmark (a script that prints and saves figures, not a test): every sampling method at the
same total response budget, from the same starting checkpoint and seed.

Methods (all on the same model — the embedded tiny arithmetic model by default, or a real one with
``--model smollm2-135m-instruct --dataset builtin:arithmetic-chat`` — same prompt pool, k =
num_generations, same max_completion_length, same optimizer settings):

  stock         TRL ``GRPOTrainer`` (the peer), ``max_steps = budget // batch`` so it spends the budget
  dapo          DAPO dynamic sampling          (pacing uniform,        filling dynamic_sampling)
  knapsack      KnapsackRL                     (pacing knapsack,       filling full)
  cero          CERO                           (pacing cero,           filling full)
  random_matched  CERO's per-round sizes on random prompts (pacing random_matched, filling full;
                needs the CERO run's allocation_state.json -- CERO is run first automatically)
  cero_fixed / cero_preset / cero_greedy   CERO ablations (filling full)
  sara          SARA                           (pacing uniform,        filling sara)
  cero_sara     CERO + SARA                    (pacing cero,           filling sara)
  cero_sara_arrol  CERO + SARA + ARROL         (pruning arrol, detect_length 2, cold_start_steps 2)
  cero_sara_random CERO + SARA + random pruning (ARROL's control: same survival rate, no head)

Per method: held-out avg@k and pass@k (``trl_alloc.evaluation``, transformers backend, k samples per
prompt on held-out test prompts), effective-group rate (groups with mixed rewards / groups touched),
responses and completion tokens per effective group, wall-clock of ``train()``, and the allocator's share
of it (``trainer.engine.history``). For stock TRL the groups are counted at the reward call (consecutive
``num_generations`` completions of one prompt). Ratio columns: responses per effective group relative
to DAPO dynamic sampling, held-out avg@k / pass@k minus stock GRPOTrainer's (and the start checkpoint's).
How each run chose prompts is judged by one method-independent observer (``selection_figures``: a
Beta state per prompt fed every observed reward): selection lift by predicted-success bin, and q̂
against the observed within-group variance.

Outputs in ``--output_dir``: ``bench.md`` (the table), ``bench.json`` (everything, per seed and per
round), and PNGs: ``egr_vs_budget.png`` (cumulative), ``pacing_gap.png``,
``responses_per_effective_group.png``, ``heldout_avg_at_k.png``, ``selection_lift.png``,
``qhat_vs_variance.png``, ``survivor_positive_ratio.png`` (pruning methods).

    python scripts/bench.py --quick                       # ~10 rounds x 256 responses, 1 seed
    python scripts/bench.py                                # full mode: 3 seeds, 40 rounds, 200 x 8 held-out
    python scripts/bench.py --quick --methods stock,dapo,cero,random_matched
    python scripts/bench.py --model smollm2-135m-instruct --dataset builtin:arithmetic-chat --levels 1 2 3 \
        --methods stock,dapo,cero,cero_sara,cero_sara_arrol --batch 16 --num_generations 4 \
        --max_completion_length 128 --temperature 0.3 --learning_rate 3e-6 --seeds 1   # ARROL detects at 128 // 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from trl_alloc.reporting.benchmarking import RoundRecorder, check_batch, cpu_run_kwargs, parse_choices, quiet, selection_figures
from trl_alloc.tasks.builtin import TASKS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# name -> (label, AllocGRPOConfig stage fields or None for stock TRL)
METHODS = {
    "stock": ("TRL GRPOTrainer", None),
    "dapo": ("DAPO dynamic sampling", dict(pacing="uniform", filling="dynamic_sampling")),
    "knapsack": ("KnapsackRL", dict(pacing="knapsack", filling="full")),
    "cero": ("CERO", dict(pacing="cero", filling="full")),
    "random_matched": ("Random-matched CERO", dict(pacing="random_matched", filling="full")),
    "cero_fixed": ("CERO fixed (ablation)", dict(pacing="cero_fixed", filling="full")),
    "cero_preset": ("CERO preset (ablation)", dict(pacing="cero_preset", filling="full")),
    "cero_greedy": ("CERO greedy (ablation)", dict(pacing="cero_greedy", filling="full")),
    "sara": ("SARA", dict(pacing="uniform", filling="sara")),
    "cero_sara": ("CERO+SARA", dict(pacing="cero", filling="sara")),
    "cero_sara_arrol": ("CERO+SARA+ARROL", dict(pacing="cero", filling="sara", pruning="arrol", detect_length=2,
                                                cold_start_steps=2)),
    "cero_sara_random": ("CERO+SARA+random pruning", dict(pacing="cero", filling="sara", pruning="random",
                                                          detect_length=2, cold_start_steps=2)),
}
PRUNING_METHODS = ("cero_sara_arrol", "cero_sara_random")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="10 rounds, 1 seed, 50 eval prompts x 4 samples (unless set explicitly)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per method (mean ± std); default 3, --quick 1")
    p.add_argument("--rounds", type=int, default=None, help="scheduler rounds K; default 40 (the embedded recipe), --quick 10")
    p.add_argument("--budget", type=int, default=None,
                   help="total responses per run (default rounds × batch); stock gets budget // batch steps")
    p.add_argument("--methods", default=",".join(METHODS), help="comma list from " + ",".join(METHODS))
    p.add_argument("--output_dir", default="outputs/bench")
    p.add_argument("--model", default="tiny", help="tiny (the embedded model), a registered name "
                   "(smollm2-135m-instruct), a local folder or a Hub id")
    p.add_argument("--dataset", default="builtin:arithmetic", choices=[f"builtin:{t}" for t in TASKS],
                   help="the built-in task (train and held-out prompts are disjoint by construction)")
    p.add_argument("--levels", type=int, nargs="+", default=None, help="difficulty levels of the task (default all)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, in training and evaluation")
    p.add_argument("--detect_length", type=int, default=None,
                   help="ARROL's detection length; default 2 for the tiny model, else max_completion_length // 4")
    p.add_argument("--num_generations", type=int, default=8, help="group size k")
    p.add_argument("--batch", type=int, default=256, help="responses per round (stock: generation batch)")
    p.add_argument("--max_completion_length", type=int, default=8)
    p.add_argument("--num_prompts", type=int, default=None,
                   help="training prompt pool size; default 128 (--quick) / 256, smaller than rounds × prompts per "
                   "round so prompts recur and the allocators' per-prompt states matter (with a pool larger than "
                   "the run visits, every prompt is fresh and knapsack / cero_fixed / cero_greedy reduce to uniform)")
    p.add_argument("--learning_rate", type=float, default=1e-4, help="the embedded recipe's rate (configs/tiny_cpu.yaml); 3e-4 and above destabilise the tiny model")
    p.add_argument("--eval_prompts", type=int, default=None, help="held-out test prompts; default 200, --quick 50")
    p.add_argument("--eval_k", type=int, default=None, help="k of avg@k / pass@k (= samples per eval prompt); default 8, --quick 4")
    p.add_argument("--seed", type=int, default=0, help="first seed (seeds are seed, seed+1, ...)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (0 = torch default)")
    p.add_argument("--from_json", default=None,
                   help="re-write the table and plots of an earlier run's bench.json into --output_dir (no training)")
    args = p.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.rounds = args.rounds or (10 if args.quick else 40)
    args.eval_prompts = args.eval_prompts or (50 if args.quick else 200)
    args.eval_k = args.eval_k or (4 if args.quick else 8)
    args.num_prompts = args.num_prompts or (128 if args.quick else 256)
    args.budget = args.budget or args.rounds * args.batch
    args.methods = parse_choices(p, args.methods, METHODS, "method")
    args.detect_length = args.detect_length or (2 if args.model == "tiny" else max(1, args.max_completion_length // 4))
    if args.model == "tiny" and args.dataset != "builtin:arithmetic":
        p.error("--model tiny is the embedded model of builtin:arithmetic; give --model for another --dataset")
    check_batch(p, args)
    if args.budget % args.batch:
        p.error(f"--budget ({args.budget}) must be a multiple of --batch ({args.batch}) so stock TRL can match it")
    if args.budget % 4:
        p.error("--budget must be a multiple of CERO's unit size (4)")
    return args


def _counting_reward(reward, k, log):
    """Stock TRL: wrap the reward to count responses, completion tokens and (mixed) groups per call.

    TRL scores a generation batch in one call, the k completions of one prompt consecutive."""

    def counted(prompts, completions, completion_ids=None, **kwargs):
        out = reward(prompts, completions, completion_ids=completion_ids, **kwargs)
        n = len(out)
        groups = [out[i:i + k] for i in range(0, n, k)]
        eff = sum(1 for g in groups if max(g) != min(g))
        toks = sum(len(c) for c in completion_ids) if completion_ids is not None else 0
        log.append({"round": len(log) + 1, "responses": n, "tokens": toks, "groups": len(groups),
                    "effective_groups": eff, "allocator_s": 0.0, "round_s": float("nan")})
        return out

    counted.__name__ = getattr(reward, "__name__", "reward")
    return counted


def run_method(method, seed, opts, model_dir, dataset, reward, run_dir, cero_state=None):
    """Train `method` from `model_dir` with `seed`; return its figures (history, wall-clock, model)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_alloc.trainer.config import AllocGRPOConfig
    from trl_alloc.trainer import AllocGRPOTrainer

    stages = METHODS[method][1]
    common = cpu_run_kwargs(run_dir, opts.batch, opts.num_generations, opts.max_completion_length, seed,
                            learning_rate=opts.learning_rate, temperature=opts.temperature)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    log = []
    recorder = RoundRecorder(dataset["prompt"])
    if stages is None:
        trainer = GRPOTrainer(model=model, reward_funcs=_counting_reward(recorder.wrap(reward, per_call=True),
                                                                         opts.num_generations, log),
                              args=GRPOConfig(max_steps=opts.budget // opts.batch, **common), train_dataset=dataset,
                              processing_class=tokenizer)
    else:
        extra = dict(stages)
        if "detect_length" in extra:
            extra["detect_length"] = opts.detect_length
        if method == "random_matched":
            extra["random_matched_reference"] = cero_state
        trainer = AllocGRPOTrainer(model=model, reward_funcs=recorder.wrap(reward), train_dataset=dataset,
                                   processing_class=tokenizer,
                                   args=AllocGRPOConfig(num_rounds=opts.rounds, rollout_budget=opts.budget,
                                                        max_generation_batches=10_000, **extra, **common))
        recorder.record_rounds_of(trainer)
    trainer.remove_callback(PrinterCallback)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    state_path = None
    if stages is not None:
        log = [dict(h) for h in trainer.engine.history]
        if method == "cero":  # the reference random_matched replays
            state_path = os.path.join(run_dir, "allocation_state.json")
            with open(state_path, "w", encoding="utf-8") as f:
                json.dump(trainer.allocation_state(), f, default=_json_default)
    rewards = [x["reward"] for x in trainer.state.log_history if "reward" in x]
    survivors = [x["pruning/survivor_positive_ratio"] for x in trainer.state.log_history
                 if "pruning/survivor_positive_ratio" in x]
    # the quality head's AUC on each round's completed rollouts, measured before it trains on them
    aucs = [x["arrol/head_auc"] for x in trainer.state.log_history if "arrol/head_auc" in x]
    out = {"method": method, "seed": seed, "wall_s": wall, "history": log,
           "train_reward": statistics.fmean(rewards) if rewards else None, "state_path": state_path,
           "selection": selection_figures(recorder.rounds, len(dataset)),
           "curve_survivor_positive_ratio": survivors,
           "survivor_positive_ratio": statistics.fmean(survivors) if survivors else None,
           "curve_head_auc": aucs, "head_auc": statistics.fmean(aucs) if aucs else None}
    model = trainer.model
    del trainer
    return out, model, tokenizer


def _json_default(obj):
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(type(obj).__name__)


def evaluate_model(model, tokenizer, test_ds, reward, opts, seed):
    from trl_alloc.evaluation import TransformersBackend, answer_spec, evaluate

    backend = TransformersBackend(model, tokenizer, batch_size=256)
    task = opts.dataset.split(":", 1)[1]
    spec = answer_spec(task if task in ("arithmetic", "countdown") else "math")
    res = evaluate(backend, tokenizer, test_ds, reward, spec, ks=(opts.eval_k,),
                   num_samples=opts.eval_k, temperature=opts.temperature, max_new_tokens=opts.max_completion_length,
                   seed=seed, progress=False)
    m = res.metrics[opts.eval_k]
    return {"avg": m["avg"], "pass": m["pass"], "maj": m["maj"]}


def run_figures(run, budget, planned_rounds):
    """Per-run scalars from the per-round history."""
    import numpy as np

    h = run["history"]
    resp = sum(r["responses"] for r in h)
    toks = sum(r["tokens"] for r in h)
    groups = sum(r["groups"] for r in h)
    eff = sum(r["effective_groups"] for r in h)
    alloc = sum(r["allocator_s"] for r in h)
    cum = np.cumsum([r["responses"] for r in h]) if h else np.zeros(0)
    K = len(h)
    run.update({
        "rounds": K, "responses": resp, "tokens": toks, "groups": groups, "effective_groups": eff,
        "egr": eff / groups if groups else 0.0,
        "responses_per_eff": resp / eff if eff else float("inf"),
        "tokens_per_eff": toks / eff if eff else float("inf"),
        "seconds_per_eff": run["wall_s"] / eff if eff else float("inf"),
        "allocator_s": alloc, "allocator_share": alloc / run["wall_s"] if run["wall_s"] else 0.0,
        "curve_cum_responses": cum.tolist(),
        "curve_egr": (np.cumsum([r["effective_groups"] for r in h])
                      / np.maximum(np.cumsum([r["groups"] for r in h]), 1)).tolist(),
        # cumulative spend minus uniform spending (budget / planned rounds per round), in responses; a run
        # that stops early (budget spent) or leaves budget unspent does not end at 0
        "curve_pacing_gap": (cum - budget * np.arange(1, K + 1) / planned_rounds).tolist(),
    })
    return run


SCALARS = ("avg", "pass", "egr", "responses_per_eff", "tokens_per_eff", "wall_s", "allocator_share", "responses", "rounds",
           "effective_groups", "d_avg_vs_stock", "d_pass_vs_stock", "rpe_ratio_vs_dapo", "d_avg_vs_start",
           "survivor_positive_ratio", "head_auc", "seconds_per_eff")


def summarise(runs, methods):
    import math

    by_seed = {}
    for r in runs:
        by_seed.setdefault(r["seed"], {})[r["method"]] = r
    for seed, rs in by_seed.items():  # paired per seed: same start, same seed
        stock, dapo = rs.get("stock"), rs.get("dapo")
        for r in rs.values():
            r["d_avg_vs_stock"] = r["avg"] - stock["avg"] if stock else None
            r["d_pass_vs_stock"] = r["pass"] - stock["pass"] if stock else None
            r["rpe_ratio_vs_dapo"] = (r["responses_per_eff"] / dapo["responses_per_eff"]
                                      if dapo and math.isfinite(dapo["responses_per_eff"]) else None)
    rows = {}
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        if not rs:
            continue
        row = {"runs": len(rs)}
        for key in SCALARS:
            vals = [r[key] for r in rs if r.get(key) is not None and math.isfinite(r[key])]
            row[key] = (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0) if vals else None
        rows[m] = row
    return rows


def _fmt(v, spec, scale=1.0, sign=False):
    if v is None:
        return "-"
    mean, std = v
    s = f"{mean * scale:{'+' if sign else ''}{spec}}"
    return s + (f" ± {std * scale:{spec}}" if std else "")


def markdown_table(rows, opts, start=None):
    k = opts.eval_k
    head = (f"| method | seeds | avg@{k} % | pass@{k} % | Δavg@{k} vs start (pp) | Δavg@{k} vs stock (pp) | "
            f"Δpass@{k} vs stock (pp) | "
            "eff. group rate % | responses / eff. group | ratio to DAPO | tokens / eff. group | responses | optimizer steps | "
            "wall s | s / eff. group | allocator share % |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for m, r in rows.items():
        lines.append(
            f"| {METHODS[m][0]} | {r['runs']} | {_fmt(r['avg'], '.1f', 100)} | {_fmt(r['pass'], '.1f', 100)} | "
            f"{_fmt(r['d_avg_vs_start'], '.1f', 100, True)} | {_fmt(r['d_avg_vs_stock'], '.1f', 100, True)} | "
            f"{_fmt(r['d_pass_vs_stock'], '.1f', 100, True)} | "
            f"{_fmt(r['egr'], '.1f', 100)} | {_fmt(r['responses_per_eff'], '.1f')} | "
            f"{_fmt(r['rpe_ratio_vs_dapo'], '.2f')} | {_fmt(r['tokens_per_eff'], '.1f')} | "
            f"{_fmt(r['responses'], '.0f')} | {_fmt(r['rounds'], '.1f')} | {_fmt(r['wall_s'], '.1f')} | {_fmt(r['seconds_per_eff'], '.1f')} | "
            f"{_fmt(r['allocator_share'], '.2f', 100)} |")
    note = (f"\nBudget {opts.budget} responses ({opts.rounds} rounds × {opts.batch}; stock: {opts.budget // opts.batch} "
            f"steps), k={opts.num_generations}, max_completion_length={opts.max_completion_length}, "
            f"prompt pool {opts.num_prompts}, held-out: {opts.eval_prompts} test prompts × {opts.eval_k} samples (T={opts.temperature:g}). "
            "Eff. group = a group with mixed rewards; rate = effective / groups touched. Ratio to DAPO = responses "
            "per effective group ÷ DAPO dynamic sampling's (paired per seed). Δ = method − stock GRPOTrainer, or "
            "− the untrained start checkpoint (paired per seed), percentage points. s / eff. group = train() "
            "wall-clock ÷ effective groups. Allocator share = allocator "
            "seconds ÷ train() wall-clock.")
    survivors = [f"{METHODS[m][0]} {_fmt(rows[m]['survivor_positive_ratio'], '.3f')}" for m in PRUNING_METHODS
                 if m in rows and rows[m]["survivor_positive_ratio"] is not None]
    if survivors:
        note += " Survivors' positive ratio (mean over rounds after the cold start): " + ", ".join(survivors) + "."
    aucs = [f"{METHODS[m][0]} {_fmt(rows[m]['head_auc'], '.3f')}" for m in PRUNING_METHODS
            if m in rows and rows[m].get("head_auc") is not None]
    if aucs:
        note += (" Quality head AUC (mean over rounds, on each round's completed rollouts before the head trains on "
                 "them): " + ", ".join(aucs) + ".")
    if start:
        note += f" Start checkpoint: avg@{k} {_fmt(start['avg'], '.1f', 100)} %, pass@{k} {_fmt(start['pass'], '.1f', 100)} %."
    return "\n".join(lines) + "\n" + note


def plots(runs, rows, methods, out_dir, opts):
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
    style = {m: dict(label=METHODS[m][0], color=plt.get_cmap("tab10")(i % 10), ls="-" if i < 10 else "--")
             for i, m in enumerate(METHODS)}
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
        ax.set_xticklabels([METHODS[m][0] for m in ms], rotation=35, ha="right", fontsize=8)
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
        xs = [np.average([b["q_hat"] for b in bs], weights=[b["groups"] for b in bs]) for _, bs in sorted(by_bin.items())]
        ys = [np.average([b["observed"] for b in bs], weights=[b["groups"] for b in bs]) for _, bs in sorted(by_bin.items())]
        if xs:
            ax.plot(xs, ys, marker="o", **style[m])
    ax.plot([0, 0.25], [0, 0.25], "k--", lw=0.8, label="calibrated")
    ax.set(xlabel="q̂ before the round (eq. 6)", ylabel="observed within-group variance",
           title="q̂ vs observed group variance")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, "qhat_vs_variance", "qhat_vs_variance.png")

    pruned = [m for m in methods if m in PRUNING_METHODS and first.get(m) and first[m]["curve_survivor_positive_ratio"]]
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


def load_earlier_run(path):
    """A finished run's bench.json, or a SystemExit naming what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f)
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or not JSON
        raise SystemExit(f"--from_json {path!r}: cannot read it as a bench.json ({exc})") from None
    missing = [k for k in ("runs", "settings", "model_dir") if k not in earlier]
    if missing or any("bin" not in v for r in earlier["runs"] for v in r.get("selection", {"variance": [{}]})["variance"]):
        raise SystemExit(f"--from_json {path!r}: not a bench.json of this version of scripts/bench.py (missing "
                         f"{missing or ['per-run selection figures']}); re-run the benchmark")
    return earlier


def main(argv=None):
    opts = parse_args(argv)
    quiet()
    import torch
    import transformers
    import trl

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.tasks.data import reward_for_dataset
    from trl_alloc.tasks.builtin import build_dataset
    from trl_alloc.tasks.tiny import get_tiny_model_dir

    if opts.threads:
        torch.set_num_threads(opts.threads)
    t_all = time.perf_counter()
    if opts.from_json:
        model_dir = load_earlier_run(opts.from_json)["model_dir"]
    elif opts.model == "tiny":
        model_dir = get_tiny_model_dir(task="arithmetic")
    else:
        from trl_alloc.tasks.models import resolve_model
        model_dir = resolve_model(opts.model)
    reward = reward_for_dataset(opts.dataset)
    task = opts.dataset.split(":", 1)[1]
    levels = tuple(opts.levels) if opts.levels else None
    methods = list(opts.methods)
    if "random_matched" in methods and "cero" not in methods:
        methods.insert(methods.index("random_matched"), "cero")  # random_matched replays CERO's sizes
        print("[bench] adding 'cero': random_matched needs its allocation_state.json", flush=True)
    order = [m for m in methods if m != "random_matched"] + (["random_matched"] if "random_matched" in methods else [])
    os.makedirs(opts.output_dir, exist_ok=True)
    print(f"[bench] model {model_dir}; methods {order}; seeds {opts.seeds}; rounds {opts.rounds}; budget "
          f"{opts.budget} responses; torch threads {torch.get_num_threads()}", flush=True)

    runs, starts = [], []
    if opts.from_json:
        earlier = load_earlier_run(opts.from_json)
        runs, starts = earlier["runs"], earlier.get("start_runs", [])
        for key in ("seeds", "rounds", "budget", "batch", "num_generations", "max_completion_length", "num_prompts",
                    "eval_prompts", "eval_k", "quick"):
            setattr(opts, key, earlier["settings"][key])
        methods = [m for m in METHODS if any(r["method"] == m for r in runs)]
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for s in range(0 if opts.from_json else opts.seeds):
            seed = opts.seed + s
            dataset = build_dataset(task, n=opts.num_prompts, seed=seed, split="train", levels=levels)
            test_ds = build_dataset(task, n=opts.eval_prompts, seed=10_000 + seed, split="test", levels=levels)
            cero_state = None
            start = evaluate_model(AutoModelForCausalLM.from_pretrained(model_dir),
                                   AutoTokenizer.from_pretrained(model_dir), test_ds, reward, opts, seed)
            starts.append(start)
            print(f"[bench] seed {seed} start checkpoint: avg@{opts.eval_k} {start['avg']:.3f}, "
                  f"pass@{opts.eval_k} {start['pass']:.3f}", flush=True)
            for m in order:
                run_dir = os.path.join(tmp, f"{m}-s{seed}")
                t = time.perf_counter()
                try:
                    run, model, tok = run_method(m, seed, opts, model_dir, dataset, reward, run_dir, cero_state)
                except Exception as exc:  # noqa: BLE001 -- one failing method should not lose the others
                    print(f"[bench] seed {seed} {m}: FAILED {type(exc).__name__}: {exc}", flush=True)
                    continue
                if m == "cero":
                    cero_state = run["state_path"]
                run.update(evaluate_model(model, tok, test_ds, reward, opts, seed))
                run["d_avg_vs_start"] = run["avg"] - start["avg"]
                run_figures(run, opts.budget, opts.rounds)
                run.pop("state_path", None)
                runs.append(run)
                with open(os.path.join(opts.output_dir, "bench.partial.json"), "w", encoding="utf-8") as f:
                    json.dump({"settings": vars(opts), "start_runs": starts, "runs": runs}, f, default=_json_default)
                print(f"[bench] seed {seed} {m:16s}: {run['responses']} resp, egr {run['egr']:.3f}, "
                      f"resp/eff {run['responses_per_eff']:.1f}, avg@{opts.eval_k} {run['avg']:.3f}, "
                      f"pass@{opts.eval_k} {run['pass']:.3f}, train {run['wall_s']:.1f} s "
                      f"(+eval {time.perf_counter() - t - run['wall_s']:.1f} s)", flush=True)
                del model

    present = [m for m in methods if any(r["method"] == m for r in runs)]
    rows = summarise(runs, present)
    start = {key: (statistics.fmean(x[key] for x in starts), statistics.stdev(x[key] for x in starts)
                   if len(starts) > 1 else 0.0) for key in ("avg", "pass")} if starts else None
    table = markdown_table(rows, opts, start)
    print()
    print(table)
    paths = plots(runs, rows, present, opts.output_dir, opts) if runs else {}
    total = earlier["total_wall_s"] if opts.from_json else time.perf_counter() - t_all
    with open(os.path.join(opts.output_dir, "bench.md"), "w", encoding="utf-8") as f:
        f.write(f"# Method benchmark ({'quick' if opts.quick else 'full'})\n\n{table}\n\nTotal wall time "
                f"{total:.0f} s.\n")
    payload = {
        "settings": vars(opts), "model_dir": model_dir, "total_wall_s": total,
        "environment": {"python": sys.version.split()[0], "torch": torch.__version__, "trl": trl.__version__,
                        "transformers": transformers.__version__, "platform": platform.platform(),
                        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "summary": rows, "start_checkpoint": start, "start_runs": starts, "runs": runs, "table": table, "plots": paths,
    }
    with open(os.path.join(opts.output_dir, "bench.json"), "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, default=_json_default)
    print(f"\n[bench] total wall time {total:.0f} s; wrote {opts.output_dir}/bench.md, bench.json, "
          + ", ".join(os.path.basename(p) for p in paths.values()), flush=True)
    return rows


if __name__ == "__main__":
    main()
