"""ARROL pruning inside AllocGRPOTrainer (arXiv 2603.24840): two-phase generation at `detect_length`, the quality head
(a side module saved as its own adapter folder), budget accounting, loss rows, checkpoints, LoRA, vLLM server mode.

Tiny Qwen2 policies on CPU (see test_trainer.py); a few rounds each. EOS gets a sampling bias so that some
rollouts finish before `detect_length` (they must never be pruned).
"""

import copy
import importlib.util
import json
import os
import time
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import make_args, tiny_setup  # noqa: E402

from trl_alloc.allocation.allocator import read_round_log  # noqa: E402
from trl_alloc.trainer.config import AllocGRPOConfig  # noqa: E402
from trl_alloc.rollout.pruning import HEAD_DIR, HEAD_OPTIMIZER_NAME, RolloutPruner  # noqa: E402
from trl_alloc.rollout.quality_head import QualityHead  # noqa: E402
from trl_alloc.trainer import AllocGRPOTrainer
from trl_alloc.trainer.checkpointing import ALLOCATION_STATE_NAME  # noqa: E402

L, MAX_LEN = 2, 6  # detect_length, max_completion_length
EOS_BIAS = {"sequence_bias": [[[1], 1.5]]}  # eos id 1: ~1 in 3 rollouts stops within its first 2 tokens
ARROL = dict(pacing="uniform", filling="full", pruning="arrol", detect_length=L, max_completion_length=MAX_LEN,
             cold_start_rounds=1, head_hidden_size=16, head_learning_rate=1e-2, num_generations=8, pruning_min_auc=0.0,
             per_device_train_batch_size=16, generation_kwargs=EOS_BIAS)


def build(out, peft_config=None, **kw):
    model, tok, ds, reward = tiny_setup()
    args = make_args(str(out), **{**ARROL, **kw})
    return AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                            peft_config=peft_config)


def spy(trainer):
    """Record every generation call (prompts, length cap, outputs), every request's rows and every loss batch."""
    rec = {"calls": [], "requests": [], "batches": []}
    gen, req, loss = trainer._generate_single_turn, trainer._generate_and_score_request, trainer._build_loss_batches

    def generate(prompt_ids, *args, **kwargs):
        out = gen(prompt_ids, *args, **kwargs)
        cap = trainer.vllm_generation.max_completion_length if trainer.use_vllm else \
            trainer.generation_config.max_new_tokens
        rec["calls"].append((cap, [list(map(int, p)) for p in prompt_ids], [list(map(int, c)) for c in out[0]]))
        return out

    def request(*args):
        rows = req(*args)
        rec["requests"].append(rows)
        return rows

    def build_loss(rows, groups):
        batches = loss(rows, groups)
        rec["batches"].append((rows, list(groups), batches))
        return batches

    trainer._generate_single_turn, trainer._generate_and_score_request = generate, request
    trainer._build_loss_batches = build_loss
    return rec


def batch_rows(batch):
    """(prompt, completion) token tuples of a collated micro-batch, padding stripped."""
    out = []
    for p, pm, c, cm in zip(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                            batch["completion_mask"]):
        out.append((tuple(p[pm.bool()].tolist()), tuple(c[cm.bool()].tolist())))
    return out


def finished_early(row, eos):
    c = row["completion_ids"]
    return len(c) < L or any(t in eos for t in c[:L])


# ---------------------------------------------------------------- the main path


@pytest.fixture(scope="module")
def arrol_run(tmp_path_factory):
    trainer = build(tmp_path_factory.mktemp("arrol"), num_rounds=5)
    head0 = {k: v.clone() for k, v in trainer.pruner.head.state_dict().items()}
    rec = spy(trainer)
    trainer.train()
    return trainer, rec, head0


