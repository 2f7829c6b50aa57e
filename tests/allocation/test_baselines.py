import itertools
import json

import numpy as np
import pytest

from trl_alloc.allocation import DynamicSamplingFiller, FullFiller, KnapsackPacer, SARAFiller, UniformPacer


def rewards_for(ids, counts, gamma, rng):
    return [(rng.random(n) < gamma[i]).astype(float) for i, n in zip(ids, counts)]


def test_uniform_pacer_is_an_epoch_pass_with_exact_budget():
    pacer = UniformPacer(10, prompts_per_round=4, group_size=8, budget_responses=8 * 10)
    seen = []
    while not pacer.finished:
        units = pacer.propose()
        seen.extend(pacer.ranked_prompts[: units.sum()].tolist())
        n = units * 8
        pacer.update(n // 2, n - n // 2)
    assert len(seen) == 10 and sorted(seen) == list(range(10))     # one epoch, no prompt repeated
    assert pacer.remaining_responses == 0 and pacer.round == 3


def test_uniform_stream_advances_by_what_a_filler_used():
    pacer = UniformPacer(20, prompts_per_round=2, group_size=4, rounds=50)
    stream = pacer.ranked_prompts.copy()
    used = np.zeros(20, np.int64)
    used[stream[:5]] = 4                                              # a filler used 5 prompts
    pacer.update(used // 2, used - used // 2)
    assert pacer.ranked_prompts[:15].tolist() == stream[5:].tolist()
    state = json.loads(json.dumps(pacer.state_dict()))
    other = UniformPacer(20, prompts_per_round=2, group_size=4, rounds=50)
    other.load_state_dict(state)
    assert np.array_equal(other.ranked_prompts, pacer.ranked_prompts)


def test_knapsack_value_and_exact_optimum_against_brute_force():
    p = np.array([0.0, 0.3, 0.5, 0.9, 1.0])
    pacer = KnapsackPacer(5, prompts_per_round=5, group_size=4, rounds=3, min_n=2, max_n=8)
    alloc = pacer._allocate(p, 20)
    assert alloc.sum() == 20 and alloc.min() >= 2 and alloc.max() <= 8
    assert alloc[4] == 2                                             # p = 1 keeps the minimum
    best = max((sum(KnapsackPacer.value(p[i], 2 + e[j]) for j, i in enumerate([1, 2, 3])), e)
               for e in itertools.product(range(7), repeat=3) if sum(e) <= 10)
    got = sum(KnapsackPacer.value(p[i], alloc[i]) for i in [1, 2, 3])
    assert got == pytest.approx(best[0])
    assert KnapsackPacer.value(0.5, 4) == pytest.approx((1 - 2 / 16) * 0.5 * 0.25)


def test_knapsack_history_and_budget():
    pacer = KnapsackPacer(8, prompts_per_round=4, group_size=4, rounds=5, history=4)
    rng = np.random.default_rng(0)
    gamma = np.array([0, 1, 0.5, 0.5, 0, 1, 0.5, 0.2])
    total = 0
    while not pacer.finished:
        units = pacer.propose()
        assert units.sum() <= 16
        s = rng.binomial(units, gamma)
        pacer.update(s, units - s)
        total += units.sum()
    assert total == 80 and pacer.remaining_responses == 0
    assert pacer.hist_len.max() <= 4
    rate = pacer.success_rate()
    assert rate[0] == 0 and rate[1] == 1


def test_dynamic_sampling_keeps_only_varied_groups_and_hits_its_cap_loudly():
    rng = np.random.default_rng(0)
    gamma = rng.beta(0.5, 0.5, 1000)
    rnd = DynamicSamplingFiller(8, max_generation_batches=50).start_round(np.arange(1000), 10**6, 16)
    while not rnd.done:
        ids, counts = rnd.requests()
        assert (counts == 8).all() and ids.size == 16
        rnd.observe(rewards_for(ids, counts, gamma, rng))
    assert len(rnd.groups) == 16 and rnd.effective == 16
    assert all(0 < rnd.successes[p] < 8 for p in rnd.groups)
    hard = DynamicSamplingFiller(4, max_generation_batches=2).start_round(np.arange(100), 10**6, 8)
    with pytest.raises(RuntimeError, match="max_generation_batches"):
        while not hard.done:
            ids, counts = hard.requests()
            hard.observe([np.zeros(n) for n in counts])


def test_sara_spends_fewer_responses_than_dynamic_sampling_per_effective_group():
    """A prompt-level Monte Carlo of SARA's stated defaults: flat prior ≈ 0.98× DS; a history prior ≈ 0.9×."""
    rng = np.random.default_rng(0)
    M = 50_000
    gamma = rng.beta(0.35, 0.5, M)
    hist = rng.binomial(8, gamma)

    def cost(filler, **kw):
        rnd = filler.start_round(np.arange(M), budget=10**7, target_groups=2000, **kw)
        while not rnd.done:
            ids, counts = rnd.requests()
            rnd.observe(rewards_for(ids, counts, gamma, rng))
        return rnd.spent / rnd.effective

    ds = cost(DynamicSamplingFiller(8, max_generation_batches=100, batch_prompts=64))
    flat = cost(SARAFiller())
    history = cost(SARAFiller(), prior_a=1 + 0.5 * hist, prior_b=1 + 0.5 * (8 - hist))
    print(f"responses per effective group: DS {ds:.2f}, SARA flat {flat:.2f}, SARA history prior {history:.2f}")
    assert flat < ds
    assert history < 0.93 * ds


def test_full_filler_respects_counts_and_budget():
    rnd = FullFiller(8).start_round(np.array([3, 1, 2]), budget=10, counts=np.array([4, 6, 8]))
    ids, counts = rnd.requests()
    assert ids.tolist() == [3, 1] and counts.tolist() == [4, 6]
