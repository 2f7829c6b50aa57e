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
  cero_sara_arrol  CERO + SARA + ARROL         (pruning arrol, detect_length 2, cold_start_rounds 2, ungated)
  cero_sara_random CERO + SARA + random pruning (ARROL's control: same survival rate, no head)

Per method: held-out avg@k and pass@k (``trl_alloc.evaluation``, transformers backend, k samples per
prompt on held-out test prompts), effective-group rate (groups with mixed rewards / groups touched),
responses and completion tokens per effective group, wall-clock of ``train()``, and the allocator's share
of it (``trainer.allocator.history``). For stock TRL the groups are counted at the reward call (consecutive
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
from collections.abc import Sequence
from typing import Any

from ..allocation.allocator import json_default
from ..benchmarks.report import load_earlier_run, markdown_table, plots
from ..benchmarks.measure import check_batch, quiet
from ..benchmarks.methods import (METHODS, evaluate_model, parse_methods, replayed_method, run_figures,
                                  run_method, summarise)
from ..tasks.builtin import TASKS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="10 rounds, 1 seed, 50 eval prompts x 4 samples (unless set explicitly)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per method (mean ± std); default 3, --quick 1")
    p.add_argument("--rounds", type=int, default=None,
                   help="scheduler rounds K; default 40 (the embedded recipe), --quick 10")
    p.add_argument("--budget", type=int, default=None,
                   help="total responses per run (default rounds × batch); stock gets budget // batch steps")
    p.add_argument("--methods", default=",".join(METHODS), help="comma list from " + ",".join(METHODS) + ", or any "
                   "registered stages as pacing+filling (e.g. greso+dynamic_sampling)")
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
    p.add_argument("--learning_rate", type=float, default=1e-4,
                   help="the embedded recipe's rate (configs/tiny_cpu.yaml); 3e-4 and above destabilise the "
                   "tiny model")
    p.add_argument("--eval_prompts", type=int, default=None, help="held-out test prompts; default 200, --quick 50")
    p.add_argument("--eval_k", type=int, default=None,
                   help="k of avg@k / pass@k (= samples per eval prompt); default 8, --quick 4")
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
    args.methods = parse_methods(p, args.methods)
    args.detect_length = args.detect_length or (2 if args.model == "tiny" else max(1, args.max_completion_length // 4))
    if args.model == "tiny" and args.dataset != "builtin:arithmetic":
        p.error("--model tiny is the embedded model of builtin:arithmetic; give --model for another --dataset")
    check_batch(p, args)
    if args.budget % args.batch:
        p.error(f"--budget ({args.budget}) must be a multiple of --batch ({args.batch}) so stock TRL can match it")
    if args.budget % 4:
        p.error("--budget must be a multiple of CERO's unit size (4)")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    opts = parse_args(argv)
    quiet()
    import torch
    import transformers
    import trl

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..tasks.builtin import build_dataset
    from ..tasks.data import reward_for_dataset
    from ..tasks.tiny import get_tiny_model_dir

    if opts.threads:
        torch.set_num_threads(opts.threads)
    t_all = time.perf_counter()
    if opts.from_json:
        model_dir = load_earlier_run(opts.from_json)["model_dir"]
    elif opts.model == "tiny":
        model_dir = get_tiny_model_dir(task="arithmetic")
    else:
        from ..tasks.models import resolve_model
        model_dir = resolve_model(opts.model)
    reward = reward_for_dataset(opts.dataset)
    task = opts.dataset.split(":", 1)[1]
    levels = tuple(opts.levels) if opts.levels else None
    methods = list(opts.methods)
    for m in [m for m in methods if replayed_method(m)]:
        if replayed_method(m) not in methods:  # e.g. random_matched replays CERO's sizes
            methods.insert(methods.index(m), replayed_method(m))
            print(f"[bench] adding {replayed_method(m)!r}: {m} needs its allocation_state.json", flush=True)
    opts.methods = methods
    order = [m for m in methods if not replayed_method(m)] + [m for m in methods if replayed_method(m)]
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
        ran = list(dict.fromkeys(r["method"] for r in runs))  # the table's order is the earlier run's
        methods = [m for m in earlier["settings"].get("methods", []) if m in ran] + [
            m for m in ran if m not in earlier["settings"].get("methods", [])]
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
                if run.get("state_path"):
                    cero_state = run["state_path"]
                run.update(evaluate_model(model, tok, test_ds, reward, opts, seed))
                run["d_avg_vs_start"] = run["avg"] - start["avg"]
                run_figures(run, opts.budget, opts.rounds)
                run.pop("state_path", None)
                runs.append(run)
                with open(os.path.join(opts.output_dir, "bench.partial.json"), "w", encoding="utf-8") as f:
                    json.dump({"settings": vars(opts), "start_runs": starts, "runs": runs}, f, default=json_default)
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
        json.dump(payload, f, indent=1, default=json_default)
    print(f"\n[bench] total wall time {total:.0f} s; wrote {opts.output_dir}/bench.md, bench.json, "
          + ", ".join(os.path.basename(p) for p in paths.values()), flush=True)
    return rows

