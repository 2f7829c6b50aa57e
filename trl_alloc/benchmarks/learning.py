"""The learning-regime benchmark (scripts/bench_learning.py): whole `scripts/train.py` runs, one per method and seed,
each with its held-out curve (`--eval_every`), compared in the user's currency: held-out accuracy against responses
spent and against the run's seconds (generation and training, evaluation excluded).

Figures, paired by seed against stock (pacing uniform, filling full: TRL's GRPO, tests/trainer/test_trl_parity.py):
- the final accuracy at the matched budget, and its difference to stock's;
- the responses and seconds a method needs to reach stock's final held-out accuracy (`cost_to_reach`: the first
  crossing on its curve, interpolated linearly between evaluations), as a ratio to stock's own;
- means with two-sided 95% Student-t intervals over seeds (`paired`).

Each finished run is one JSON file in the runs folder (`<method>-s<seed>.json`); a run already there is not run
again, so later sessions add seeds and methods to the same folder.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..allocation.allocator import json_default
from .methods import method_recipe

STOCK = "stock"
TRAIN_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "scripts", "train.py")


def method_flags(method: str) -> list[str]:
    """`train.py` flags of a bench method (`benchmarks.methods.method_recipe`); stock is TRL's GRPO through our
    trainer (pacing uniform, filling full)."""
    stages = method_recipe(method)[1] or {"pacing": "uniform", "filling": "full"}
    flags = []
    for key, value in stages.items():
        flags += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return flags


def run_path(runs_dir: str, method: str, seed: int) -> str:
    return os.path.join(runs_dir, f"{method}-s{seed}.json")


def code_commit() -> str | None:
    """The commit of the code that runs (with `-dirty` where files differ from it), or None outside a git clone."""
    root = os.path.dirname(os.path.dirname(TRAIN_SCRIPT))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    """What a run computes on: the CPU's model and cores, the instruction set torch dispatches to ("AVX2",
    "AVX512", ...), whether the CPU has AMX, and the GPU where there is one. Floats, and so RL trajectories,
    differ between these; a paired comparison whose runs differ in them carries that difference too."""
    import torch

    model = platform.processor()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    return {"cpu": model or platform.machine(), "cores": os.cpu_count(),
            "isa": torch.backends.cpu.get_cpu_capability(), "amx": bool(torch.cpu._is_amx_tile_supported()),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def interrupted_at(out: str) -> int | None:
    """The optimizer step of the newest complete checkpoint an interrupted run left in `out`, or None."""
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(out) if os.path.isdir(out) else None
    return int(last.rsplit("-", 1)[1]) if last else None


def _run_counting_seconds(cmd: list[str], log: Any, progress: dict[str, Any], progress_path: str,
                          timeout: float | None, heartbeat_s: float) -> int:
    """Run `cmd`, adding its seconds to `progress["wall_s"]` in `progress_path` every `heartbeat_s` and at its end,
    so a part that a stopped session killed (SIGKILL included) still counts, to within `heartbeat_s`. Returns its
    exit code."""
    base, t0 = progress["wall_s"], time.perf_counter()

    def save() -> None:  # whole or not at all (a kill may come mid-write)
        progress["wall_s"] = base + time.perf_counter() - t0
        with open(progress_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(progress, f)
        os.replace(progress_path + ".tmp", progress_path)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        while True:
            try:
                return proc.wait(timeout=heartbeat_s)
            except subprocess.TimeoutExpired:
                save()
                if timeout is not None and time.perf_counter() - t0 > timeout:
                    raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        save()


def held_out_details(out: str, curve: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The curve's points with each evaluation's share of held-out samples cut at the token cap and their mean
    length (`truncated_share`, `mean_completion_tokens`), read from the `eval/<when>/eval_results.json` that
    `train.py` writes for every evaluation; a point without that file is left as it is."""
    points = []
    for point in curve:
        path = os.path.join(out, "eval", point["when"], "eval_results.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                info = json.load(f)["info"]
            point = {**point, "truncated_share": info["truncated_rate"],
                     "mean_completion_tokens": info["mean_completion_tokens"]}
        points.append(point)
    return points


def regraded(record: dict[str, Any], out: str, commit: str | None = None,
             verifier: Callable[..., list[float]] | None = None) -> dict[str, Any]:
    """`record` with every held-out evaluation scored again by this commit's verifier from the samples that
    `train.py` wrote (`out/eval/<when>/samples.jsonl`, `trl_alloc.evaluation.regrade`), the accuracy the run
    measured kept as `accuracy_as_run`: a verifier fixed after the runs re-scores them without sampling again.
    `commit`: the code's, taken before any record is written (default: `code_commit()` now); `verifier`: a reward
    function (default: the one the run evaluated with, `eval_results.json`'s `reward`; before evaluations named it,
    their answer type's own, `reward_for_task`)."""
    from ..evaluation import regrade
    from ..tasks.rewards import VERIFIERS, reward_for_task

    task_verifier = verifier is None

    points = []
    for point in record["held_out_curve"]:
        folder = os.path.join(out, "eval", point["when"])
        if not os.path.isfile(os.path.join(folder, "samples.jsonl")):
            raise FileNotFoundError(f"{record['method']} seed {record['seed']}: no samples in {folder} to regrade; "
                                    "give --output_dir the folder whose train/ holds the run's train.py outputs")
        if task_verifier:
            with open(os.path.join(folder, "eval_results.json"), encoding="utf-8") as f:
                info = json.load(f)["info"]
            verifier = VERIFIERS.get(info.get("reward")) or reward_for_task(info["answer_type"])
        accuracy = regrade(os.path.join(folder, "samples.jsonl"), verifier)
        points.append({**point, "accuracy": accuracy, "accuracy_as_run": point.get("accuracy_as_run",
                                                                                  point["accuracy"])})
    at = {p["when"]: p["accuracy"] for p in points}
    return {**record, "held_out_curve": points,
            "held_out_accuracy_before": at.get("before", record["held_out_accuracy_before"]),
            "held_out_accuracy_after": at.get("after", points[-1]["accuracy"]),
            "regraded": {"commit": commit or code_commit(), "verifier": verifier.__name__,
                         "accuracy_as_run_after": record.get("regraded", {}).get(
                             "accuracy_as_run_after", record["held_out_accuracy_after"])}}


def run_one(method: str, seed: int, train_args: Sequence[str], runs_dir: str, work_dir: str, eval_every: int,
            timeout: float | None = None, eval_every_responses: int = 0, save_steps: int = 0,
            heartbeat_s: float = 30.0, eval_before_from: str | None = None) -> dict[str, Any]:
    """One `train.py` run of `method` at `seed` (its output in `work_dir/<method>-s<seed>`); its record (settings,
    code commit, `machine()` of each part, engine, curve, allocation summary, wall seconds) is written to the runs
    folder and returned. With `save_steps`, the run keeps its newest checkpoint (with its curve so far) every
    `save_steps` optimizer steps, and a run that a stopped session interrupted resumes from it; the record lists the
    steps it resumed at. Its seconds so far are kept every `heartbeat_s` (`<run>.progress.json`), so an interrupted
    part's count too. With `eval_before_from` (another run's output folder at this seed), the run takes that run's
    "before" held-out evaluation where it is the same one (`train.py --eval_before_from`)."""
    out = os.path.join(work_dir, f"{method}-s{seed}")
    cmd = [sys.executable, TRAIN_SCRIPT, *train_args, *method_flags(method), "--seed", str(seed),
           "--output_dir", out, "--eval_every", str(eval_every), "--eval_every_responses", str(eval_every_responses)]
    if eval_before_from and "--eval_before_from" not in train_args:
        cmd += ["--eval_before_from", eval_before_from]
    if save_steps:
        cmd += ["--save_strategy", "steps", "--save_steps", str(save_steps)]
        cmd += [] if "--save_total_limit" in train_args else ["--save_total_limit", "1"]
    progress_path = out + ".progress.json"  # the seconds and resumptions of the run's earlier, interrupted parts
    progress = {"wall_s": 0.0, "resumed_at_steps": [], "commits": [], "machines": []}
    step = interrupted_at(out) if save_steps else None
    if step is not None and os.path.isfile(progress_path):
        with open(progress_path, encoding="utf-8") as f:
            progress = json.load(f)
    if step is not None:
        cmd += ["--resume_from_checkpoint", "true"]
        progress["resumed_at_steps"].append(step)
    commit, this_machine = code_commit(), machine()
    progress["commits"].append(commit)
    if this_machine not in progress.setdefault("machines", []):  # (progress files older than `machines` lack it)
        progress["machines"].append(this_machine)
    os.makedirs(work_dir, exist_ok=True)
    with open(out + ".log", "a" if step is not None else "w", encoding="utf-8") as log:
        returncode = _run_counting_seconds(cmd, log, progress, progress_path, timeout, heartbeat_s)
    wall_s = progress["wall_s"]
    if returncode != 0:
        raise RuntimeError(f"{method} seed {seed}: train.py exited with {returncode} (log: {out}.log)")
    with open(os.path.join(out, "allocation", "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    if not summary.get("held_out_curve"):
        raise RuntimeError(f"{method} seed {seed}: the run has no held-out curve; the bench needs a held-out set (a "
                           "test split, --test_dataset_name or --test_fraction) and --eval_samples above 0.")
    keys = ("rounds", "responses_spent", "tokens_spent", "groups", "effective_groups", "effective_group_rate",
            "responses_per_effective_group", "pool_prompts", "prompts_seen", "prompts_trained",
            "prompts_with_signal", "rounds_without_signal", "truncated_share", "engine", "engine_mismatch",
            "held_out_accuracy_before", "held_out_accuracy_after", "held_out_split", "held_out_prompts",
            "held_out_samples", "held_out_backend", "held_out_reward", "held_out_before_from", "held_out_curve",
            "budget_responses", "methods")
    record = {"method": method, "seed": seed, "commit": commit, "command": cmd[1:], "wall_s": wall_s,
              "resumed_at_steps": progress["resumed_at_steps"], "commits": sorted(set(progress["commits"]) - {None}),
              "machines": progress["machines"],
              **{k: summary.get(k) for k in keys}}
    record["held_out_curve"] = held_out_details(out, record["held_out_curve"])
    write_record(runs_dir, record)
    return record


def write_record(runs_dir: str, record: dict[str, Any]) -> None:
    """A run's record, as `<runs_dir>/<method>-s<seed>.json`."""
    os.makedirs(runs_dir, exist_ok=True)
    with open(run_path(runs_dir, record["method"], record["seed"]), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, default=json_default)


def load_runs(runs_dir: str) -> list[dict[str, Any]]:
    """Every run record in the runs folder."""
    if not os.path.isdir(runs_dir):
        return []
    runs = []
    for name in sorted(os.listdir(runs_dir)):
        if name.endswith(".json"):
            with open(os.path.join(runs_dir, name), encoding="utf-8") as f:
                runs.append(json.load(f))
    return runs


def cost_to_reach(curve: Sequence[dict[str, Any]], target: float, axis: str) -> float:
    """The `axis` value ("responses", "seconds" or "cpu_seconds") at which the curve first reaches `target`
    accuracy, linear between the two evaluations around the crossing; inf if it never does."""
    for i, point in enumerate(curve):
        if point["accuracy"] >= target:
            if i == 0:
                return float(point[axis])
            a, b = curve[i - 1], point
            frac = (target - a["accuracy"]) / (b["accuracy"] - a["accuracy"])
            return float(a[axis] + frac * (b[axis] - a[axis]))
    return math.inf


ENDPOINT_SHARES = (0.5, 0.75, 1.0)  # the primary endpoint: held-out accuracy at these shares of the budget


def accuracy_at(curve: Sequence[dict[str, Any]], responses: float) -> float:
    """Held-out accuracy at `responses` spent, linear between evaluations; past the curve's last point (a run that
    spent less than the budget), that point's accuracy: the run is compared at its own spend."""
    xs = [float(p["responses"]) for p in curve]
    ys = [float(p["accuracy"]) for p in curve]
    for i in range(1, len(xs)):
        if responses <= xs[i]:
            frac = (responses - xs[i - 1]) / (xs[i] - xs[i - 1]) if xs[i] > xs[i - 1] else 1.0
            return ys[i - 1] + max(0.0, frac) * (ys[i] - ys[i - 1])
    return ys[-1]


def budget_of(record: dict[str, Any]) -> int:
    """The run's response budget (records older than `budget_responses`: stock's, which spends all of it)."""
    return int(record.get("budget_responses") or record["responses_spent"])


def endpoint(record: dict[str, Any], shares: Sequence[float] = ENDPOINT_SHARES) -> float:
    """The benchmark's primary endpoint (docs/benchmarks.md, written down before the runs): the mean held-out
    accuracy at 50, 75 and 100% of the run's response budget (`accuracy_at`)."""
    budget = float(budget_of(record))
    return statistics.fmean(accuracy_at(record["held_out_curve"], share * budget) for share in shares)


def seeds_for_half_width(sd: float, half_width: float) -> int:
    """Seeds a paired mean needs for its two-sided 95% Student-t interval to be at most ±`half_width`."""
    from scipy.stats import t

    n = 2
    while t.ppf(0.975, n - 1) * sd / math.sqrt(n) > half_width:
        n += 1
    return n


def paired(values: Iterable[float]) -> dict[str, Any]:
    """Mean and two-sided 95% Student-t interval of per-seed values (finite ones; `n_inf` counts the others)."""
    from scipy.stats import t

    values = list(values)
    finite = [v for v in values if math.isfinite(v)]
    out = {"n": len(finite), "n_inf": len(values) - len(finite), "mean": None, "low": None, "high": None,
           "sd": None}
    if finite:
        mean = statistics.fmean(finite)
        sd = statistics.stdev(finite) if len(finite) > 1 else math.nan
        half = t.ppf(0.975, len(finite) - 1) * sd / math.sqrt(len(finite)) if len(finite) > 1 else math.nan
        out.update(mean=mean, low=mean - half, high=mean + half, sd=sd)
    return out


def compare(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: final accuracy and effective groups (the learning signal the budget bought), their paired
    differences to stock, and the ratios of responses and seconds to reach stock's final accuracy, over the seeds
    where stock ran too (and, for CPU seconds, where both runs measured them)."""
    by = {(r["method"], r["seed"]): r for r in runs}
    methods = list(dict.fromkeys([STOCK] + [r["method"] for r in runs]))
    rows = {}
    for m in methods:
        seeds = sorted(s for (mm, s) in by if mm == m)
        both = [s for s in seeds if (STOCK, s) in by]
        row = {"seeds": seeds, "final": paired(by[m, s]["held_out_accuracy_after"] for s in seeds),
               "effective_groups": paired(by[m, s]["effective_groups"] for s in seeds),
               "d_effective_groups": paired(by[m, s]["effective_groups"] - by[STOCK, s]["effective_groups"]
                                            for s in both),
               "responses": paired(by[m, s]["responses_spent"] for s in seeds),
               "wall_s": paired(by[m, s]["held_out_curve"][-1]["seconds"] for s in seeds),
               "d_final": paired(by[m, s]["held_out_accuracy_after"] - by[STOCK, s]["held_out_accuracy_after"]
                                 for s in both),
               "endpoint": paired(endpoint(by[m, s]) for s in seeds),
               "d_endpoint": paired(endpoint(by[m, s]) - endpoint(by[STOCK, s]) for s in both),
               "spend_share": paired(by[m, s]["responses_spent"] / budget_of(by[m, s]) for s in seeds),
               "cut_after": paired(by[m, s]["held_out_curve"][-1]["truncated_share"] for s in seeds
                                   if "truncated_share" in by[m, s]["held_out_curve"][-1])}
        for axis in ("responses", "seconds", "cpu_seconds"):
            ratios = []
            for s in (s for s in both if all(axis in r["held_out_curve"][0] for r in (by[m, s], by[STOCK, s]))):
                target = by[STOCK, s]["held_out_accuracy_after"]
                stock = cost_to_reach(by[STOCK, s]["held_out_curve"], target, axis)
                if stock > 0:  # (0: the start checkpoint was already there, nothing to compare)
                    ratios.append(cost_to_reach(by[m, s]["held_out_curve"], target, axis) / stock)
            row[f"{axis}_to_target_ratio"] = paired(ratios)
        rows[m] = row
    return rows


def _interval(p: dict[str, Any], spec: str, scale: float = 1.0, sign: bool = False) -> str:
    if p["mean"] is None:
        return f"never ({p['n_inf']} of {p['n_inf']})" if p["n_inf"] else "-"
    s = f"{p['mean'] * scale:{'+' if sign else ''}{spec}}"
    if p["n"] > 1:
        s += f" [{p['low'] * scale:{'+' if sign else ''}{spec}}, {p['high'] * scale:{'+' if sign else ''}{spec}}]"
    return s + (f" ({p['n_inf']} of {p['n'] + p['n_inf']} never)" if p["n_inf"] else "")


def markdown_table(rows: dict[str, dict[str, Any]]) -> str:
    head = ("| method | seeds | endpoint % (mean at 50/75/100% of budget) | Δ endpoint vs stock (pp) | "
            "held-out accuracy % | Δ vs stock (pp) | responses to stock's final (× stock) | "
            "seconds to stock's final (× stock) | CPU seconds to stock's final (× stock) | responses | run s | "
            "effective groups | Δ effective groups vs stock | held-out cut at the cap, after % |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for m, r in rows.items():
        lines.append(f"| {method_recipe(m)[0] if m != STOCK else 'stock GRPO'} | {len(r['seeds'])} | "
                     f"{_interval(r['endpoint'], '.1f', 100)} | {_interval(r['d_endpoint'], '.1f', 100, True)} | "
                     f"{_interval(r['final'], '.1f', 100)} | {_interval(r['d_final'], '.1f', 100, True)} | "
                     f"{_interval(r['responses_to_target_ratio'], '.2f')} | "
                     f"{_interval(r['seconds_to_target_ratio'], '.2f')} | "
                     f"{_interval(r['cpu_seconds_to_target_ratio'], '.2f')} | {_interval(r['responses'], '.0f')} | "
                     f"{_interval(r['wall_s'], '.0f')} | {_interval(r['effective_groups'], '.0f')} | "
                     f"{_interval(r['d_effective_groups'], '.1f', sign=True)} | "
                     f"{_interval(r['cut_after'], '.1f', 100)} |")
    return "\n".join(lines)


def power_lines(rows: dict[str, dict[str, Any]], half_width: float = 0.04) -> list[str]:
    """Per method against stock: the paired SD of the endpoint and the seeds its 95% interval needs to be at most
    ±`half_width` (the benchmark's design target)."""
    out = []
    for m, r in rows.items():
        d = r["d_endpoint"]
        if m == STOCK or d["n"] < 2 or not math.isfinite(d["sd"]):
            continue
        half = (d["high"] - d["low"]) / 2
        out.append(f"{m}: Δ endpoint paired SD {100 * d['sd']:.1f} pp over {d['n']} seeds, 95% half-width "
                   f"{100 * half:.1f} pp; ±{100 * half_width:.0f} pp needs {seeds_for_half_width(d['sd'], half_width)}"
                   " seeds at this SD")
    return out


def sd_interval(sd: float, n: int) -> tuple[float, float]:
    """Two-sided 95% interval of a standard deviation `sd` measured over `n` values (chi-square, normal values)."""
    from scipy.stats import chi2

    return sd * math.sqrt((n - 1) / chi2.ppf(0.975, n - 1)), sd * math.sqrt((n - 1) / chi2.ppf(0.025, n - 1))


def sd_comparison_lines(rows: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]],
                        label: str = "this design", other_label: str = "the other") -> list[str]:
    """Did one design narrow the seed-to-seed spread? Per method in both and per paired difference to stock (the
    endpoint and the final accuracy): each design's paired SD with its 95% interval (`sd_interval`), and the
    two-sided F-test p-value of their variances' ratio."""
    from scipy.stats import f

    out = []
    for m in (m for m in rows if m != STOCK and m in other):
        for key, name in (("d_endpoint", "Δ endpoint"), ("d_final", "Δ final")):
            a, b = rows[m][key], other[m][key]
            if a["n"] < 2 or b["n"] < 2:
                continue
            (alo, ahi), (blo, bhi) = sd_interval(a["sd"], a["n"]), sd_interval(b["sd"], b["n"])
            ratio = (a["sd"] / b["sd"]) ** 2 if b["sd"] > 0 else math.inf
            p = min(1.0, 2 * min(f.cdf(ratio, a["n"] - 1, b["n"] - 1), f.sf(ratio, a["n"] - 1, b["n"] - 1)))
            out.append(f"{m}: {name} paired SD {100 * a['sd']:.1f} pp [{100 * alo:.1f}, {100 * ahi:.1f}] over "
                       f"{a['n']} seeds ({label}) against {100 * b['sd']:.1f} pp [{100 * blo:.1f}, {100 * bhi:.1f}] "
                       f"over {b['n']} ({other_label}); variance ratio {ratio:.2f}, F-test p = {p:.2g}")
    return out


def truncation_lines(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Does the token cap decide the comparison? Per seed, the methods by endpoint with the share of their last
    evaluation's held-out samples cut at the cap; over all runs with that share, its Spearman correlation with the
    endpoint and the correlation's two-sided permutation p-value (exact for up to 9 runs)."""
    from scipy.stats import PermutationMethod, pearsonr, rankdata

    runs = [r for r in runs if "truncated_share" in r["held_out_curve"][-1]]
    out = []
    for seed in sorted({r["seed"] for r in runs}):
        ranked = sorted((r for r in runs if r["seed"] == seed), key=endpoint, reverse=True)
        out.append(f"seed {seed}: " + " > ".join(
            f"{r['method']} {100 * endpoint(r):.1f}% (cut {100 * r['held_out_curve'][-1]['truncated_share']:.0f}%)"
            for r in ranked))
    if len(runs) > 2:
        test = pearsonr(rankdata([endpoint(r) for r in runs]),
                        rankdata([r["held_out_curve"][-1]["truncated_share"] for r in runs]),
                        method=PermutationMethod(random_state=0))
        out.append(f"endpoint vs the last evaluation's cut share over {len(runs)} runs: Spearman "
                   f"{test.statistic:+.2f} (permutation p = {test.pvalue:.2g})")
    return out


def mean_curve(runs: Sequence[dict[str, Any]], shares: Sequence[float]) -> list[float]:
    """The runs' mean held-out accuracy at each share of their budget (`accuracy_at`: linear between evaluations,
    a run that spent less read at its own spend), so methods whose evaluations fall at other spends are averaged
    at the same points."""
    return [statistics.fmean(accuracy_at(r["held_out_curve"], share * budget_of(r)) for r in runs)
            for share in shares]


def plot_curves(runs: Sequence[dict[str, Any]], path: str) -> str:
    """Held-out accuracy against responses (left: each run thin, each method's mean over its seeds thick, at
    eighths of the budget) and against the run's seconds (right), a colour per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in runs))
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labelled = set()  # the right panel names each method once; the left names the means
    for r in runs:
        curve = r["held_out_curve"]
        for ax, axis in zip(axes, ("responses", "seconds")):
            label = r["method"] if axis == "seconds" and r["method"] not in labelled else None
            labelled.update([label] if label else [])
            ax.plot([p[axis] for p in curve], [100 * p["accuracy"] for p in curve], marker=".", lw=0.8, alpha=0.45,
                    color=colours[r["method"]], label=label)
    shares = [i / 8 for i in range(9)]
    for m in methods:
        mine = [r for r in runs if r["method"] == m]
        budget = statistics.fmean(budget_of(r) for r in mine)
        axes[0].plot([s * budget for s in shares], [100 * a for a in mean_curve(mine, shares)], lw=2.5,
                     color=colours[m], label=f"{m}: mean of {len(mine)} seed{'s' if len(mine) > 1 else ''}")
    for ax, label in zip(axes, ("responses spent", "run seconds (generation + training)")):
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy %")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["ENDPOINT_SHARES", "accuracy_at", "code_commit", "compare", "cost_to_reach", "endpoint", "held_out_details",
           "load_runs", "markdown_table", "mean_curve", "method_flags", "paired", "plot_curves", "power_lines",
           "run_one", "sd_comparison_lines", "sd_interval", "seeds_for_half_width", "truncation_lines",
           "write_record"]
