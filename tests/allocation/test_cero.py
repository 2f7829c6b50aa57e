import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from trl_alloc.allocation import (BetaState, CEROFixed, CEROGreedy, CEROPreset, CEROScheduler, RandomMatched,
                                  make_pacer, oracle_exposure, supporting_exposure, utility, variance_proxy)


def run(sched, p, rng, rounds=None):
    """Drive a pacer with Bernoulli(p) rewards; returns per-round units."""
    history = []
    while not sched.finished and (rounds is None or len(history) < rounds):
        units = sched.propose()
        n = units * sched.unit_size
        s = rng.binomial(n, p)
        sched.update(s, n - s)
        history.append(units)
    return history


# ---- eq. 5, eq. 6 -------------------------------------------------------------------------------
def test_variance_proxy_closed_form_and_prop_3_1():
    assert variance_proxy(1, 1) == pytest.approx(1 / 6)
    assert variance_proxy(3, 1) == pytest.approx(3 / (4 * 5))
    # Prop. 3.1: the proxy is the expected unbiased within-group sample variance.
    rng = np.random.default_rng(0)
    P = rng.beta(2.0, 5.0, 200_000)
    r = rng.random((200_000, 8)) < P[:, None]
    assert r.var(axis=1, ddof=1).mean() == pytest.approx(variance_proxy(2.0, 5.0), rel=0.02)
    # not Var(P)
    assert variance_proxy(2.0, 5.0) != pytest.approx(2 * 5 / (49 * 8))


def test_beta_update_with_forgetting_eq5():
    b = BetaState(3, prior=(1.0, 2.0), forgetting=0.5)
    b.update([2, 0, 0], [1, 0, 3])
    b.update([0, 1, 0], [0, 0, 0])
    # a = a0 + ρ(a − a0) + S applied twice
    assert b.a == pytest.approx([1 + 0.5 * 2, 1 + 1, 1])
    assert b.b == pytest.approx([2 + 0.5 * 1, 2, 2 + 0.5 * 3])


# ---- eq. 9 and the Fenchel representation ------------------------------------------------------
@pytest.mark.parametrize("c,theta", [(0.3, 0.1), (0.3, 0.29), (0.05, 0.04), (0.3, 1e-9), (0.3, 0.5), (0.0, 0.1)])
def test_supporting_exposure_minimises_theta_z_minus_u(c, theta):
    Z = 40.0
    grid = np.linspace(0, Z, 400_001)
    obj = theta * grid - (1 - np.exp(-c * grid))
    z = supporting_exposure(theta, c, Z)
    assert theta * z - (1 - np.exp(-c * z)) == pytest.approx(obj.min(), abs=1e-9)
    if 0 < c and c * np.exp(-c * Z) < theta < c:        # interior: first-order condition θ = c e^(−cz)
        assert c * np.exp(-c * z) == pytest.approx(theta)
        assert z == pytest.approx(np.log(c / theta) / c)


def test_fenchel_identity_on_a_grid():
    R, lam, q, Z = 5.0, 1.0, 0.2, 60.0
    c = 4 * lam * q / R
    c_bar = lam / R
    thetas = np.linspace(0, c_bar, 20_001)
    zs = supporting_exposure(thetas, c, Z)
    u_star = thetas * zs - utility(q, zs, R, lam)          # U*(θ) = θ z*(θ) − U(z*(θ))
    for z in [0.0, 0.5, 3.0, 17.0, Z]:
        assert np.min(thetas * z - u_star) == pytest.approx(utility(q, z, R, lam), abs=2e-5)


# ---- Algorithm 1 --------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(M=st.integers(3, 40), K=st.integers(1, 12), C=st.integers(2, 20), frac=st.floats(0.05, 1.0),
       nmax=st.integers(1, 3), seed=st.integers(0, 1000))
def test_cero_respects_every_constraint_and_spends_the_budget(M, K, C, frac, nmax, seed):
    C = max(C, nmax)
    usable = min(C, M * nmax)
    B = max(1, int(frac * K * usable))
    sched = CEROScheduler(M, K, B, C, max_units=nmax, seed=seed)
    rng = np.random.default_rng(seed)
    p = rng.random(M)
    spent = 0
    for units in run(sched, p, rng):
        assert units.max(initial=0) <= nmax
        assert units.sum() <= C
        spent += units.sum()
        assert spent <= B
    assert spent == B and sched.remaining_budget == 0  # B <= K·C: the whole budget is spent by round K
    assert sched.round <= K


def test_same_seed_same_decisions_and_seed_breaks_ties():
    def decisions(seed):
        rng = np.random.default_rng(1)
        return np.stack(run(CEROScheduler(50, 20, 200, 12, seed=seed), rng.random(50), rng))
    assert np.array_equal(decisions(3), decisions(3))
    assert not np.array_equal(decisions(3)[0], decisions(4)[0])   # all margins tie in round 1


def test_state_dict_mid_run_gives_identical_later_decisions():
    rng_p = np.random.default_rng(5)
    p = rng_p.random(300)
    a = CEROScheduler(300, 30, 1500, 80, forgetting=0.9, seed=2)
    rng = np.random.default_rng(9)
    run(a, p, rng, rounds=12)
    state = json.loads(json.dumps(a.state_dict()))
    b = CEROScheduler(300, 30, 1500, 80, forgetting=0.9, seed=2)
    b.load_state_dict(state)
    rng_b = np.random.default_rng(77)
    rng_a = np.random.default_rng(77)
    ha, hb = run(a, p, rng_a), run(b, p, rng_b)
    assert len(ha) == len(hb) == 18
    assert all(np.array_equal(x, y) for x, y in zip(ha, hb))
    assert a.nu == b.nu and np.array_equal(a.vartheta, b.vartheta)
    assert np.array_equal(a.ranked_prompts, b.ranked_prompts)


