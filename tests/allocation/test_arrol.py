"""ARROL pieces (arXiv 2603.24840): survival probabilities, calibrator, rank weights, weighted voting."""

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_alloc.allocation.arrol import (
    ScoreCalibrator,
    accuracy,
    binary_auc,
    rank_weights,
    sample_survivors,
    survival_probabilities,
    vote_totals,
    weighted_majority_vote,
)

# ---------------------------------------------------------------- survival probabilities


def test_survival_closed_form_fixed_direction():
    # tilt = λ(ρ − q) = [.25, .25, −.25], mean −1/12 -> δ = +1/12 -> p = [2/3, 2/3, 1/6].
    p = survival_probabilities([0.0, 0.0, 1.0], direction="fixed", p_min=0.0, p_max=1.0)
    np.testing.assert_allclose(p, [2 / 3, 2 / 3, 1 / 6], atol=1e-12)


def test_survival_closed_form_auto_mirrors_below_target():
    # mean(q) = 1/3 < ρ: tilt flips to λ(q − ρ) = [−.25, −.25, .25] -> δ = −1/12 -> [1/3, 1/3, 5/6].
    p = survival_probabilities([0.0, 0.0, 1.0], p_min=0.0, p_max=1.0)
    np.testing.assert_allclose(p, [1 / 3, 1 / 3, 5 / 6], atol=1e-12)
    # mean(q) = 2/3 > ρ: auto is the main-text formula (s = +1) unchanged.
    q = [1.0, 1.0, 0.0]
    np.testing.assert_allclose(survival_probabilities(q), survival_probabilities(q, direction="fixed"))


def test_survival_clipping_closed_form():
    # λ = 2: tilt = [1, −1, −1, −1]; p_0 clips at 0.9, the rest solve 0.9 + 3x = 2 -> x = 11/30.
    p = survival_probabilities([0.0, 1.0, 1.0, 1.0], slope=2.0, direction="fixed")
    np.testing.assert_allclose(p, [0.9, 11 / 30, 11 / 30, 11 / 30], atol=1e-12)


def test_balanced_group_is_uniform():
    np.testing.assert_allclose(survival_probabilities([0.0, 1.0, 0.2, 0.8], keep_ratio=0.3), 0.3)


@st.composite
def _groups(draw):
    q = draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=64))
    p_min = draw(st.floats(0.0, 0.5))
    p_max = draw(st.floats(0.5, 1.0))
    keep = draw(st.floats(max(p_min, 1e-6), p_max))
    rho = draw(st.floats(0.0, 1.0))
    slope = draw(st.floats(0.0, 5.0))
    return np.array(q), keep, rho, slope, p_min, p_max


@settings(max_examples=300, deadline=None)
@given(_groups(), st.sampled_from(["auto", "fixed"]))
def test_survival_mean_and_bounds_property(group, direction):
    q, keep, rho, slope, p_min, p_max = group
    p = survival_probabilities(q, keep, rho, slope, p_min, p_max, direction=direction)
    assert p.shape == q.shape
    assert abs(p.mean() - keep) < 1e-9
    assert (p >= p_min - 1e-12).all() and (p <= p_max + 1e-12).all()
    order = np.argsort(q, kind="stable")
    steps = np.diff(p[order])
    if direction == "fixed" or q.mean() > rho:  # lower q -> higher p
        assert (steps <= 1e-12).all()
    elif q.mean() < rho:  # mostly-wrong group: higher q -> higher p
        assert (steps >= -1e-12).all()


@pytest.mark.parametrize("n", [1, 2, 16, 257])
@pytest.mark.parametrize("keep", [0.1, 0.25, 0.5, 0.77, 0.9])
def test_survival_mean_random_groups(n, keep):
    rng = np.random.default_rng(n)
    for _ in range(20):
        q = rng.beta(0.5, 0.5, size=n)
        p = survival_probabilities(q, keep_ratio=keep)
        assert abs(p.mean() - keep) < 1e-9
        assert p.min() >= 0.1 - 1e-12 and p.max() <= 0.9 + 1e-12


def test_keep_ratio_one_and_empty():
    np.testing.assert_array_equal(survival_probabilities([0.1, 0.9, 0.5], keep_ratio=1.0), 1.0)
    assert survival_probabilities([]).shape == (0,)


