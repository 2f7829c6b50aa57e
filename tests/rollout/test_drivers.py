"""Event-driven rounds over rollout backends (rollout/drivers.py): exact accounting whatever the order of
events, kept groups mixed, the surplus aborted once the target is reached; the engine model
(rollout/engine_model.py) shows where the wall-clock goes."""

import importlib.util
from collections import Counter

import numpy as np
import pytest

from trl_alloc.allocation import make_filler
from trl_alloc.allocation.event_rounds import BatchedEventRound
from trl_alloc.rollout.backends import BatchedRollouts, VLLMServerRollouts
from trl_alloc.rollout.engine_model import SimulatedRollouts
from trl_alloc.rollout.drivers import run_round


def first_token_even(rollout):
    """A success signal the random policy splits about evenly."""
    return float(bool(rollout.token_ids) and rollout.token_ids[0] % 2 == 0)


def ds_round(budget, k, target, max_batches=10):
    return make_filler("dynamic_sampling", group_size=k, max_generation_batches=max_batches).start_event_round(
        np.arange(1000), budget, target)


def check_accounting(driver, rnd, budget, k, max_tokens, success=first_token_even):
    submitted = [rid for kind, _, rid in driver.events if kind == "submit"]
    ended = Counter(rid for kind, _, rid in driver.events if kind in ("done", "abort"))
    assert driver.spent == rnd.spent == len(submitted) <= budget
    assert sorted(ended) == sorted(submitted) and set(ended.values()) == {1}  # each rollout ends once
    assert len(driver.ended) == driver.spent and driver.tokens == sum(len(r.token_ids) for r in driver.ended)
    assert driver.aborted == sum(r.finish_reason == "abort" for r in driver.ended) == rnd.stats()["aborted"]
    assert all(len(r.token_ids) <= max_tokens for r in driver.ended)
    by_pid = {}
    for r in driver.ended:
        by_pid.setdefault(r.tag, []).append(r)
    for pid in rnd.groups:  # kept groups are complete and mixed
        scores = [success(r) for r in by_pid[pid]]
        assert len(scores) == k and 0 < sum(scores) < k and all(r.finish_reason != "abort" for r in by_pid[pid])
    return by_pid


def test_batched_dynamic_sampling_is_exact_and_deterministic(tiny_random_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.evaluation import TransformersBackend, tokenize_prompts

    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir)
    tok = AutoTokenizer.from_pretrained(tiny_random_dir)
    backend = TransformersBackend(model, tok, batch_size=32)
    prompts = tokenize_prompts(tok, [f"{a}+{b}=" for a in range(6) for b in range(5)])
    runs = []
    for _ in range(2):
        rollouts = BatchedRollouts.from_backend(backend, temperature=1.0, seed=3)
        rnd = ds_round(40, 4, 3)
        driver = run_round(rnd, rollouts, prompts.__getitem__, first_token_even, max_tokens=4, max_inflight=8)
        check_accounting(driver, rnd, 40, 4, 4)
        assert rollouts.in_flight == 0 and rollouts.calls == driver.spent // 8 + (driver.spent % 8 > 0)
        runs.append((driver.events, rnd.groups))
    assert runs[0] == runs[1]  # one seed, one run
    # a target that cannot be met spends whole groups up to the budget, and keeps none
    rollouts = BatchedRollouts.from_backend(backend, temperature=1.0, seed=3)
    rnd = ds_round(18, 4, 3)
    driver = run_round(rnd, rollouts, prompts.__getitem__, lambda r: 1.0, max_tokens=4)
    assert driver.spent == 16 and rnd.groups == [] and len(rnd.rejected) == 4 and driver.aborted == 0


def test_engine_model_event_rounds_beat_synchronous_calls():
    """On the engine model (continuous batching, long-tailed lengths), SARA as events needs far less engine time per
    effective group than SARA as synchronous calls, and less than synchronous dynamic sampling; it spends more
    responses than synchronous SARA (overcommit). Measured over these 3 seeds (a deterministic simulation):
    time ratios 0.11 (vs sync SARA) and 0.64-0.81 (vs sync DS), responses 1.2-1.6x sync SARA's."""
    p = np.random.default_rng(0).beta(0.4, 0.4, 400)

    def outcome(pid, rng):
        return int(rng.lognormal(np.log(300), 0.7)), float(rng.random() < p[pid])

    def run(rnd, seed):
        engine = SimulatedRollouts(outcome, max_num_seqs=128, seed=seed)
        driver = run_round(rnd, engine, lambda pid: [1], lambda r: r.info["success"], 1024, max_inflight=256)
        assert driver.spent == rnd.spent and driver.tokens == sum(len(r.token_ids) for r in driver.ended)
        assert 0 <= engine.idle_fraction <= 1 and rnd.stats()["effective_groups"] == 32
        return engine.clock_s / 32, driver.spent

    for seed in range(3):
        sara = lambda: make_filler("sara", group_size=8)  # noqa: E731
        sync_s, sync_n = run(BatchedEventRound(sara().start_round(np.arange(400), 4000, 32)), seed)
        event_s, event_n = run(sara().start_event_round(np.arange(400), 4000, 32), seed)
        ds_s, ds_n = run(BatchedEventRound(make_filler("dynamic_sampling", group_size=8).start_round(
            np.arange(400), 4000, 32)), seed)
        assert event_s < 0.5 * sync_s and event_s < ds_s, (seed, event_s, sync_s, ds_s)
        assert event_n < 1.7 * sync_n, (seed, event_n, sync_n)  # the price: over-admitted prompts aborted


