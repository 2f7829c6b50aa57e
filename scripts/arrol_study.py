#!/usr/bin/env python
"""What ARROL's quality head can learn on a real model (a study, not a test; docs/arrol.md, "What the head can
learn").

1. A probe pass: the base model samples `--k` rollouts of each of `--num_prompts` prompts through vLLM (in this
   process), scored by the dataset's reward (any dataset `scripts/train.py` takes). Saved as `probe.json`;
   `--probe_file` reuses one.
2. Features of every rollout still running at each detection point (`trl_alloc.benchmarks.arrol_study`).
3. Heads trained offline, held-out AUC by prompt-split k-fold: by detection point, feature (layer, last token or
   mean-pooled), head size and weight decay; head-free signals beside them (log-probability and entropy so far,
   agreement with the group).
4. `results.json`, `table.md` and `auc.png` in `--output_dir`; `--save_head` also writes the trainer's head (last
   layer, last token, at `--head_point`) trained on every rollout, for `--quality_head_init`.

    python scripts/arrol_study.py --output_dir outputs/arrol_study
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="a registered model, local folder or Hub id")
    p.add_argument("--dataset", default="builtin:arithmetic-chat", help="any dataset_name train.py takes")
    p.add_argument("--levels", type=int, nargs="*", default=[1, 2, 3], help="built-in difficulty levels")
    p.add_argument("--num_prompts", type=int, default=300)
    p.add_argument("--k", type=int, default=8, help="rollouts per prompt")
    p.add_argument("--max_tokens", type=int, default=96, help="the completion cap")
    p.add_argument("--temperature", type=float, default=0.3)
    p.add_argument("--points", type=int, nargs="+", default=[4, 8, 16, 24, 48], help="detection points (tokens)")
    p.add_argument("--layers", type=int, nargs="*", default=None,
                   help="hidden_states indices (default: a third, two thirds and the last)")
    p.add_argument("--head_sizes", type=int, nargs="+", default=[0, 64, 256], help="0 = linear probe")
    p.add_argument("--weight_decays", type=float, nargs="+", default=[0.0, 0.1])
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu_memory_utilization", type=float, default=0.3, help="vLLM: on CPU, the share of RAM")
    p.add_argument("--probe_file", default=None, help="reuse this probe.json instead of sampling")
    p.add_argument("--head_point", type=int, default=None, help="--save_head's detection point (default: the "
                   "point up to half the cap where the trainer's feature ranks best within groups)")
    p.add_argument("--save_head", action="store_true", help="write output_dir/quality_head (QualityHead folder)")
    p.add_argument("--output_dir", default="outputs/arrol_study")
    return p.parse_args(argv)


def prompt_pool(args):
    """The training prompts the probe pass samples: the first `num_prompts` of the dataset's train split."""
    from trl_alloc.tasks.data import load_prompt_dataset

    ds = load_prompt_dataset(args.dataset, "train", num_builtin=args.num_prompts, seed=args.seed,
                             levels=args.levels or None)
    return ds.select(range(min(len(ds), args.num_prompts)))


def probe_pass(args, ds, model_dir, tokenizer):
    """k rollouts per prompt from a vLLM engine in this process, with their rewards."""
    from vllm import LLM

    from trl_alloc.allocation import SUCCESS_THRESHOLD
    from trl_alloc.evaluation import VLLMEngineBackend, generate_samples, score_samples
    from trl_alloc.tasks.data import reward_for_dataset

    llm = LLM(model=model_dir, dtype="float32", gpu_memory_utilization=args.gpu_memory_utilization,
              enforce_eager=True, enable_chunked_prefill=False, seed=args.seed)
    t0 = time.perf_counter()
    samples = generate_samples(VLLMEngineBackend(llm), tokenizer, list(ds["prompt"]), args.k, args.max_tokens,
                               args.temperature, seed=args.seed)
    seconds = time.perf_counter() - t0
    rewards = score_samples(reward_for_dataset(args.dataset), ds, samples)
    del llm
    gc.collect()
    return {"model": args.model, "dataset": args.dataset, "levels": args.levels, "k": args.k,
            "max_tokens": args.max_tokens, "temperature": args.temperature, "seconds": seconds,
            "prompt_ids": samples.prompt_ids, "completion_ids": samples.completion_ids,
            "rewards": rewards.tolist(), "success_threshold": SUCCESS_THRESHOLD}


