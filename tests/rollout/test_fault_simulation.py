"""Deterministic simulation of faults, on the loop code that trains: the trainer's Allocator and StreamDriver over
the engine model's simulated vLLM engine (simulate_engine), with faults injected by seeded schedules:
- a rollout that never returns (it ends only when aborted);
- aborts that arrive late, after the rollout may have ended;
- a slow or stalling engine (step times that jump);
- an engine that dies mid-round, and a weight push that fails.
Under every schedule the budget is exact, every started rollout ends exactly once, no rollout is trained twice, no
trained token is older than max_staleness, and nothing hangs: the run ends, or stops with an error that names the
problem. A failing schedule names its seed; `replay(seed)` runs it again."""

import argparse
import heapq

import numpy as np
import pytest

from trl_alloc.rollout.engine_model import SimulatedRollouts, simulate_engine

SCHEDULES = 2000
PLAN = dict(prompts=24, rounds=6, budget=6 * 32, unit_size=4, units_per_group=2, capacity=8, tau_low=0.45,
            history_decay=1.0, drift=1.5, engine_seqs=10, step_ms=25.0, length_median=4.0, length_sigma=0.8,
            max_tokens=12, rollout_max_inflight=12, train_ms_per_token=0.5, sync_s=0.1)
METHODS = ("cero+sara", "uniform+dynamic_sampling", "uniform", "uniform+sara")
MAX_POLLS = 20_000  # far more than any schedule needs: more is a hang


class EngineDied(ConnectionError):
    pass


def faulty_engine(schedule):
    """A simulated engine class injecting the faults of one schedule (a seeded generator of fault draws)."""
    rng = np.random.default_rng(schedule)
    p_stuck, p_late = rng.choice([0.0, 0.0, 0.005, 0.02]), rng.choice([0.0, 0.3, 1.0])
    die_at = int(rng.integers(5, 400)) if rng.random() < 0.1 else None
    push_fails_at = int(rng.integers(1, 6)) if rng.random() < 0.1 else None
    slow = rng.random() < 0.5

    class Faulty(SimulatedRollouts):
        polls = pushes = 0

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.stuck, self.late = set(), set()

        def submit(self, prompt_ids, n=1, max_tokens=16, tag=None, detect_at=None):
            rids = super().submit(prompt_ids, n, max_tokens, tag, detect_at)
            self.stuck |= {rid for rid in rids if rng.random() < p_stuck}
            self._drop_stuck_ends()
            return rids

        def _admit(self):
            super()._admit()
            self._drop_stuck_ends()

        def _drop_stuck_ends(self):  # a stuck rollout runs (holding its slot) and never ends by itself
            if self.stuck and any(rid in self.stuck for _, _, rid in self._ends):
                self._ends = [e for e in self._ends if e[2] not in self.stuck]
                heapq.heapify(self._ends)

        def step_time(self):
            return super().step_time() * (float(rng.choice([1.0, 1.0, 5.0, 50.0])) if slow else 1.0)

        def abort(self, rids):
            rids = list(rids)
            late = {rid for rid in rids if rid in self.running and rng.random() < p_late}
            self.late |= late
            return super().abort([rid for rid in rids if rid not in late])

        def next_completed(self, timeout=None):
            Faulty.polls += 1
            if Faulty.polls > MAX_POLLS:
                raise AssertionError(f"schedule {schedule}: no end after {MAX_POLLS} polls (a hang)")
            if die_at is not None and Faulty.polls >= die_at:
                raise EngineDied(f"schedule {schedule}: the engine died")
            out = super().next_completed(timeout)
            if self.late:  # the late aborts arrive now: what ended meanwhile came back finished
                late, self.late = self.late, set()
                out = out + super().abort(late)
            return out

        def generated_tokens(self):  # called at each weight push, while the engine is paused
            Faulty.pushes += 1
            if push_fails_at is not None and Faulty.pushes >= push_fails_at:
                raise RuntimeError(f"schedule {schedule}: the weight push failed")
            return super().generated_tokens()

    return Faulty


