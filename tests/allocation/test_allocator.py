"""The allocator without TRL (allocation/allocator.py): one run driven round by round with synthetic
rewards, exact accounting, its versioned state, and the registry it is built from."""

import json
import subprocess
import sys

import numpy as np
import pytest

from trl_alloc.allocation import make_filler, make_pacer, method_class, method_names
from trl_alloc.allocation.allocator import (PLAN_FIELDS, STATE_VERSION, Allocator, json_default,
                                         migrate_state, read_round_log)
from trl_alloc.allocation.pipeline import round_arguments
from trl_alloc.allocation.registry import register
from trl_alloc.allocation.rounds import Rounds

K, N, ROUNDS, UNIT = 4, 24, 5, 2


def plan(**kw):
    return {"pacing": "cero", "filling": "sara", "pruning": "none", "num_prompts": N, "num_rounds": ROUNDS,
            "rollout_budget": 80, "allocation_seed": 0, "dataset_fingerprint": "abc", **kw}


def make_allocator(round_log_path=None, **kw):
    pacer = make_pacer("cero", N, rounds=ROUNDS, budget=80 // UNIT, round_capacity=12, unit_size=UNIT, seed=0)
    filler = make_filler("sara", group_size=K, probe=2, tau_low="auto", commit_min=K)

    def join(pacer, units, **options):
        return round_arguments(pacer, filler, units, **options)
    return Allocator(pacer, filler, join, plan(**kw), round_log_path=round_log_path)


def rounds(e, p_success, rng, n):
    """`n` rounds of `e` through the round runner (`allocation.rounds.Rounds`), each recorded as the trainer records
    it (the round's `recorded`: the round-log entry); rows carry only what the allocator reads."""
    def generate(ids, counts):
        return [{"pid": pid, "success": float(rng.random() < p_success[pid]), "pruned": False,
                 "completion_ids": [1] * (1 + pid % 3)} for pid, n in zip(ids, counts) for _ in range(n)]

    def record(rnd):
        rows, requests = rnd.result
        return e.record_round(rnd.summary, rows, rnd.admitted, requests,
                              loss_responses=len(rnd.summary["groups"]) * K, allocator_s=0.0, round_s=1.0)
    return Rounds.driven(e, n, lambda i: e.drive_requests(generate), record=record)


def test_allocator_accounts_exactly_and_never_overspends(tmp_path):
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, N)
    path = tmp_path / "allocation" / "rounds.jsonl"
    e = make_allocator(round_log_path=str(path))
    spent = tokens = 0
    requests = []
    for rnd in rounds(e, p, rng, ROUNDS):
        entry, (rows, _) = rnd.recorded, rnd.result
        spent += len(rows)
        tokens += sum(len(r["completion_ids"]) for r in rows)
        assert entry["responses"] == len(rows) and (entry["generation_calls"] >= 1) == bool(rows)  # CERO may skip
        requests.append(json.loads(json.dumps(e.last_round_log["requests"])))
    c = e.counters
    assert c["rounds"] == ROUNDS and c["responses"] == spent == int(e.exposure.sum()) and c["tokens"] == tokens
    assert spent + e.pacer.remaining_responses == 80 and spent <= 80
    log = read_round_log(str(path))  # one line per round, the requests each round made
    assert ([h["round"] for h in e.history] == list(range(1, ROUNDS + 1))
            and [x["round"] for x in log] == list(range(ROUNDS)))
    assert [x["requests"] for x in log] == requests and log[-1] == json.loads(json.dumps(e.last_round_log))
    assert [len(x["groups"]) for x in log] == [h["committed"] for h in e.history]
    assert e.report()["budget"] == 80 and e.report()["methods"] == {"pacing": "cero", "filling": "sara",
                                                                   "pruning": "none"}


def test_allocator_state_round_trips_and_resumes_identically(tmp_path):
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    p = np.random.default_rng(2).uniform(0, 1, N)
    full_log, first_log, other_log = (str(tmp_path / name / "rounds.jsonl") for name in ("full", "first", "other"))
    full, first = make_allocator(round_log_path=full_log), make_allocator(round_log_path=first_log)
    full_rounds = iter(rounds(full, p, rng_a, ROUNDS))
    for _ in zip(range(2), full_rounds, rounds(first, p, rng_b, ROUNDS)):
        pass
    state = json.loads(json.dumps(first.state_dict(), default=json_default))
    assert state["version"] == STATE_VERSION and all(state[k] == plan()[k] for k in PLAN_FIELDS)
    list(rounds(first, p, np.random.default_rng(9), 1))  # past the checkpoint, then the run dies: its line is dropped
    assert len(read_round_log(first_log)) == 3
    # the same output_dir, and a new one
    resumed, elsewhere = make_allocator(round_log_path=first_log), make_allocator(round_log_path=other_log)
    resumed.load_state_dict(state)
    elsewhere.load_state_dict(state)
    rng_c, twin = np.random.default_rng(1), make_allocator()
    list(rounds(twin, p, rng_c, 2))  # rng_c where rng_b was at the checkpoint
    for _ in zip(full_rounds, rounds(resumed, p, rng_b, ROUNDS - 2), rounds(elsewhere, p, rng_c, ROUNDS - 2)):
        pass
    assert read_round_log(first_log) == read_round_log(full_log)  # no round twice, none lost
    assert read_round_log(other_log) == read_round_log(full_log)[2:] and resumed.history == full.history
    assert resumed.counters == full.counters and resumed.exposure.tolist() == full.exposure.tolist()


