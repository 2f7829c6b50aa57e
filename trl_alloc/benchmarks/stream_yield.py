"""The stream's yield, guarded: effective groups a round of CERO + SARA as a stream (`rollout_mode="stream"`)
against stock GRPO, on the engine model at fixed seeds and on the live vLLM CPU server, compared with reference
figures kept in `docs/data/stream_yield/reference.json` (scripts/bench_stream_yield.py; docs/benchmarks.md says
how and when to run it).

The tolerance (`tolerance`): a figure fails when its mean over seeds is below the reference's by more than three
standard errors of a difference of two means, 3 · s · sqrt(1/n_ref + 1/n), s the reference's SD over seeds. A
change that only reshuffles the random draws stays within it; a drop of a third (the size of the one a user
reported on 2026-12-06, docs/benchmarks.md "The stream's yield at equal settings") does not, at the reference's
spread. The engine model is deterministic for a seed, so at the reference's commit its
figures are exact; the live figures move with the machine's timing, hence their seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings
from typing import Any

import numpy as np

# the live CPU bench's scale on the CPU-calibrated engine model (docs/benchmarks.md, "one stream across rounds"):
# B = 8 groups of k = 8 a round, 8 rounds, window 64, 69 ms a decode step + 5.9 ms per running sequence; the
# allocation at the trainer's defaults (plan.py's flags for the same plan; the other engine figures its defaults)
ENGINE_PLAN = {"prompts": 2000, "budget": 512, "rounds": 8, "capacity": 16, "unit_size": 4, "units_per_group": 2,
               "engine_seqs": 64, "step_ms": 69.0, "step_ms_per_seq": 5.9, "length_median": 60.0,
               "length_sigma": 0.6, "max_tokens": 96, "drift": 1.5, "train_gpus": 1, "train_ms_per_token": 0.0,
               "sync_s": 0.0, "colocate": False, "detect_length": 512}
ENGINE_ROWS = {"stock sync": ("uniform", "sync"), "stock stream": ("uniform", "stream"),
               "cero+sara stream": ("cero+sara", "stream")}
LIVE_ARGS = ["--rounds", "8", "--methods", "stock,cero_sara_stream", "--max_completion_length", "64"]
LIVE_ROWS = {"stock": "stock", "cero+sara stream": "cero_sara_stream"}


def engine_yield(seeds: list[int], max_staleness: int = 2) -> dict[str, dict[str, list[float]]]:
    """Per row of `ENGINE_ROWS`, per seed: effective groups a round and responses per effective group, on the
    engine model at `ENGINE_PLAN` with the trainer's defaults otherwise (`rollout.engine_model.simulate_engine`)."""
    from ..rollout.engine_model import simulate_engine

    out = {name: {"effective_groups_per_round": [], "responses_per_effective_group": []} for name in ENGINE_ROWS}
    for seed in seeds:
        args = argparse.Namespace(**ENGINE_PLAN, seed=seed, max_staleness=max_staleness)
        for name, (method, mode) in ENGINE_ROWS.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                r = simulate_engine(method, mode, args, args.rounds)
            out[name]["effective_groups_per_round"].append(r["effective_groups"] / r["rounds"])
            out[name]["responses_per_effective_group"].append(r["responses"] / max(r["effective_groups"], 1))
    return out


def live_yield(seeds: list[int], output_dir: str) -> dict[str, dict[str, list[float]]]:
    """Per row of `LIVE_ROWS`, per seed: the live CPU server's effective groups a round, responses and seconds per
    effective group (`scripts/bench_rollout.py` with `LIVE_ARGS`, one server started per seed)."""
    out = {name: {"effective_groups_per_round": [], "responses_per_effective_group": [], "s_per_effective_group": []}
           for name in LIVE_ROWS}
    for seed in seeds:
        folder = os.path.join(output_dir, f"live_seed{seed}")
        subprocess.run([sys.executable, "-m", "trl_alloc.cli.bench_rollout", *LIVE_ARGS, "--seed", str(seed),
                        "--output_dir", folder], check=True)
        for name, figures in read_live(folder).items():
            for key, value in figures.items():
                out[name][key].append(value)
    return out


