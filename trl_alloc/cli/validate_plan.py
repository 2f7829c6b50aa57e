"""The planner against learning runs that happened (trl_alloc/benchmarks/plan_validation.py): probe each seed's
pool of a `bench_learning.py` runs folder with the run's base model and sampling settings, predict every method's
effective groups and responses per effective group, and print predicted against measured.

    python scripts/validate_plan.py --runs_dir docs/data/learning_smollm2_pool64 \
        --probe_dir docs/data/plan_validation/pool64

Probes already in `--probe_dir` (`probe-s<seed>.json`) are reused, so the table can be redone in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

from ..allocation.allocator import json_default
from ..benchmarks.learning import load_runs
from ..benchmarks.plan_validation import RECORD_METHODS, by_method, markdown, probe_run, run_settings, validate


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--runs_dir", required=True, help="a folder of bench_learning.py run records")
    p.add_argument("--probe_dir", required=True, help="where each seed's probe pass is kept (and reused)")
    p.add_argument("--model", default=None, help="the base model (default: the runs' model_name_or_path)")
    p.add_argument("--probe_prompts", type=int, default=None, help="probe a seeded sample of this many of each "
                   "pool's prompts (default: all); the rest of the pool is drawn from the probed rates")
    p.add_argument("--probe_backend", default="auto", choices=["auto", "vllm", "transformers"])
    p.add_argument("--plan_seeds", type=int, default=5, help="planner seeds per prediction")
    p.add_argument("--label", default=None, help="the table's title (default: the runs folder)")
    args = p.parse_args(argv)
    records = [r for r in load_runs(args.runs_dir) if r["method"] in RECORD_METHODS]
    if not records:
        p.error(f"no run records of {', '.join(RECORD_METHODS)} in {args.runs_dir}")
    os.makedirs(args.probe_dir, exist_ok=True)
    probes = {}
    for seed in sorted({int(r["seed"]) for r in records}):
        path = os.path.join(args.probe_dir, f"probe-s{seed}.json")
        if not os.path.isfile(path):
            settings = run_settings(next(r for r in records if int(r["seed"]) == seed))
            print(f"[validate_plan] probing seed {seed}'s pool", flush=True)
            probe = probe_run(settings, seed, args.model or settings["model_name_or_path"], args.probe_prompts,
                              args.probe_backend)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(probe, f)
        with open(path, encoding="utf-8") as f:
            probes[seed] = json.load(f)
    result = validate(records, probes, args.plan_seeds)
    text = markdown(result, args.label or args.runs_dir)
    print(text)
    with open(os.path.join(args.probe_dir, "validation.json"), "w", encoding="utf-8") as f:
        json.dump({"runs_dir": args.runs_dir, **result, "by_method": by_method(result), "table": text}, f, indent=1,
                  default=json_default)
    with open(os.path.join(args.probe_dir, "validation.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return result
