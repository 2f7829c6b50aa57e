"""Every filler has one round (`event_rounds.EventRound`); deterministic mode drives it over a synchronous backend
(`SynchronousRound`). Pinned here: that synchronous driving is SARA's round-synchronous Algorithm 1 and DAPO's
batch loop exactly, against small reference implementations written from the papers, decision for decision."""

import numpy as np
import pytest

from trl_alloc.allocation import registry
from trl_alloc.allocation.baselines import DynamicSamplingFiller
from trl_alloc.allocation.event_rounds import EventRound, SynchronousRound
from trl_alloc.allocation.sara import ABANDON, COMMIT, SARAFiller, decide


def algorithm1(filler, stream, budget, target, prior_a, prior_b, outcome):
    """SARA, Algorithm 1 (round-synchronous), with budget-aware admission (docs/allocation.md): returns the calls
    (prompt ids, counts), the committed and the abandoned prompts. `outcome(pid, n)` -> n rewards (NaN: unscored)."""
    k, probe, commit_min = filler.k, filler.probe, filler.commit_min
    pos, n, s, f = (np.zeros(0, np.int64) for _ in range(4))
    nxt, spent, groups, abandoned, calls = 0, 0, [], [], []
    cont, more = np.zeros(0, np.int64), np.zeros(0, np.int64)
    while True:
        left = budget - spent
        reserve = int(np.sum(k - n[[list(pos).index(p) for p in cont]])) if cont.size else 0
        need = min(target - len(groups) - cont.size, max(left - reserve, 0) // k)
        fresh = np.arange(nxt, min(nxt + max(need, 0), stream.size))
        nxt += fresh.size
        ask_pos = np.concatenate([cont, fresh])
        want = np.concatenate([more, np.full(fresh.size, probe)])
        give = np.clip(left - (np.cumsum(want) - want), 0, want)
        keep = give > 0
        nxt -= int((~keep[cont.size:]).sum())
        fresh = fresh[keep[cont.size:]]
        pos, n, s, f = (np.concatenate([x, np.zeros(fresh.size, np.int64)]) for x in (pos, n, s, f))
        pos[pos.size - fresh.size:] = fresh
        if not keep.any():
            return calls, groups, abandoned
        ids, counts = stream[ask_pos[keep]], give[keep]
        calls.append((ids.tolist(), counts.tolist()))
        spent += int(counts.sum())
        for p, c in zip(ask_pos[keep], counts):
            j = list(pos).index(p)
            r = outcome(int(stream[p]), int(c))
            r = r[~np.isnan(r)]
            n[j] += c
            s[j] += int((r >= 0.5).sum())
            f[j] += int((r < 0.5).sum())
        verdict, p_eff = decide(n, s, k, filler.threshold(n), commit_min, (prior_a[pos], prior_b[pos]), f)
        for j in np.flatnonzero(verdict == COMMIT):
            if len(groups) < target:
                groups.append(int(stream[pos[j]]))
        abandoned += [int(stream[pos[j]]) for j in np.flatnonzero(verdict == ABANDON)]
        live = (verdict != COMMIT) & (verdict != ABANDON)
        pos, n, s, f, p_eff = pos[live], n[live], s[live], f[live], p_eff[live]
        if len(groups) >= target:
            return calls, groups, abandoned
        mixed = (s >= 1) & (f >= 1)
        order = np.lexsort((-p_eff, ~mixed))
        cont, more = pos[order], np.where(mixed, commit_min - n, 1)[order]


def drive(rnd, outcome):
    calls = []
    while not rnd.done:
        ids, counts = rnd.requests()
        calls.append((ids.tolist(), counts.tolist()))
        rnd.observe([outcome(int(p), int(c)) for p, c in zip(ids, counts)])
    return calls


def replayed(sequences):
    """`outcome(pid, n)` -> the next n rewards of prompt pid's fixed sequence (both implementations see the same)."""
    used = {}

    def outcome(pid, n):
        i = used.get(pid, 0)
        used[pid] = i + n
        return sequences[pid][i:i + n]

    return outcome


@pytest.mark.parametrize("seed", range(30))
def test_synchronous_sara_is_algorithm_1(seed):
    rng = np.random.default_rng(seed)
    rate = rng.choice([0.0, 0.05, 0.5, 0.95, 1.0], size=100)
    sequences = {p: np.where(rng.random(64) < 0.05, np.nan, (rng.random(64) < rate[p]).astype(float))
                 for p in range(100)}  # (5% unscored)
    kw = dict(group_size=int(rng.choice([4, 8])), probe=int(rng.choice([1, 2, 3])),
              tau_low=float(rng.choice([0.2, 0.45, 0.6])), commit_min=None if seed % 3 else 4)
    stream, budget, target = rng.permutation(100), int(rng.choice([20, 60, 400])), int(rng.choice([3, 8, 20]))
    prior_a, prior_b = rng.uniform(0.5, 3, 100)[stream], rng.uniform(0.5, 3, 100)[stream]
    want_calls, want_groups, want_abandoned = algorithm1(SARAFiller(**kw), stream, budget, target, prior_a, prior_b,
                                                         replayed(sequences))
    rnd = SARAFiller(**kw).start_round(stream, budget, target, prior_a=prior_a, prior_b=prior_b)
    assert isinstance(rnd, SynchronousRound)
    assert drive(rnd, replayed(sequences)) == want_calls
    assert rnd.groups == want_groups and rnd.abandoned == want_abandoned and rnd.spent <= budget


@pytest.mark.parametrize("seed", range(10))
def test_synchronous_dynamic_sampling_is_dapos_batch_loop(seed):
    """DAPO: batches of `batch_prompts` whole groups until the target is kept (std > 0); the cap is an error."""
    rng = np.random.default_rng(seed)
    rate = rng.choice([0.0, 0.5, 1.0], size=200)
    k, target, batches = 4, int(rng.choice([3, 8])), int(rng.choice([2, 10]))
    filler = DynamicSamplingFiller(group_size=k, max_generation_batches=batches)
    stream = rng.permutation(200)
    rewards = {int(p): (rng.random(k) < rate[p]).astype(float) for p in stream}
    rnd = filler.start_round(stream, 10_000, target)
    calls, kept, capped = [], [], False
    try:
        calls = drive(rnd, lambda pid, n: rewards[pid][:n])
    except RuntimeError as e:
        capped = "max_generation_batches" in str(e)
    for b in range(batches):  # the reference
        batch = stream[b * target:(b + 1) * target]
        kept += [int(p) for p in batch if np.std(rewards[int(p)]) > 0][:target - len(kept)]
        if len(kept) >= target:
            break
    assert capped == (len(kept) < target)
    if not capped:
        assert rnd.groups == kept and [ids for ids, _ in calls] == [stream[b * target:(b + 1) * target].tolist()
                                                                    for b in range(len(calls))]


def test_every_filler_has_one_round():
    """`start_round` is `start_event_round`'s round over a synchronous backend, for every registered filler."""
    for name in registry.method_names("filling"):
        filler = registry.method_class("filling", name)(group_size=4)
        sync = filler.start_round(np.arange(10), 40, 2)
        assert isinstance(sync, SynchronousRound) and isinstance(sync.round, EventRound)
        assert type(sync.round) is type(filler.start_event_round(np.arange(10), 40, 2))
