#!/usr/bin/env python
"""Trainer wall-clock (a benchmark, not a test): stock TRL ``GRPOTrainer`` vs ``AllocGRPOTrainer``.

One run, identical settings for every variant (embedded tiny model, arithmetic prompts, seed,
rounds, num_generations, batch):

  (a) ``stock``    TRL's ``GRPOTrainer``
  (b) ``uniform``  ``AllocGRPOTrainer(pacing="uniform", filling="full")``  -- target (b)/(a) <= 1.05
  (c) ``cero``     ``AllocGRPOTrainer(pacing="cero", filling="sara")``

Each variant is warmed up once (one short run, not recorded), then run ``--repeats`` times in an
interleaved, rotating order (a b c, b c a, c a b, ...) so slow drift of the machine does not
favour one variant. Per run: wall-clock of ``trainer.train()`` and of every optimizer step
(callback timestamps), responses generated (counted at the generation call), and for the
allocating trainers the allocator's own time (``trainer.allocator.history``: ``allocator_s`` / ``round_s``).
Reported: median s/step over all recorded steps, median total s per run, ms/response, the ratio of
median s/step to stock, and the allocator's share of the round wall-clock.

    python scripts/bench_trainer.py --rounds 20 --repeats 5 --output outputs/bench_trainer.json

``CPU s/step`` (process time) is the least sensitive to other load on the machine; ``paired ratio``
compares each run with the stock run of the same repeat.
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

from trl_alloc.benchmarks.measure import cpu_run_kwargs, parse_choices, check_batch, quiet, step_timer
from trl_alloc.trainer.trl_compat import count_generated

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VARIANTS = {
    "stock": "(a) TRL GRPOTrainer",
    "uniform": "(b) Alloc uniform+full",
    "cero": "(c) Alloc cero+sara",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rounds", type=int, default=20, help="optimizer steps (= scheduler rounds) per run")
    p.add_argument("--repeats", type=int, default=5, help="recorded runs per variant (interleaved)")
    p.add_argument("--num_generations", type=int, default=8, help="group size k")
    p.add_argument("--batch", type=int, default=64,
                   help="per_device_train_batch_size: responses per step (batch / k prompts per step)")
    p.add_argument("--max_completion_length", type=int, default=8)
    p.add_argument("--num_prompts", type=int, default=512, help="size of the arithmetic prompt pool")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads; 0 = torch's default. 1 by default: the ~0.4M-parameter model gains "
                   "nothing from more, and on a shared 2-core machine extra threads make timings swing several-fold")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--no_warmup", action="store_true", help="skip the unrecorded warm-up run of each variant")
    p.add_argument("--model_dir", default=None, help="model directory (default: the embedded tiny model)")
    p.add_argument("--output", default=None, help="write the full results as JSON here")
    args = p.parse_args(argv)
    args.variants = parse_choices(p, args.variants, VARIANTS, "variant")
    check_batch(p, args)
    for name in ("rounds", "repeats", "num_generations", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    return args


def run_once(variant, rounds, opts, model_dir, dataset, reward, out_root):
    """Build the trainer for `variant`, train for `rounds` steps; return the timings."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_alloc.trainer.config import AllocGRPOConfig
    from trl_alloc.trainer import AllocGRPOTrainer

    common = cpu_run_kwargs(tempfile.mkdtemp(prefix=f"{variant}-", dir=out_root), opts.batch, opts.num_generations,
                            opts.max_completion_length, opts.seed, learning_rate=5e-4, max_steps=rounds)
    torch.manual_seed(opts.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    t_build = time.perf_counter()
    if variant == "stock":
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**common), train_dataset=dataset,
                              processing_class=tokenizer)
    else:
        pacing, filling = ("uniform", "full") if variant == "uniform" else ("cero", "sara")
        trainer = AllocGRPOTrainer(model=model, reward_funcs=reward, train_dataset=dataset, processing_class=tokenizer,
                                   args=AllocGRPOConfig(pacing=pacing, filling=filling, **common))
    build_s = time.perf_counter() - t_build
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout (same for every variant)
    timer = step_timer()
    trainer.add_callback(timer)
    generated = count_generated(trainer)
    t0 = time.perf_counter()
    trainer.train()
    t1 = time.perf_counter()
    total_s = t1 - t0
    # after the last step: TRL/Trainer teardown, and for AllocGRPOTrainer the allocation report (JSON + plots)
    end_s = t1 - timer.last_end if timer.last_end is not None else float("nan")
    out = {"variant": variant, "build_s": build_s, "train_s": total_s, "train_end_s": end_s,
           "steps": len(timer.steps), "step_s": timer.steps, "step_cpu_s": timer.cpu,
           "responses": generated["n"]}
    history = getattr(trainer, "history", None)
    if history:
        out["allocator_s"] = sum(h["allocator_s"] for h in history)
        out["round_s"] = sum(h["round_s"] for h in history)
        out["loss_responses"] = sum(h["loss_responses"] for h in history)
        out["effective_groups"] = sum(h["effective_groups"] for h in history)
    rewards = [x["reward"] for x in trainer.state.log_history if "reward" in x]
    out["mean_reward"] = statistics.fmean(rewards) if rewards else None
    del trainer, model
    return out


