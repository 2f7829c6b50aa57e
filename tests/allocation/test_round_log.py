"""The round log (allocation/allocator.py): one JSON line per round in `output_dir/allocation/rounds.jsonl`, appended
as each round is recorded, kept in sync with the checkpoint a run resumes from, and never accumulated in memory."""

import json
import os

import numpy as np

from trl_alloc.allocation import make_filler, make_pacer
from trl_alloc.allocation.allocator import Allocator, json_default, read_round_log, round_log_file
from trl_alloc.allocation.pipeline import round_arguments
from trl_alloc.rollout.drivers import backend_rounds
from trl_alloc.rollout.engine_model import SimulatedRollouts

N, K = 24, 4


def make_allocator(rounds, budget_units, round_log_path=None):
    pacer = make_pacer("cero", N, rounds=rounds, budget=budget_units, round_capacity=12, unit_size=2, seed=0)
    filler = make_filler("sara", group_size=K, probe=2, tau_low="auto")

    def join(pacer, units, **options):  # allocation.pipeline.round_arguments(pacer, filler, units, ...)
        return round_arguments(pacer, filler, units, **options)
    plan = {"pacing": "cero", "filling": "sara", "pruning": "none", "num_prompts": N, "num_rounds": rounds,
            "rollout_budget": 2 * budget_units, "allocation_seed": 0, "dataset_fingerprint": "x"}
    return Allocator(pacer, filler, join, plan, round_log_path=round_log_path)


def event_round(e, p, rng, window=6):
    """One event round through the round runner (`rollout.drivers.backend_rounds`: a `RoundDriver` over the engine
    model's simulated engine, so rollouts end and are aborted in a random order), recorded as the trainer records it;
    returns (rows, events, the summary the trainer broadcasts)."""
    engine = SimulatedRollouts(lambda pid, r: (r.lognormal(np.log(8), 0.7), r.random() < p[pid]),
                               max_num_seqs=window, seed=int(rng.integers(2 ** 31)))
    rnd = next(iter(backend_rounds(e, True, lambda i: engine, lambda pid: [], lambda r: r.info["success"], 64,
                                       rounds=1, max_inflight=window)))
    rows = [{"pid": r.tag, "completion_ids": r.token_ids, "aborted": r.finish_reason == "abort",
             "success": float("nan") if r.finish_reason == "abort" else float(r.info["success"])}
            for r in rnd.driver.ended]
    events = [(kind, np.int64(pid), rid) for kind, pid, rid in rnd.driver.events]  # numpy ids, as a backend's
    e.record_round(rnd.summary, rows, rnd.admitted, [], len(rnd.summary["groups"]) * K, 0.0, 1.0, events=events)
    return rows, events, rnd.summary


def deterministic_round(e, p, rng):
    """One deterministic round as the trainer drives it (`Allocator.run_round`)."""
    r = e.run_round(lambda ids, counts: [{"pid": pid, "success": float(rng.random() < p[pid]), "completion_ids": [1]}
                                         for pid, n in zip(ids, counts) for _ in range(n)])
    e.record_round(r.summary, r.rows, r.admitted, r.requests, len(r.summary["groups"]) * K, 0.0, 1.0)
    return r.requests, r.summary


def test_one_line_per_round_with_requests_groups_and_events(tmp_path, monkeypatch):
    p = np.random.default_rng(0).uniform(0, 1, N)
    rng = np.random.default_rng(1)
    path = round_log_file(str(tmp_path / "out"))
    assert path == str(tmp_path / "out" / "allocation" / "rounds.jsonl")
    e = make_allocator(5, 40, path)
    requests, summary = deterministic_round(e, p, rng)
    assert read_round_log(path) == [{"round": 0, "requests": [list(map(list, r)) for r in requests],
                                     "groups": summary["groups"]}]  # written at once (no events key: none)
    _, events, summary = event_round(e, p, rng)
    log = read_round_log(path)
    assert len(log) == 2 and log[1] == {"round": 1, "requests": [], "groups": summary["groups"],
                                        "events": [[kind, int(pid), rid] for kind, pid, rid in events]}
    assert e.last_round_log["round"] == 1 and e.last_round_log["events"] is events  # only the last line in memory

    # a new run in the same output_dir (no resume) starts the file anew
    again = make_allocator(5, 40, path)
    deterministic_round(again, p, np.random.default_rng(1))
    assert [x["round"] for x in read_round_log(path)] == [0]

    # without a path (simulators, tests) nothing is written anywhere
    monkeypatch.chdir(tmp_path / "out")
    quiet = make_allocator(5, 40)
    deterministic_round(quiet, p, rng)
    event_round(quiet, p, rng)
    assert sorted(os.listdir(tmp_path / "out")) == ["allocation"] and os.listdir(tmp_path / "out" / "allocation") == [
        "rounds.jsonl"] and quiet.last_round_log["round"] == 1


