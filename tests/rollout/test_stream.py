"""One rollout stream across rounds (`StreamDriver` + the fillers' carry-over) on the engine model: exact
accounting at every round boundary, carried rollouts trained once, the staleness bound, and what CERO has
seen when it proposes the next round."""

import argparse
import collections
import json

import numpy as np
import pytest

from trl_alloc.allocation import make_filler, make_pacer
from trl_alloc.allocation.allocator import Allocator
from trl_alloc.allocation.pipeline import round_arguments
from trl_alloc.rollout.engine_model import SimulatedRollouts, simulate_engine
from trl_alloc.rollout.drivers import StreamDriver
from trl_alloc.allocation.rounds import Rounds

FILLERS = {"full": {}, "sara": {"tau_low": 0.45}, "dynamic_sampling": {"max_generation_batches": 6}}


class LateAborts(SimulatedRollouts):
    """As vLLM's streamed backend: an abort does not reach a rollout that has already ended; that one is handed
    back by a later `next_completed` (the engine model's own `abort` returns it at once)."""

    def abort(self, rids):
        ended = {r.rid for r in self._ended if r.finish_reason != "detect"}
        return super().abort([rid for rid in rids if rid not in ended])


class CheckpointedCarry(Allocator):
    """Each stream round resumes its open groups from JSON, with string keys, as a checkpoint holds them."""

    def start_round(self, events=False, carry=None, wait_for_groups=False):
        return super().start_round(events, None if carry is None else json.loads(json.dumps(carry)), wait_for_groups)


def run_stream(pacing, filling, rounds=8, max_staleness=1, window=48, train_s=3.0, seed=0, prompts=300,
               engine_cls=SimulatedRollouts):
    """`rounds` stream rounds through the round runner (`allocation.rounds.Rounds.stream`, a server's order: the next
    round opens before the training step); returns the driver, the per-round log and the checks' raw material."""
    k = 8
    if pacing == "cero":
        pacer = make_pacer("cero", prompts, rounds=40, budget=800, round_capacity=24, max_units=2, unit_size=4,
                           seed=seed)
    else:
        pacer = make_pacer("uniform", prompts, prompts_per_round=12, group_size=k, budget_responses=8000, seed=seed)
    filler = make_filler(filling, group_size=k, **FILLERS[filling])
    allocator = CheckpointedCarry(pacer, filler, lambda pc, units, **kw: round_arguments(pc, filler, units, **kw),
                                  plan={})
    p = np.random.default_rng(seed).uniform(0.05, 0.95, prompts)
    budget0 = pacer.remaining_responses

    def outcome(pid, rng):
        return rng.lognormal(np.log(60), 0.7), rng.random() < p[pid]

    def train_and_push(bump):  # the next round's rollouts go on while this one trains, then the engine pauses to push
        engine.run_for(train_s)
        engine.pause_for(0.5)
        bump()

    engine = engine_cls(outcome, max_num_seqs=window, step_s=0.05, seed=seed)
    driver = StreamDriver(engine, lambda pid: [], 256, max_inflight=window, max_staleness=max_staleness)
    log, trained_rids, events = [], collections.Counter(), []

    def at_close(closed):  # the runner's `record` hook: at the close, before the next round opens
        rnd = closed.closed
        events.extend(driver.take_events())  # (the driver keeps only the current round's)
        s, f, started = rnd.outcomes(pacer.num_prompts)
        # the budget is exact at every boundary: what was started, in flight included, is spent
        assert budget0 - pacer.remaining_responses == driver.spent
        assert driver.spent == driver.ended_count + len(driver.live)
        # carried: still running, or ended after the close (replayed into the next round); the rest of what runs
        # was aborted at the close and ended before the abort reached it (it comes back through a later poll)
        carried = sum(st["live"] for st in driver.carry.values())
        running = sum(pid in driver.carry for pid in driver.live.values())
        assert carried == driver.carried == running + len(driver.replay)
        log.append({"round": closed.index, "groups": list(rnd.groups), "trained": driver.trained,
                    "stats": rnd.stats(), "s": s, "f": f})
        for row in driver.trained:
            trained_rids[row["rid"]] += 1
    for _ in Rounds.stream(allocator, driver, rounds, success=lambda r: r.info["success"], push=train_and_push,
                           record=at_close):
        pass
    dropped = driver.finish()
    driver.run_events = events + driver.take_events()
    return driver, log, trained_rids, None, dropped, pacer, budget0


