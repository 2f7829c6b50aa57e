import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.special import beta as beta_fn

from trl_alloc.allocation import FullFiller, SARAFiller, decide, effective_probability
from trl_alloc.allocation.sara import ABANDON, COMMIT, CONTINUE


def drive(rnd, gamma, rng):
    """Run a round against Bernoulli(gamma[prompt]) rewards."""
    while not rnd.done:
        ids, counts = rnd.requests()
        rnd.observe([(rng.random(n) < gamma[i]).astype(float) for i, n in zip(ids, counts)])
    return rnd


@pytest.mark.parametrize("k", [4, 8, 16])
def test_uniform_prior_closed_form(k):
    n = np.arange(1, k + 1)
    assert effective_probability(n, 0, k) == pytest.approx((k - n) / (k + 1))
    assert effective_probability(n, n, k) == pytest.approx((k - n) / (k + 1))   # symmetric all-pass
    assert effective_probability(0, 0, k) == pytest.approx((k - 1) / (k + 1))   # before any rollout


def test_informative_prior_matches_beta_function_ratio_and_monte_carlo():
    a0, b0, n, k = 2.0, 5.0, 3, 8
    expect = 1 - beta_fn(a0, b0 + k) / beta_fn(a0, b0 + n)
    assert effective_probability(n, 0, k, (a0, b0)) == pytest.approx(expect)
    rng = np.random.default_rng(0)
    g = rng.beta(a0, b0, 400_000)
    first = rng.random((g.size, n)) < g[:, None]
    keep = ~first.any(1)                                   # condition on an all-fail prefix
    rest = rng.random((keep.sum(), k - n)) < g[keep, None]
    assert rest.any(1).mean() == pytest.approx(expect, abs=0.005)
    # per-prompt prior arrays broadcast
    got = effective_probability([3, 3], [0, 0], 8, (np.array([1.0, 2.0]), np.array([1.0, 5.0])))
    assert got == pytest.approx([5 / 9, expect])


def test_mixed_is_one_and_monotone_decidability():
    assert effective_probability([2, 5], [1, 3], 8) == pytest.approx([1, 1])
    p = effective_probability(np.arange(0, 9), 0, 8, (1.5, 0.7))
    assert np.all(np.diff(p[1:]) < 0) and p[-1] == 0


def test_decision_rule_eq3():
    d, _ = decide([2, 2, 5, 8, 4], [1, 0, 0, 4, 2], 8, tau_low=0.45, commit_min=4)
    # (2,1) mixed but below commit_min; (2,0): 6/9 >= .45; (5,0): 3/9 < .45; (8,4) mixed; (4,2) mixed
    assert d.tolist() == [CONTINUE, CONTINUE, ABANDON, COMMIT, COMMIT]


def test_round_commits_only_full_mixed_groups_and_respects_budget():
    rng = np.random.default_rng(0)
    gamma = rng.beta(0.5, 0.5, 5000)
    rnd = drive(SARAFiller().start_round(np.arange(5000), budget=700, target_groups=64), gamma, rng)
    assert rnd.spent <= 700
    for pid in rnd.groups:
        assert rnd.successes[pid] + rnd.failures[pid] == 8
        assert 0 < rnd.successes[pid] < 8
    for pid in rnd.abandoned:
        assert rnd.successes[pid] in (0, rnd.successes[pid] + rnd.failures[pid])
    assert rnd.effective == len(rnd.groups) <= 64


@settings(max_examples=40, deadline=None)
@given(k=st.integers(2, 10), n0=st.integers(1, 4), target=st.integers(1, 20), budget=st.integers(0, 300),
       commit_min=st.integers(2, 10), seed=st.integers(0, 100))
def test_round_never_overspends_or_overfills(k, n0, target, budget, commit_min, seed):
    n0, commit_min = min(n0, k), min(commit_min, k)
    rng = np.random.default_rng(seed)
    gamma = rng.random(60)
    f = SARAFiller(group_size=k, probe=n0, commit_min=commit_min)
    rnd = drive(f.start_round(np.arange(60), budget=budget, target_groups=target), gamma, rng)
    assert rnd.spent <= budget
    assert len(rnd.groups) <= target
    sizes = [rnd.successes[p] + rnd.failures[p] for p in rnd.groups]
    assert all(commit_min <= n <= k for n in sizes)
    s, f_, resp = rnd.outcomes(60)
    assert resp.sum() == rnd.spent and (resp <= k).all()


@pytest.mark.parametrize("tau", [0.3, 0.45])
def test_theorem1_abandoned_would_be_effective_below_tau_low(tau):
    """Monte Carlo: of abandoned prompts, the share whose full group would have been mixed is
    E[p_eff | abandoned] < τ_low (at τ = 0.45 abandonment happens at p_eff = 4/9, so within noise)."""
    rng = np.random.default_rng(1)
    gamma = rng.beta(1.0, 1.0, 40_000)                   # prompts drawn from the prior SARA assumes
    rnd = drive(SARAFiller(tau_low=tau).start_round(np.arange(40_000), budget=10**7, target_groups=10_000),
                gamma, rng)
    lost = []
    for pid in rnd.abandoned:
        n, s = rnd.successes[pid] + rnd.failures[pid], rnd.successes[pid]
        rest = rng.random(8 - n) < gamma[pid]
        lost.append(0 < s + rest.sum() < 8)
    assert len(lost) > 2000 and max(rnd.abandon_p) < tau
    stderr = np.std(lost) / np.sqrt(len(lost))
    assert abs(np.mean(lost) - np.mean(rnd.abandon_p)) < 3 * stderr     # the loss is exactly p_eff
    assert np.mean(lost) < tau + 3 * stderr and np.mean(rnd.abandon_p) < tau
    if tau == 0.3:
        assert np.mean(lost) < tau