def replay(schedule):
    """One schedule: a method, a seed, max_staleness, and the faults; returns what the invariants need."""
    rng = np.random.default_rng([schedule, 1])
    method = METHODS[int(rng.integers(len(METHODS)))]
    args = argparse.Namespace(**PLAN, seed=int(rng.integers(1 << 16)), max_staleness=int(rng.integers(1, 4)),
                              colocate=bool(rng.random() < 0.3))
    seen = {"trained": [], "staleness": [], "drivers": []}

    def on_close(driver, allocator):
        seen["drivers"] = [driver, allocator]
        seen["trained"] += [row["rid"] for row in driver.trained]
        seen["staleness"] += [s for row in driver.trained for s in row["token_staleness"]]
        assert driver.spent <= args.budget and allocator.counters["responses"] == driver.spent

    try:
        totals = simulate_engine(method, "stream", args, args.rounds, engine_class=faulty_engine(schedule),
                                 on_close=on_close)
        error = None
    except (TimeoutError, EngineDied, RuntimeError) as exc:
        totals, error = None, exc
    return args, seen, totals, error


def check(schedule):
    args, seen, totals, error = replay(schedule)
    where = f"schedule {schedule} (replay with tests/rollout/test_fault_simulation.py::replay({schedule}))"
    assert len(seen["trained"]) == len(set(seen["trained"])), f"{where}: a rollout was trained twice"
    assert max(seen["staleness"], default=0) <= args.max_staleness, f"{where}: a token older than max_staleness"
    if error is not None:
        message = str(error)
        assert ("no rollout ended" in message or "the engine died" in message
                or "the weight push failed" in message), f"{where}: an unclear error: {error!r}"
        return type(error).__name__
    assert totals["responses"] <= args.budget, f"{where}: over budget"
    driver, allocator = seen["drivers"]
    assert driver.ended_count == driver.spent == allocator.counters["responses"] == totals["responses"], \
        f"{where}: a started rollout did not end exactly once"
    assert not driver.live, f"{where}: rollouts left running"
    return "ok"


def test_every_schedule_keeps_the_invariants():
    outcomes = {}
    for schedule in range(SCHEDULES):
        try:
            outcome = check(schedule)
        except AssertionError:
            raise
        except Exception as exc:  # an error no fault explains: the loop broke
            raise AssertionError(f"schedule {schedule} (replay({schedule})): {exc!r}") from exc
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # the schedules reach every ending: most finish, the others stop with each clear error
    assert outcomes["ok"] > SCHEDULES // 3 and {"TimeoutError", "EngineDied", "RuntimeError"} <= set(outcomes), \
        outcomes


@pytest.mark.parametrize("schedule", [0, 1, 2])
def test_a_schedule_replays_identically(schedule):
    first, second = replay(schedule), replay(schedule)
    assert first[1]["trained"] == second[1]["trained"] and repr(first[3]) == repr(second[3])
    assert first[2] == second[2]


def test_a_run_resumed_at_a_random_round_boundary_makes_the_same_decisions(tmp_path):
    """Checkpoint and resume (the allocator's state through JSON into a fresh one) between any two rounds: the round
    log is the uninterrupted run's, line for line (sync and events; a stream's resume drops the rollouts in flight by
    design, docs/reliability.md#resume). 200 seeded schedules."""
    from trl_alloc.allocation.allocator import read_round_log

    resumed = 0
    for schedule in range(200):
        rng = np.random.default_rng([schedule, 2])
        method, mode = METHODS[int(rng.integers(len(METHODS)))], ("sync", "events")[int(rng.integers(2))]
        args = argparse.Namespace(**PLAN, seed=int(rng.integers(1 << 16)), max_staleness=1, colocate=False)
        at = int(rng.integers(1, args.rounds))
        logs = []
        for resume_after in (None, at):
            path = tmp_path / f"{schedule}-{resume_after}.jsonl"
            simulate_engine(method, mode, args, args.rounds, round_log_path=str(path), resume_after=resume_after)
            logs.append(read_round_log(str(path)))
        assert logs[0] == logs[1], f"schedule {schedule} ({method}, {mode}, resumed after round {at}): other decisions"
        resumed += len(logs[0]) > at  # (a run that spent its budget first had nothing left to resume)
    assert resumed > 100