def test_two_phases_and_pruned_rollouts_stop_at_detect_length(arrol_run):
    trainer, rec, _ = arrol_run
    eos = set(trainer.eos_token_ids)
    caps = [cap for cap, _, _ in rec["calls"]]
    assert set(caps) <= {L, MAX_LEN - L} and caps[0] == L
    rows = [r for req in rec["requests"] for r in req]
    pruned = [r for r in rows if r["pruned"]]
    assert pruned, "after the cold start some rollouts must be pruned"
    for r in pruned:  # generated exactly detect_length tokens, unfinished, never rewarded
        assert len(r["completion_ids"]) == L and r["completion_ids"][-1] not in eos
        assert np.isnan(r["reward"]) and torch.isnan(r["rewards"]).all()
    # phase 2 continued exactly the surviving eligible rollouts, from prompt + partial
    continued = Counter(tuple(p) for cap, ps, _ in rec["calls"] if cap == MAX_LEN - L for p in ps)
    survivors = Counter(tuple(r["prompt_ids"] + r["completion_ids"][:L]) for r in rows
                        if not r["pruned"] and not finished_early(r, eos))
    assert continued == survivors
    # no generated token past detect_length for pruned rollouts: every phase-1 output is at most L long
    assert all(len(c) <= L for cap, _, outs in rec["calls"] if cap == L for c in outs)


def test_rollouts_finishing_before_detect_length_are_never_pruned(arrol_run):
    trainer, rec, _ = arrol_run
    eos = set(trainer.eos_token_ids)
    rows = [r for req in rec["requests"] for r in req]
    early = [r for r in rows if finished_early(r, eos)]
    assert early, "the EOS bias should make some rollouts finish early"
    assert not any(r["pruned"] for r in early)
    assert all(np.isfinite(r["reward"]) for r in early)


def test_pruned_responses_count_in_the_budget(arrol_run):
    trainer, rec, _ = arrol_run
    phase1 = sum(len(ps) for cap, ps, _ in rec["calls"] if cap == L)
    rows = [r for req in rec["requests"] for r in req]
    n_pruned = sum(r["pruned"] for r in rows)
    assert phase1 == len(rows) == trainer.allocator.counters["responses"] == 5 * 16  # every response, pruned included
    assert trainer.allocator.pacer.remaining_responses == trainer.allocator.pacer.budget_responses - len(rows) == 0
    assert sum(h["pruned"] for h in trainer.allocator.history) == n_pruned == trainer.pruner.totals["pruned"]
    # L tokens per pruned one
    assert trainer.allocator.counters["tokens"] == sum(len(r["completion_ids"]) for r in rows)
    logged = [h for h in trainer.state.log_history if "pruning/pruned" in h]
    assert sum(h["pruning/pruned"] for h in logged) == n_pruned
    assert logged[-1]["pruning/tokens_saved_total"] > 0


def test_pruned_rollouts_never_reach_the_loss(arrol_run):
    trainer, rec, _ = arrol_run
    for rows, groups, batches in rec["batches"]:
        want = Counter((tuple(r["prompt_ids"]), tuple(r["completion_ids"])) for r in rows
                       if r["pid"] in groups and not r["pruned"])
        got = Counter(row for b in batches if "tool_mask" not in b for row in batch_rows(b))
        assert got == want
        assert float(batches[0]["num_items_in_batch"]) == sum(len(c) * n for (_, c), n in want.items())


def test_survivors_are_about_keep_ratio_of_the_eligible(arrol_run):
    trainer, _, _ = arrol_run
    logged = [h for h in trainer.state.log_history if "pruning/eligible" in h]
    assert logged[0]["pruning/active"] == 0.0 and logged[0]["pruning/pruned"] == 0.0  # cold start
    active = [h for h in logged if h["pruning/active"] == 1.0]
    eligible = sum(h["pruning/eligible"] for h in active)
    kept = eligible - sum(h["pruning/pruned"] for h in active)
    assert eligible >= 30 and 0.3 <= kept / eligible <= 0.7  # κ = 0.5, binomial noise over ~40 draws


def test_head_is_trained_and_metrics_logged(arrol_run):
    trainer, _, head0 = arrol_run
    head = trainer.pruner.head.state_dict()
    assert any(not torch.equal(head[k], head0[k]) for k in head)
    assert trainer.pruner.policy.rounds == 5 and len(trainer.pruner.policy.calibrator) > 0
    keys = set().union(*trainer.state.log_history)
    assert {"arrol/head_accuracy", "arrol/head_loss", "pruning/keep_ratio", "pruning/survivor_positive_ratio",
            "pruning/target_ratio", "pruning/tokens_saved", "pruning/generation_s"} <= keys