def _yield_gap(a, b, tau, trials=200, budget=512):
    """Paired difference of effective groups, SARA minus uniform fixed-k, at the same budget."""
    rng = np.random.default_rng(2)
    filler, diff = SARAFiller(tau_low=tau), []
    for _ in range(trials):
        gamma = rng.beta(a, b, 2000)
        rnd = drive(filler.start_round(np.arange(2000), budget=budget, target_groups=budget // 8), gamma, rng)
        r = rng.random((budget // 8, 8)) < gamma[:budget // 8, None]
        diff.append(rnd.effective - ((r.sum(1) > 0) & (r.sum(1) < 8)).sum())
        assert rnd.spent <= budget
    return np.mean(diff), np.std(diff) / np.sqrt(trials)


@pytest.mark.parametrize("a,b", [(0.5, 0.5), (0.3, 1.0), (0.2, 0.2)])
def test_theorem3_fixed_budget_yield_beats_uniform_on_saturated_pools(a, b):
    """Theorem 3 on saturation-heavy pools (the RLVR regime) at the paper's τ_low = 0.45."""
    gap, se = _yield_gap(a, b, 0.45)
    assert gap > 2 * se > 0


@pytest.mark.parametrize("a,b", [(1.0, 1.0), (2.0, 2.0), (0.5, 0.5)])
def test_break_even_tau_is_never_worse_than_uniform(a, b):
    """τ_low = "auto" (break-even threshold) is within noise of uniform or better on any pool, whereas
    the fixed 0.45 loses groups when few prompts are saturated (abandoning at p_eff = 4/9 costs more
    than the freed rollouts buy)."""
    gap, se = _yield_gap(a, b, "auto")
    assert gap > -3 * se
    if (a, b) == (2.0, 2.0):
        fixed_gap, fixed_se = _yield_gap(a, b, 0.45)
        assert fixed_gap < gap - 3 * fixed_se


def test_history_prior_saves_rollouts():
    """A prompt's own history as prior (what CERO supplies) decides saturated prompts sooner."""
    rng = np.random.default_rng(3)
    gamma = rng.beta(0.4, 0.4, 3000)
    flat = drive(SARAFiller().start_round(np.arange(3000), target_groups=64), gamma, np.random.default_rng(4))
    hist_n = 8
    hs = rng.binomial(hist_n, gamma)
    rnd = SARAFiller().start_round(np.arange(3000), target_groups=64, prior_a=1 + 0.5 * hs,
                                   prior_b=1 + 0.5 * (hist_n - hs))
    warm = drive(rnd, gamma, np.random.default_rng(4))
    assert warm.effective == flat.effective == 64
    assert warm.spent < 0.97 * flat.spent


def test_warm_start_state_round_trip():
    f = SARAFiller(warm_start_decay=0.8, num_prompts=100)
    rng = np.random.default_rng(0)
    gamma = rng.random(100)
    drive(f.start_round(np.arange(100), target_groups=5), gamma, rng)
    g = SARAFiller(warm_start_decay=0.8, num_prompts=100)
    g.load_state_dict(json.loads(json.dumps(f.state_dict())))
    assert np.allclose(g.history.a, f.history.a) and f.history.a.sum() > 100


@pytest.mark.parametrize("kwargs,match", [
    (dict(probe=9), "probe"), (dict(tau_low=0.0), "tau_low"), (dict(tau_low=1.2), "tau_low"),
    (dict(commit_min=9), "commit_min"), (dict(group_size=1), "group_size"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SARAFiller(**kwargs)


def test_unscored_rewards_are_spent_but_neither_success_nor_failure():
    rnd = SARAFiller().start_round(np.arange(4), target_groups=2)
    ids, counts = rnd.requests()
    rnd.observe([np.array([np.nan, 1.0])] + [np.zeros(n) for n in counts[1:]])
    s, f, spent = rnd.outcomes(4)
    pid = int(ids[0])
    reserved = dict(zip(*(x.tolist() for x in rnd.requests())))  # the next call is spent once it is asked for
    assert (s[pid], f[pid], spent[pid] - reserved.get(pid, 0)) == (1, 0, 2)
    assert rnd.unscored == {pid: 1} and rnd.stats()["unscored"] == 1
    assert rnd.spent == int(counts.sum()) + sum(reserved.values())


def test_a_full_uncommitted_group_is_abandoned_even_at_a_zero_threshold():
    """tau_low="auto" gives τ = (k − n)·η = 0 at n = k: the full, saturated group must still end."""
    verdict, p = decide(np.array([8, 8, 8]), np.array([0, 8, 4]), 8, tau_low=np.zeros(3),
                        failures=np.array([8, 0, 3]))  # the third: 1 unscored, so s + f < n
    assert verdict.tolist() == [ABANDON, ABANDON, COMMIT] and p[0] == p[1] == 0.0


def test_bad_rewards_are_rejected():
    rnd = SARAFiller().start_round(np.arange(4), target_groups=2)
    ids, counts = rnd.requests()
    with pytest.raises(ValueError, match="rewards"):
        rnd.observe([np.zeros(1)])
    with pytest.raises(ValueError, match="s <= n <= k"):
        effective_probability(9, 0, 8)


def test_full_filler_is_plain_grpo():
    rnd = FullFiller(4).start_round(np.array([5, 2, 7]), budget=8)
    ids, counts = rnd.requests()
    assert ids.tolist() == [5, 2] and counts.tolist() == [4, 4]
    rnd.observe([np.array([1, 0, 0, 0]), np.ones(4)])
    assert rnd.done and rnd.groups == [5, 2] and rnd.effective == 1
