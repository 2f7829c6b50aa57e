"""AllocGRPOTrainer with rollout_mode="stream" (trainer/event_modes.py) on the tiny model, transformers generation:
one stream across rounds keeps the budget exact, trains each carried rollout once and none older than
`max_staleness`, and a checkpoint taken mid-stream says what became of the rollouts then in flight."""

import json
import os
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from helpers import build  # noqa: E402

from trl_alloc.allocation.allocator import json_default, read_round_log  # noqa: E402
from trl_alloc.trainer.checkpointing import ALLOCATION_STATE_NAME  # noqa: E402


def train_with_spy(trainer, **kwargs):
    """Train, keeping each round's loss rows (what TRL's loss saw)."""
    seen, inner = [], trainer._build_loss_batches

    def spy(rows, groups):
        out = inner(rows, groups)
        seen.append((list(trainer.round_state.loss_rows), list(groups)))
        return out

    trainer._build_loss_batches = spy
    trainer.train(**kwargs)
    return seen


def check_stream(trainer, seen, budget, max_staleness):
    spent = budget - trainer.allocator.pacer.remaining_responses
    assert trainer.allocator.counters["responses"] == spent <= budget  # spent at submission, in flight included
    assert sum(h["responses"] for h in trainer.allocator.history) == spent
    log = read_round_log(trainer.round_log_path)  # one line per round, with the events that round saw
    assert [entry["round"] for entry in log] == list(range(trainer.allocator.counters["rounds"]))
    events = [e for entry in log for e in entry["events"]]
    submitted = [rid for kind, _, rid in events if kind == "submit"]
    ended = Counter(rid for kind, _, rid in events if kind != "submit")
    assert len(submitted) == len(set(submitted)) == spent  # every started rollout is in the log once...
    assert set(ended) <= set(submitted) and set(ended.values()) <= {1}  # ...and ends at most once (the rest:
    # still running when the stream ended, aborted by `finish`)
    trained = Counter(r["rid"] for rows, _ in seen for r in rows)
    assert trained and set(trained.values()) == {1}  # carried rollouts are trained once, never twice
    assert len(seen) == len(log)
    for (rows, groups), entry in zip(seen, log):
        assert all(r["pid"] in groups and not r.get("aborted") for r in rows)
        assert all(0 <= r["staleness"] <= max_staleness for r in rows)
        # every trained token counted once at the version that generated it, none past the bound
        by_version = {int(k): n for k, n in entry["token_staleness"].items()}
        assert sum(by_version.values()) == sum(len(r["completion_ids"]) for r in rows)
        assert all(0 <= s <= max_staleness for s in by_version)
        assert max(by_version, default=0) == max((r["staleness"] for r in rows), default=0)
    return trained


@pytest.mark.parametrize("pacing,filling", [("cero", "sara"), ("uniform", "full"), ("uniform", "dynamic_sampling")])
def test_stream_keeps_the_budget_exact_and_trains_each_rollout_once(tmp_path, pacing, filling):
    budget = 64
    trainer = build(tmp_path, pacing=pacing, filling=filling, num_rounds=8, rollout_budget=budget,
                    max_generation_batches=50, rollout_mode="stream", rollout_max_inflight=6, max_staleness=2)
    seen = train_with_spy(trainer)
    check_stream(trainer, seen, budget, 2)
    assert trainer.state.global_step == trainer.allocator.counters["rounds"]
    logged = {k for x in trainer.state.log_history for k in x}
    assert {"alloc/carried", "alloc/staleness_max", "alloc/in_flight"} <= logged


def test_stream_carries_groups_across_rounds(tmp_path):
    """SARA's groups straddle round boundaries: some round trains rows that ended in an earlier round. (A round's
    budget, 1 × 4 groups × k, runs out before it has its 4 groups: it closes on its budget while groups run.)"""
    trainer = build(tmp_path, pacing="uniform", filling="sara", num_rounds=8, rollout_budget=96,
                    rollout_mode="stream", rollout_max_inflight=5, max_staleness=3, target_groups=4,
                    sara_safety_factor=1)
    seen = train_with_spy(trainer)
    check_stream(trainer, seen, 96, 3)
    assert sum(h.get("carried", 0) for h in trainer.allocator.history) > 0
    assert any(r["staleness"] >= 1 for rows, _ in seen for r in rows)


def test_stream_mode_is_checked(tmp_path):
    with pytest.raises(ValueError, match="max_staleness"):
        build(tmp_path, rollout_mode="stream", max_staleness=0)
    with pytest.raises(ValueError, match="one optimizer step"):
        build(tmp_path, rollout_mode="stream", steps_per_generation=2)
    # (in-stream: tests/trainer/test_colocate.py)
    with pytest.raises(ValueError, match="prunes .* inside a vLLM engine"):
        build(tmp_path, rollout_mode="stream", pruning="random", detect_length=2)


