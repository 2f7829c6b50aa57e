"""ARROL's gate (docs/arrol.md, "The gate"): pruning only behind a head whose held-out AUC within groups clears a
threshold."""

import json

import numpy as np
import pytest

from trl_alloc.allocation.arrol import ARROLPruning, AUCGate, RandomPruning, binary_auc


def groups_of(n_groups, k=8):
    return np.repeat(np.arange(n_groups), k)


def test_gate_opens_for_a_within_group_signal_and_reports_its_figures():
    gate = AUCGate(min_auc=0.6, window=256, min_groups=8)
    rng = np.random.default_rng(0)
    g = groups_of(32)
    y = rng.random(g.size) < 0.3
    scores = y + rng.normal(0, 0.8, g.size)
    gate.observe(scores, y, g)
    f = gate.figures()
    assert f["open"] and gate.is_open and f["rollouts"] == 256
    mixed = [k for k in range(32) if 0 < y[g == k].sum() < 8]
    assert f["mixed_groups"] == len(mixed)
    pairs = [(y[g == k].sum() * (8 - y[g == k].sum()), binary_auc(scores[g == k], y[g == k])) for k in mixed]
    assert f["auc"] == pytest.approx(sum(w * a for w, a in pairs) / sum(w for w, _ in pairs))
    assert f["pooled_auc"] == binary_auc(scores, y) and f["p_value"] < 1e-6
    assert "open" in gate.reason() and "0.6" in gate.reason()


def test_ranking_prompts_against_each_other_does_not_open_it():
    """A head that knows which prompts are hard has a high pooled AUC and nothing to offer inside a group."""
    rng = np.random.default_rng(1)
    g = groups_of(64)
    rate = rng.beta(0.7, 1.5, 64)[g]
    y = rng.random(g.size) < rate
    gate = AUCGate(min_auc=0.6, window=512)
    gate.observe(rate + rng.normal(0, 0.01, g.size), y, g)  # the prompt's difficulty, plus noise
    f = gate.figures()
    assert f["pooled_auc"] > 0.75 and abs(f["auc"] - 0.5) < 0.1 and not f["open"]


def test_gate_stays_closed_for_random_scores_over_many_windows():
    """A coin: across 2,000 windows of 16 random groups of 8 the gate essentially never opens (AUC >= 0.6 and
    stratified one-sided p <= 0.001 together; measured over 4,000 windows: 0.075%; 0.025% for 512 rollouts)."""
    rng = np.random.default_rng(2)
    opened = 0
    for _ in range(2000):
        gate = AUCGate(min_auc=0.6, window=128, min_groups=4)
        y = rng.random(128) < rng.uniform(0.1, 0.5)
        gate.observe(rng.normal(size=128), y, groups_of(16))
        opened += gate.is_open
    assert opened <= 8  # expected 1.5; P(more than 8 | 0.075%) < 1e-4


def test_gate_needs_mixed_groups():
    gate = AUCGate(min_auc=0.6, window=100, min_groups=8)
    y = np.array([0, 1] * 20)
    gate.observe(y + np.arange(40) / 100, y, groups_of(5))  # perfectly ranked inside 5 groups: too few
    assert not gate.is_open and gate.figures()["auc"] == 1.0 and gate.figures()["mixed_groups"] == 5
    assert "needs 8 mixed groups" in gate.reason()
    gate.observe(np.zeros(48), np.zeros(48), groups_of(6) + 100)  # decided groups add no pair
    assert not gate.is_open and gate.figures()["mixed_groups"] == 5
    with pytest.raises(ValueError, match="name the group"):
        gate.observe([0.1, 0.2], [0, 1], ["a"])


def test_gate_window_slides_and_closes_when_the_head_degrades():
    gate = AUCGate(min_auc=0.6, window=128, min_groups=8)
    y = np.array([0, 1] * 64)
    gate.observe(y * 2.0 + np.linspace(0, 1, 128), y, groups_of(16))
    assert gate.is_open
    gate.observe(np.random.default_rng(3).normal(size=128), y, groups_of(16) + 16)  # only the coin's now
    assert not gate.is_open and gate.figures()["rollouts"] == 128


def test_gate_off_is_always_open_and_bad_thresholds_are_refused():
    assert AUCGate(min_auc=0.0).is_open and not AUCGate(min_auc=0.0).enabled
    with pytest.raises(ValueError, match="min_auc"):
        AUCGate(min_auc=1.5)


def test_gate_state_round_trips_through_json_with_this_runs_thresholds():
    gate = AUCGate(min_auc=0.6, window=64)
    y = np.array([0, 1] * 40)
    gate.observe(2 * y + np.random.default_rng(5).normal(size=80), y, groups_of(10))
    state = json.loads(json.dumps(gate.state_dict()))
    strict = AUCGate(min_auc=0.99, window=64)
    strict.load_state_dict(state)
    assert strict.figures()["auc"] == gate.figures()["auc"] and len(state["scores"]) == 64
    assert gate.is_open and not strict.is_open


def test_arrol_prunes_only_past_the_cold_start_and_with_the_gate_open():
    policy = ARROLPruning(cold_start_rounds=1, min_auc=0.6, heldout_fraction=0.25, seed=0)
    groups = groups_of(8)
    logits = np.random.default_rng(0).normal(size=64)
    policy.end_round()
    assert not policy.active and not policy.prune(groups, logits).any()  # past the cold start, gate closed
    y = np.array([0, 1] * 40)
    policy.observe(y + 0.1 * np.arange(80) / 80, y, heldout=np.ones(80, bool), groups=groups_of(10))
    assert policy.active and policy.prune(groups, logits).any()
    state = json.loads(json.dumps(policy.state_dict()))
    again = ARROLPruning(cold_start_rounds=1, min_auc=0.6, heldout_fraction=0.25, seed=0)
    again.load_state_dict(state)
    assert again.active and np.array_equal(again.hold_out(groups_of(50)), policy.hold_out(groups_of(50)))


def test_hold_out_takes_whole_groups_at_the_fraction_and_only_while_the_gate_is_on():
    policy = ARROLPruning(min_auc=0.6, heldout_fraction=0.2, seed=4)
    g = np.array([3, 3, 9, 3, 9, 1] * 2)
    masks = [policy.hold_out(g) for _ in range(2000)]
    assert all(len(set(m[g == k])) == 1 for m in masks for k in (1, 3, 9))  # a group is in or out, whole
    assert np.mean([m[g == 3][0] for m in masks]) == pytest.approx(0.2, abs=0.03)
    assert not ARROLPruning(min_auc=0.0, seed=4).hold_out(g).any()
    assert not RandomPruning(min_auc=0.6, seed=4).hold_out(g).any()  # the control has no head to gate
    assert RandomPruning(min_auc=0.6, cold_start_rounds=0).active
    with pytest.raises(ValueError, match="heldout_fraction"):
        ARROLPruning(min_auc=0.6, heldout_fraction=0.0)


def test_held_out_rollouts_feed_the_gate_and_every_one_the_calibrator():
    policy = ARROLPruning(min_auc=0.6, seed=0)
    held = np.array([True, False] * 20)
    y = np.array([0, 0, 1, 1] * 10)
    policy.observe(np.arange(40.0), y, heldout=held, groups=groups_of(5))
    assert len(policy.calibrator) == 40 and policy.gate.figures()["rollouts"] == 20