def main(argv=None):
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.benchmarks import arrol_study as study
    from trl_alloc.evaluation.backends import _eos_ids
    from trl_alloc.rollout.quality_head import QualityHead
    from trl_alloc.tasks.models import resolve_model

    os.makedirs(args.output_dir, exist_ok=True)
    model_dir = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ds = prompt_pool(args)
    if args.probe_file:
        with open(args.probe_file) as f:
            probe = json.load(f)
    else:
        probe = probe_pass(args, ds, model_dir, tokenizer)
        with open(os.path.join(args.output_dir, "probe.json"), "w") as f:
            json.dump(probe, f)
    k = probe["k"]
    wins = (np.asarray(probe["rewards"]) >= probe["success_threshold"]).sum(1)
    with open(os.path.join(args.output_dir, "probe_counts.json"), "w") as f:  # for train.py --probe_counts
        json.dump({"prompts": list(ds["prompt"])[:len(wins)], "successes": wins.tolist(),
                   "failures": (k - wins).tolist()}, f)
    prompt_ids = [p for p in probe["prompt_ids"] for _ in range(k)]
    completion_ids = [c for cs in probe["completion_ids"] for c in cs]
    labels = (np.asarray(probe["rewards"]).reshape(-1) >= probe["success_threshold"]).astype(np.int64)
    groups = np.repeat(np.arange(len(probe["prompt_ids"])), k)
    cap = probe["max_tokens"]
    mixed = np.mean([0 < labels[groups == g].sum() < k for g in np.unique(groups)])
    print(f"probe pass: {len(labels)} rollouts of {len(probe['prompt_ids'])} prompts, reward rate "
          f"{labels.mean():.3f}, mixed groups {mixed:.3f}, {probe['seconds']:.0f} s", flush=True)

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    n_layers = model.config.num_hidden_layers
    layers = args.layers or sorted({n_layers // 3, 2 * n_layers // 3, n_layers})
    t0 = time.perf_counter()
    feats = study.probe_features(model, prompt_ids, completion_ids, groups, args.points, layers,
                                 _eos_ids(model, tokenizer))
    feature_s = time.perf_counter() - t0
    folds = study.prompt_folds(groups, args.folds, args.seed)
    results = {"args": vars(args), "probe": {k_: probe[k_] for k_ in ("model", "dataset", "levels", "k", "max_tokens",
                                                                      "temperature", "seconds")},
               "rollouts": int(len(labels)), "reward_rate": float(labels.mean()), "feature_s": feature_s,
               "layers": layers, "num_layers": n_layers, "rows": []}
    default_size, default_wd = 256, 0.1

    def add(d, kind, **row):
        rows = feats.rows[d]
        results["rows"].append({"point": d, "fraction_of_cap": d / cap, "kind": kind, "eligible": int(len(rows)),
                                **row})
        print(json.dumps(results["rows"][-1]), flush=True)

    for d in feats.points:
        rows = feats.rows[d]
        y, g, f = labels[rows], groups[rows], folds[rows]
        for layer in layers:
            for pool in ("last", "mean"):
                s = study.cross_validated_scores(feats.hidden[(d, layer, pool)], y, f, default_size, default_wd,
                                                 args.seed)
                add(d, "head", layer=layer, pooling=pool, head_hidden_size=default_size, weight_decay=default_wd,
                    **study.auc_row(s, y, g))
        for size in args.head_sizes:
            for wd in args.weight_decays:
                if (size, wd) == (default_size, default_wd):
                    continue
                s = study.cross_validated_scores(feats.hidden[(d, n_layers, "last")], y, f, size, wd, args.seed)
                add(d, "head", layer=n_layers, pooling="last", head_hidden_size=size, weight_decay=wd,
                    **study.auc_row(s, y, g))
        for name, values in feats.signals[d].items():
            add(d, "signal", signal=name, **study.auc_row(study.cross_validated_signal(values, y, f), y, g))
        # the trainer's online head replayed over held-out prompts (fold 0, in prompt order, 48 rollouts a round),
        # from a fresh head and from one pretrained on the other folds' prompts (quality_head_init)
        x, test = feats.hidden[(d, n_layers, "last")], f == 0
        order = np.flatnonzero(test)
        pretrained = study.fit_head(x[~test], y[~test], default_size, default_wd, args.seed)
        for start, init in (("fresh", None), ("pretrained", pretrained)):
            s = study.online_replay(x, y, order, per_round=48, init=init, seed=args.seed)
            half = len(order) // 2
            add(d, "online", start=start, **study.auc_row(s, y[order], g[order]),
                first_half=study.auc_row(s[:half], y[order][:half], g[order][:half])["auc"],
                second_half=study.auc_row(s[half:], y[order][half:], g[order][half:])["auc"])

    rates = (wins + 1) / (k + 2)  # each prompt's posterior-mean success rate under the base model
    settings = [(r, min(b, r * len(rates) * g // 2), g) for r, b, g in ((12, 192, 4), (40, 2560, 8))]
    results["cero_seeding"] = [study.cero_seeding_effect(rates, probe_k=4, rounds=r, budget=b, group_size=g)
                               for r, b, g in settings]  # the recipe's run, and a longer one with a binding budget
    for row in results["cero_seeding"]:
        print(json.dumps(row), flush=True)
    results["pruning_at_auc"] = [study.pruning_at_auc(auc, rate) for rate in (0.1, 0.25, 0.5)
                                 for auc in (0.5, 0.6, 0.7, 0.8, 0.9)]  # what a head of that AUC would buy
    with open(os.path.join(args.output_dir, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    write_table(results, os.path.join(args.output_dir, "table.md"))
    plot(results, os.path.join(args.output_dir, "auc.png"))
    if args.save_head:
        trainer_rows = [r for r in results["rows"] if r["kind"] == "head" and r["layer"] == n_layers
                        and r["pooling"] == "last" and r["head_hidden_size"] == default_size
                        and r["weight_decay"] == default_wd and r["point"] <= cap / 2]
        d = args.head_point or max(trainer_rows, key=lambda r: r["auc_within_group"])["point"]
        rows = feats.rows[d]
        fitted = study.fit_head(feats.hidden[(d, n_layers, "last")], labels[rows], default_size, default_wd, args.seed)
        head = QualityHead(fitted.hidden_size, default_size, detect_length=d, base_model=args.model)
        head.load_state_dict(fitted.state_dict())
        head.save_pretrained(os.path.join(args.output_dir, "quality_head"))
        print(f"saved the trainer's head (detect_length {d}) to {args.output_dir}/quality_head", flush=True)
    print(open(os.path.join(args.output_dir, "table.md")).read())
    return 0


def _name(r):
    if r["kind"] == "online":
        return f"online head as trained in the trainer, {r['start']}"
    if r["kind"] == "signal":
        return f"signal: {r['signal']}"
    size = "linear" if r["head_hidden_size"] == 0 else f"MLP {r['head_hidden_size']}"
    return f"layer {r['layer']} {r['pooling']}, {size}, wd {r['weight_decay']:g}"


def write_table(results, path):
    names = list(dict.fromkeys(_name(r) for r in results["rows"]))
    points = sorted({r["point"] for r in results["rows"]})
    cell = {(_name(r), r["point"]): r for r in results["rows"]}
    lines = ["| feature / signal | " + " | ".join(f"d={d}" for d in points) + " |",
             "|---|" + "---|" * len(points)]
    for name in names:
        vals = [cell.get((name, d)) for d in points]
        lines.append(f"| {name} | " + " | ".join("" if v is None else f"{v['auc']:.2f} / {v['auc_within_group']:.2f}"
                                                 for v in vals) + " |")
    elig = {r["point"]: (r["eligible"], r["positives"]) for r in results["rows"] if r["kind"] == "head"}
    lines.append("| eligible rollouts (positive) | " + " | ".join(f"{elig[d][0]} ({elig[d][1]})" for d in points)
                 + " |")
    with open(path, "w") as f:
        f.write("AUC pooled / within-group, held out by prompt\n\n" + "\n".join(lines) + "\n")


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key, title in ((axes[0], "auc", "pooled"), (axes[1], "auc_within_group", "within a prompt's group")):
        by = {}
        for r in results["rows"]:
            if r["kind"] != "head" or r["head_hidden_size"] == 256:
                by.setdefault(_name(r), []).append((r["point"], r[key]))
        for name, pts in by.items():
            pts.sort()
            ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", label=name,
                    linestyle="--" if name.startswith("signal") else ":" if name.startswith("online") else "-")
        ax.axhline(0.5, color="grey", lw=0.8)
        ax.axhline(0.7, color="grey", lw=0.8, ls=":")
        ax.set_title(f"held-out AUC, {title}")
        ax.set_xlabel("detection point (tokens)")
    axes[0].set_ylabel("AUC")
    axes[1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