@pytest.mark.parametrize("engine_cls", [SimulatedRollouts, LateAborts])
@pytest.mark.parametrize("pacing,filling", [("uniform", "full"), ("uniform", "sara"), ("cero", "sara"),
                                            ("uniform", "dynamic_sampling")])
def test_stream_accounting_is_exact_across_rounds(pacing, filling, engine_cls):
    driver, log, trained, observed, dropped, pacer, budget0 = run_stream(pacing, filling, max_staleness=2,
                                                                         engine_cls=engine_cls)
    # every started rollout ends exactly once, across rounds (the stream's end included)
    ends = collections.Counter(rid for kind, _, rid in driver.run_events if kind != "submit")
    submits = [rid for kind, _, rid in driver.run_events if kind == "submit"]
    assert len(submits) == len(set(submits)) == driver.spent == driver.ended_count
    assert set(ends) == set(submits) and max(ends.values()) == 1
    assert budget0 - pacer.remaining_responses == driver.spent and not driver.live
    # carried rollouts are trained once, never twice; a trained row belongs to a group its round committed
    assert trained and max(trained.values()) == 1
    for entry in log:
        assert all(row["pid"] in entry["groups"] for row in entry["trained"])
        assert all(not row["aborted"] for row in entry["trained"])
    # the stream did carry groups over and overlapped training, within the bound
    assert driver.carried_total > 0
    staleness = collections.Counter(row["staleness"] for e in log for row in e["trained"])
    assert max(staleness) <= 2 and staleness[1] > 0


def test_no_trained_rollout_is_older_than_max_staleness():
    """CERO + SARA's straddling groups: groups past the bound are dropped (aborted, counted), at 1 and at 2."""
    for bound in (1, 2):
        driver, log, *_ = run_stream("cero", "sara", rounds=10, max_staleness=bound, window=48)
        rows = [row for e in log for row in e["trained"]]
        assert rows and max(row["staleness"] for row in rows) <= bound
        assert driver.stale_aborted > 0 and sum(e["stats"]["expired"] for e in log) > 0  # the bound did act
    with pytest.raises(ValueError, match="max_staleness"):
        StreamDriver(SimulatedRollouts(lambda pid, rng: (4, 1)), lambda pid: [], 8, max_staleness=0)


def test_cero_has_seen_exactly_the_outcomes_that_ended_in_closed_rounds():
    """Delayed feedback (docstring of `CEROScheduler.update`): with ρ = 1 the Beta state is the prior plus every
    observed outcome of a rollout that ended before its round closed; carried ones count in the round that
    observes them, spend counts at submission."""
    driver, log, *_ , pacer, budget0 = run_stream("cero", "sara", rounds=8, max_staleness=2)
    s = sum(e["s"] for e in log)
    f = sum(e["f"] for e in log)
    assert np.array_equal(pacer.beta.a, 1.0 + s) and np.array_equal(pacer.beta.b, 1.0 + f)
    # and those outcomes are the scored rows the driver handed to the closed rounds
    assert s.sum() + f.sum() <= driver.ended_count
    assert sum(int(e["stats"]["carried_in"]) for e in log) > 0


