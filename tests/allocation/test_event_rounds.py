"""The fillers' event rounds (allocation/event_rounds.py, sara.SARARound, baselines.DynamicSamplingRound)
fed one rollout at a time in random orders: exact accounting, SARA's rule on every decision, and an allocator
run that resumes identically."""

import json

import numpy as np
import pytest

from trl_alloc.allocation import decide, effective_probability, make_filler, make_pacer
from trl_alloc.allocation.allocator import Allocator, json_default, read_round_log
from trl_alloc.allocation.event_rounds import BatchedEventRound
from trl_alloc.allocation.pipeline import round_arguments
from trl_alloc.allocation.sara import ABANDON


def drive(rnd, p_success, rng, window=16):
    """End a random in-flight rollout at each step (abort the cancelled ones); check the budget at every step.
    Returns the per-prompt outcome sequences and the count of started and ended rollouts."""
    live, seen, started, ended = [], {}, 0, 0
    while True:
        if not rnd.done:
            for pid, n in rnd.submissions(window - len(live)):
                live += [pid] * n
                started += n
        assert rnd.spent == started <= rnd.budget and len(live) <= window
        if not live:
            assert rnd.done
            return seen, started, ended
        pid = live.pop(int(rng.integers(len(live))))
        ok = float(rng.random() < p_success[pid])
        seen.setdefault(pid, []).append(ok)
        ended += 1
        rnd.observe_rollout(pid, ok)
        for doomed in sorted(rnd.cancelled if not rnd.done else set(live)):
            while doomed in live:
                live.remove(doomed)
                ended += 1
                rnd.observe_rollout(doomed, float("nan"), aborted=True)


@pytest.mark.parametrize("seed", range(6))
def test_sara_event_round_accounts_exactly_and_applies_eq3_on_every_decision(seed):
    rng = np.random.default_rng(seed)
    p = rng.beta(0.5, 0.5, 60)
    filler = make_filler("sara", group_size=6, probe=2, tau_low=0.45)
    rnd = filler.start_event_round(np.arange(60), budget=150, target_groups=6)
    seen, started, ended = drive(rnd, p, rng)
    assert started == ended == rnd.spent <= 150 and rnd.done and not rnd.live
    s, f, spent = rnd.outcomes(60)
    assert spent.sum() == started and (s + f).sum() == started - rnd.stats()["aborted"]
    assert len(rnd.groups) <= 6 and set(rnd.groups).isdisjoint(rnd.abandoned)
    for pid in rnd.groups:  # committed: mixed, with commit_min observed outcomes
        assert s[pid] >= 1 and f[pid] >= 1 and s[pid] + f[pid] >= 6
    for pid in rnd.abandoned:  # abandoned: eq. 3 said so at its last observed outcome
        n_obs = len(seen[pid])
        verdict, _ = decide([n_obs], [sum(seen[pid][:n_obs])], 6, 0.45)
        assert verdict[0] == ABANDON or s[pid] + f[pid] < n_obs  # (an aborted sibling ends after the decision)
    assert rnd.stats()["effective_groups"] == len(rnd.groups)


def test_sara_event_round_admits_by_expected_groups():
    """The paper's refill first (target prompts, n0 probes each); then, while rollouts run, extra prompts into the
    free window until committed + sum(p_eff) of the active prompts reaches overcommit × target."""
    filler = make_filler("sara", group_size=8, probe=2, overcommit=1.5)
    rnd = filler.start_event_round(np.arange(100), budget=10_000, target_groups=4)
    assert rnd.submissions(1000) == [(0, 2), (1, 2), (2, 2), (3, 2)]  # nothing in flight: Algorithm 1, line 10
    extra = rnd.submissions(1000)
    fresh = effective_probability(0, 0, 8)  # 7/9 for the uniform prior
    assert 4 + len(extra) == int(np.ceil(4 * 1.5 / fresh)) and all(n == 2 for _, n in extra)
    assert rnd.submissions(1000) == []  # nothing more until something ends
    with pytest.raises(ValueError, match="overcommit"):
        make_filler("sara", group_size=8, overcommit=0.5)


def test_dynamic_sampling_event_round_keeps_complete_mixed_groups_and_hits_the_cap():
    rng = np.random.default_rng(0)
    p = rng.beta(0.5, 0.5, 80)
    rnd = make_filler("dynamic_sampling", group_size=4, max_generation_batches=20).start_event_round(
        np.arange(80), budget=200, target_groups=5)
    seen, started, ended = drive(rnd, p, rng, window=12)
    assert started == ended == rnd.spent <= 200 and started % 4 == 0
    for pid in rnd.groups:
        assert len(seen[pid]) == 4 and 0 < sum(seen[pid]) < 4
    for pid in rnd.rejected:
        assert len(seen[pid]) == 4 and sum(seen[pid]) in (0, 4)
    capped = make_filler("dynamic_sampling", group_size=4, max_generation_batches=2).start_event_round(
        np.arange(80), budget=400, target_groups=3)
    with pytest.raises(RuntimeError, match="max_generation_batches"):
        drive(capped, np.zeros(80), rng)  # never mixed: 2 batches of 3 prompts, then the cap