def test_engine_model_pruning_in_the_stream_decides_whole_cohorts_and_frees_their_slots():
    """Snapshots at the detection point are decided a cohort (one submission) at a time; a pruned rollout is
    aborted there (detect_at tokens, spent, no reward) and the others run on; exact accounting."""
    def outcome(pid, rng):
        return (10 if pid == 0 else 60), 1.0  # prompt 0's rollouts end before the point: never snapshotted

    engine = SimulatedRollouts(outcome, max_num_seqs=8, seed=0)  # 8 slots for 24 rollouts: cohorts queue
    calls = []

    def on_detect(snaps):
        calls.append([(s.tag, s.info["cohort"], s.info["ended"]) for s in snaps])
        return [s.rid for s in snaps if s.rid % 2 == 0]

    full = make_filler("full", group_size=4).start_event_round(np.arange(6), budget=24, target_groups=6)
    driver = run_round(full, engine, lambda pid: [1], lambda r: r.info["success"], 100, max_inflight=24,
                       detect_at=20, on_detect=on_detect)
    cohorts = Counter(c for call in calls for _, c, _ in call)
    assert sorted(cohorts) == [1, 2, 3, 4, 5] and set(cohorts.values()) == {4}  # whole cohorts; prompt 0: none
    assert not any(e for call in calls for *_, e in call)  # (no rollout ends between 20 and 60 tokens)
    ended = {r.rid: r for r in driver.ended}
    assert driver.pruned == {rid for rid in ended if rid % 2 == 0 and ended[rid].tag != 0}
    for rid, r in ended.items():  # a pruned one runs on while its cohort's last members reach the point
        if rid in driver.pruned:
            assert r.finish_reason == "abort" and 20 <= len(r.token_ids) < 60
        else:
            assert len(r.token_ids) == (10 if r.tag == 0 else 60)
    assert full.spent == driver.spent == 24 and full.stats()["pruned"] == len(driver.pruned) == 10
    assert driver.tokens == sum(len(r.token_ids) for r in driver.ended) < 4 * 10 + 20 * 60


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_server_dynamic_sampling_aborts_the_surplus_with_exact_accounting(vllm_server):
    prompts = {i: [5 + i % 20, 6, 7] for i in range(1000)}
    rollouts = VLLMServerRollouts(vllm_server.url, temperature=1.0, seed=0, extra={"ignore_eos": True})
    try:
        # rollout-id parity: every group of two consecutive rollouts is mixed, so the target is reached
        # with the first two groups to finish, and the rest of the window is aborted
        odd = lambda r: float(r.rid % 2)  # noqa: E731
        rnd = ds_round(48, 2, 2)
        driver = run_round(rnd, rollouts, prompts.__getitem__, odd, max_tokens=60, max_inflight=16, timeout=120)
        check_accounting(driver, rnd, 48, 2, 60, success=odd)
        assert len(rnd.groups) == 2  # (whether any rollout is still running to abort then is timing)
        done = [i for i, (kind, pid, _) in enumerate(driver.events) if kind == "done" and pid in rnd.groups]
        submits = [i for i, (kind, _, _) in enumerate(driver.events) if kind == "submit"]
        assert max(submits) < max(done) and driver.spent < 48  # nothing submitted once the target is met
        assert rollouts.in_flight == 0 and rollouts.next_completed(timeout=1) == []
        assert all(len(r.token_ids) < 60 for r in driver.ended if r.finish_reason == "abort")

        # SARA as events: a prompt that never succeeds is abandoned (an in-flight sibling is aborted); prompts
        # whose rollouts alternate are committed at k; exact accounting throughout
        sara = make_filler("sara", group_size=4, probe=2, tau_low=0.45).start_event_round(
            np.arange(1000), budget=80, target_groups=3)
        score = lambda r: 0.0 if r.tag % 2 == 0 else float(r.rid % 2)  # noqa: E731
        driver = run_round(sara, rollouts, prompts.__getitem__, score, max_tokens=60, max_inflight=12, timeout=120)
        by_pid = check_accounting(driver, sara, 80, 4, 60, success=score)
        assert sara.abandoned and all(pid % 2 == 1 for pid in sara.groups)  # even prompts never mix
        # eq. 3 abandons unmixed prompts only (an odd prompt can be one: when the window splits its probes,
        # its rollout ids may share a parity)
        for pid in sara.abandoned:
            seen = {score(r) for r in by_pid[pid] if r.finish_reason != "abort"}
            assert len(seen) <= 1, (pid, seen)
        for r in driver.ended:  # every aborted rollout belongs to a decided prompt or came after the target
            if r.finish_reason == "abort":
                assert r.tag in sara.abandoned or r.tag not in sara.groups
        assert rollouts.in_flight == 0 and sum(len(v) for v in by_pid.values()) == driver.spent

        # in-stream pruning at the detection point: the rollouts named at their snapshot are aborted in the
        # engine and end pruned (spent, no reward, filling their group); the rest run on in their request
        full = make_filler("full", group_size=4).start_event_round(np.arange(6), budget=24, target_groups=6)
        calls = []

        def doomed(snaps):  # decided a whole cohort (one submission: a prompt's 4 rollouts) at a time
            calls.append(sorted(r.rid for r in snaps))
            return [r.rid for r in snaps if r.rid % 4 == 0]

        driver = run_round(full, rollouts, prompts.__getitem__, lambda r: float(r.rid % 2), max_tokens=120,
                           max_inflight=24, timeout=120, detect_at=6, on_detect=doomed)
        cohorts = sorted(rid for call in calls for rid in call)
        assert cohorts == sorted(r.rid for r in driver.ended)  # every rollout's snapshot, exactly once
        base = cohorts[0]
        for call in calls:  # whole cohorts only: rollouts base + 4c .. base + 4c + 3 were one submission
            whole = {(rid - base) // 4 for rid in call}
            assert call == sorted(base + 4 * c + j for c in whole for j in range(4)), calls
        ended = {r.rid: r for r in driver.ended}
        # the named ones are cut where the abort reaches them in time; one that ended first is kept, complete
        # (how many is timing: the tiny model decodes 120 tokens in about a second)
        assert driver.pruned <= {rid for rid in ended if rid % 4 == 0}
        for rid, r in ended.items():
            if rid in driver.pruned:
                assert r.finish_reason == "abort" and 6 <= len(r.token_ids) < 120
            else:
                assert r.finish_reason == "length" and len(r.token_ids) == 120
        n_pruned = len(driver.pruned)
        assert full.stats()["pruned"] == n_pruned and full.stats()["aborted"] == driver.aborted == 0
        assert sum(kind == "prune" for kind, _, _ in driver.events) == n_pruned and full.spent == 24
        assert len(full.groups) == 6 and driver.tokens == sum(len(r.token_ids) for r in driver.ended)
    finally:
        rollouts.close()


def test_plan_engine_model_reports_gpu_seconds_per_effective_group(capsys):
    """plan.py's engine table: every method synchronous (and, for an adaptive filler, as events), exact totals."""
    import argparse

    from trl_alloc.cli.plan import engine_table

    args = argparse.Namespace(prompts=600, rounds=40, budget=8000, unit_size=4, units_per_group=2, capacity=60,
                              tau_low=0.45, history_decay=1.0, drift=1.5, seed=0, engine_methods="uniform,cero+sara",
                              engine_rounds=4, engine_seqs=64, step_ms=25.0, length_median=300.0, length_sigma=0.6,
                              max_tokens=1024, rollout_max_inflight=64, gpus_per_engine=2, engine_prune="uniform",
                              prune_keep=0.5, detect_length=128, train_gpus=0, train_ms_per_token=0.0, sync_s=0.0,
                              engine_staleness="")
    rows = engine_table(args)
    assert set(rows) == {"uniform sync", "cero+sara sync", "cero+sara events", "uniform events + pruning"}
    for r in rows.values():
        assert r["rounds"] == 4 and 0 < r["responses"] <= 8000 and r["effective_groups"] > 0
        assert r["gpu_s_per_eff"] == pytest.approx(2 * r["engine_s"] / r["effective_groups"])
        # learning signal: at most 1/4 per effective group (p(1-p) <= 1/4), more than nothing
        assert 0 < r["signal"] <= r["effective_groups"] / 4
        assert r["gpu_s_per_signal"] == pytest.approx(2 * r["engine_s"] / r["signal"])
        assert 0 <= r["idle"] < 1 and r["tokens"] <= r["responses"] * 1024
    assert rows["cero+sara events"]["engine_s"] < rows["cero+sara sync"]["engine_s"]
    # pruning in the stream: the same responses as full groups, fewer tokens; no pruning elsewhere
    pruned, full = rows["uniform events + pruning"], rows["uniform sync"]
    assert pruned["responses"] == full["responses"] and 0 < pruned["pruned"] < pruned["responses"]
    assert pruned["tokens"] < full["tokens"] and pruned["engine_s"] < full["engine_s"]
    assert all(r["pruned"] == 0 for name, r in rows.items() if "pruning" not in name)
    assert "GPU-s/eff" in capsys.readouterr().out


def test_learning_signal_is_the_within_group_variance_of_trained_groups():
    """Σ p(1 - p) over groups, from scored rows only: pruned, aborted and unscored (NaN) rows do not count."""
    from trl_alloc.rollout.engine_model import learning_signal

    nan = float("nan")
    rows = ([{"pid": 0, "success": s} for s in (1, 0, 0, 0)]            # p = 1/4: 3/16
            + [{"pid": 1, "success": s} for s in (1, 1, 0, 0)]          # p = 1/2: 1/4
            + [{"pid": 2, "success": 1.0}] * 4                          # p = 1: nothing to learn
            + [{"pid": 3, "success": 1.0}, {"pid": 3, "success": 0.0},  # p = 1/2 over its two scored rows
               {"pid": 3, "success": 0.0, "pruned": True}, {"pid": 3, "success": 1.0, "aborted": True},
               {"pid": 3, "success": nan}])
    assert learning_signal(rows) == 3 / 16 + 1 / 4 + 0 + 1 / 4
    assert learning_signal([]) == 0.0


@pytest.mark.parametrize("overcommit", [1.5, 3.0])
def test_plan_builds_sara_with_its_overcommit(overcommit):
    """`plan.py --sara_overcommit` reaches the filler it simulates (the config's `sara_overcommit`)."""
    import argparse

    from trl_alloc.allocation.simulate import plan_allocator

    args = argparse.Namespace(prompts=600, rounds=40, budget=8000, unit_size=4, units_per_group=2, capacity=60,
                              tau_low=0.45, history_decay=1.0, seed=0, sara_overcommit=overcommit)
    allocator, config = plan_allocator("cero+sara", args)
    assert allocator.filler.overcommit == config.sara_overcommit == overcommit


def test_a_rollout_the_server_cannot_generate_fails_the_round_clearly():
    """No server at the URL: each streamed request fails, and the round stops with the rollout backend's error."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, nothing listens
    rollouts = VLLMServerRollouts(f"http://127.0.0.1:{port}", model="m", request_timeout=5)
    try:
        with pytest.raises(RuntimeError, match="failed in the rollout backend: ConnectionError"):
            run_round(ds_round(8, 2, 1), rollouts, lambda pid: [1, 2], lambda r: 1.0, max_tokens=4, timeout=30)
    finally:
        rollouts.close()


def test_pruning_only_mixed_prompts_spares_saras_probes():
    """`prune_undecided=False`: the engine model's SARA round with pruning allowed only where the prompt is known
    to be mixed; every pruned rollout belongs to such a prompt (the rest of a committed group), probes never."""
    from trl_alloc.allocation.arrol import RandomPruning

    p = np.random.default_rng(0).uniform(0.3, 0.7, 200)

    def outcome(pid, rng):
        return int(rng.lognormal(np.log(300), 0.5)) + 50, float(rng.random() < p[pid])

    rnd = make_filler("sara", group_size=8).start_event_round(np.arange(200), 1200, 16)
    engine = SimulatedRollouts(outcome, max_num_seqs=64, seed=0)
    policy, cut_mixed = RandomPruning(keep_ratio=0.5, cold_start_rounds=0, seed=0), []

    def on_detect(snaps):
        allowed = [rnd.mixed(s.tag) and not s.info["ended"] for s in snaps]
        cut = policy.prune([s.info["cohort"] for s in snaps]) & np.asarray(allowed)
        cut_mixed.extend(rnd.mixed(s.tag) for s, c in zip(snaps, cut) if c)
        return [s.rid for s, c in zip(snaps, cut) if c]

    driver = run_round(rnd, engine, lambda pid: [1], lambda r: r.info["success"], 1024, max_inflight=64,
                       detect_at=40, on_detect=on_detect)
    assert driver.pruned and len(cut_mixed) >= len(driver.pruned) and all(cut_mixed)
    submitted_first = {}
    for kind, pid, rid in driver.events:  # a prompt's first submission is its probe: never pruned
        if kind == "submit":
            submitted_first.setdefault(pid, []).append(rid)
    probes = {rid for rids in submitted_first.values() for rid in rids[:2]}
    assert not probes & driver.pruned
    assert driver.spent == rnd.spent <= 1200 and rnd.stats()["pruned"] == len(driver.pruned)