def test_carry_survives_a_checkpoint_and_resumes_first():
    """A SARA round closes once its budget is all started; its open groups, through JSON, are the next round's
    first prompts with their (n, s, f) and rollouts in flight, already paid for (never a second group)."""
    filler = make_filler("sara", group_size=4, probe=2)
    rnd = filler.start_event_round(np.arange(6), budget=12, target_groups=6, carry={})
    assert rnd.submissions(room=6) == [(0, 2), (1, 2), (2, 2)]
    rnd.observe_rollouts([{"pid": 0, "success": 1.0}, {"pid": 1, "success": 1.0}, {"pid": 0, "success": 0.0}])
    # prompt 0 is mixed: the rest of its group; prompt 1 keeps n0 running; then fresh probes up to the budget
    assert rnd.submissions(room=6) == [(0, 2), (1, 1), (3, 2), (4, 1)]
    assert rnd.done and rnd.spent == 12 and not rnd.cancelled  # closed, nothing aborted
    carry = json.loads(json.dumps(rnd.hand_over(expire=[2])))
    assert rnd.expired == [2] and rnd.cancelled == {2}  # a group past the staleness bound is dropped
    assert sorted(int(p) for p in carry) == [0, 1, 3, 4]
    assert carry["0"] == {"pid": 0, "started": 4, "ended": 2, "s": 1, "f": 1, "a": 1.0, "b": 1.0, "need": 0, "live": 2}
    nxt = filler.start_event_round(np.arange(8), budget=8, target_groups=4, carry=carry)
    assert nxt.stream.tolist() == [0, 1, 3, 4, 2, 5, 6, 7]
    assert nxt.in_flight == 2 + 2 + 2 + 1 and nxt.spent == 0 and nxt.prepaid_counts(8).sum() == 7
    assert nxt.submissions(room=2) == [(4, 1), (2, 1)]  # the carried prompt's next rollout first, then fresh
    nxt.observe_rollouts([{"pid": 0, "success": 0.0}, {"pid": 0, "success": 1.0}])  # prompt 0's group completes
    assert nxt.groups == [0] and nxt.mixed(0)
    s, f, started = nxt.outcomes(8)
    assert (s[0], f[0], started[0]) == (1, 1, 0)  # observed here, paid for by the round before


def test_engine_model_stream_rows_add_up():
    """plan.py's stream rows: training in the loop, overlap shortens the wall clock, totals add up."""
    args = argparse.Namespace(prompts=600, rounds=40, budget=8000, unit_size=4, units_per_group=2, capacity=60,
                              tau_low=0.45, history_decay=1.0, drift=1.5, seed=0, engine_seqs=64, step_ms=25.0,
                              length_median=300.0, length_sigma=0.6, max_tokens=1024, rollout_max_inflight=64,
                              detect_length=128,
                              train_gpus=2, train_ms_per_token=0.5, sync_s=1.0, max_staleness=2)
    sync = simulate_engine("uniform", "sync", args, 6)
    stream = simulate_engine("uniform", "stream", args, 6)
    for r in (sync, stream):
        assert r["rounds"] == 6 and 0 < r["responses"] <= 8000 and r["train_s"] > 0 and 0 <= r["idle"] < 1
        assert r["trained_tokens"] * 0.5e-3 / 2 == pytest.approx(r["train_s"])
        assert sum(r["staleness"].values()) > 0
    assert set(sync["staleness"]) == {0} and max(stream["staleness"]) <= 2
    assert stream["engine_s"] < sync["engine_s"]  # generation overlaps training, no round waits on its tail
    # synchronous rounds: generation, then the engine waits for training and the push (1 s a round)
    generation_only = simulate_engine("uniform", "sync", argparse.Namespace(
        **{**vars(args), "train_ms_per_token": 0.0, "sync_s": 0.0}), 6)
    assert sync["engine_s"] == pytest.approx(generation_only["engine_s"] + sync["train_s"] + 6 * 1.0)


