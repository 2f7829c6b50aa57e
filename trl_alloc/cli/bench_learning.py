"""Learning-regime benchmark (a script that prints and saves figures, not a test): whole `train.py` runs per method
and seed at one response budget, each with a held-out curve, compared against stock GRPO in accuracy per response
and per second (trl_alloc/benchmarks/learning.py). Everything after `--` goes to train.py, so any dataset it takes
works (`--dataset_name train.jsonl --test_dataset_name test.jsonl`).

    python scripts/bench_learning.py --methods stock,dapo,cero_sara --seeds 0 1 2 \
        -- --config configs/learning_smollm2.yaml
    python scripts/bench_learning.py --report_only --runs_dir docs/data/learning_smollm2   # the table and plot only
    python scripts/bench_learning.py --report_only --runs_dir docs/data/learning_smollm2_pool64_onpolicy \
        --compare_sd_with docs/data/learning_smollm2_pool64   # and the seed-to-seed spread against another design
    python scripts/bench_learning.py --runs_dir RUNS --output_dir OUT --regrade_into RUNS/regraded  # a fixed verifier

Runs already in `--runs_dir` are kept and not run again: a later session adds seeds to the same folder. A run a
stopped session interrupted resumes from its newest checkpoint (`--save_steps`), with its curve so far.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..allocation.allocator import json_default
from ..benchmarks.learning import (STOCK, code_commit, compare, held_out_details, load_runs, markdown_table,
                                   plot_curves, power_lines, regraded, run_one, run_path, sd_comparison_lines,
                                   truncation_lines, write_record)
from ..benchmarks.methods import METHODS, parse_methods
from ..evaluation.metrics import ANSWER_TYPES
from .held_out_before import KEY_FILE
from ..tasks.rewards import VERIFIERS, reward_for_task


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--methods", default="stock,dapo,cero_sara",
                   help="comma list from " + ",".join(METHODS) + " (stock: pacing uniform, filling full), or "
                   "pacing+filling")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eval_every", type=int, default=0, help="rounds between held-out evaluations (0: off)")
    p.add_argument("--eval_every_responses", type=int, default=128,
                   help="also evaluate each time the responses spent pass another multiple of this: the same points "
                   "for every method (0: off)")
    p.add_argument("--runs_dir", default="outputs/bench_learning/runs", help="one JSON per finished run (kept)")
    p.add_argument("--output_dir", default="outputs/bench_learning", help="table, figures, plot, train.py outputs")
    p.add_argument("--save_steps", type=int, default=4,
                   help="keep each run's newest checkpoint every this many optimizer steps, so a run a stopped "
                   "session interrupted resumes there (0: no checkpoints; an interrupted run starts again)")
    p.add_argument("--timeout", type=float, default=None, help="seconds one train.py run may take")
    p.add_argument("--report_only", action="store_true", help="only the table and plot of the runs in --runs_dir")
    p.add_argument("--compare_sd_with", default=None, metavar="RUNS_DIR",
                   help="also compare the seed-to-seed spread with another design's runs (e.g. "
                   "docs/data/learning_smollm2_pool64, the bfloat16-engine runs): each paired SD with its interval "
                   "and an F-test")
    p.add_argument("--add_held_out_details", action="store_true",
                   help="first add each evaluation's held-out cut share and mean length to the records in --runs_dir "
                   "that lack them (written before those fields existed), from their train.py outputs in "
                   "--output_dir/train; then report")
    p.add_argument("--regrade_into", default=None, metavar="RUNS_DIR",
                   help="score every held-out evaluation of the runs in --runs_dir again with this commit's verifier, "
                   "from the samples in --output_dir/train, into new records in RUNS_DIR (each run's own accuracy "
                   "kept as accuracy_as_run); then report those")
    p.add_argument("--regrade_verifier", default=None, choices=sorted(VERIFIERS),
                   help="the verifier --regrade_into scores with (default: the one each run evaluated with, e.g. "
                   "math_reward); "
                   "math_number_reward pays an answer only where it states a number, not an expression such as "
                   "'90 - 4' that math-verify evaluates for it")
    args = p.parse_args(own)
    args.methods = parse_methods(p, args.methods)
    args.report_only = args.report_only or args.add_held_out_details or bool(args.regrade_into)
    if args.regrade_verifier and not args.regrade_into:
        p.error("--regrade_verifier chooses the verifier of --regrade_into: give --regrade_into RUNS_DIR too")
    if STOCK not in args.methods and not args.report_only:
        p.error("--methods needs 'stock': every figure is paired against it")
    if not train_args and not args.report_only:
        p.error("give train.py's arguments after `--` (e.g. -- --config configs/learning_smollm2.yaml)")
    return args, train_args


def add_held_out_details(runs_dir: str, work_dir: str) -> None:
    """`held_out_details` for the records in `runs_dir` whose curve lacks them, from `work_dir/<method>-s<seed>`."""
    for record in load_runs(runs_dir):
        out = os.path.join(work_dir, f"{record['method']}-s{record['seed']}")
        if all("truncated_share" in p for p in record["held_out_curve"]) or not os.path.isdir(out):
            continue
        record["held_out_curve"] = held_out_details(out, record["held_out_curve"])
        write_record(runs_dir, record)
        print(f"[bench_learning] {record['method']} seed {record['seed']}: held-out cut shares added from {out}",
              flush=True)


def regrade_runs(runs_dir: str, work_dir: str, into: str, verifier: str | None = None) -> None:
    """`regraded` records of every run in `runs_dir` (samples from `work_dir/<method>-s<seed>`) written to `into`.
    A run whose samples are gone (another machine's, an earlier session's) keeps the record `into` already holds
    for it, if that record regraded this very run (its commit and its as-run final accuracy) with this verifier
    (`verifier`, or the run's own when None); a record that
    regrades to the same figures is kept as it is, with the commit that first regraded it."""
    runs, commit = load_runs(runs_dir), code_commit()  # (before writing: records in the repository would dirty it)
    if not runs:
        raise SystemExit(f"--regrade_into: no runs in {runs_dir}")
    earlier = {(r["method"], r["seed"]): r for r in load_runs(into) if "regraded" in r}
    for record in runs:
        own = {record["held_out_reward"]} if record.get("held_out_reward") else {  # (older records: the task's own)
            reward_for_task(t).__name__ for t in ANSWER_TYPES}
        verifiers, asked = ({verifier}, verifier) if verifier else (own, "the run's own")
        kept = earlier.get((record["method"], record["seed"]))
        try:
            new = regraded(record, os.path.join(work_dir, f"{record['method']}-s{record['seed']}"), commit,
                           VERIFIERS[verifier] if verifier else None)
        except FileNotFoundError as e:
            if kept is None or (kept.get("commit"), kept["regraded"]["accuracy_as_run_after"]) != (
                    record.get("commit"), record["held_out_accuracy_after"]):
                raise SystemExit(f"--regrade_into: {e}" + ("" if kept is None else f"; the record in {into} "
                                 "regraded another run of it (its commit or final accuracy differ)")) from None
            if kept["regraded"]["verifier"] not in verifiers:
                raise SystemExit(f"--regrade_into: {e}; the record in {into} was regraded with "
                                 f"{kept['regraded']['verifier']}, not {asked}: regrade "
                                 "into another folder, or on the machine that holds the samples") from None
            print(f"[bench_learning] {record['method']} seed {record['seed']}: no samples here; the record in {into} "
                  f"(regraded at {kept['regraded']['commit']}) is kept", flush=True)
            continue
        if kept is not None and kept == dict(new, regraded=dict(new["regraded"], commit=kept["regraded"]["commit"])):
            print(f"[bench_learning] {record['method']} seed {record['seed']}: regraded as before; the record in "
                  f"{into} (regraded at {kept['regraded']['commit']}) is kept", flush=True)
            continue
        write_record(into, new)
        print(f"[bench_learning] {record['method']} seed {record['seed']}: held-out after "
              f"{new['regraded']['accuracy_as_run_after']:.3f} as run, {new['held_out_accuracy_after']:.3f} "
              f"regraded ({new['regraded']['verifier']})", flush=True)


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    args, train_args = parse_args(argv)
    if not args.report_only:
        work_dir = os.path.join(args.output_dir, "train")
        for seed in args.seeds:  # seed-major: each finished seed pairs every method
            # the methods at a seed evaluate one model on one held-out set before training: sampled once
            before = [os.path.join(work_dir, f"{m}-s{seed}") for m in args.methods]
            before = next((d for d in before if os.path.isfile(os.path.join(d, "eval", "before", KEY_FILE))), None)
            for method in args.methods:
                if os.path.exists(run_path(args.runs_dir, method, seed)):
                    print(f"[bench_learning] {method} seed {seed}: already in {args.runs_dir}", flush=True)
                    continue
                print(f"[bench_learning] {method} seed {seed}: running", flush=True)
                r = run_one(method, seed, train_args, args.runs_dir, work_dir, args.eval_every, timeout=args.timeout,
                            eval_every_responses=args.eval_every_responses, save_steps=args.save_steps,
                            eval_before_from=before)
                before = before or os.path.join(work_dir, f"{method}-s{seed}")
                print(f"[bench_learning] {method} seed {seed}: held-out {r['held_out_accuracy_before']:.3f} -> "
                      f"{r['held_out_accuracy_after']:.3f}, {r['responses_spent']} responses, "
                      f"{r['held_out_curve'][-1]['seconds']:.0f} s of run ({r['wall_s']:.0f} s with evaluation)",
                      flush=True)
    if args.add_held_out_details:
        add_held_out_details(args.runs_dir, os.path.join(args.output_dir, "train"))
    if args.regrade_into:
        regrade_runs(args.runs_dir, os.path.join(args.output_dir, "train"), args.regrade_into, args.regrade_verifier)
        args.runs_dir = args.regrade_into
    runs = load_runs(args.runs_dir)
    if not runs:
        raise SystemExit(f"no runs in {args.runs_dir}")
    rows = compare(runs)
    table = markdown_table(rows)
    power = power_lines(rows) + truncation_lines(runs)
    if args.compare_sd_with:
        other = load_runs(args.compare_sd_with)
        if not other:
            raise SystemExit(f"--compare_sd_with: no runs in {args.compare_sd_with}")
        power += sd_comparison_lines(rows, compare(other), args.runs_dir, args.compare_sd_with)
    print("\n" + table + "".join("\n" + line for line in power))
    os.makedirs(args.output_dir, exist_ok=True)
    plot = plot_curves(runs, os.path.join(args.output_dir, "learning_curves.png"))
    with open(os.path.join(args.output_dir, "bench_learning.md"), "w", encoding="utf-8") as f:
        f.write(f"# Learning-regime benchmark\n\n{table}\n\n" + "".join(f"- {line}\n" for line in power)
                + f"\nRuns: {args.runs_dir}\n")
    with open(os.path.join(args.output_dir, "bench_learning.json"), "w", encoding="utf-8") as f:
        json.dump({"rows": rows, "table": table, "power": power, "runs_dir": args.runs_dir}, f, indent=1,
                  default=json_default)
    print(f"\n[bench_learning] wrote {args.output_dir}/bench_learning.md, bench_learning.json, "
          f"{os.path.basename(plot)}", flush=True)
    return rows
