#!/usr/bin/env python
"""ARROL pruning benchmark (a benchmark, not a test): ``pruning`` none vs random vs arrol at the same budget.

One vLLM server (CPU, started by this script) serves every run. Identical settings for every variant:
embedded tiny model and arithmetic prompts, seed, rounds, num_generations, batch, the paper's
``pacing="uniform", filling="full"``; ``random`` and ``arrol`` prune at ``detect_length`` with keep ratio
κ (``--keep_ratio``) after ``--cold_start_rounds`` rounds without pruning.

Every run pushes its weights into the server, so before each run the base weights are pushed back through
the client's weight push (``AllocVLLMClient.update_weights``) and the server's checksum is checked against
the base model's. Pushing costs well under a second; restarting the server would cost its start-up time
(reported as ``server_start_s``), so the push is what this script uses.

Reported per variant (whole run, and after the cold start where pruning is active):

* tokens generated per effective group: completion tokens generated (pruned rollouts count their
  ``detect_length`` tokens) / groups with mixed rewards among the surviving rollouts;
* the trainer's own estimate of tokens not generated thanks to pruning (``pruning/tokens_saved``);
* median wall-clock per optimizer step, and median generation time per step (the server calls, timed
  at ``_generate_single_turn`` for every variant; ``pruning/generation_s`` where logged);
* for arrol: the quality head's accuracy / AUC on each round's completed rollouts (``arrol/head_*``),
  measured before the head trains on them.

    python scripts/bench_arrol.py --rounds 150 --output outputs/bench_arrol.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time

from trl_alloc.benchmarks.measure import cpu_run_kwargs, quiet, step_timer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VARIANTS = ("none", "random", "arrol")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rounds", type=int, default=150, help="optimizer steps (= scheduler rounds) per variant")
    p.add_argument("--num_generations", type=int, default=8, help="group size k")
    p.add_argument("--batch", type=int, default=64, help="responses per round (batch / k groups per round)")
    p.add_argument("--detect_length", type=int, default=2, help="tokens generated before scoring / pruning")
    p.add_argument("--max_completion_length", type=int, default=8)
    p.add_argument("--keep_ratio", type=float, default=0.5, help="κ")
    p.add_argument("--learning_rate", type=float, default=1e-4,
                   help="policy learning rate (the embedded recipe's; 3e-4 and above destabilise the tiny model)")
    p.add_argument("--cold_start_rounds", type=int, default=2)
    p.add_argument("--pruning_min_auc", type=float, default=0.0,
                   help="the trainer's gate (docs/arrol.md, 'The gate'); 0 = the paper's ARROL, ungated")
    p.add_argument("--levels", default=None,
                   help="comma-separated arithmetic difficulty levels 1..5 (default: all); '5' gives the longest "
                   "answers (3-4 digit sums/products), i.e. the most tokens after detect_length")
    p.add_argument("--num_prompts", type=int, default=512, help="size of the arithmetic prompt pool")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads in the trainer (0 = default)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--server_timeout", type=float, default=600.0, help="seconds to wait for the server to start")
    p.add_argument("--output", default="outputs/bench_arrol.json", help="JSON results ('' to skip)")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [v for v in args.variants if v not in VARIANTS]:
        p.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    args.levels = tuple(int(x) for x in args.levels.split(",")) if args.levels else None
    if args.batch % args.num_generations:
        p.error(f"--batch ({args.batch}) must be a multiple of --num_generations ({args.num_generations})")
    if not 1 <= args.detect_length < args.max_completion_length:
        p.error("need 1 <= --detect_length < --max_completion_length")
    return args


def _time_generation(trainer, box):
    """Wall-clock of every generation call (the server round trips), appended to the current round's slot."""
    inner = trainer._generate_single_turn

    def generate(prompt_ids, *args, **kwargs):
        t = time.perf_counter()
        out = inner(prompt_ids, *args, **kwargs)
        box["cur"] += time.perf_counter() - t
        box["calls"] += 1
        box["lengths"].extend(len(c) for c in out[0])
        return out

    trainer._generate_single_turn = generate


def reset_server_weights(client, base_model):
    """Push the base weights into the server; check the server now holds exactly them."""
    from trl_alloc.serving import pushed_checksum

    t = time.perf_counter()
    client.update_weights(base_model)
    push_s = time.perf_counter() - t
    want, got = pushed_checksum(base_model), client.weights_checksum()["last_push_checksum"]
    if want != got:
        raise RuntimeError(f"server weights checksum {got} != base model's {want} after the reset push")
    return push_s