def summarise(runs, variants):
    rows = {}
    for v in variants:
        rs = [r for r in runs if r["variant"] == v]
        if not rs:
            continue
        steps = [s for r in rs for s in r["step_s"]]
        row = {
            "runs": len(rs),
            "median_step_s": statistics.median(steps),
            "median_step_cpu_s": statistics.median(s for r in rs for s in r["step_cpu_s"]),
            "median_total_s": statistics.median(r["train_s"] for r in rs),
            "min_total_s": min(r["train_s"] for r in rs),
            "responses_per_run": statistics.median(r["responses"] for r in rs),
        }
        row["median_train_end_s"] = statistics.median(r["train_end_s"] for r in rs)
        # step time only (generation + scoring + allocator + loss + optimizer) per response generated
        row["ms_per_response"] = 1e3 * statistics.median(sum(r["step_s"]) / max(r["responses"], 1) for r in rs)
        if all("allocator_s" in r for r in rs):
            alloc, rnd = sum(r["allocator_s"] for r in rs), sum(r["round_s"] for r in rs)
            total = sum(r["train_s"] for r in rs)
            row["allocator_share_of_rounds"] = alloc / rnd if rnd else 0.0
            row["allocator_share_of_train"] = alloc / total if total else 0.0
            row["allocator_ms_per_round"] = 1e3 * alloc / max(sum(len(r["step_s"]) for r in rs), 1)
            row["loss_responses_per_run"] = statistics.median(r["loss_responses"] for r in rs)
        rows[v] = row
    if "stock" in rows:
        base_step, base_total = rows["stock"]["median_step_s"], rows["stock"]["median_total_s"]
        stock_by_rep = {r["repeat"]: statistics.median(r["step_s"]) for r in runs if r["variant"] == "stock"}
        for v, row in rows.items():
            row["ratio_step_vs_stock"] = row["median_step_s"] / base_step
            row["ratio_total_vs_stock"] = row["median_total_s"] / base_total
            row["ratio_cpu_vs_stock"] = row["median_step_cpu_s"] / rows["stock"]["median_step_cpu_s"]
            # paired: within each repeat (adjacent runs, similar machine load), then the median over repeats
            paired = [statistics.median(r["step_s"]) / stock_by_rep[r["repeat"]]
                      for r in runs if r["variant"] == v and r["repeat"] in stock_by_rep]
            row["paired_ratio_step_vs_stock"] = statistics.median(paired) if paired else None
    return rows