def test_margins_dual_updates_match_eq10_by_hand():
    s = CEROScheduler(4, 4, 8, 4, max_units=2, seed=0)
    units = s.propose()
    assert np.all(s.vartheta == pytest.approx(4 / 6)) and s.nu == 0.5
    assert sorted(units.tolist()) == [0, 0, 2, 2]
    succ = np.where(units > 0, 3, 0)
    fail = units * 4 - succ
    v0, nu0, virtual = s.vartheta.copy(), s.nu, s.virtual.copy()
    s.update(succ, fail)
    a = 1 + succ
    b = 1 + fail
    q = a * b / ((a + b) * (a + b + 1))
    R, K, Z = 8 / 4, 4, 8
    c = 4 * q / R
    zs = supporting_exposure(v0 / R, c, Z)
    expect = np.clip(v0 - (virtual - zs / K) / 2 / np.sqrt(K), 0, 1)
    assert s.vartheta == pytest.approx(expect)
    assert s.nu == pytest.approx(np.clip(nu0 - (2 - 4) / max(2, 4 - 2) / np.sqrt(K), 0, 1))


def test_regret_against_oracle_shrinks_with_horizon():
    """Theorem 5.1 on a stationary instance: per-prompt regret falls roughly like 1/sqrt(K)."""
    def regret(K, seed, M=100):
        rng = np.random.default_rng(seed)
        p = rng.random(M)
        B = K * M // 2
        s = CEROScheduler(M, K, B, 2 * B // K, seed=seed)
        run(s, p, rng)
        q = p * (1 - p)
        opt = oracle_exposure(q, B, s.Z, s.R)
        return (utility(q, opt, s.R).sum() - utility(q, s.exposure, s.R).sum()) / M
    r = {K: np.mean([regret(K, seed) for seed in range(3)]) for K in (10, 40, 160, 640)}
    assert r[10] > r[40] > r[160] > r[640] > 0
    assert r[640] < 0.25 * r[10]


def test_oracle_matches_brute_force():
    q, R, B, Z = np.array([0.05, 0.2, 0.12]), 1.5, 6, 4
    best = max((z for z in itertools.product(range(Z + 1), repeat=3) if sum(z) <= B),
               key=lambda z: utility(q, np.array(z), R).sum())
    z = oracle_exposure(q, B, Z, R)
    assert utility(q, z, R).sum() == pytest.approx(utility(q, np.array(best), R).sum())
    assert z.sum() == B and z.max() <= Z


# ---- ablations ------------------------------------------------------------------------------------
def test_cero_fixed_quota_and_frozen_price():
    s = CEROFixed(100, 10, 105, 40, seed=0)
    hist = run(s, np.full(100, 0.5), np.random.default_rng(0))
    assert [h.sum() for h in hist] == [10, 11] * 5          # 105 units spread evenly
    assert s.nu == 0.0


def test_cero_preset_front_loads_like_the_paper():
    s = CEROPreset(8699, 500, 64_000, 132, seed=0)
    first, second = s.round_capacity(), None
    s.round = 250
    second = s.round_capacity()
    assert (first * 4, second * 4) == (528, 496)
    s = CEROPreset(60, 10, 95, 12, seed=0)
    hist = run(s, np.full(60, 0.5), np.random.default_rng(0))
    assert [h.sum() for h in hist] == [12] * 5 + [7] * 5


def test_cero_greedy_ranks_by_marginal_utility():
    s = CEROGreedy(6, 5, 10, 2, max_units=2, seed=0)
    s.beta.a[:] = [1, 5, 50, 5, 1, 2]
    s.beta.b[:] = [1, 5, 1, 1, 50, 2]
    units = s.propose()
    assert np.flatnonzero(units).tolist() == [1]   # q̂ largest for Beta(5,5)


def test_random_matched_replays_sizes_on_permuted_prompts():
    ref_sched = CEROScheduler(40, 8, 60, 10, seed=0)
    ref = run(ref_sched, np.random.default_rng(0).random(40), np.random.default_rng(1))
    rm = RandomMatched(40, ref_sched.allocation_log, unit_size=4, seed=3)
    got = run(rm, np.full(40, 0.5), np.random.default_rng(2))
    assert [g.sum() for g in got] == [r.sum() for r in ref]
    assert [sorted(g[g > 0]) for g in got] == [sorted(r[r > 0]) for r in ref]
    assert any(not np.array_equal(g, r) for g, r in zip(got, ref))
    assert rm.remaining_budget == 0


# ---- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    (dict(budget=-5), "budget"), (dict(budget=10.5), "budget"), (dict(round_capacity=1), "round_capacity"),
    (dict(budget=10_000), "budget"), (dict(forgetting=0.0), "forgetting"), (dict(prior=(0, 1)), "prior"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    args = dict(num_prompts=20, rounds=10, budget=40, round_capacity=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        CEROScheduler(**args)


def test_bad_feedback_is_rejected():
    s = CEROScheduler(10, 5, 20, 4)
    s.propose()
    with pytest.raises(ValueError, match="successes"):
        s.update(np.zeros(9), np.zeros(10))
    with pytest.raises(ValueError, match="failures"):
        s.update(np.zeros(10), -np.ones(10))
    with pytest.raises(ValueError, match="budget"):
        s.update(np.full(10, 100), np.zeros(10), responses=np.full(10, 100))
    with pytest.raises(ValueError, match="responses"):
        s.update(np.full(10, 100), np.zeros(10))
    with pytest.raises(ValueError, match="unknown `pacing="):
        make_pacer("cero_turbo", 10)
