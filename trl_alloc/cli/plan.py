"""Plan a run before renting GPUs: the real schedulers, no model, on a pool whose difficulty drifts.

Defaults are the CERO paper's scale: 8,699 prompts, K = 500 rounds, 256,000 responses, 8 per admitted
prompt (g = 4, N_max = 2), C = 132 units. Prints a table per allocator (budget spent, effective
groups, EGR, responses per effective group, pacing gap, scheduler ms/round, selection lift) and
writes plan.json and PNG plots to --output_dir.

Then the same fillers on the engine model, a simulated vLLM engine (`rollout.engine_model`: continuous batching of
--engine_seqs sequences, one decode step of --step_ms per token, response lengths lognormal with median
--length_median under the papers' 2,048-token cap), for the first --engine_rounds rounds, synchronous
(each call waits for its longest rollout) and as events: engine seconds per round, responses, tokens and
GPU-seconds per effective group, and the idle share of the engine. GPU-hours, not responses. The trainer
is in the loop: a round trains for its trained tokens × --train_ms_per_token / --train_gpus, then pushes
its weights (--sync_s); synchronous and event rounds leave the engine idle meanwhile, the stream rows
(rollout_mode="stream": carry-over, the next round generating while this one trains, --engine_staleness
bounds) keep it decoding. GPU-seconds count every GPU, training ones included. With --colocate, one GPU
generates and trains in turn (TRL's colocate mode): nothing overlaps, and the stream rows only carry what
runs past a round's groups. The --engine_prune methods run once more with pruning in the stream at
--detect_length tokens (random at κ = --prune_keep: the compute ARROL's aborts free, without the head's
selection).
"""

from __future__ import annotations

import argparse
import json
import os
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trl_alloc.allocation.config import allocation_field_specs
from trl_alloc.allocation.registry import method_class, registered_hyperparameters
from trl_alloc.allocation.simulate import in_workers, plan_config, simulate


