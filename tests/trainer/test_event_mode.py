"""AllocGRPOTrainer with rollout_mode="events" (trainer/event_modes.py) on the tiny model, transformers
generation: the exactness of the deterministic mode (budget, resume, groups from their own round) holds,
every started rollout ends exactly once, and the order of events is in the round log
(output_dir/allocation/rounds.jsonl, one line per round, written by the main process)."""

import importlib.util
import json
import os
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from helpers import build  # noqa: E402

from trl_alloc.allocation.allocator import json_default, read_round_log  # noqa: E402
from trl_alloc.trainer.trl_compat import count_generated  # noqa: E402
from trl_alloc.trainer.checkpointing import ALLOCATION_STATE_NAME  # noqa: E402


def check_events(entry):
    """Each rollout submitted once and ended once; groups are prompts that had rollouts this round."""
    events = entry["events"]
    submitted = [rid for kind, _, rid in events if kind == "submit"]
    ended = Counter(rid for kind, _, rid in events if kind in ("done", "abort"))
    assert len(set(submitted)) == len(submitted) and set(ended) == set(submitted) and set(ended.values()) <= {1}
    at = {rid: i for i, (kind, _, rid) in enumerate(events) if kind == "submit"}
    assert all(i > at[rid] for i, (kind, _, rid) in enumerate(events) if kind != "submit")  # ends after its start
    # a committed group had a rollout end (or, with pruning, cut at the detection point: `full` commits a prompt
    # with its survivors, possibly none)
    assert set(entry["groups"]) <= {pid for kind, pid, _ in events if kind in ("done", "prune")}
    return len(submitted)


@pytest.mark.parametrize("pacing,filling", [("cero", "sara"), ("uniform", "sara"), ("uniform", "dynamic_sampling"),
                                            ("cero", "full")])
def test_events_never_generate_past_the_budget(tmp_path, pacing, filling):
    budget = 40
    trainer = build(tmp_path, pacing=pacing, filling=filling, num_rounds=6, rollout_budget=budget,
                    max_generation_batches=50, rollout_mode="events", rollout_max_inflight=8)
    generated = count_generated(trainer)
    trainer.train()
    spent = budget - trainer.allocator.pacer.remaining_responses
    assert generated["n"] == trainer.allocator.counters["responses"] == spent <= budget
    assert trainer.state.global_step == trainer.allocator.counters["rounds"] <= 6
    log = read_round_log(trainer.round_log_path)
    assert [entry["round"] for entry in log] == list(range(trainer.allocator.counters["rounds"]))
    started = [check_events(entry) for entry in log]
    assert sum(started) == spent and [h["responses"] for h in trainer.allocator.history] == started
    assert any(entry["groups"] for entry in log)  # something was trained
    assert all(h["aborted"] == 0 for h in trainer.allocator.history)  # batched generation: nothing left running
    logged = {k for x in trainer.state.log_history for k in x}
    assert {"alloc/responses_aborted", "alloc/engine_wait_s"} <= logged


def test_events_respect_the_window(tmp_path):
    trainer = build(tmp_path, pacing="uniform", filling="sara", num_rounds=2, rollout_budget=64,
                    rollout_mode="events", rollout_max_inflight=5)
    sizes = []
    inner = trainer._generate_and_score_request

    def spy(prompt_ids, counts):
        sizes.append(sum(counts))
        return inner(prompt_ids, counts)

    trainer._generate_and_score_request = spy
    trainer.train()
    assert sizes and max(sizes) <= 5 and sum(sizes) == trainer.allocator.counters["responses"]


def test_events_resume_restores_the_allocator_and_reproduces_decisions(tmp_path):
    kw = dict(pacing="cero", filling="sara", num_rounds=4, rollout_budget=48, save_strategy="steps", save_steps=2,
              rollout_mode="events", rollout_max_inflight=6)
    full = build(tmp_path / "full", **kw)
    full.train()
    ckpt = tmp_path / "full" / "checkpoint-2"
    saved = json.loads((ckpt / ALLOCATION_STATE_NAME).read_text())
    resumed = build(tmp_path / "resumed", **kw)
    resumed.train(resume_from_checkpoint=str(ckpt))
    after_load = json.loads(json.dumps(resumed.allocation_state(), default=json_default))
    assert saved["counters"]["rounds"] == 2
    # the same events, groups, in the same order (another output_dir: its file holds the rounds it ran)
    assert read_round_log(resumed.round_log_path) == read_round_log(full.round_log_path)[2:]
    assert after_load["pacer"] == full.allocation_state()["pacer"]