def markdown_table(rows):
    head = ("| variant | runs | median s/step | median total s | after last step s | responses/run | "
            "step ms/response | ratio s/step vs (a) | paired ratio | ratio total vs (a) | CPU s/step | "
            "ratio CPU vs (a) | allocator share |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for v, r in rows.items():
        share = r.get("allocator_share_of_rounds")
        share_txt = (f"{100 * share:.2f}% of rounds, {100 * r['allocator_share_of_train']:.2f}% of train "
                     f"({r['allocator_ms_per_round']:.1f} ms/round)"
                     if share is not None else "-")
        ratio_s = r.get("ratio_step_vs_stock")
        ratio_t = r.get("ratio_total_vs_stock")
        paired = r.get("paired_ratio_step_vs_stock")
        ratio_c = r.get("ratio_cpu_vs_stock")
        lines.append(f"| {VARIANTS[v]} | {r['runs']} | {r['median_step_s']:.3f} | {r['median_total_s']:.2f} | "
                     f"{r['median_train_end_s']:.2f} | {r['responses_per_run']:.0f} | {r['ms_per_response']:.2f} | "
                     f"{'-' if ratio_s is None else f'{ratio_s:.3f}'} | "
                     f"{'-' if paired is None else f'{paired:.3f}'} | "
                     f"{'-' if ratio_t is None else f'{ratio_t:.3f}'} | {r['median_step_cpu_s']:.3f} | "
                     f"{'-' if ratio_c is None else f'{ratio_c:.3f}'} | "
                     f"{share_txt} |")
    return "\n".join(lines)


def main(argv=None):
    opts = parse_args(argv)
    quiet()
    import torch
    import trl
    import transformers

    from trl_alloc.tasks.rewards import arithmetic_reward
    from trl_alloc.tasks.builtin import build_dataset

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars
    if opts.threads:
        torch.set_num_threads(opts.threads)
    model_dir = opts.model_dir
    if model_dir is None:
        from trl_alloc.tasks.tiny import get_tiny_model_dir

        t = time.perf_counter()
        model_dir = get_tiny_model_dir(task="arithmetic")
        print(f"[bench] tiny model: {model_dir} ({time.perf_counter() - t:.1f} s to get)", flush=True)
    need = opts.rounds * opts.batch // opts.num_generations
    dataset = build_dataset("arithmetic", n=max(opts.num_prompts, need), seed=opts.seed, split="train")
    print(f"[bench] {len(dataset)} prompts; rounds={opts.rounds} repeats={opts.repeats} "
          f"k={opts.num_generations} batch={opts.batch} max_completion_length={opts.max_completion_length} "
          f"torch threads={torch.get_num_threads()}", flush=True)

    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_trainer-") as out_root:
        if not opts.no_warmup:
            for v in opts.variants:
                t = time.perf_counter()
                run_once(v, min(2, opts.rounds), opts, model_dir, dataset, arithmetic_reward, out_root)
                print(f"[bench] warm-up {v}: {time.perf_counter() - t:.1f} s", flush=True)
        n = len(opts.variants)
        for rep in range(opts.repeats):
            order = opts.variants[rep % n:] + opts.variants[:rep % n]  # rotate: each variant leads once
            for v in order:
                r = run_once(v, opts.rounds, opts, model_dir, dataset, arithmetic_reward, out_root)
                r["repeat"] = rep
                runs.append(r)
                extra = (f", allocator {1e3 * r['allocator_s']:.1f} ms of {r['round_s']:.2f} s rounds"
                         if "allocator_s" in r else "")
                print(f"[bench] repeat {rep} {v:8s}: train {r['train_s']:.2f} s, {r['steps']} steps, "
                      f"median step {statistics.median(r['step_s']):.3f} s, {r['responses']} responses{extra}",
                      flush=True)

    rows = summarise(runs, opts.variants)
    table = markdown_table(rows)
    print()
    print(table)
    if "uniform" in rows and "stock" in rows:
        ratio = rows["uniform"]["ratio_step_vs_stock"]
        paired = rows["uniform"]["paired_ratio_step_vs_stock"]
        cpu = rows["uniform"]["ratio_cpu_vs_stock"]
        print(f"\n(b)/(a) median s/step ratio = {ratio:.3f} (paired per repeat {paired:.3f}, CPU time {cpu:.3f}); "
              f"target <= 1.05: {'met' if max(ratio, cpu) <= 1.05 else 'NOT met'}")
    if opts.output:
        os.makedirs(os.path.dirname(os.path.abspath(opts.output)), exist_ok=True)
        payload = {
            "settings": {k: v for k, v in vars(opts).items()}, "model_dir": model_dir,
            "environment": {"python": sys.version.split()[0], "torch": torch.__version__, "trl": trl.__version__,
                            "transformers": transformers.__version__, "platform": platform.platform(),
                            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()},
            "summary": rows, "runs": runs, "table": table,
        }
        with open(opts.output, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
        print(f"[bench] wrote {opts.output}")
    return rows


if __name__ == "__main__":
    main()