@pytest.mark.parametrize("kwargs, match", [
    (dict(keep_ratio=0.05), "cannot be met"),
    (dict(keep_ratio=0.95), "cannot be met"),
    (dict(keep_ratio=0.0), "keep_ratio"),
    (dict(keep_ratio=1.2), "keep_ratio"),
    (dict(p_min=0.6, p_max=0.4), "p_min"),
    (dict(slope=-1.0), "slope"),
    (dict(direction="up"), "direction"),
])
def test_survival_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        survival_probabilities([0.2, 0.8], **kwargs)


def test_survival_bad_q():
    with pytest.raises(ValueError, match="`q`"):
        survival_probabilities([0.2, np.nan])
    with pytest.raises(ValueError, match="`q`"):
        survival_probabilities([0.2, 1.5])


def test_sample_survivors_frequencies_and_determinism():
    p = np.tile([0.1, 0.9], 20000)
    mask = sample_survivors(p, np.random.default_rng(0))
    assert mask.dtype == bool
    assert abs(mask[0::2].mean() - 0.1) < 0.01 and abs(mask[1::2].mean() - 0.9) < 0.01
    np.testing.assert_array_equal(mask, sample_survivors(p, np.random.default_rng(0)))
    assert sample_survivors([0.0, 1.0], np.random.default_rng(1)).tolist() == [False, True]
    with pytest.raises(ValueError, match="`p`"):
        sample_survivors([0.5, np.nan], np.random.default_rng(0))

# ---------------------------------------------------------------- calibrator


def test_calibrator_hand_computed_posterior():
    cal = ScoreCalibrator(num_bins=2, buffer_size=100, alpha=1.0)
    np.testing.assert_allclose(cal.calibrate([-3.0, 0.3, 5.0]), 0.5)  # empty buffer
    # sigmoid(±3) -> bins 1 / 0: pairs (1,1) (1,1) (0,0) (0,1) (1,0); n1 = [1, 2], n0 = [1, 1].
    cal.update([3, 3, -3, -3, 3], [1, 1, 0, True, 0])
    assert len(cal) == 5
    # π = 4/7; bin 1: P(1|1) = 3/5, P(1|0) = 2/4 -> q = 8/13; bin 0: P(0|1) = 2/5, P(0|0) = 2/4 -> 16/31.
    np.testing.assert_allclose(cal.calibrate([2.0, -2.0]), [8 / 13, 16 / 31], rtol=1e-12)


def test_calibrator_binning_edges():
    cal = ScoreCalibrator(num_bins=10)
    np.testing.assert_array_equal(cal.bins([-np.inf, -1e9, 0.0, 1e9, np.inf]), [0, 0, 5, 9, 9])


def test_calibrator_sliding_buffer_drops_oldest():
    cal = ScoreCalibrator(num_bins=4, buffer_size=3)
    cal.update([5.0, 5.0], [1, 1])
    cal.update([-5.0, -5.0, 5.0], [0, 0, 0])
    assert len(cal) == 3
    state = cal.state_dict()
    assert state["bins"] == [0, 0, 3] and state["labels"] == [0, 0, 0]
    fresh = ScoreCalibrator(num_bins=4, buffer_size=3)
    fresh.update([-5.0, -5.0, 5.0], [0, 0, 0])
    np.testing.assert_array_equal(cal.calibrate([-5.0, 0.0, 5.0]), fresh.calibrate([-5.0, 0.0, 5.0]))


def test_calibrator_state_dict_json_round_trip():
    rng = np.random.default_rng(0)
    cal = ScoreCalibrator(num_bins=7, buffer_size=50, alpha=0.5)
    cal.update(rng.normal(size=80), rng.random(80) < 0.3)
    state = json.loads(json.dumps(cal.state_dict()))
    other = ScoreCalibrator()  # different config: the state carries its own
    other.load_state_dict(state)
    x = rng.normal(size=30) * 3
    np.testing.assert_array_equal(other.calibrate(x), cal.calibrate(x))
    more_x, more_y = rng.normal(size=20), rng.random(20) < 0.5
    cal.update(more_x, more_y)
    other.update(more_x, more_y)
    assert len(other) == len(cal) == 50
    np.testing.assert_array_equal(other.calibrate(x), cal.calibrate(x))
    with pytest.raises(ValueError, match="corrupt"):
        other.load_state_dict({**state, "bins": state["bins"][:-1]})


