"""ARROL's gate (docs/arrol.md, "The gate"): pruning only behind a head whose held-out AUC clears a threshold."""

import json

import numpy as np
import pytest

from trl_alloc.allocation.arrol import ARROLPruning, AUCGate, RandomPruning, binary_auc


def test_gate_opens_for_a_separable_signal_and_reports_its_figures():
    gate = AUCGate(min_auc=0.6, window=200, min_per_class=16)
    rng = np.random.default_rng(0)
    y = rng.random(200) < 0.3
    scores = y + rng.normal(0, 0.8, 200)
    gate.observe(scores, y)
    f = gate.figures()
    assert f["open"] and gate.is_open
    assert f["positives"] == int(y.sum()) and f["negatives"] == 200 - int(y.sum())
    assert f["auc"] == binary_auc(scores, y)
    assert f["auc"] > 0.75 and f["p_value"] < 1e-6
    assert "open" in gate.reason() and "0.6" in gate.reason()


def test_gate_stays_closed_for_random_scores_over_many_windows():
    """A coin: across 2,000 windows of random scores the gate essentially never opens (AUC >= 0.6 and one-sided
    p <= 0.001 together; measured over 4,000 such windows of 128: 0.075% open, 0.0% at the default window of 512)."""
    rng = np.random.default_rng(1)
    opened = 0
    for _ in range(2000):
        gate = AUCGate(min_auc=0.6, window=128, min_per_class=16)
        y = rng.random(128) < rng.uniform(0.1, 0.5)
        gate.observe(rng.normal(size=128), y)
        opened += gate.is_open
    assert opened <= 8  # expected 1.5; P(more than 8 | 0.075%) < 1e-4


def test_gate_needs_both_classes_and_min_per_class():
    gate = AUCGate(min_auc=0.6, window=100, min_per_class=16)
    gate.observe(np.arange(10.0), [0] * 5 + [1] * 5)  # perfectly ranked, but too few
    assert not gate.is_open and gate.figures()["auc"] == 1.0
    assert "needs 16 of each" in gate.reason()
    gate.observe(np.zeros(50), [0] * 50)
    assert not gate.is_open


def test_gate_window_slides_and_closes_when_the_head_degrades():
    gate = AUCGate(min_auc=0.6, window=100, min_per_class=16)
    y = np.array([0, 1] * 50)
    gate.observe(y * 2.0 + np.linspace(0, 1, 100), y)
    assert gate.is_open
    rng = np.random.default_rng(3)
    gate.observe(rng.normal(size=100), y)  # the window now holds only the coin's
    assert not gate.is_open and gate.figures()["positives"] + gate.figures()["negatives"] == 100


def test_gate_off_is_always_open_and_bad_thresholds_are_refused():
    assert AUCGate(min_auc=0.0).is_open and not AUCGate(min_auc=0.0).enabled
    with pytest.raises(ValueError, match="min_auc"):
        AUCGate(min_auc=1.5)


def test_gate_state_round_trips_through_json_with_this_runs_thresholds():
    gate = AUCGate(min_auc=0.6, window=64)
    y = np.array([0, 1] * 40)
    gate.observe(2 * y + np.random.default_rng(5).normal(size=80), y)
    state = json.loads(json.dumps(gate.state_dict()))
    strict = AUCGate(min_auc=0.99, window=64)
    strict.load_state_dict(state)
    assert strict.figures()["auc"] == gate.figures()["auc"] and len(state["scores"]) == 64
    assert gate.is_open and not strict.is_open


def test_arrol_prunes_only_past_the_cold_start_and_with_the_gate_open():
    policy = ARROLPruning(cold_start_rounds=1, min_auc=0.6, heldout_fraction=0.25, seed=0)
    groups = np.repeat(np.arange(8), 8)
    logits = np.random.default_rng(0).normal(size=64)
    policy.end_round()
    assert not policy.active and not policy.prune(groups, logits).any()  # past the cold start, gate closed
    y = np.array([0, 1] * 40)
    policy.observe(y + 0.1 * np.arange(80) / 80, y, heldout=np.ones(80, bool))
    assert policy.active and policy.prune(groups, logits).any()
    state = json.loads(json.dumps(policy.state_dict()))
    again = ARROLPruning(cold_start_rounds=1, min_auc=0.6, heldout_fraction=0.25, seed=0)
    again.load_state_dict(state)
    assert again.active and np.array_equal(again.hold_out(100), policy.hold_out(100))


def test_hold_out_draws_the_fraction_and_only_while_the_gate_is_on():
    policy = ARROLPruning(min_auc=0.6, heldout_fraction=0.2, seed=4)
    share = np.mean([policy.hold_out(100).mean() for _ in range(200)])
    assert share == pytest.approx(0.2, abs=0.01)
    assert not ARROLPruning(min_auc=0.0, seed=4).hold_out(100).any()
    assert not RandomPruning(min_auc=0.6, seed=4).hold_out(100).any()  # the control has no head to gate
    assert RandomPruning(min_auc=0.6, cold_start_rounds=0).active
    with pytest.raises(ValueError, match="heldout_fraction"):
        ARROLPruning(min_auc=0.6, heldout_fraction=0.0)


def test_held_out_rollouts_feed_the_gate_not_only_the_calibrator():
    policy = ARROLPruning(min_auc=0.6, seed=0)
    held = np.array([True, False] * 20)
    y = np.array([0, 0, 1, 1] * 10)
    policy.observe(np.arange(40.0), y, heldout=held)
    assert len(policy.calibrator) == 40
    f = policy.gate.figures()
    assert f["positives"] + f["negatives"] == 20