def test_batched_event_round_takes_the_batched_rounds_decisions():
    rng = np.random.default_rng(3)
    outcomes = rng.random((30, 8)) < 0.5
    for name, kw in (("full", {}), ("sara", {"probe": 2})):
        a = make_filler(name, group_size=8, **kw).start_round(np.arange(30), 160, 8)
        b = BatchedEventRound(make_filler(name, group_size=8, **kw).start_round(np.arange(30), 160, 8))
        used = {}
        while not a.done:  # batched: each prompt's outcomes in order
            ids, counts = a.requests()
            a.observe([outcomes[p, used.get(p, 0):used.get(p, 0) + n] for p, n in zip(ids, counts)])
            for p, n in zip(ids, counts):
                used[p] = used.get(p, 0) + n
        used, live = {}, []
        while not b.done:  # events: the same outcomes, ending in reverse order, 5 at a time in flight
            for pid, n in b.submissions(5 - len(live)):
                live += [pid] * n
            pid = live.pop()
            b.observe_rollout(pid, float(outcomes[pid, used.get(pid, 0)]))
            used[pid] = used.get(pid, 0) + 1
        assert b.groups == a.groups and b.spent == a.spent and b.abandoned == a.abandoned


def make_allocator(round_log_path=None):
    pacer = make_pacer("cero", 24, rounds=5, budget=40, round_capacity=12, unit_size=2, seed=0)
    filler = make_filler("sara", group_size=4, probe=2, tau_low="auto")

    def join(pacer, units, **kw):
        return round_arguments(pacer, filler, units, **kw)
    plan = {"pacing": "cero", "filling": "sara", "pruning": "none", "num_prompts": 24, "num_rounds": 5,
            "rollout_budget": 80, "allocation_seed": 0, "dataset_fingerprint": "x"}
    return Allocator(pacer, filler, join, plan, round_log_path=round_log_path)


def event_round(e, p, rng):
    admitted = e.start_round(events=True)
    live, rows = [], []
    while not e.round_done or live:
        if not e.round_done:
            for pid, n in e.submissions(6 - len(live)):
                live += [pid] * n
        if not live:
            continue
        pid = live.pop(int(rng.integers(len(live))))
        row = {"pid": pid, "success": float(rng.random() < p[pid]), "completion_ids": [1, 2]}
        rows.append(row)
        cancelled = set(e.observe_rollouts([row]))
        for doomed in [x for x in live if x in cancelled]:
            live.remove(doomed)
            rows.append({"pid": doomed, "success": float("nan"), "aborted": True, "completion_ids": [1]})
            e.observe_rollouts([rows[-1]])
    summary = e.finish_round()
    e.record_round(summary, rows, admitted, [], len(summary["groups"]) * 4, 0.0, 1.0)
    return rows


def test_allocator_event_rounds_never_overspend_and_resume_identically(tmp_path):
    p = np.random.default_rng(1).uniform(0, 1, 24)
    full, first = make_allocator(str(tmp_path / "full.jsonl")), make_allocator()
    rng_a, rng_b = np.random.default_rng(2), np.random.default_rng(2)
    spent = 0
    for _ in range(2):
        spent += len(event_round(full, p, rng_a))
        event_round(first, p, rng_b)
    resumed = make_allocator(str(tmp_path / "resumed.jsonl"))
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict(), default=json_default)))
    for _ in range(3):
        spent += len(event_round(full, p, rng_a))
        event_round(resumed, p, rng_b)
    full_log = read_round_log(str(tmp_path / "full.jsonl"))
    assert resumed.history == full.history and read_round_log(str(tmp_path / "resumed.jsonl")) == full_log[2:]
    assert [x["round"] for x in full_log] == list(range(5))
    assert full.counters["responses"] == spent == 80 - full.pacer.remaining_responses <= 80


@pytest.mark.parametrize("replace_probes", [True, False])
def test_sara_replace_probes_paces_an_undecided_prompt(replace_probes):
    """As events, an undecided unmixed prompt's ended rollout is replaced at once, so n0 keep running (default);
    with `replace_probes=False` it gets one more only once none of its rollouts is in flight, as Algorithm 1 paces
    it; and the budget holds either way."""
    filler = make_filler("sara", group_size=8, probe=2, tau_low=0.01, replace_probes=replace_probes)
    rnd = filler.start_event_round(np.arange(1), budget=64, target_groups=1)
    assert rnd.submissions(100) == [(0, 2)]
    rnd.observe_rollout(0, 0.0)  # one probe failed; the other still runs: the prompt continues
    assert rnd.submissions(100) == ([(0, 1)] if replace_probes else [])
    rnd.observe_rollout(0, 0.0)
    assert rnd.submissions(100) == [(0, 1)]  # nothing of it in flight now: one more either way
    seen, started, ended = drive(filler.start_event_round(np.arange(40), budget=400, target_groups=6),
                                 np.full(40, 0.3), np.random.default_rng(0))
    assert started == ended <= 400
    with pytest.raises(ValueError, match="replace_probes"):
        make_filler("sara", replace_probes="no")