def test_head_step_reduces_its_loss_on_fixed_data():
    args = make_args("unused", **ARROL)
    pruner = RolloutPruner(args, hidden_size=8, seed=0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=gen)
    y = (x[:, 0] > 0).float()
    losses = [pruner.train_head(x, y) for _ in range(40)]
    assert losses[-1] < 0.7 * losses[0]
    logits = pruner.head(x).detach().numpy()
    assert ((logits > 0) == (y.numpy() > 0)).mean() > 0.8


def test_head_never_backpropagates_into_the_policy(tmp_path):
    trainer = build(tmp_path, num_rounds=1)
    from trl_alloc.rollout.quality_head import last_hidden_states

    feats = last_hidden_states(trainer.model, [[2, 3, 4], [5, 6]], pad_id=0)
    assert feats.shape == (2, 64) and not feats.requires_grad
    trainer.pruner.train_head(feats, torch.tensor([1.0, 0.0]))
    assert all(p.grad is None for p in trainer.model.parameters())


def test_the_default_gate_keeps_pruning_off_until_the_head_is_measured(tmp_path, capsys):
    """With the gate on (the default), a head measured on too few held-out rollouts prunes nothing: rollouts run to
    the end, the budget is exact, the run says why once, and its summary and card record the gate."""
    trainer = build(tmp_path, num_rounds=4, pruning_min_auc=0.6)
    rec = spy(trainer)
    trainer.train()
    rows = [r for req in rec["requests"] for r in req]
    assert not any(r["pruned"] for r in rows) and trainer.pruner.totals["pruned"] == 0
    assert trainer.pruner.totals["eligible"] > 0 and any(len(r["completion_ids"]) > L for r in rows)
    assert trainer.allocator.counters["responses"] == len(rows) == 4 * 16
    logged = [x for x in trainer.state.log_history if "arrol/gate_open" in x]
    assert len(logged) == 4 and all(x["arrol/gate_open"] == 0.0 for x in logged)
    assert all(0 <= x["arrol/heldout_samples"] <= 4 * 16 for x in logged)
    out = capsys.readouterr().out
    assert out.count("ARROL pruning is off") == 1 and "mixed groups to measure the head" in out
    gate = trainer.write_allocation_report()["pruning"]["gate"]
    assert gate["open"] is False and gate["min_auc"] == 0.6
    trainer.pruner.save(tmp_path)
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert "Pruning gate at the end of the run: **closed**" in card and "| `pruning_min_auc` | 0.6 |" in card


# ---------------------------------------------------------------- random pruning (the paper's control)


def test_random_pruning_at_the_same_keep_ratio(tmp_path):
    trainer = build(tmp_path, pruning="random", num_rounds=4, save_strategy="steps", save_steps=4)
    rec = spy(trainer)
    trainer.train()
    assert trainer.pruner.head is None
    rows = [r for req in rec["requests"] for r in req]
    assert any(r["pruned"] for r in rows) and all(len(r["completion_ids"]) == L for r in rows if r["pruned"])
    for rows_, groups, batches in rec["batches"]:
        n_loss = sum(1 for r in rows_ if r["pid"] in groups and not r["pruned"])
        assert sum(len(batch_rows(b)) for b in batches if "tool_mask" not in b) == n_loss
    assert trainer.allocator.counters["responses"] == len(rows) == 4 * 16
    ckpt = tmp_path / "checkpoint-4"
    assert not (ckpt / HEAD_DIR).exists()
    assert json.loads((ckpt / ALLOCATION_STATE_NAME).read_text())["pruner"]["mode"] == "random"


# ---------------------------------------------------------------- checkpoints