def test_state_version_is_checked_and_old_states_migrate():
    e = make_allocator()
    state = json.loads(json.dumps(e.state_dict(), default=json_default))
    with pytest.raises(ValueError, match=r"checkpoint-9/allocation_state.json has state version 3, newer"):
        make_allocator().load_state_dict({**state, "version": STATE_VERSION + 1},
                                         where="checkpoint-9/allocation_state.json")
    v1 = {k: state[k] for k in ("pacer", "filler", "counters", "budget_exhausted", "pacing", "filling",
                                "num_prompts", "num_rounds")}
    v1["version"] = 1
    migrated = migrate_state(v1)
    assert migrated["version"] == STATE_VERSION and migrated["history"] == [] and migrated["pruning"] == "none"
    make_allocator().load_state_dict(v1)  # a state-version-1 checkpoint still resumes
    with pytest.raises(ValueError, match="rollout_budget=80, but this run has rollout_budget=96"):
        make_allocator(rollout_budget=96).load_state_dict(state, where="x")


def test_registry_maps_every_config_name_to_its_class():
    assert set(method_names("pacing")) >= {"uniform", "knapsack", "cero", "cero_fixed", "cero_preset",
                                           "cero_greedy", "random_matched"}  # and any method added as a new file
    assert set(method_names("filling")) >= {"full", "dynamic_sampling", "sara"}
    assert method_names("pruning") == ("none", "arrol", "random") and method_class("pruning", "none") is None
    assert [n for n in method_names("pacing") if method_class("pacing", n).budget_in_units][:4] == [
        "cero", "cero_fixed", "cero_preset", "cero_greedy"]
    for stage in ("pacing", "filling"):
        for name in method_names(stage):
            assert method_class(stage, name).method_name == name
    with pytest.raises(ValueError, match="unknown `pacing='ceros'`; choose one of uniform, knapsack, cero"):
        method_class("pacing", "ceros")
    with pytest.raises(ValueError, match="registered twice"):
        register("pacing", "cero")(type("Other", (), {}))


def test_config_validation_reads_the_registry():
    """The config's choices are the registry's (no second list of names)."""
    from trl_alloc.trainer import config

    assert config.PACINGS == method_names("pacing")[:len(config.PACINGS)]  # (+ classes named by import path since)
    with pytest.raises(ValueError, match="pacing"):
        config.AllocGRPOConfig(output_dir="/tmp/x", pacing="ceros", use_cpu=True, report_to=[])


def test_random_matched_resumes_with_its_saved_seed():
    """RandomMatched's permutation comes from the checkpoint's seed, not from the resuming run's."""
    reference = [[[0, 1, 2], [1, 1, 2]], [[3, 4], [2, 1]]]
    saved = make_pacer("random_matched", 10, reference=reference, unit_size=2, seed=0)
    resumed = make_pacer("random_matched", 10, reference=reference, unit_size=2, seed=7)
    assert resumed.ranked_prompts.tolist() != saved.ranked_prompts.tolist()
    resumed.load_state_dict(json.loads(json.dumps(saved.state_dict(), default=json_default)))
    assert resumed.seed == 0 and resumed.ranked_prompts.tolist() == saved.ranked_prompts.tolist()
    assert resumed.propose().tolist() == saved.propose().tolist()


def test_json_default_converts_numpy_and_refuses_the_rest():
    data = {"i": np.int64(3), "f": np.float32(0.5), "b": np.bool_(True), "a": np.arange(3)}
    assert json.loads(json.dumps(data, default=json_default)) == {"i": 3, "f": 0.5, "b": True, "a": [0, 1, 2]}
    with pytest.raises(TypeError, match="set is not JSON-serialisable"):
        json.dumps({"s": {1}}, default=json_default)


@pytest.mark.parametrize("module", ["trl_alloc.allocation", "trl_alloc.allocation.allocator",
                                    "trl_alloc.allocation.factory", "trl_alloc.allocation.simulate",
                                    "trl_alloc.serving.server", "trl_alloc.serving.protocol"])
def test_torch_free_modules_import_neither_torch_nor_trl(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_one_stop_rule_for_every_rank_and_the_planner():
    """`Allocator.more_rounds`: rounds left and budget left. A rank that only records the broadcast summaries (its
    pacer never advances) stops where the main process stops; the planner's `min_responses` ends on a remainder
    smaller than one group."""
    rng, p = np.random.default_rng(0), np.random.default_rng(1).uniform(0, 1, N)
    main, follower = make_allocator(), make_allocator()

    def generate(ids, counts):
        return [{"pid": pid, "success": float(rng.random() < p[pid]), "completion_ids": [1]}
                for pid, n in zip(ids, counts) for _ in range(n)]
    def requests(e):
        return lambda i: e.drive_requests(generate)
    closed = 0
    for r in Rounds.driven(main, 10 * ROUNDS, requests(main)):  # the round runner (allocation/rounds.py)
        closed += 1
        rows, asked = r.result
        for e in (main, follower):
            e.record_round(r.summary, rows, r.admitted, asked, 0, 0.0, 1.0)
        assert follower.more_rounds(closed, 10 * ROUNDS) == main.more_rounds(closed, 10 * ROUNDS)
    assert main.pacer.finished and not follower.pacer.finished and closed <= ROUNDS  # the budget, not 10 x ROUNDS
    assert main.counters["responses"] + main.pacer.remaining_responses == 80
    fresh = make_allocator()
    assert len(list(Rounds.driven(fresh, 2, requests(fresh)))) == 2 and fresh.more_rounds(2, 3)
    assert not fresh.more_rounds(2, 2) and not fresh.more_rounds(2, 3, fresh.pacer.remaining_responses + 1)
