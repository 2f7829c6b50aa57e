"""Event-driven dynamic sampling (rollout/streaming.py): exact accounting whatever the order of events,
kept groups mixed, the surplus aborted once the target is reached."""

import importlib.util
from collections import Counter

import pytest
from helpers import build_served_model

from trl_alloc.rollout.events import BatchedRollouts, VLLMServerRollouts
from trl_alloc.rollout.streaming import dynamic_sampling_round


def first_token_even(rollout):
    """A success signal the random policy splits about evenly."""
    return float(bool(rollout.token_ids) and rollout.token_ids[0] % 2 == 0)


def check_accounting(out, budget, k, target, max_tokens, success=first_token_even):
    submitted = [rid for kind, _, rid in out.events if kind == "submit"]
    ended = Counter(rid for kind, _, rid in out.events if kind in ("done", "abort"))
    assert out.spent == len(submitted) <= budget and out.spent % k == 0
    assert sorted(ended) == sorted(submitted) and set(ended.values()) == {1}  # each rollout ends once
    rollouts = [r for rs in out.rollouts.values() for r in rs]
    assert len(rollouts) == out.spent and out.tokens == sum(len(r.token_ids) for r in rollouts)
    assert out.aborted == sum(r.finish_reason == "abort" for r in rollouts)
    assert all(len(r.token_ids) <= max_tokens for r in rollouts)
    assert len(out.groups) <= target
    for pid in out.groups + out.surplus:  # kept groups are complete and mixed
        scores = [success(r) for r in out.rollouts[pid]]
        assert len(scores) == k and 0 < sum(scores) < k and all(r.finish_reason != "abort" for r in out.rollouts[pid])


def test_batched_dynamic_sampling_is_exact_and_deterministic(tiny_random_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.evaluation import TransformersBackend, tokenize_prompts

    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir)
    tok = AutoTokenizer.from_pretrained(tiny_random_dir)
    backend = TransformersBackend(model, tok, batch_size=32)
    prompts = list(enumerate(tokenize_prompts(tok, [f"{a}+{b}=" for a in range(6) for b in range(5)])))
    runs = []
    for _ in range(2):
        engine = BatchedRollouts.from_backend(backend, temperature=1.0, seed=3)
        out = dynamic_sampling_round(engine, prompts, group_size=4, target_groups=3, budget=40,
                                     success=first_token_even, max_tokens=4, max_inflight=8)
        check_accounting(out, 40, 4, 3, 4)
        assert engine.in_flight == 0 and engine.calls == out.spent // 8 + (out.spent % 8 > 0)
        runs.append(out)
    assert runs[0].events == runs[1].events and runs[0].groups == runs[1].groups  # one seed, one run
    # a target that cannot be met spends whole groups up to the budget, and keeps none
    engine = BatchedRollouts.from_backend(backend, temperature=1.0, seed=3)
    out = dynamic_sampling_round(engine, prompts, group_size=4, target_groups=3, budget=18,
                                 success=lambda r: 1.0, max_tokens=4)
    assert out.spent == 16 and out.groups == [] and len(out.rejected) == 4 and out.aborted == 0


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_server_dynamic_sampling_aborts_the_surplus_with_exact_accounting(tmp_path):
    from trl_alloc.serving import start_server

    build_served_model(str(tmp_path / "model"))
    prompts = [(i, [5 + i % 20, 6, 7]) for i in range(40)]
    with start_server(str(tmp_path / "model"), timeout=600, env={"HF_HUB_OFFLINE": "1"}) as server:
        engine = VLLMServerRollouts(server.url, temperature=1.0, seed=0, extra={"ignore_eos": True})
        try:
            # rollout-id parity: every group of two consecutive rollouts is mixed, so the target is reached
            # with the first two groups to finish, and the rest of the window is aborted
            odd = lambda r: float(r.rid % 2)  # noqa: E731
            out = dynamic_sampling_round(engine, prompts, group_size=2, target_groups=2, budget=48,
                                         success=odd, max_tokens=60, max_inflight=16, timeout=120)
            check_accounting(out, 48, 2, 2, 60, success=odd)
            assert len(out.groups) == 2
            done = [i for i, (kind, pid, _) in enumerate(out.events) if kind == "done" and pid in out.groups]
            submits = [i for i, (kind, _, _) in enumerate(out.events) if kind == "submit"]
            assert max(submits) < max(done) and out.spent < 48  # nothing submitted once the target is met
            assert engine.in_flight == 0 and engine.next_completed(timeout=1) == []
            assert all(len(r.token_ids) < 60 for rs in out.rollouts.values() for r in rs if r.finish_reason == "abort")
        finally:
            engine.close()