def read_live(folder: str) -> dict[str, dict[str, float]]:
    """One live run's figures per row of `LIVE_ROWS`, from the `bench_rollout.json` it wrote in `folder`."""
    with open(os.path.join(folder, "bench_rollout.json"), encoding="utf-8") as f:
        summary = json.load(f)["summary"]
    return {name: {"effective_groups_per_round": summary[m]["effective_groups"] / summary[m]["rounds"],
                   "responses_per_effective_group": summary[m]["responses_per_eff"],
                   "s_per_effective_group": summary[m]["s_per_eff"]} for name, m in LIVE_ROWS.items()}


def tolerance(reference: list[float], n: int) -> float:
    """How far a mean over `n` seeds may fall below `reference`'s mean (module docstring): 3 standard errors of the
    difference of two means at the reference's SD over seeds."""
    if len(reference) < 2:
        raise ValueError("a reference needs at least two seeds to give a spread.")
    return 3.0 * float(np.std(reference, ddof=1)) * math.sqrt(1.0 / len(reference) + 1.0 / n)


def compare(reference: dict[str, dict[str, list[float]]], now: dict[str, dict[str, list[float]]],
            metric: str = "effective_groups_per_round") -> list[dict[str, Any]]:
    """One line per row present in both: reference mean, this run's mean, the allowed drop and whether it holds.
    Only a drop fails (a rise says the reference may need updating)."""
    lines = []
    for name in reference:
        if name not in now:
            continue
        ref, got = reference[name][metric], now[name][metric]
        allowed = tolerance(ref, len(got))
        diff = float(np.mean(got)) - float(np.mean(ref))
        lines.append({"row": name, "metric": metric, "reference": float(np.mean(ref)), "now": float(np.mean(got)),
                      "difference": diff, "allowed_drop": allowed, "seeds": len(got), "ok": diff >= -allowed})
    return lines


def markdown(lines: list[dict[str, Any]], title: str) -> str:
    head = (f"{title}\n\n| row | effective groups a round: reference | now | difference | allowed drop | seeds | |\n"
            "|---|---|---|---|---|---|---|\n")
    return head + "\n".join(f"| {x['row']} | {x['reference']:.2f} | {x['now']:.2f} | {x['difference']:+.2f} | "
                            f"{x['allowed_drop']:.2f} | {x['seeds']} | {'ok' if x['ok'] else 'DROP'} |"
                            for x in lines)


def main_run(args: argparse.Namespace) -> int:
    """scripts/bench_stream_yield.py: 0 when every figure holds, 1 when one dropped (or the reference is written)."""
    from .learning import code_commit

    reference = None
    if os.path.exists(args.reference):
        with open(args.reference, encoding="utf-8") as f:
            reference = json.load(f)
    commit = code_commit()
    record = {"commit": commit, "engine": {"commit": commit, "plan": ENGINE_PLAN,
                                           "seeds": args.engine_seeds, "rows": engine_yield(args.engine_seeds)}}
    if args.live_seeds:
        folder = args.output_dir or tempfile.mkdtemp(prefix="stream_yield_")
        record["live"] = {"commit": commit, "command": "python scripts/bench_rollout.py " + " ".join(LIVE_ARGS)
                          + " --seed S",
                          "seeds": args.live_seeds, "rows": live_yield(args.live_seeds, folder)}
    if args.write_reference:
        os.makedirs(os.path.dirname(os.path.abspath(args.reference)), exist_ok=True)
        kept = reference or {}
        kept.update(record)  # (an engine-only run keeps the reference's live figures)
        with open(args.reference, "w", encoding="utf-8") as f:
            json.dump(kept, f, indent=1)
        print(f"wrote {args.reference} (commit {record['commit']})")
        return 0
    if reference is None:
        raise SystemExit(f"no reference at {args.reference}; record one with --write_reference.")
    failed = False
    for part in ("engine", "live"):
        if part in record and part in reference:
            lines = compare(reference[part]["rows"], record[part]["rows"])
            print(markdown(lines, f"{part} (reference: commit {reference[part].get('commit')}, "
                                  f"{len(reference[part]['seeds'])} seeds; now: commit {commit})") + "\n")
            failed |= not all(x["ok"] for x in lines)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "stream_yield.json"), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
    print("the stream's yield DROPPED below the reference: see docs/benchmarks.md (the stream's yield)" if failed
          else "the stream's yield holds")
    return int(failed)


__all__ = ["ENGINE_PLAN", "ENGINE_ROWS", "LIVE_ARGS", "LIVE_ROWS", "compare", "engine_yield", "live_yield",
           "main_run", "markdown", "read_live", "tolerance"]
