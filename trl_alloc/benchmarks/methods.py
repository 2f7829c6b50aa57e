"""The method benchmark's runs (`trl-alloc-bench`, scripts/bench.py): each method trained from the same
start checkpoint at the same response budget, evaluated on held-out prompts, and its allocation figures."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..allocation.allocator import json_default
from ..allocation.registry import method_class
from .measure import RoundRecorder, cpu_run_kwargs, selection_figures

if TYPE_CHECKING:
    import argparse

    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# name -> (label, AllocGRPOConfig stage fields or None for stock TRL); any other 'pacing+filling' also runs
# (`method_recipe`)
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
                                                cold_start_rounds=2, pruning_min_auc=0.0)),
    "cero_sara_random": ("CERO+SARA+random pruning", dict(pacing="cero", filling="sara", pruning="random",
                                                          detect_length=2, cold_start_rounds=2)),
}
PRUNING_METHODS = ("cero_sara_arrol", "cero_sara_random")



def method_recipe(name: str) -> tuple[str, dict[str, Any] | None]:
    """(label, stage fields or None for stock TRL) of bench method `name`: a recipe of `METHODS`, or any registered
    stages written 'pacing+filling' (e.g. 'greso+dynamic_sampling'; 'cero' alone: full groups)."""
    if name in METHODS:
        return METHODS[name]
    pacing, _, filling = name.partition("+")
    stages = dict(pacing=pacing, filling=filling or "full")
    for stage, value in stages.items():
        method_class(stage, value)  # an unknown name lists the registered ones
    return name, stages


def parse_methods(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The bench methods of a `--methods` comma list, each checked (`method_recipe`): an unknown one is the
    parser's error."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    for m in methods:
        try:
            method_recipe(m)
        except ValueError as err:
            parser.error(f"--methods {m!r}: {err}")
    return methods


def replayed_method(name: str) -> str | None:
    """The bench method whose allocation state `name` replays (`RandomMatched.replays`), or None."""
    stages = method_recipe(name)[1]
    return None if stages is None else getattr(method_class("pacing", stages["pacing"]), "replays", None)


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


def run_method(method: str, seed: int, opts: argparse.Namespace, model_dir: str, dataset: Dataset,
               reward: Callable[..., list[float]], run_dir: str, cero_state: str | None = None
               ) -> tuple[dict[str, Any], PreTrainedModel, PreTrainedTokenizerBase]:
    """Train `method` from `model_dir` with `seed`; return its figures (history, wall-clock, model)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from ..trainer import AllocGRPOConfig, AllocGRPOTrainer

    stages = method_recipe(method)[1]
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
        if replayed_method(method):
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
        log = [dict(h) for h in trainer.allocator.history]
        if method in {replayed_method(m) for m in opts.methods}:  # the reference random_matched replays
            state_path = os.path.join(run_dir, "allocation_state.json")
            with open(state_path, "w", encoding="utf-8") as f:
                json.dump(trainer.allocation_state(), f, default=json_default)
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


def evaluate_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, test_ds: Dataset,
                   reward: Callable[..., list[float]], opts: argparse.Namespace, seed: int) -> dict[str, float]:
    from ..evaluation import TransformersBackend, answer_spec, evaluate

    backend = TransformersBackend(model, tokenizer, batch_size=256)
    task = opts.dataset.split(":", 1)[1]
    spec = answer_spec(task if task in ("arithmetic", "countdown") else "math")
    res = evaluate(backend, tokenizer, test_ds, reward, spec, ks=(opts.eval_k,),
                   num_samples=opts.eval_k, temperature=opts.temperature, max_new_tokens=opts.max_completion_length,
                   seed=seed, progress=False)
    m = res.metrics[opts.eval_k]
    return {"avg": m["avg"], "pass": m["pass"], "maj": m["maj"]}


def run_figures(run: dict[str, Any], budget: int, planned_rounds: int) -> dict[str, Any]:
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


SCALARS = ("avg", "pass", "egr", "responses_per_eff", "tokens_per_eff", "wall_s", "allocator_share", "responses",
           "rounds", "effective_groups", "d_avg_vs_stock", "d_pass_vs_stock", "rpe_ratio_vs_dapo", "d_avg_vs_start",
           "survivor_positive_ratio", "head_auc", "seconds_per_eff")


def summarise(runs: list[dict[str, Any]], methods: Iterable[str]) -> dict[str, dict[str, Any]]:
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
