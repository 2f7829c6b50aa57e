"""End-of-run allocation plots and summary (`output_dir/allocation/`): spend per round vs uniform,
effective-group rate, exposure distribution, head calibration when ARROL is on."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def summarize(history: Sequence[Mapping[str, Any]], exposure: ArrayLike, budget_responses: int,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's allocation summary from per-round records (dicts with `responses`, `groups`,
    `effective_groups`, `tokens`) and per-prompt exposure (responses per prompt)."""
    spend = np.array([h.get("responses", 0) for h in history], float)
    groups = np.array([h.get("groups", 0) for h in history], float)
    eff = np.array([h.get("effective_groups", 0) for h in history], float)
    exposure = np.asarray(exposure, float)
    rounds = len(history)
    uniform = budget_responses / rounds if rounds else 0.0
    gap = np.cumsum(spend) - uniform * np.arange(1, rounds + 1)
    out = {
        "rounds": rounds,
        "budget_responses": int(budget_responses),
        "responses_spent": int(spend.sum()),
        "responses_remaining": int(budget_responses - spend.sum()),
        "tokens_spent": int(sum(h.get("tokens", 0) for h in history)),
        "groups": int(groups.sum()),
        "effective_groups": int(eff.sum()),
        "effective_group_rate": float(eff.sum() / groups.sum()) if groups.sum() else 0.0,
        "responses_per_effective_group": float(spend.sum() / eff.sum()) if eff.sum() else None,
        "max_abs_pacing_gap": float(np.abs(gap).max()) if rounds else 0.0,
        "pool_prompts": int(exposure.size),
        "prompts_seen": int((exposure > 0).sum()),
        "exposure_quantiles": {str(q): float(np.quantile(exposure, q)) for q in (0.5, 0.9, 0.99, 1.0)}
        if exposure.size else {},
        "truncated_share": float(sum(h.get("truncated", 0) for h in history) / spend.sum()) if spend.sum() else 0.0,
        "prompts_trained": len({p for h in history for p in h.get("trained_pids", ())}),
        "prompts_with_signal": len({p for h in history for p in h.get("signal_pids", ())}),
        "engine_mismatch": _mismatch(history),
    }
    out.update(extra or {})
    return out


def _mismatch(history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The run's engine-trainer mismatch from its rounds' (trainer/metrics.py `MISMATCH_RECORD`): the largest
    |Δ log-prob|, the other figures averaged over the rounds that trained."""
    out = {}
    for key in ("logp_difference_mean", "logp_difference_max", "is_capped_share", "is_ratio_p05", "is_ratio_p50",
                "is_ratio_p95"):
        values = [h[key] for h in history if key in h]
        if values:
            out[key] = float(max(values) if key.endswith("max") else np.mean(values))
    return out


def write_allocation_report(output_dir: str | os.PathLike, history: list[dict[str, Any]], exposure: ArrayLike,
                            budget_responses: int, extra: Mapping[str, Any] | None = None,
                            calibration: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """Write `summary.json` and the PNG plots; returns the summary. `calibration` (optional):
    dict with `predicted` and `observed` positive rates per score bin."""
    folder = os.path.join(output_dir, "allocation")
    os.makedirs(folder, exist_ok=True)
    summary = summarize(history, exposure, budget_responses, extra)
    summary["plots"] = _plot(folder, history, np.asarray(exposure, float), budget_responses, calibration)
    with open(os.path.join(folder, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({**summary, "per_round": history}, f, indent=1, default=float)
    return summary


def update_summary(output_dir: str | os.PathLike, updates: Mapping[str, Any]) -> dict[str, Any]:
    """Add `updates` (e.g. held-out accuracy) to `output_dir/allocation/summary.json`; returns the whole file."""
    path = os.path.join(output_dir, "allocation", "summary.json")
    with open(path, encoding="utf-8") as f:
        full = json.load(f)
    full.update(updates)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(full, f, indent=1, default=float)
    os.replace(path + ".tmp", path)
    return full


def _plot(folder, history, exposure, budget_responses, calibration):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    rounds = np.arange(1, len(history) + 1)
    spend = np.array([h.get("responses", 0) for h in history], float)

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(os.path.join(folder, name), dpi=100)
        plt.close(fig)
        written.append(name)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(rounds, np.cumsum(spend), label="spent")
    ax.plot(rounds, budget_responses / max(len(history), 1) * rounds, "--", label="uniform spending")
    ax.set(xlabel="round", ylabel="responses (cumulative)", title="Spend per round vs uniform")
    ax.legend()
    save(fig, "spend.png")

    groups = np.array([h.get("groups", 0) for h in history], float)
    eff = np.array([h.get("effective_groups", 0) for h in history], float)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(rounds, np.divide(eff, groups, out=np.zeros_like(eff), where=groups > 0), marker=".")
    ax.set(xlabel="round", ylabel="effective / groups", ylim=(0, 1.05), title="Effective-group rate")
    save(fig, "effective_group_rate.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(exposure, bins=min(30, max(int(exposure.max()) + 1, 2)) if exposure.size else 2)
    ax.set(xlabel="responses per prompt over the run", ylabel="prompts", title="Exposure distribution")
    save(fig, "exposure.png")

    if calibration:
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.plot([0, 1], [0, 1], "k--", lw=0.8)
        ax.plot(calibration["predicted"], calibration["observed"], "o-")
        ax.set(xlabel="head's calibrated q", ylabel="observed success rate", title="Quality-head calibration")
        save(fig, "head_calibration.png")
    return written
