#!/usr/bin/env python
"""Whether a refactor changed what trains: six short tiny-model train.py runs (deterministic, events and stream
rounds; CERO + SARA, DAPO's dynamic sampling, stock's full groups) at a reference commit and in this working tree,
compared by the sha256 of the trained weights and of the round log (its seconds left out); with --plan, the
default plan.py's plan.json too. Exits 1 on any difference.

    python scripts/check_bit_identity.py --ref main~3 [--plan]

Both sides run on this machine, one after the other: floats differ between machines, so hashes compare only
within one. About 4 minutes for the runs on 2 cores, and 1 minute a plan.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = [("deterministic", "cero", "sara", "grpo"), ("events", "cero", "sara", "grpo"),
        ("stream", "cero", "sara", "grpo"), ("deterministic", "uniform", "dynamic_sampling", "dapo"),
        ("events", "uniform", "full", "grpo"), ("stream", "uniform", "dynamic_sampling", "dapo")]
COMMON = ["--config", "configs/tiny_cpu.yaml", "--num_rounds", "6", "--num_builtin_prompts", "200",
          "--num_eval_prompts", "8", "--eval_samples", "1", "--save_strategy", "no", "--logging_steps", "1"]


ROUND_LOG_CLOCK = ("time_share", "peak_memory_gb", "step_time")  # and every `*_s`: a round log's seconds are real
PLAN_CLOCK = ("alloc_ms", "scheduler_ms_per_round")  # a plan's other seconds run on the engine model's virtual clock


def without_seconds(x: object, drop: tuple[str, ...] = ROUND_LOG_CLOCK, drop_s: bool = True) -> object:
    """`x` with its wall-clock fields left out: `drop`, and with `drop_s` every `*_s`."""
    if isinstance(x, dict):
        return {k: without_seconds(v, drop, drop_s) for k, v in x.items()
                if k not in drop and not (drop_s and k.endswith("_s"))}
    if isinstance(x, list):
        return [without_seconds(v, drop, drop_s) for v in x]
    return x


def digest(run_dir: str) -> dict[str, str]:
    """sha256 of a run's `model.safetensors` and of its round log without seconds."""
    with open(os.path.join(run_dir, "model.safetensors"), "rb") as f:
        weights = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(run_dir, "allocation", "rounds.jsonl"), encoding="utf-8") as f:
        lines = [without_seconds(json.loads(line)) for line in f if line.strip()]
    rounds = hashlib.sha256(json.dumps(lines, sort_keys=True).encode()).hexdigest()
    return {"weights": weights, "rounds": rounds, "lines": str(len(lines))}


def run_tree(tree: str, out: str, plan: bool) -> dict[str, dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": tree}
    got = {}
    for mode, pacing, filling, algorithm in RUNS:
        name = f"{mode}-{pacing}-{filling}-{algorithm}"
        cmd = [sys.executable, "scripts/train.py", *COMMON, "--rollout_mode", mode, "--pacing", pacing,
               "--filling", filling, "--algorithm", algorithm, "--output_dir", os.path.join(out, name)]
        with open(os.path.join(out, name + ".log"), "w", encoding="utf-8") as log:
            subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
        got[name] = digest(os.path.join(out, name))
    if plan:
        subprocess.run([sys.executable, "scripts/plan.py", "--output_dir", os.path.join(out, "plan")], cwd=tree,
                       env=env, stdout=subprocess.DEVNULL, check=True)
        with open(os.path.join(out, "plan", "plan.json"), encoding="utf-8") as f:
            table = without_seconds({k: v for k, v in json.load(f).items() if k != "settings"}, PLAN_CLOCK, False)
        got["plan.json"] = {"table": hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()}
    return got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", default="HEAD", help="the reference commit (default HEAD: the tree's own changes)")
    p.add_argument("--plan", action="store_true", help="compare the default plan.py's plan.json too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ref_tree = os.path.join(tmp, "ref")
        subprocess.run(["git", "worktree", "add", "--detach", "-q", ref_tree, args.ref], cwd=ROOT, check=True)
        try:
            results = {}
            for side, tree in (("ref", ref_tree), ("tree", ROOT)):
                os.makedirs(os.path.join(tmp, side + "-runs"))
                results[side] = run_tree(tree, os.path.join(tmp, side + "-runs"), args.plan)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", ref_tree], cwd=ROOT, check=False)
    differ = 0
    for name, ref in results["ref"].items():
        same = ref == results["tree"][name]
        differ += not same
        print(f"{name:40s} {'identical' if same else 'DIFFERENT'}  {ref} {'' if same else results['tree'][name]}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