def test_calibrator_bad_inputs():
    cal = ScoreCalibrator()
    with pytest.raises(ValueError, match="`logits`"):
        cal.update([0.1, np.nan], [0, 1])
    with pytest.raises(ValueError, match="`labels`"):
        cal.update([0.1, 0.2], [0, np.nan])
    with pytest.raises(ValueError, match="`labels`"):
        cal.update([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="same shape"):
        cal.update([0.1, 0.2], [0])
    with pytest.raises(ValueError, match="`logits`"):
        cal.calibrate([np.nan])
    for kwargs in (dict(num_bins=0), dict(buffer_size=0), dict(alpha=0.0)):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            ScoreCalibrator(**kwargs)
    assert len(cal) == 0


@pytest.mark.parametrize("pool_rate", [0.2, 0.8])
def test_pruning_balances_survivors_better_than_random(pool_rate):
    """Informative head: calibrated ARROL pruning moves the survivors' positive ratio toward 0.5."""
    rng = np.random.default_rng(123)
    G, groups, keep = 16, 1500, 0.5

    def draw(n):
        y = rng.random(n) < pool_rate
        return 2.0 * (2 * y - 1) + rng.normal(size=n), y

    cal = ScoreCalibrator(num_bins=10, buffer_size=2048)
    cal.update(*draw(4000))
    assert accuracy(*draw(4000)) > 0.9
    kept = {"arrol": [0, 0], "random": [0, 0], "fixed": [0, 0]}  # [positives, survivors]
    for _ in range(groups):
        logits, y = draw(G)
        q = cal.calibrate(logits)
        masks = {"arrol": sample_survivors(survival_probabilities(q, keep), rng),
                 "random": sample_survivors(np.full(G, keep), rng),
                 "fixed": sample_survivors(survival_probabilities(q, keep, direction="fixed"), rng)}
        for name, m in masks.items():
            kept[name][0] += int(y[m].sum())
            kept[name][1] += int(m.sum())
    ratio = {k: pos / n for k, (pos, n) in kept.items()}
    assert abs(kept["arrol"][1] / (G * groups) - keep) < 0.01  # same keep ratio
    assert abs(ratio["random"] - pool_rate) < 0.02
    assert abs(ratio["arrol"] - 0.5) < abs(ratio["random"] - 0.5) - 0.08
    if pool_rate < 0.5:  # the main-text literal λ(ρ − q_i) prunes the scarce positives first
        assert ratio["fixed"] < ratio["random"] - 0.08

# ---------------------------------------------------------------- test-time weighting


def test_rank_weights_closed_form():
    np.testing.assert_allclose(rank_weights([3, 1, 2]), [1.0, 0.0, 0.5])
    np.testing.assert_allclose(rank_weights([0.2, 0.9, 0.5, -1.0, 0.7]), [0.25, 1.0, 0.5, 0.0, 0.75])
    np.testing.assert_allclose(rank_weights([1.0, 1.0, 0.0]), [0.75, 0.75, 0.0])  # average rank 1.5
    np.testing.assert_allclose(rank_weights([4.2]), [1.0])
    assert rank_weights([]).shape == (0,)
    with pytest.raises(ValueError, match="`scores`"):
        rank_weights([1.0, np.nan])


def test_weighted_vote_differs_from_plain_majority():
    answers = ["a", "a", "a", "b", "b"]
    scores = [-2.0, -1.0, 0.0, 3.0, 2.0]  # b's candidates rank 1 and 2
    w = rank_weights(scores)  # [0, .25, .5, 1, .75] -> a: 0.75, b: 1.75
    assert weighted_majority_vote(answers) == "a"
    assert weighted_majority_vote(answers, w) == "b"
    assert vote_totals(answers, w)["b"] == (1.75, 2, 3)


def test_weighted_vote_ties_and_none():
    assert weighted_majority_vote(["x", "y", "y"], [1.0, 0.5, 0.5]) == "y"  # weight tie -> count
    assert weighted_majority_vote(["x", "y"], [0.3, 0.3]) == "x"  # full tie -> first seen
    assert weighted_majority_vote([None, None, "z"]) == "z"
    assert weighted_majority_vote([None, "q", None, "r", "r"], [9.0, 0.2, 9.0, 0.1, 0.0]) == "q"
    assert weighted_majority_vote([None]) is None
    assert weighted_majority_vote([]) is None
    assert weighted_majority_vote([1, 2, 2, (3, 4)], [0.0, 0.1, 0.1, 0.5]) == (3, 4)


def test_weighted_vote_bad_weights():
    with pytest.raises(ValueError, match="`weights`"):
        weighted_majority_vote(["a", "b"], [1.0, np.nan])
    with pytest.raises(ValueError, match="`weights`"):
        weighted_majority_vote(["a", "b"], [1.0])


def test_head_metrics():
    assert binary_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert binary_auc([1, 2, 3], [0, 1, 1]) == 1.0 and binary_auc([3, 2, 1], [0, 1, 1]) == 0.0
    assert binary_auc([1, 1, 1, 1], [0, 1, 0, 1]) == 0.5
    assert np.isnan(binary_auc([1, 2], [1, 1]))
    assert accuracy([2.0, -1.0, 0.5], [1, 0, 0]) == pytest.approx(2 / 3)
    assert accuracy([0.9, 0.2], [True, False], threshold=0.5) == 1.0
    with pytest.raises(ValueError, match="`scores`"):
        binary_auc([np.nan, 1.0], [0, 1])


def test_module_imports_no_torch():
    code = ("import sys, trl_alloc.allocation.arrol; "
            "assert 'torch' not in sys.modules and 'trl' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- pruned responses in the round accounting


def test_round_counts_pruned_responses_as_spent_without_reward():
    """ARROL's pruned rollouts: spent budget, neither success nor failure (their rewards are ignored)."""
    from trl_alloc.allocation import FullFiller, UniformPacer

    pacer = UniformPacer(4, prompts_per_round=2, group_size=4, budget_responses=16, seed=0)
    units = pacer.propose()
    rnd = FullFiller(4).start_round(pacer.ranked_prompts, budget=8, counts=units[pacer.ranked_prompts] * 4)
    ids, counts = rnd.requests()
    assert counts.tolist() == [4, 4]
    rewards = [np.array([1.0, np.nan, 0.0, np.nan]), np.array([1.0, 1.0, np.nan, 0.0])]
    pruned = [np.array([False, True, False, True]), np.array([False, False, True, False])]
    rnd.observe(rewards, pruned=pruned)
    s, f, spent = rnd.outcomes(4)
    a, b = ids.tolist()
    assert (s[a], f[a], spent[a]) == (1, 1, 4) and (s[b], f[b], spent[b]) == (2, 1, 4)
    assert rnd.spent == 8 and rnd.stats()["pruned"] == 3 and rnd.pruned == {a: 2, b: 1}
    assert rnd.effective == 2  # mixed among the observed (surviving) responses
    pacer.update(s, f, spent)
    assert pacer.remaining_responses == 8  # pruned responses were paid for
    rnd2 = FullFiller(4).start_round([0], budget=4, counts=np.array([4]))  # a NaN of a *completed* one: unscored
    rnd2.observe([np.array([np.nan, 1.0, 0.0, 1.0])], pruned=[np.zeros(4, bool)])
    s, f, spent = rnd2.outcomes(1)
    assert (s[0], f[0], spent[0]) == (2, 1, 4) and rnd2.unscored == {0: 1} and rnd2.pruned == {}


def test_sara_counts_pruned_toward_the_group_but_not_the_posterior():
    from trl_alloc.allocation import SARAFiller, effective_probability

    # two observed failures + two pruned of k = 4: decided by the 2 failures with r = 0 left
    assert effective_probability(4, 0, 4, failures=2) == 0.0
    # nothing observed yet (all pruned): both end terms apply, like before any rollout
    assert effective_probability(2, 0, 4, failures=0) == pytest.approx(effective_probability(0, 0, 2))
    with pytest.raises(ValueError, match="s <= n <= k"):
        effective_probability(2, 1, 4, failures=2)
    rnd = SARAFiller(group_size=4, probe=2, commit_min=4).start_round(np.arange(3), budget=12, target_groups=1)
    ids, counts = rnd.requests()
    rewards = [np.array([1.0, 0.0])] + [np.array([0.0, 0.0])] * (len(ids) - 1)
    pruned = [np.array([False, False])] + [np.array([True, True])] * (len(ids) - 1)
    rnd.observe(rewards, pruned=pruned)
    assert rnd.stats()["pruned"] == 2 * (len(ids) - 1)
    ids2, counts2 = rnd.requests()
    first = {int(p): int(c) for p, c in zip(ids2, counts2)}
    assert first[int(ids[0])] == 2  # mixed after 2 generated: 4 − 2 more to reach commit_min
    s, f, spent = rnd.outcomes(3)  # (the next call is spent once it is asked for)
    assert spent.sum() == counts.sum() + counts2.sum() and s.sum() + f.sum() == 2