def test_stream_resume_mid_stream(tmp_path):
    """A checkpoint holds the allocator's state at the last close and names the rollouts then in flight; a run
    resumed from it starts from that state and keeps the budget exact."""
    kw = dict(pacing="uniform", filling="full", num_rounds=6, rollout_budget=48, save_strategy="steps",
              save_steps=2, rollout_mode="stream", rollout_max_inflight=5, max_staleness=2)
    full = build(tmp_path / "full", **kw)
    full.train()
    ckpt = tmp_path / "full" / "checkpoint-2"
    saved = json.loads((ckpt / ALLOCATION_STATE_NAME).read_text())
    assert saved["counters"]["rounds"] == 2 and "stream" in saved
    assert {"in_flight", "open_groups", "held_rows", "fate"} <= set(saved["stream"])
    resumed = build(tmp_path / "resumed", **kw)
    loaded = []
    inner = resumed.load_allocation_state

    def spy(state, *args, **kwargs):
        out = inner(state, *args, **kwargs)
        loaded.append(json.loads(json.dumps(resumed.allocator.state_dict(), default=json_default)))
        return out

    resumed.load_allocation_state = spy
    seen = train_with_spy(resumed, resume_from_checkpoint=str(ckpt))
    after_load = loaded[0]
    assert after_load["pacer"] == saved["pacer"] and after_load["counters"] == saved["counters"]
    assert resumed.allocator.counters["rounds"] == full.allocator.counters["rounds"]
    assert saved["stream"]["in_flight"] > 0  # this run had rollouts in flight at the checkpoint
    spent = 48 - resumed.allocator.pacer.remaining_responses
    assert resumed.allocator.counters["responses"] == spent <= 48
    assert all(0 <= r["staleness"] <= 2 for rows, _ in seen for r in rows)


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_stream_through_the_vllm_server(tmp_path, vllm_server):
    """vLLM server mode: rollouts keep running while the trainer trains, each weight push pauses the server with
    /pause?mode=keep (in-flight rollouts go on, on the new weights), stale tokens are trained with TRL's
    importance-sampling correction from vLLM's sampling log-probs, and no trained token is too old."""
    from helpers import make_args, sums_task
    from transformers import AutoModelForCausalLM

    from trl_alloc.trainer import AllocGRPOTrainer
    from trl_alloc.trainer.trl_compat import patch_trl_vllm_client

    server, model_dir = vllm_server, vllm_server.model_dir  # the session's (tests/conftest.py)
    tok, dataset, first_digit_reward = sums_task(model_dir)
    budget = 48  # full groups (stock GRPO as a stream): every committed group trains, whatever the rewards

    def make(name):
        args = make_args(str(tmp_path / name), pacing="uniform", filling="full", num_rounds=6,
                         rollout_budget=budget, max_completion_length=24, rollout_mode="stream",
                         rollout_max_inflight=8, max_staleness=2, use_vllm=True, vllm_mode="server",
                         vllm_server_base_url=server.url, vllm_server_timeout=120, generation_kwargs=None,
                         learning_rate=1e-2, save_strategy="steps", save_steps=3)
        with patch_trl_vllm_client(request_timeout=300):
            return AllocGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                                    reward_funcs=first_digit_reward, args=args, train_dataset=dataset,
                                    processing_class=tok)

    trainer = make("out")
    batches, inner = [], trainer._collate

    def spy(rows_, *a, **kw):
        out = inner(rows_, *a, **kw)
        batches.append((rows_, out))
        return out

    trainer._collate = spy
    client = trainer.vllm_generation.vllm_client
    pauses, paused = [], client.paused

    def count_pauses(mode="keep"):
        pauses.append(mode)
        return paused(mode)

    client.paused = count_pauses
    seen = train_with_spy(trainer)
    check_stream(trainer, seen, budget, 2)
    # one push per optimizer step but the last (no rollout runs on its weights) and those of empty rounds (learning
    # rate 0: no new weights), each inside a keep-pause
    updates = sum(h["loss_responses"] > 0 for h in trainer.allocator.history[:-1])
    assert pauses == ["keep"] * updates and updates >= 2 and trainer.state.global_step >= 3
    assert client.weights_checksum()["num_pushes"] - server.pushes_before >= len(pauses)
    assert not client._get(f"{server.url}/is_paused")["is_paused"]  # every pause was resumed
    trained = [r for rows_, _ in seen for r in rows_]
    assert any(r["staleness"] >= 1 for r in trained)  # rollouts ran while the trainer trained
    for rows_, out in batches:  # the correction, from vLLM's sampling log-probs, on every trained token
        if not rows_:
            continue
        assert all(len(r["sampling_logps"]) == len(r["completion_ids"]) for r in rows_)
        assert "importance_sampling_ratio" in out and "sampling_per_token_logps" in out
    logged = {k for x in trainer.state.log_history for k in x}
    assert {"sampling/importance_sampling_ratio/mean", "alloc/staleness_max", "alloc/carried"} <= logged

    # resume mid-stream from the server run's checkpoint: the allocator's state at the last close, the rollouts
    # then in flight named (and dropped), the checkpoint's weights pushed inside a keep-pause, the budget exact
    ckpt = tmp_path / "out" / "checkpoint-3"
    saved = json.loads((ckpt / ALLOCATION_STATE_NAME).read_text())
    assert saved["counters"]["rounds"] == 3 and {"in_flight", "open_groups", "fate"} <= set(saved["stream"])
    resumed = make("resumed")
    seen = train_with_spy(resumed, resume_from_checkpoint=str(ckpt))
    assert resumed.state.global_step == trainer.state.global_step
    spent = budget - resumed.allocator.pacer.remaining_responses
    assert resumed.allocator.counters["responses"] == spent <= budget
    trained = Counter(r["rid"] for rows_, _ in seen for r in rows_)
    assert trained and set(trained.values()) == {1}
    assert all(0 <= r["staleness"] <= 2 for rows_, _ in seen for r in rows_)
    assert not client._get(f"{server.url}/is_paused")["is_paused"]