def test_events_mode_is_checked(tmp_path):
    with pytest.raises(ValueError, match="rollout_mode"):
        build(tmp_path, rollout_mode="asynchronous")
    with pytest.raises(ValueError, match="rollout_max_inflight"):
        build(tmp_path, rollout_mode="events", rollout_max_inflight=2)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_events_through_the_vllm_server(tmp_path, vllm_server):
    """vLLM server mode: one streamed request per rollout, weights pushed before each round, sampling
    log-probs kept for the importance-sampling correction, aborted rollouts never reach the loss."""
    from helpers import make_args, sums_task
    from transformers import AutoModelForCausalLM

    from trl_alloc.trainer import AllocGRPOTrainer
    from trl_alloc.trainer.trl_compat import patch_trl_vllm_client

    server, model_dir = vllm_server, vllm_server.model_dir  # the session's (tests/conftest.py)
    tok, dataset, first_digit_reward = sums_task(model_dir)

    def run(name, budget, **kw):
        args = make_args(str(tmp_path / name), num_rounds=3, rollout_budget=budget, max_completion_length=8,
                         rollout_mode="events", rollout_max_inflight=8, use_vllm=True, vllm_mode="server",
                         vllm_server_base_url=server.url, vllm_server_timeout=120, generation_kwargs=None, **kw)
        with patch_trl_vllm_client(request_timeout=300):
            trainer = AllocGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                                       reward_funcs=first_digit_reward, args=args,
                                       train_dataset=dataset, processing_class=tok)
        seen, inner = [], trainer._build_loss_batches

        def spy(rows_, groups):
            seen.append((rows_, groups))
            return inner(rows_, groups)

        trainer._build_loss_batches = spy
        trainer.train()
        client = trainer.vllm_generation.vllm_client
        assert client.weights_checksum()["num_pushes"] - server.pushes_before >= trainer.state.global_step
        spent = budget - trainer.allocator.pacer.remaining_responses
        assert trainer.allocator.counters["responses"] == sum(len(r) for r, _ in seen) == spent <= budget
        assert sum(check_events(e) for e in read_round_log(trainer.round_log_path)) == spent
        for rows_, groups in seen:
            for r in rows_:
                assert len(r["completion_ids"]) <= 8
                if not (r["aborted"] or r["pruned"]):
                    assert len(r["sampling_logps"]) == len(r["completion_ids"])
        loss = trainer.round_state.loss_rows  # the last round's: no aborted or pruned rollout
        assert all(not r["aborted"] and not r["pruned"] for r in loss)
        return trainer, [r for rs, _ in seen for r in rs]

    run("sara", 72, pacing="uniform", filling="sara")

    # ARROL in the stream: the head goes to the server with the weights, the worker scores each rollout at
    # detect_length, pruned rollouts are aborted there (spent, no reward, never in the loss)
    trainer, seen = run("arrol", 48, pacing="uniform", filling="full", pruning="arrol", detect_length=2,
                        cold_start_rounds=1, head_hidden_size=16, keep_ratio=0.5, per_device_train_batch_size=16,
                        pruning_min_auc=0.0)
    pruned = [r for r in seen if r["pruned"]]
    prunes = [(pid, rid) for e in read_round_log(trainer.round_log_path) for kind, pid, rid in e["events"]
              if kind == "prune"]
    assert len(prunes) == len(pruned) == trainer.pruner.totals["pruned"] == sum(h["pruned"] for h in
                                                                                 trainer.allocator.history)
    assert {r["rid"] for r in pruned} == {rid for _, rid in prunes}
    assert all(r["success"] != r["success"] and r["reward"] != r["reward"] for r in pruned)  # NaN: no reward
    assert all(2 <= len(r["completion_ids"]) <= 8 for r in pruned)
    assert trainer.pruner.totals["eligible"] > 0 and len(trainer.pruner.policy.calibrator) > 0  # head learnt


def test_events_keep_arrol_two_phase_pruning_with_transformers_generation(tmp_path):
    """Without vLLM the pending rollouts are one two-phase request: pruned rows stay pruned (spent, no reward,
    never in the loss), and the budget is exact."""
    seen = []
    trainer = build(tmp_path, pacing="uniform", filling="full", pruning="arrol", detect_length=2,
                    max_completion_length=6, cold_start_rounds=1, head_hidden_size=16, num_generations=8,
                    pruning_min_auc=0.0,
                    per_device_train_batch_size=16, num_rounds=4, rollout_mode="events", rollout_max_inflight=16,
                    generation_kwargs={"sequence_bias": [[[1], 1.5]]})
    inner = trainer._build_loss_batches

    def spy(rows, groups):
        seen.append((rows, groups))
        return inner(rows, groups)

    trainer._build_loss_batches = spy
    trainer.train()
    rows = [r for rs, _ in seen for r in rs]
    pruned = [r for r in rows if r["pruned"]]
    assert pruned and all(len(r["completion_ids"]) == 2 for r in pruned)  # cut at detect_length
    assert sum(h["pruned"] for h in trainer.allocator.history) == len(pruned) == trainer.pruner.totals["pruned"]
    log = read_round_log(trainer.round_log_path)
    assert trainer.allocator.counters["responses"] == len(rows) == sum(check_events(e) for e in log)
    assert all(not r["pruned"] for r in trainer.round_state.loss_rows)