def test_engine_model_colocate_overlaps_nothing():
    """plan.py --colocate: one GPU generates and trains in turn, so a stream overlaps nothing (its wall clock is its
    generation plus every round's training and push), and its rounds wait for their groups: only a filler's
    surplus, running when the round has its groups, is carried."""
    args = argparse.Namespace(prompts=600, rounds=40, budget=8000, unit_size=4, units_per_group=2, capacity=60,
                              tau_low=0.45, history_decay=1.0, drift=1.5, seed=0, engine_seqs=64, step_ms=25.0,
                              length_median=300.0, length_sigma=0.6, max_tokens=1024, rollout_max_inflight=64,
                              detect_length=128,
                              train_gpus=1, train_ms_per_token=0.5, sync_s=1.0, max_staleness=2, colocate=True)
    for method in ("uniform", "cero+sara"):
        stream = simulate_engine(method, "stream", args, 6)
        assert stream["rounds"] == 6 and max(stream["staleness"]) <= 2
        generation_only = simulate_engine(method, "stream", argparse.Namespace(
            **{**vars(args), "train_ms_per_token": 0.0, "sync_s": 0.0}), 6)
        trained_rounds = 6  # every round of these two trains (a group commits in each)
        assert stream["engine_s"] >= stream["train_s"] + trained_rounds * 1.0
        if method == "uniform":  # full groups: nothing runs past a round's groups, so nothing is carried
            assert stream["carried"] == 0 and set(stream["staleness"]) == {0}
            assert stream["engine_s"] == pytest.approx(generation_only["engine_s"] + stream["train_s"] + 6 * 1.0)
    server = simulate_engine("uniform", "stream", argparse.Namespace(**{**vars(args), "colocate": False}), 6)
    assert server["engine_s"] < simulate_engine("uniform", "stream", args, 6)["engine_s"]  # a server overlaps


def test_every_token_records_the_version_that_generated_it():
    """A push notes each rollout's tokens so far: its later tokens are the new version's. One engine slot, 10-token
    rollouts, a push after 4 steps: the running rollout's first 4 tokens are one version old, the rest and the
    waiting rollout's (all generated after the push) are current."""
    engine = SimulatedRollouts(lambda pid, rng: (10, 1.0), max_num_seqs=1, step_s=1.0)
    driver = StreamDriver(engine, lambda pid: [], 64, max_staleness=1)
    rnd = make_filler("full", group_size=2).start_event_round(np.arange(1), budget=2, target_groups=1, carry={},
                                                                   wait_for_groups=True)
    driver.start(rnd)
    engine.run_for(4.0)
    driver.push()
    driver.run(lambda r: r.info["success"])
    first, second = sorted(driver.trained, key=lambda row: row["rid"])
    assert first["token_staleness"] == [1] * 4 + [0] * 6 and first["staleness"] == 1
    assert second["token_staleness"] == [0] * 10 and second["staleness"] == 0  # submitted at 0, waited: all new
    assert driver.token_staleness == {1: 4, 0: 16}


def test_token_versions_across_many_pushes():
    """On a CERO + SARA stream: one version per completion token, oldest first, the row's staleness its oldest
    token's, none past the bound, and rollouts that straddle a push (tokens of two versions)."""
    driver, log, *_ = run_stream("cero", "sara", rounds=8, max_staleness=2)
    rows = [row for e in log for row in e["trained"]]
    straddling = 0
    for row in rows:
        per_token = row["token_staleness"]
        assert len(per_token) == len(row["completion_ids"]) and per_token[0] == row["staleness"]
        assert per_token == sorted(per_token, reverse=True) and 0 <= per_token[-1] and per_token[0] <= 2
        straddling += len(set(per_token)) > 1
    assert straddling > 0


def held_by(driver):
    """How many items the stream driver's containers hold (rollouts, ids, events, rows)."""
    return (len(driver.events) + len(driver.ended) + len(driver.pruned) + len(driver._cohort_of)
            + sum(map(len, driver._unresolved.values())) + sum(map(len, driver._snapshots.values()))
            + len(driver.started_at) + len(driver.marks) + len(driver.group_version) + len(driver._orphans)
            + sum(map(len, driver.held.values())) + len(driver.live) + len(driver.replay) + len(driver._held))


