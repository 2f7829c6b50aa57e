"""The trainer's pruning stage behind ARROL's gate (docs/arrol.md, "The gate"): constructed hidden states with and
without a signal the quality head can learn, through `RolloutPruner` as the trainer drives it (decide, record,
end_round), and a head started from a file (`quality_head_init`)."""

import numpy as np
import pytest
import torch
from helpers import make_args

from trl_alloc.rollout.pruning import RolloutPruner
from trl_alloc.rollout.quality_head import QualityHead

H, GROUPS, K = 8, 8, 8
GATED = dict(pacing="uniform", filling="full", pruning="arrol", detect_length=2, max_completion_length=6,
             cold_start_rounds=2, head_hidden_size=16, head_learning_rate=3e-2, survival_slope=1.0, num_generations=K,
             per_device_train_batch_size=GROUPS * K)


def run(tmp_path, signal: bool, rounds: int = 40, **kw):
    """`rounds` rounds of 64 eligible rollouts; success is x[0] > 0.67 (signal) or a coin of the same rate, 0.25."""
    pruner = RolloutPruner(make_args(str(tmp_path), **{**GATED, **kw}), hidden_size=H, seed=0)
    rng = np.random.default_rng(0)
    logs, rates = [], []
    for _ in range(rounds):
        groups = np.repeat(np.arange(GROUPS), K)
        x = rng.normal(size=(GROUPS * K, H)).astype(np.float32)
        y = x[:, 0] > 0.67 if signal else rng.random(GROUPS * K) < 0.25
        cut = set(pruner.decide(groups, range(len(groups)), list(x)))
        pruner.record([{"pid": int(g), "success": float(y[i]), "completion_ids": [5] * 6, "pruned": i in cut}
                       for i, g in enumerate(groups)])
        rates.append(y.mean())
        logs.append(pruner.end_round())
    return pruner, logs, np.array(rates)


def test_gate_stays_closed_for_a_head_without_signal(tmp_path):
    pruner, logs, _ = run(tmp_path, signal=False)
    assert pruner.totals["pruned"] == 0 and all(x["pruning/pruned"] == 0 for x in logs)
    assert all(x["arrol/gate_open"] == 0.0 for x in logs)
    assert max(x.get("arrol/auc_heldout", 0.5) for x in logs[10:]) < 0.6
    assert logs[-1]["arrol/heldout_samples"] > 300  # a fifth of 40 x 64, the window not yet full
    notes = pruner.take_notices()
    assert len(notes) == 1 and notes[0].startswith("ARROL pruning is off") and "pruning_min_auc=0" in notes[0]
    report = pruner.report()
    assert report["gate"]["open"] is False and report["gate"]["min_auc"] == 0.7


def test_gate_opens_for_a_learnable_signal_and_pruning_then_favours_successes(tmp_path):
    pruner, logs, rates = run(tmp_path, signal=True)
    opened = [i for i, x in enumerate(logs) if x["arrol/gate_open"]]
    assert opened and logs[opened[0]]["arrol/auc_heldout"] >= 0.7  # the default pruning_min_auc
    assert pruner.totals["pruned"] > 0
    assert all(x["pruning/pruned"] == 0 for x in logs[:opened[0] + 1])  # nothing pruned before it opened
    after = [x for x in logs[opened[0] + 1:] if x["pruning/pruned"]]
    survivors = np.mean([x["pruning/survivor_positive_ratio"] for x in after])
    assert survivors >= 1.2 * rates.mean()  # mostly-failing groups keep their likely successes (auto direction)
    assert any(n.startswith("ARROL pruning is on") for n in pruner.take_notices())


def test_held_out_rollouts_are_never_pruned_nor_trained_on(tmp_path):
    pruner = RolloutPruner(make_args(str(tmp_path), **{**GATED, "pruning_min_auc": 0.0, "cold_start_rounds": 0}),
                           hidden_size=H, seed=0)
    assert not pruner.policy.hold_out(64).any()  # gate off: no slice held out, every rollout trains the head
    gated = RolloutPruner(make_args(str(tmp_path), **GATED), hidden_size=H, seed=0)
    gated.policy.gate.min_auc, gated.policy.rounds = 1e-9, 2  # open on any evidence, past the cold start
    y = np.array([0, 1] * 20)
    gated.policy.gate.observe(y + np.linspace(0, 0.1, 40), y, np.repeat(np.arange(10), 4))
    assert gated.active
    x = np.random.default_rng(1).normal(size=(64, H)).astype(np.float32)
    cut = set(gated.decide(np.repeat(np.arange(8), 8), range(64), list(x)))
    held = {k for k, v in gated._scored.items() if v[2] is not None}
    assert cut and held and not cut & held
    gated.record([{"pid": i // 8, "success": float(i % 2), "completion_ids": [5] * 6, "pruned": i in cut}
                  for i in range(64)])
    assert len(gated._heldout) == len(held) and len(gated._train) == 64 - len(cut) - len(held)


def test_head_starts_from_a_saved_one(tmp_path):
    torch.manual_seed(3)
    saved = QualityHead(H, 16, detect_length=2, base_model="probe")
    saved.save_pretrained(tmp_path / "head")
    pruner = RolloutPruner(make_args(str(tmp_path), **GATED, quality_head_init=str(tmp_path / "head")),
                           hidden_size=H, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(pruner.head.state_dict().values(), saved.state_dict().values()))
    with pytest.raises(ValueError, match="hidden states of size 8"):
        RolloutPruner(make_args(str(tmp_path), **GATED, quality_head_init=str(tmp_path / "head")), hidden_size=16)
    with pytest.raises(ValueError, match="not a QualityHead folder"):
        make_args(str(tmp_path), **GATED, quality_head_init=str(tmp_path))