def test_save_and_resume_restore_head_and_calibrator(tmp_path):
    kw = dict(pacing="cero", filling="sara", num_rounds=4, rollout_budget=64, save_strategy="steps", save_steps=2)
    full = build(tmp_path / "full", **kw)
    snapshots = {}
    inner_save = full.save_model

    def save_and_snapshot(output_dir=None, _internal_call=False):
        inner_save(output_dir, _internal_call)
        snapshots[os.path.basename(output_dir)] = (
            {k: v.clone() for k, v in full.pruner.head.state_dict().items()},
            json.loads(json.dumps(full.pruner.state_dict())))

    full.save_model = save_and_snapshot
    full.train()
    ckpt = tmp_path / "full" / "checkpoint-2"
    assert {"config.json", "model.safetensors"} <= set(os.listdir(ckpt / HEAD_DIR))
    assert (ckpt / HEAD_OPTIMIZER_NAME).is_file()
    saved = json.loads((ckpt / ALLOCATION_STATE_NAME).read_text())
    head2, pruner2 = snapshots["checkpoint-2"]
    assert saved["pruner"] == pruner2 and saved["pruner"]["rounds"] == 2
    config = json.loads((ckpt / HEAD_DIR / "config.json").read_text())
    assert config["hidden_size"] == 64 and config["detect_length"] == L and config["head_hidden_size"] == 16
    loaded = QualityHead.from_pretrained(str(ckpt / HEAD_DIR))
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, head2[k])

    resumed = build(tmp_path / "resumed", **kw)
    restored = {}
    inner_load = resumed._load_optimizer_and_scheduler

    def load_and_snapshot(checkpoint):
        inner_load(checkpoint)
        restored["head"] = {k: v.clone() for k, v in resumed.pruner.head.state_dict().items()}
        restored["pruner"] = json.loads(json.dumps(resumed.pruner.state_dict()))
        restored["optimizer"] = copy.deepcopy(resumed.pruner.optimizer.state_dict())

    resumed._load_optimizer_and_scheduler = load_and_snapshot
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert restored["pruner"] == pruner2  # calibrator buffer, survivor RNG, rounds seen: exactly
    for k, v in restored["head"].items():
        assert torch.equal(v, head2[k])
    saved_opt = torch.load(ckpt / HEAD_OPTIMIZER_NAME, weights_only=True)
    assert restored["optimizer"]["state"][0]["step"] == saved_opt["state"][0]["step"] > 0
    # ... and the resumed run repeats the uninterrupted one's decisions and head updates
    assert read_round_log(resumed.round_log_path) == read_round_log(full.round_log_path)[2:]
    assert ([h["pruned"] for h in resumed.allocator.history]
            == [h["pruned"] for h in full.allocator.history])  # the whole run's history
    assert resumed.pruner.state_dict() == full.pruner.state_dict()
    for k, v in resumed.pruner.head.state_dict().items():
        torch.testing.assert_close(v, full.pruner.head.state_dict()[k])


def test_resume_rejects_a_different_pruning(tmp_path):
    first = build(tmp_path / "a", num_rounds=1, save_strategy="steps", save_steps=1)
    first.train()
    other = build(tmp_path / "b", pruning="random", num_rounds=1)
    with pytest.raises(ValueError, match="pruning="):
        other.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-1"))


# ---------------------------------------------------------------- LoRA policy