def run_variant(variant, opts, model_dir, server_url, dataset, reward, out_root):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from trl_alloc.trainer.config import AllocGRPOConfig
    from trl_alloc.trainer import AllocGRPOTrainer

    args = AllocGRPOConfig(
        **cpu_run_kwargs(tempfile.mkdtemp(prefix=f"{variant}-", dir=out_root), opts.batch, opts.num_generations,
                         opts.max_completion_length, opts.seed, learning_rate=opts.learning_rate),
        num_rounds=opts.rounds, max_steps=opts.rounds,
        pacing="uniform", filling="full", pruning=variant, detect_length=opts.detect_length,
        keep_ratio=opts.keep_ratio, cold_start_rounds=opts.cold_start_rounds, head_hidden_size=64,
        head_learning_rate=1e-2, pruning_min_auc=opts.pruning_min_auc,
        use_vllm=True, vllm_mode="server", vllm_server_base_url=server_url, vllm_server_timeout=120,
    )
    torch.manual_seed(opts.seed)
    trainer = AllocGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=reward,
                               args=args, train_dataset=dataset,
                               processing_class=AutoTokenizer.from_pretrained(model_dir))
    trainer.remove_callback(PrinterCallback)
    timer = step_timer()
    trainer.add_callback(timer)
    gen = {"cur": 0.0, "calls": 0, "lengths": [], "per_step": []}
    _time_generation(trainer, gen)

    from transformers import TrainerCallback

    class GenSlot(TrainerCallback):  # close each step's generation-time slot
        def on_step_end(self, args, state, control, **kwargs):
            gen["per_step"].append(gen["cur"])
            gen["cur"] = 0.0

    trainer.add_callback(GenSlot())
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0

    hist = trainer.allocator.history
    logs = [h for h in trainer.state.log_history if "alloc/round" in h]
    cold = opts.cold_start_rounds if variant != "none" else 0

    def per_round(key):
        return [h.get(key) for h in logs]

    def ratio(rs):
        tok, eff = sum(h["tokens"] for h in rs), sum(h["effective_groups"] for h in rs)
        return tok / eff if eff else math.inf, tok, eff

    tpe_all, tok_all, eff_all = ratio(hist)
    # same rounds for every variant ("after cold start" = rounds cold+1..R, where pruning is active)
    tpe_post, tok_post, eff_post = ratio(hist[opts.cold_start_rounds:])
    saved = [x for x in per_round("pruning/tokens_saved") if x is not None]
    acc = [x for x in per_round("arrol/head_accuracy") if x is not None]
    auc = [x for x in per_round("arrol/head_auc") if x is not None]
    acc_post = [h["arrol/head_accuracy"] for h in logs[cold:] if "arrol/head_accuracy" in h]
    auc_post = [h["arrol/head_auc"] for h in logs[cold:] if "arrol/head_auc" in h]
    rewards = [h["reward"] for h in logs if "reward" in h]
    pos_post = [h["pruning/survivor_positive_ratio"] for h in logs[cold:] if "pruning/survivor_positive_ratio" in h]
    out = {
        "variant": variant, "train_s": train_s, "steps": len(timer.steps), "step_s": timer.steps,
        "median_step_s": statistics.median(timer.steps),
        "median_step_s_post_cold": statistics.median(timer.steps[opts.cold_start_rounds:] or timer.steps),
        "gen_s_per_step": gen["per_step"], "median_gen_s": statistics.median(gen["per_step"]),
        "median_gen_s_post_cold": statistics.median(gen["per_step"][opts.cold_start_rounds:] or gen["per_step"]),
        "generation_calls": gen["calls"],
        "pruning_generation_s": [x for x in per_round("pruning/generation_s") if x is not None],
        "responses": sum(h["responses"] for h in hist), "pruned": sum(h["pruned"] for h in hist),
        "loss_responses": sum(h["loss_responses"] for h in hist),
        "tokens": tok_all, "effective_groups": eff_all, "groups": sum(h["groups"] for h in hist),
        "tokens_per_effective_group": tpe_all,
        "tokens_post_cold": tok_post, "effective_groups_post_cold": eff_post,
        "tokens_per_effective_group_post_cold": tpe_post,
        "tokens_spent_logged": logs[-1].get("alloc/tokens_spent") if logs else None,
        "tokens_saved_est": sum(saved) if saved else None,
        "eligible": sum(x for x in per_round("pruning/eligible") if x is not None) or None,
        "finished_early": sum(x for x in per_round("pruning/finished_early") if x is not None) or None,
        "head_accuracy": acc, "head_auc": auc,
        "head_accuracy_post_cold_mean": statistics.fmean(acc_post) if acc_post else None,
        "head_auc_post_cold_mean": statistics.fmean(auc_post) if auc_post else None,
        # majority-class accuracy of the head's labels (completed eligible rollouts): context for head_accuracy
        "majority_baseline_post_cold": max(m := statistics.fmean(pos_post), 1 - m) if pos_post else None,
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "mean_completion_len_generated": statistics.fmean(gen["lengths"]) if gen["lengths"] else None,
        "completion_mean_length": [h.get("completions/mean_length") for h in logs],
        "history": hist,
    }
    del trainer
    return out


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def markdown_table(results, opts):
    head = ("| pruning | tokens generated | eff. groups | tokens / eff. group "
            "| tokens / eff. group (after cold start) | pruned / eligible | tokens saved (est.) "
            "| mean final len (completed) | median s/step | median gen s/step "
            "| head acc (majority baseline) after cold start | head AUC (after cold start) | mean reward |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        pe = f"{r['pruned']}/{_fmt(r['eligible'], '.0f')}" if r["variant"] != "none" else "-"
        lens = [x for x in r["completion_mean_length"] if x is not None]
        lines.append(
            f"| {r['variant']} | {r['tokens']} | {r['effective_groups']} | {r['tokens_per_effective_group']:.1f} | "
            f"{r['tokens_per_effective_group_post_cold']:.1f} | {pe} | {_fmt(r['tokens_saved_est'], '.1f')} | "
            f"{_fmt(statistics.fmean(lens) if lens else None)} | {r['median_step_s']:.3f} | "
            f"{r['median_gen_s']:.3f} | {_fmt(r['head_accuracy_post_cold_mean'], '.3f')} "
            f"({_fmt(r['majority_baseline_post_cold'], '.3f')}) | "
            f"{_fmt(r['head_auc_post_cold_mean'], '.3f')} | {_fmt(r['mean_reward'], '.3f')} |")
    return "\n".join(lines)


def main(argv=None):
    opts = parse_args(argv)
    quiet()
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM

    from trl_alloc.tasks.rewards import arithmetic_reward
    from trl_alloc.serving import AllocVLLMClient, start_server
    from trl_alloc.tasks.builtin import build_dataset
    from trl_alloc.tasks.tiny import get_tiny_model_dir

    if opts.threads:
        torch.set_num_threads(opts.threads)
    model_dir = get_tiny_model_dir(task="arithmetic")
    need = opts.rounds * opts.batch // opts.num_generations
    dataset = build_dataset("arithmetic", n=max(opts.num_prompts, need), seed=opts.seed, split="train",
                            levels=opts.levels)
    base_model = AutoModelForCausalLM.from_pretrained(model_dir)
    print(f"[bench] model {model_dir}; {len(dataset)} prompts (levels {opts.levels or 'all'}); rounds={opts.rounds} "
          f"k={opts.num_generations} batch={opts.batch} detect_length={opts.detect_length} "
          f"max_completion_length={opts.max_completion_length} κ={opts.keep_ratio} "
          f"cold_start_rounds={opts.cold_start_rounds}", flush=True)

    t = time.perf_counter()
    server = start_server(model_dir, timeout=opts.server_timeout,
                          env={"HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"})
    server_start_s = time.perf_counter() - t
    print(f"[bench] vLLM server up at {server.url} in {server_start_s:.1f} s", flush=True)
    results, pushes = [], []
    try:
        client = AllocVLLMClient(base_url=server.url, request_timeout=300)
        with tempfile.TemporaryDirectory(prefix="bench_arrol-") as out_root:
            for v in opts.variants:
                pushes.append(reset_server_weights(client, base_model))
                t = time.perf_counter()
                r = run_variant(v, opts, model_dir, server.url, dataset, arithmetic_reward, out_root)
                r["reset_push_s"] = pushes[-1]
                results.append(r)
                print(f"[bench] {v:6s}: {time.perf_counter() - t:.1f} s ({r['steps']} steps, reset push "
                      f"{pushes[-1]:.2f} s), {r['tokens']} tokens, {r['effective_groups']} effective groups, "
                      f"pruned {r['pruned']}", flush=True)
        client.close()
    finally:
        server.stop()
    table = markdown_table(results, opts)
    print()
    print(table)
    print(f"\nserver start {server_start_s:.1f} s vs base-weight reset push median {statistics.median(pushes):.2f} s "
          f"(pushes used)")
    if opts.output:
        os.makedirs(os.path.dirname(os.path.abspath(opts.output)), exist_ok=True)
        payload = {
            "settings": vars(opts), "model_dir": model_dir, "server_start_s": server_start_s,
            "reset_push_s": pushes,
            "environment": {"python": sys.version.split()[0], "torch": torch.__version__, "trl": trl.__version__,
                            "transformers": transformers.__version__, "platform": platform.platform(),
                            "cpu_count": os.cpu_count()},
            "results": results, "table": table,
        }
        with open(opts.output, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1, default=str)
        print(f"[bench] wrote {opts.output}")
    return results


if __name__ == "__main__":
    main()