def plot(results: dict[str, tuple[dict[str, Any], dict[str, list]]], args: argparse.Namespace, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    per_round = args.budget / args.rounds
    for name, (summary, rec) in results.items():
        spend = np.asarray(rec["spend"])
        ax[0, 0].plot(spend, lw=0.8, label=name)
        ax[0, 1].plot(np.cumsum(spend) - per_round * np.arange(1, spend.size + 1), label=name)
        eff = np.convolve(rec["effective"], np.ones(25) / 25, "valid")
        grp = np.convolve(rec["groups"], np.ones(25) / 25, "valid")
        ax[1, 0].plot(eff / np.maximum(grp, 1e-9), label=name)
        if summary["selection_lift_by_predicted_success"]:
            ax[1, 1].plot(np.linspace(0.1, 0.9, 5), summary["selection_lift_by_predicted_success"], "o-", label=name)
    ax[0, 0].axhline(per_round, color="k", ls="--", lw=0.8)
    ax[0, 0].set(title="responses spent per round (dashed: uniform)", xlabel="round")
    ax[0, 1].set(title="cumulative pacing gap vs uniform spending", xlabel="round", ylabel="responses")
    ax[1, 0].set(title="effective-group rate (25-round mean)", xlabel="round")
    ax[1, 1].axhline(1, color="k", ls="--", lw=0.8)
    ax[1, 1].set(title="selection lift by predicted success (1 = pool share)", xlabel="predicted success bin")
    for a in ax.flat:
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def engine_runs(args: argparse.Namespace) -> dict[str, tuple[Callable[..., Any], tuple]]:
    """The engine model's runs of the comparison (module docstring), by row name: `simulate_engine` and its
    arguments."""
    from trl_alloc.rollout.engine_model import simulate_engine

    methods = [m for m in args.engine_methods.split(",") if m]
    if not methods:
        return {}
    staleness = [int(x) for x in str(args.engine_staleness).split(",") if x]
    runs = {}
    for method in methods:
        for mode in ("sync",) if "+" not in method else ("sync", "events"):  # full groups: one call either way
            runs[f"{method} {mode}"] = (method, mode, None, None)
        for s in staleness:
            runs[f"{method} stream (max_staleness {s})"] = (method, "stream", None, s)
    for method in [m for m in args.engine_prune.split(",") if m]:
        runs[f"{method} events + pruning"] = (method, "events", args.prune_keep, None)
        for s in staleness[-1:]:
            runs[f"{method} stream + pruning (max_staleness {s})"] = (method, "stream", args.prune_keep, s)
    return {name: (simulate_engine, (method, mode, argparse.Namespace(**{**vars(args), "max_staleness": s or 1}),
                                     args.engine_rounds, keep))
            for name, (method, mode, keep, s) in runs.items()}


def engine_table(args: argparse.Namespace, rows: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The engine-model comparison (module docstring): its rows (`engine_runs`, run here unless given), printed as
    its table."""
    if rows is None:
        rows = in_workers(engine_runs(args), 1)
    if not rows:
        return {}
    colocate = getattr(args, "colocate", False)  # (a caller's namespace may predate --colocate)
    gpus = 1 if colocate else args.gpus_per_engine + args.train_gpus
    overcommit, window = plan_config("uniform+sara", args).sara_overcommit, plan_config("uniform", args).rollout_window
    print(f"\nengine model: {args.engine_seqs} sequences, {args.step_ms:g} ms/step (+ "
          f"{getattr(args, 'step_ms_per_seq', 0.0):g} ms per "
          f"running sequence), lengths median "
          f"{args.length_median:g} (σ {args.length_sigma:g}) cut at {args.max_tokens}, window {window} "
          f"(--rollout_max_inflight, else a round's responses, as the trainer), "
          f"first {args.engine_rounds} rounds; training {args.train_ms_per_token:g} ms per trained token on each of "
          f"{args.train_gpus} GPUs, weight push {args.sync_s:g} s; SARA's overcommit {overcommit:g}; "
          f"GPU-s = wall × {gpus} GPUs"
          f"{' (colocate: one GPU generates and trains in turn)' if colocate else ''}; pruning: random at "
          f"κ = {args.prune_keep:g} at {args.detect_length} tokens")
    cols = ("s/round", "train s/round", "GPU-s/eff", "GPU-s/signal", "responses/eff", "tokens/eff", "aborted",
            "carried", "stale", "pruned", "idle")
    print(f"{'method':<46}" + "".join(f"{c:>14}" for c in cols))
    for name, r in rows.items():
        eff, n = max(r["effective_groups"], 1), max(r["rounds"], 1)
        r.update({"s_per_round": r["engine_s"] / n, "train_s_per_round": r["train_s"] / n,
                  "responses_per_eff": r["responses"] / eff, "tokens_per_eff": r["tokens"] / eff,
                  "gpu_s_per_eff": r["engine_s"] * gpus / eff,
                  "gpu_s_per_signal": r["engine_s"] * gpus / r["signal"] if r["signal"] else float("inf")})
        vals = (r["s_per_round"], r["train_s_per_round"], r["gpu_s_per_eff"], r["gpu_s_per_signal"],
                r["responses_per_eff"],
                r["tokens_per_eff"], r["aborted"], r["carried"], r["stale_aborted"], r["pruned"], r["idle"])
        print(f"{name:<46}" + "".join(f"{v:>14.2f}" if isinstance(v, float) else f"{v:>14}" for v in vals))
    for name, r in rows.items():
        if "stream" in name:
            print(f"  staleness of trained rollouts (their oldest token), {name}: {r['staleness']}; "
                  f"of trained tokens: {r['token_staleness']}")
    return rows


PLAN_OWN = {"pacing", "filling", "pruning", "rollout_budget", "num_rounds", "max_staleness", "unit_size", "max_units",
            "round_capacity"}  # set by the plan itself: --methods, --budget, --rounds, --engine_staleness, the shape


def _flag_type(kind: Any) -> Any:
    """How the command line's text becomes a value of a field of type `kind` (the declarations check the rest)."""
    kinds = set(typing.get_args(kind)) if isinstance(kind, types.UnionType) else {kind}
    if bool in kinds:
        return lambda text: {"true": True, "false": False}.get(text.lower(), text)
    if int in kinds:
        return int
    if float in kinds:
        return _number_or_text
    return str


def _number_or_text(text: str) -> float | str:
    """A number, or the text a field also takes (tau_low's 'auto')."""
    try:
        return float(text)
    except ValueError:
        return text


def add_allocation_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for every allocation field the plan does not set itself (allocation/config.py: the fields
    AllocGRPOConfig has, from the methods' declarations), unset by default: the run then has the trainer's defaults."""
    group = parser.add_argument_group("allocation settings (AllocGRPOConfig's fields; unset: the trainer's defaults)")
    for name, kind, spec in allocation_field_specs():
        if name in PLAN_OWN or f"--{name}" in parser._option_string_actions:
            continue
        group.add_argument(f"--{name}", type=_flag_type(kind), default=None,
                           help=f"{spec.metadata.get('help', '')} (trainer's default: {spec.default!r})")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Clear errors for settings no plan can have (argparse's usage line, exit status 2)."""
    for name in ("prompts", "rounds", "budget", "unit_size", "units_per_group", "capacity", "engine_seqs",
                 "max_tokens", "gpus_per_engine"):
        if getattr(args, name) is not None and getattr(args, name) < 1:  # (capacity None: the trainer's)
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    for name in ("step_ms", "step_ms_per_seq", "train_ms_per_token", "sync_s", "length_median", "length_sigma",
                 "engine_rounds", "train_gpus"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0, got {getattr(args, name)}.")
    k = args.unit_size * args.units_per_group
    if args.budget < k * args.rounds:
        parser.error(f"--budget ({args.budget} responses) is less than one group of {k} per round over --rounds "
                     f"{args.rounds} ({k * args.rounds}); raise --budget or lower --rounds.")
    for method in [m for m in args.methods.split(",") + args.engine_methods.split(",") if m]:
        for stage, name in zip(("pacing", "filling"), method.split("+", 1)):
            try:
                method_class(stage, name)
            except ValueError as err:
                parser.error(f"--methods {method!r}: {err}")
        try:  # the trainer's config checks every value the plan gives it
            plan_config(method, args).check_budget(args.rounds)
        except (TypeError, ValueError) as err:
            parser.error(str(err))
    for group in registered_hyperparameters().values():  # a value is checked by its declaration, whichever method
        for h in group:                                    # reads it
            if getattr(args, h.name, None) is not None:
                try:
                    h.check(getattr(args, h.name))
                except (TypeError, ValueError) as err:
                    parser.error(str(err))
    if not 0 < args.prune_keep <= 1:
        parser.error(f"--prune_keep must lie in (0, 1], got {args.prune_keep}.")


def make_parser() -> argparse.ArgumentParser:
    """plan.py's flags: the plan's own (pool, budget, engine), then every allocation field (`add_allocation_flags`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=None, help="prompts in the pool (default: the paper's 8,699; "
                        "with --model/--dataset: the probed ones)")
    parser.add_argument("--rounds", type=int, default=None, help="K (default: the paper's 500; on your pool: 40)")
    parser.add_argument("--budget", type=int, default=None, help="global budget in responses (default: the paper's "
                        "256,000; on your pool: rounds x max(1, prompts / 16) x k)")
    parser.add_argument("--unit_size", type=int, default=4, help="g: responses per allocation unit")
    parser.add_argument("--units_per_group", type=int, default=2, help="N_max")
    parser.add_argument("--capacity", type=int, default=None,
                        help="C: units per round (default: the paper's 132; on your pool: the trainer's)")
    data = parser.add_argument_group("plan on your own model and data (a probe pass first; docs/benchmarks.md, "
                                     "'Planning on your own pool')")
    data.add_argument("--model", default=None, help="the base model: a folder, a Hub id, smollm2-135m-instruct or "
                      "`tiny` (a built-in task's)")
    data.add_argument("--dataset", default=None, help="the prompt pool, as train.py takes it (a local .jsonl/.json/"
                      ".parquet/.csv, a Hub dataset, builtin:...)")
    data.add_argument("--probe_file", default=None, help="a probe.json an earlier plan wrote, instead of probing")
    data.add_argument("--probe_prompts", type=int, default=64, help="prompts the probe samples (seeded)")
    data.add_argument("--probe_k", type=int, default=8, help="responses per probed prompt")
    data.add_argument("--probe_max_tokens", type=int, default=256, help="the probe's response cap (tokens)")
    data.add_argument("--probe_temperature", type=float, default=1.0)
    data.add_argument("--probe_backend", default="auto", choices=["auto", "vllm", "transformers"],
                      help="auto: a vLLM engine in this process where vLLM is installed")
    data.add_argument("--builtin_levels", type=int, nargs="+", default=None, help="a built-in task's levels")
    data.add_argument("--plan_seeds", type=int, default=3, help="seeds each method runs on the pool (the spread)")
    data.add_argument("--drift_from", default=None, help="the output_dir of a stock run (pacing uniform, filling "
                      "full) on this pool: the pool's drift is fitted to its per-round successes (default: static)")
    parser.add_argument("--drift", type=float, default=1.5, help="logit drift of the pool over the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="uniform,cero,cero_fixed,cero_preset,cero_greedy,random_matched,"
                        "knapsack,uniform+sara,cero+sara,uniform+dynamic_sampling")
    parser.add_argument("--engine_methods", default="uniform,uniform+dynamic_sampling,uniform+sara,cero+sara",
                        help="methods run on the engine model ('' skips it)")
    parser.add_argument("--engine_prune", default="uniform,cero+sara",
                        help="methods also run as events with pruning in the stream (random at --prune_keep)")
    parser.add_argument("--prune_keep", type=float, default=0.5, help="κ: share of the eligible rollouts kept")
    parser.add_argument("--detect_length", type=int, default=512, help="the detection point (tokens)")
    parser.add_argument("--engine_rounds", type=int, default=30)
    parser.add_argument("--engine_seqs", type=int, default=256, help="sequences decoded at once (max_num_seqs)")
    parser.add_argument("--step_ms", type=float, default=25.0,
                        help="one decode step of the engine (default: Llama-3.1-8B on one H100 with vLLM 0.6, 256 "
                        "sequences: median TPOT 25.6 ms, docs/benchmarks.md)")
    parser.add_argument("--step_ms_per_seq", type=float, default=0.0,
                        help="added per running sequence (a CPU: `scripts/bench_rollout.py --calibrate` fits both)")
    parser.add_argument("--engine_profile", default=None,
                        help="a bench_rollout.json written by `scripts/bench_rollout.py --calibrate` on your engine: "
                        "its fitted decode step sets --step_ms and --step_ms_per_seq")
    parser.add_argument("--length_median", type=float, default=700.0)
    parser.add_argument("--length_sigma", type=float, default=0.6)
    parser.add_argument("--max_tokens", type=int, default=2048)
    parser.add_argument("--gpus_per_engine", type=int, default=1, help="generation GPUs (one vLLM engine)")
    parser.add_argument("--train_gpus", type=int, default=8, help="training GPUs (0: generation only)")
    parser.add_argument("--train_ms_per_token", type=float, default=0.55,
                        help="training ms per trained token on one GPU (old log-probs + update; docs/benchmarks.md)")
    parser.add_argument("--sync_s", type=float, default=1.0, help="one weight push to the engine (s)")
    parser.add_argument("--colocate", action="store_true",
                        help="TRL's colocate mode: one GPU generates and trains in turn (sets --train_gpus 1 and "
                        "--gpus_per_engine 1; the engine is paused while the trainer trains, also in stream rows)")
    parser.add_argument("--engine_staleness", default="1,2",
                        help="max_staleness values of the stream rows ('' skips them)")
    parser.add_argument("--output_dir", default="outputs/plan")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="processes the runs share (default: one per core; the figures do not depend on it)")
    add_allocation_flags(parser)
    return parser


PAPER_SHAPE = {"prompts": 8699, "rounds": 500, "budget": 256_000, "capacity": 132}  # arXiv 2610.09679 App. G


def paper_shape(args: argparse.Namespace) -> argparse.Namespace:
    """The CERO paper's pool, rounds, budget and capacity where the command line gave none (the synthetic plan)."""
    for name, value in PAPER_SHAPE.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def apply_engine_profile(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--engine_profile: the decode step `bench_rollout.py --calibrate` fitted on the user's engine (a + b × running
    sequences) as --step_ms and --step_ms_per_seq."""
    if not args.engine_profile:
        return
    try:
        with open(args.engine_profile, encoding="utf-8") as f:
            fit = json.load(f).get("calibration") or {}
        args.step_ms, args.step_ms_per_seq = 1e3 * float(fit["a_s"]), 1e3 * float(fit["b_s"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        parser.error(f"--engine_profile {args.engine_profile}: no decode-step fit in it ({err!r}); write one with "
                     "`python scripts/bench_rollout.py --calibrate --output_dir DIR` (DIR/bench_rollout.json).")


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    parser = make_parser()
    args = parser.parse_args(argv)
    apply_engine_profile(parser, args)
    if args.model or args.dataset or args.probe_file:
        return plan_on_your_pool(parser, args)
    paper_shape(args)
    check_args(parser, args)
    if args.colocate:
        args.train_gpus = args.gpus_per_engine = 1
    os.makedirs(args.output_dir, exist_ok=True)
    methods = [m for m in args.methods.split(",") if m]
    replays = {m: getattr(method_class("pacing", m.partition("+")[0]), "replays", None) for m in methods}
    for source in {r for r in replays.values() if r and r not in methods}:
        methods.insert(0, source)  # random_matched replays a CERO run's allocation log
    # every run at once over --workers processes, the engine model's too; a replaying method after its source
    tasks = {("pool", m): (simulate, (m, args)) for m in methods if not replays.get(m)}
    tasks.update({("engine", name): task for name, task in engine_runs(args).items()})
    done = in_workers(tasks, args.workers)
    for method in [m for m in methods if replays.get(m)]:
        done[("pool", method)] = simulate(method, args, done[("pool", replays[method])][2])
    results = {m: done[("pool", m)][:2] for m in methods}  # printed in the order given
    cols = ["rounds", "responses_spent", "budget_left", "effective_groups", "egr", "responses_per_effective_group",
            "max_abs_pacing_gap", "scheduler_ms_per_round"]
    print(f"{'method':<26}" + "".join(f"{c[:14]:>15}" for c in cols) + "  selection lift (bins of q)")
    for name, (s, _) in results.items():
        vals = "".join(f"{s[c]:>15.3f}" if isinstance(s[c], float) else f"{s[c]:>15}" for c in cols)
        print(f"{name:<26}{vals}  {s['selection_lift_by_predicted_success']}")
    engine = engine_table(args, {name: row for (kind, name), row in done.items() if kind == "engine"})
    with open(os.path.join(args.output_dir, "plan.json"), "w") as f:
        json.dump({"settings": vars(args), "configs": {m: plan_config(m, args).allocation_settings() for m in
                                                       dict.fromkeys(methods + args.engine_methods.split(",")) if m},
                   "results": {k: {"summary": s, "per_round": r}
                                                       for k, (s, r) in results.items()}, "engine": engine}, f)
    plot(results, args, os.path.join(args.output_dir, "plan.png"))
    print(f"wrote {args.output_dir}/plan.json and plan.png")


def plan_on_your_pool(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """A probe pass of `--model` over `--dataset` (or `--probe_file`), then every method on that pool
    (`benchmarks.pool_plan`): the table with its spread over seeds, one recommendation, plan.json, plan.png and the
    probe's `probe_counts.json` (what `train.py --probe_counts` starts CERO from)."""
    from trl_alloc.benchmarks import pool_plan
    from trl_alloc.benchmarks.probe import pool_summary, probe_pool, write_probe_counts

    if args.probe_file:
        with open(args.probe_file, encoding="utf-8") as f:
            probe = json.load(f)
    elif not (args.model and args.dataset):
        parser.error("a plan on your pool needs both --model and --dataset (or --probe_file).")
    else:
        if args.probe_prompts < 1 or args.probe_k < 2:
            parser.error("--probe_prompts must be >= 1 and --probe_k >= 2 (one response says nothing of a group).")
        probe = probe_pool(args.model, args.dataset, k=args.probe_k, num_prompts=args.probe_prompts,
                           max_tokens=args.probe_max_tokens, temperature=args.probe_temperature, seed=args.seed,
                           backend=args.probe_backend, levels=args.builtin_levels)
    os.makedirs(args.output_dir, exist_ok=True)
    write_probe_counts(probe, os.path.join(args.output_dir, "probe.json"))
    write_probe_counts({key: probe[key] for key in ("prompts", "successes", "failures")},
                       os.path.join(args.output_dir, "probe_counts.json"))
    summary = pool_summary(probe["successes"], probe["failures"])
    k = args.unit_size * args.units_per_group
    pool_plan.pool_shape(args, len(probe["successes"]), k)
    args.length_median, args.max_tokens = max(probe["length_median"], 1.0), probe["max_tokens"]
    if args.colocate:
        args.train_gpus = args.gpus_per_engine = 1
    check_args(parser, args)
    plan = pool_plan.plan_on_pool(args, probe, args.plan_seeds)
    text = pool_plan.markdown(probe, summary, plan, args)
    print(text)
    with open(os.path.join(args.output_dir, "plan.json"), "w", encoding="utf-8") as f:
        json.dump({"settings": vars(args), "probe": {k_: v for k_, v in probe.items() if k_ != "prompts"},
                   "pool": summary, **plan}, f, indent=1, default=float)
    with open(os.path.join(args.output_dir, "plan.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    plot_pool(summary, plan, os.path.join(args.output_dir, "plan.png"))
    print(f"wrote {args.output_dir}/plan.json, plan.md, plan.png, probe_counts.json (train.py --probe_counts)")
    return plan


def plot_pool(summary: dict[str, Any], plan: dict[str, Any], path: str) -> None:
    """The probed success rates (left) and each setting's cost with its spread over seeds (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    edges = np.asarray(summary["edges"])
    ax[0].bar(edges[:-1], summary["histogram"], width=np.diff(edges), align="edge", edgecolor="k")
    ax[0].set(title="probed success rate per prompt", xlabel="success rate", ylabel="prompts")
    rows = plan["engine"] or plan["rows"]
    key = "gpu_s_per_signal" if plan["engine"] else "responses_per_effective_group"
    names = list(rows)
    means = [rows[n][key]["mean"] for n in names]
    err = np.array([[m - rows[n][key]["min"] for n, m in zip(names, means)],
                    [rows[n][key]["max"] - m for n, m in zip(names, means)]])
    ax[1].barh(names, means, xerr=err, color=["C1" if n == plan["recommendation"]["setting"] else "C0"
                                                for n in names])
    ax[1].set(title=key.replace("_", " ") + " (min-max over seeds)", xlabel=key.replace("_", " "))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