def test_a_stream_holds_no_history():
    """2,000 stream rounds (through the round runner, `allocation.rounds.Rounds`) with carried groups and in-stream
    pruning at a detection point: what the driver holds stays what one round and the rollouts in flight need (it
    used to keep every ended rollout, every pruned id and every detection cohort: 3.7x more after 40 rounds than
    after 10), while the run's totals stay exact."""
    k, prompts, rounds = 4, 200, 2000
    pacer = make_pacer("uniform", prompts, prompts_per_round=2, group_size=k, budget_responses=10 ** 6, seed=0)
    filler = make_filler("full", group_size=k)
    p = np.random.default_rng(0).uniform(0.05, 0.95, prompts)
    engine = SimulatedRollouts(lambda pid, rng: (rng.lognormal(np.log(20), 0.7), rng.random() < p[pid]),
                               max_num_seqs=8, step_s=0.05, seed=0)
    driver = StreamDriver(engine, lambda pid: [], 64, max_inflight=8, max_staleness=2, detect_at=8,
                          on_detect=lambda snaps: [r.rid for r in snaps if r.rid % 3 == 0])
    allocator = Allocator(pacer, filler, lambda pacer, units, **kw: round_arguments(pacer, filler, units, **kw),
                          plan={})
    held, budget0 = [], pacer.remaining_responses
    for _ in Rounds.stream(allocator, driver, rounds, success=lambda r: r.info["success"],
                           push=lambda bump: (engine.run_for(1.0), bump()),  # the trainer's step, then the push
                           after_round=lambda rnd: held.append(held_by(driver))):
        pass
    assert budget0 - pacer.remaining_responses == driver.spent == driver.ended_count + len(driver.live)
    assert driver.pruned_count > rounds and driver.carried_total > 0 and driver.spent > 5 * rounds
    early, late = max(held[:200]), max(held[-1000:])
    assert late <= 1.5 * early, (early, late)  # flat: bounded by a round and the window, not by the rounds run


@pytest.mark.parametrize("colocate", [False, True])
def test_stream_rounds_open_each_round_once(colocate):
    """`StreamRounds.begin` opens a round only when none is open: a server's next round opens at the close (before
    the training step), a colocate engine's after the push; begin then hands back that round and what it admitted,
    and a round that trained nothing pushes no version."""
    from trl_alloc.allocation.rounds import StreamRounds

    pacer = make_pacer("uniform", 40, prompts_per_round=4, group_size=4, budget_responses=10 ** 5, seed=0)
    filler = make_filler("full", group_size=4)
    allocator = Allocator(pacer, filler, lambda pc, units, **kw: round_arguments(pc, filler, units, **kw), plan={})
    engine = SimulatedRollouts(lambda pid, rng: (rng.lognormal(np.log(20), 0.5), rng.random() < 0.5),
                               max_num_seqs=16, step_s=0.05, seed=0)
    driver = StreamDriver(engine, lambda pid: [], 64, max_inflight=16)
    loop = StreamRounds(allocator, driver, 4, colocate)
    opened = []
    start_round = allocator.start_round
    allocator.start_round = lambda *a, **kw: opened.append(start_round(*a, **kw)) or opened[-1]
    versions = []
    while True:
        admitted = loop.begin()
        assert loop.is_open and admitted == opened[-1] == 4 and loop.begin() == admitted  # no second open
        driver.run(lambda r: r.info["success"])
        loop.close()
        assert not loop.is_open
        loop.after_close()
        assert loop.is_open == (not colocate and loop.more)  # a server's next round opens before the training step
        trained = loop.closed % 2 == 1  # every other round trains nothing: no push, no new version
        loop.after_train(trained)
        versions.append(driver.version)
        assert loop.is_open == loop.more  # colocate: opened after the push
        if not loop.more:
            break
    driver.finish()
    assert len(opened) == loop.closed == 4 and versions == [1, 1, 2, 2]