def test_resume_keeps_the_checkpoints_rounds_only(tmp_path):
    """A run resumed from checkpoint N in its own output_dir: the lines of rounds after N (recorded before the
    run stopped, the last one torn by the crash) are dropped, so the file ends up with every round exactly once,
    as the uninterrupted run's does."""
    p = np.random.default_rng(0).uniform(0, 1, N)
    full_path, run_path = str(tmp_path / "full.jsonl"), str(tmp_path / "run" / "rounds.jsonl")
    full, run = make_allocator(6, 60, full_path), make_allocator(6, 60, run_path)
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    for _ in range(2):
        event_round(full, p, rng_a)
        event_round(run, p, rng_b)
    checkpoint = json.loads(json.dumps(run.state_dict(), default=json_default))
    rng_at_checkpoint = json.loads(json.dumps(rng_b.bit_generator.state))
    for _ in range(2):  # on past the checkpoint, then a crash in the middle of a line
        event_round(run, p, rng_b)
    with open(run_path, "a") as f:
        f.write('{"round": 4, "requests": [], "gro')
    assert len(read_round_log(full_path)) == 2 and open(run_path).read().count("\n") == 4

    resumed = make_allocator(6, 60, run_path)
    resumed.load_state_dict(checkpoint)
    assert [x["round"] for x in read_round_log(run_path)] == [0, 1]  # at once: a rollback leaves no line behind
    rng_b.bit_generator.state = rng_at_checkpoint
    for _ in range(4):
        event_round(full, p, rng_a)
        event_round(resumed, p, rng_b)
    log = read_round_log(run_path)
    assert [x["round"] for x in log] == list(range(6)) and log == read_round_log(full_path)
    assert resumed.history == full.history


def test_memory_and_payload_stay_flat_over_200_rounds(tmp_path):
    """200 event rounds: the file has 200 lines (with the events); in memory, the allocator's only per-round record is
    `history` (and CERO's `allocation_log`, what `random_matched` replays, in the pacer): every other container and
    the rest of the state keep their size, so no round's events are kept; the summary broadcast each round
    (`on_main.allocate(allocator.finish_round)` in the trainer) has a size bounded independently of the round index."""
    rounds = 200
    p = np.random.default_rng(0).uniform(0, 1, N)
    rng = np.random.default_rng(1)
    path = str(tmp_path / "allocation" / "rounds.jsonl")
    e = make_allocator(rounds, rounds * 10, path)  # 20 responses a round

    def containers(obj):
        return {k: len(v) for k, v in vars(obj).items() if isinstance(v, (list, dict, tuple, set, np.ndarray))}

    def flat_state_size():  # the state less the per-round records
        state = e.state_dict()
        state = {**state, "history": [], "pacer": {**state["pacer"], "allocation_log": []}}
        return len(json.dumps(state, default=json_default))

    summaries, event_bytes, at = [], 0, {}
    for r in range(rounds):
        _, events, summary = event_round(e, p, rng)
        summaries.append(summary)
        event_bytes += len(json.dumps(events, default=json_default))
        if r + 1 in (50, rounds):
            at[r + 1] = {"allocator": containers(e), "pacer": containers(e.pacer), "filler": containers(e.filler),
                         "state": flat_state_size(), "history": len(e.history)}

    log = read_round_log(path)
    assert [x["round"] for x in log] == list(range(rounds)) and all(
        x["groups"] == s["groups"] for x, s in zip(log, summaries))
    assert sum(len(x["events"]) for x in log) > 20 * rounds  # the events are on disk...
    early, late = at[50], at[rounds]
    assert late["history"] - early["history"] == rounds - 50
    grown = {(part, k) for part in ("allocator", "pacer", "filler") for k, n in late[part].items()
             if n != early[part].get(k)}
    assert grown == {("allocator", "history"), ("pacer", "allocation_log")}  # ...and in memory only one line of them
    assert e.last_round_log["round"] == rounds - 1
    # over 150 rounds the rest of the state changes by digits only: less than one round's events
    assert abs(late["state"] - early["state"]) <= 256 < event_bytes / rounds
    # the broadcast summary: the committed groups (at most the pool) and fixed fields whose size does not grow
    fixed = [len(json.dumps({**s, "groups": []}, default=json_default)) for s in summaries]
    assert max(fixed) - min(fixed) <= 32 and all(len(s["groups"]) <= N and "events" not in s for s in summaries)
    bound = max(fixed) + len(json.dumps(list(range(N))))
    assert all(len(json.dumps(s, default=json_default)) <= bound for s in summaries)