def test_lora_policy_with_head_as_side_adapter(tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = build(tmp_path, peft_config=lora, num_rounds=3, learning_rate=5e-2)
    rec = spy(trainer)
    trainer.train()
    trainer.save_model()
    assert (tmp_path / "adapter_config.json").is_file() and (tmp_path / HEAD_DIR / "model.safetensors").is_file()
    assert any(r["pruned"] for req in rec["requests"] for r in req)
    # the head is no part of the policy: not in its parameters, its optimizer or its adapter file
    policy_params = {id(p) for p in trainer.model.parameters()}
    assert not policy_params & {id(p) for p in trainer.pruner.head.parameters()}
    from safetensors.torch import load_file

    assert not any("net." in k for k in load_file(str(tmp_path / "adapter_model.safetensors")))
    # features come from the adapted policy: disabling the adapter changes them once LoRA has moved
    from trl_alloc.rollout.quality_head import last_hidden_states

    seq = [rec["calls"][0][1][0]]
    with_adapter = last_hidden_states(trainer.model, seq, pad_id=0)
    with trainer.model.disable_adapter():
        without = last_hidden_states(trainer.model, seq, pad_id=0)
    assert not torch.allclose(with_adapter, without)
    # test-time weighting reuses the saved head on the policy's hidden states
    head = QualityHead.from_pretrained(str(tmp_path / HEAD_DIR))
    want = trainer.pruner.head(with_adapter).detach().numpy()
    np.testing.assert_allclose(head.score(trainer.model, seq, pad_id=0), want, rtol=1e-5)


# ---------------------------------------------------------------- config errors


@pytest.mark.parametrize("overrides,match", [
    (dict(pruning="bogus"), "unknown `pruning='bogus'`"),
    (dict(detect_length=6), "below `max_completion_length`"),
    (dict(keep_ratio=0.05), "survival_min, survival_max"),
    (dict(survival_min=0.6, survival_max=0.4), "must not exceed"),
    (dict(keep_ratio=0.0), "keep_ratio"),
    (dict(head_learning_rate=0.0), "head_learning_rate"),
    (dict(cold_start_rounds=-1), "cold_start_rounds"),
])
def test_bad_pruning_config(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace("[", r"\[")):
        make_args(str(tmp_path), **{**ARROL, **overrides})


def test_pruning_none_is_unchanged(tmp_path):
    """pruning='none': no pruner, one full-length generation call per request, every rollout completes and
    is scored, and there are no pruning metrics, no pruner state and no quality-head folder."""
    args = AllocGRPOConfig(output_dir=str(tmp_path / "defaults"), use_cpu=True, report_to=[])
    assert args.pruning == "none" and args.detect_length == 512 and args.keep_ratio == 0.5
    trainer = build(tmp_path / "none", pruning="none", max_steps=2, save_strategy="steps", save_steps=2)
    assert trainer.pruner is None and trainer.allocator.pruner is None
    rec = spy(trainer)
    trainer.train()
    assert len(rec["calls"]) == len(rec["requests"]) > 0  # one generation call per request, no second phase
    assert all(cap == MAX_LEN for cap, _, _ in rec["calls"])
    rows = [r for req in rec["requests"] for r in req]
    assert not any(r["pruned"] for r in rows) and all(np.isfinite(r["success"]) for r in rows)
    assert trainer.allocator.counters["responses"] == len(rows) == 2 * 16
    assert sum(h["pruned"] for h in trainer.allocator.history) == 0
    assert not any(k.startswith(("pruning/", "arrol/")) for x in trainer.state.log_history for k in x)
    checkpoint = tmp_path / "none" / "checkpoint-2"
    assert (checkpoint / ALLOCATION_STATE_NAME).is_file() and not (checkpoint / HEAD_DIR).exists()
    assert json.loads((checkpoint / ALLOCATION_STATE_NAME).read_text())["pruner"] is None


# ---------------------------------------------------------------- two processes, ZeRO-3 (slow)


@pytest.mark.slow
def test_two_process_zero3_ranks_agree_on_pruning(two_process_runs):
    """`accelerate launch` with 2 CPU processes under ZeRO-3 (collective forwards and generation): one-row
    SARA requests leave some ranks without rows; every rank makes the same decisions, the budget is exact.
    (Run "arrol" of helpers.TWO_PROCESS_RUNS, in the ZeRO-3 launch the other two-process tests share.)"""
    ranks, out = two_process_runs("zero3", "arrol")
    log = [{k: x[k] for k in ("round", "requests", "groups")} for x in ranks[0]["round_log"]]  # the main's file
    assert ranks[0]["decided"] == ranks[1]["decided"] == log and ranks[0]["counters"] == ranks[1]["counters"]
    assert len(log) == ranks[0]["counters"]["rounds"] == 3
    assert ranks[0]["param_sums"] == ranks[1]["param_sums"]
    state = ranks[0]["allocation_state"]
    assert state["pruner"]["totals"]["pruned"] > 0 and state["pruner"]["rounds"] == 3
    assert ranks[0]["counters"]["responses"] == 40 - state["pacer"]["remaining_responses"] <= 40
    assert (out / "run" / "checkpoint-2" / HEAD_DIR / "model.safetensors").is_file()


# ---------------------------------------------------------------- vLLM server mode (CPU)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_arrol_through_the_vllm_server(tmp_path, vllm_server):
    """Phase 1 on the server with max_tokens = detect_length, scoring in the trainer, phase 2 sends prompt + partial
    for the survivors only; pruned rollouts never get a token past detect_length."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from trl_alloc.serving import find_free_port
    from trl_alloc.trainer.trl_compat import patch_trl_vllm_client

    server, model_dir = vllm_server, vllm_server.model_dir  # head_dim 64 (every vLLM CPU attention backend), eos 2
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]

    def first_digit_reward(completions, answer, **kwargs):
        return [float(c[:1] == a[:1]) for c, a in zip(completions, answer)]

    args = make_args(str(tmp_path / "out"), **{**ARROL, "generation_kwargs": None}, num_rounds=4,
                     use_vllm=True, vllm_mode="server", vllm_server_base_url=server.url, vllm_server_timeout=60)
    with patch_trl_vllm_client(request_timeout=300):
        trainer = AllocGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                                   reward_funcs=first_digit_reward, args=args,
                                   train_dataset=Dataset.from_list(rows), processing_class=tok)
    client = trainer.vllm_generation.vllm_client
    sent, inner = [], client.generate

    def generate(prompts, **kw):
        out = inner(prompts, **kw)
        sent.append((kw["max_tokens"], [list(p) for p in prompts], out["completion_ids"]))
        return out

    client.generate = generate
    rec = spy(trainer)

    class StopAfterThree(TrainerCallback):  # leaves budget for a 4th round, used below
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step >= 3

    trainer.add_callback(StopAfterThree())
    trainer.train()
    assert trainer.state.global_step == 3 and client.weights_checksum()["num_pushes"] - server.pushes_before >= 3
    rows = [r for req in rec["requests"] for r in req]
    eos = set(trainer.eos_token_ids)
    assert {m for m, _, _ in sent} == {L, MAX_LEN - L}
    assert all(len(c) <= L for m, _, outs in sent if m == L for c in outs)
    pruned = [r for r in rows if r["pruned"]]
    assert pruned and all(len(r["completion_ids"]) == L for r in pruned)
    continued = Counter(tuple(p) for m, ps, _ in sent if m == MAX_LEN - L for p in ps)
    survivors = Counter(tuple(r["prompt_ids"] + r["completion_ids"][:L]) for r in rows
                        if not r["pruned"] and not finished_early(r, eos))
    assert continued == survivors  # only survivors go on, from prompt + partial
    assert trainer.allocator.counters["responses"] == len(rows) == 3 * 16
    for r in rows:  # sampling log-probs cover the whole completion (phase 1 + phase 2)
        assert len(r["sampling_logps"]) == len(r["completion_ids"])
    for rows_, groups, batches in rec["batches"]:
        n_loss = sum(1 for r in rows_ if r["pid"] in groups and not r["pruned"])
        assert sum(len(batch_rows(b)) for b in batches if "tool_mask" not in b) == n_loss

    # The server goes away (nothing listens at the client's URL any more; the session's server stays up for the
    # other tests): the next round fails with a clear error within the configured timeout, and what was trained
    # is intact on disk.
    trainer.save_model(str(tmp_path / "out" / "last"))
    from trl_alloc.serving import VLLMServerUnreachableError

    client.base_url = gone = f"http://127.0.0.1:{find_free_port()}"
    client.connection_timeout = 5.0
    start = time.monotonic()
    with pytest.raises(VLLMServerUnreachableError, match=gone.split("//")[1]):
        trainer._run_round()
    assert time.monotonic() - start < 30
    last = tmp_path / "out" / "last"
    reloaded = AutoModelForCausalLM.from_pretrained(str(last))
    for (name, p), q in zip(trainer.model.named_parameters(), reloaded.parameters()):
        assert torch.equal(p.detach().cpu(), q), name
    assert json.loads((last / "allocation_state.json").read_text())["counters"]["rounds"] == 3
