"""AllocGRPOTrainer on a tiny locally built model (CPU, single process)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from trl_alloc.trainer.config import AllocGRPOConfig  # noqa: E402

# ---------------------------------------------------------------- helpers

import importlib.util  # noqa: E402
import json  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from helpers import ROOT, SCRIPTED, build, make_args, scripted_generation, tiny_setup  # noqa: E402, F401

from trl_alloc.trainer.trl_compat import count_generated  # noqa: E402
from trl_alloc.trainer.config import AllocDAPOConfig  # noqa: E402
from trl_alloc.allocation.allocator import json_default as _json_default, read_round_log  # noqa: E402
from trl_alloc.trainer import AllocDAPOTrainer, AllocGRPOTrainer  # noqa: E402
from trl_alloc.trainer.checkpointing import ALLOCATION_STATE_NAME  # noqa: E402

# ---------------------------------------------------------------- stock equivalence


@pytest.mark.parametrize("loss_type,accum", [("dapo", 1), ("grpo", 1), ("dapo", 2)])
def test_uniform_full_matches_stock_grpo(tmp_path, loss_type, accum):
    """Same prompts and scripted completions: same loss and the same parameters after two steps."""
    common = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=3, learning_rate=1e-2,
                  logging_steps=1, report_to=[], bf16=False, use_cpu=True, gradient_checkpointing=False,
                  save_strategy="no", seed=0, max_steps=2, loss_type=loss_type, gradient_accumulation_steps=accum)
    results = []
    for kind in ("stock", "alloc"):
        model, tok, ds, reward = tiny_setup(seed=0, n_prompts=2 * accum)  # = one stock step's prompts
        if kind == "stock":
            args = GRPOConfig(output_dir=str(tmp_path / kind), **common)
            trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                                  processing_class=tok)
        else:
            args = AllocGRPOConfig(output_dir=str(tmp_path / kind), pacing="uniform", filling="full", **common)
            trainer = AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                                       processing_class=tok)
        scripted_generation(trainer).train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        results.append((losses, [p.detach().clone() for p in trainer.model.parameters()]))
    (stock_loss, stock_params), (alloc_loss, alloc_params) = results
    assert len(alloc_loss) == len(stock_loss) == 2
    np.testing.assert_allclose(alloc_loss, stock_loss, rtol=1e-4, atol=1e-6)
    for a, b in zip(alloc_params, stock_params):  # Adam steps are ~lr = 1e-2; summation order differs
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    initial = list(tiny_setup(seed=0)[0].parameters())
    assert any(not torch.equal(a, b) for a, b in zip(alloc_params, initial)), "the policy should have moved"


# ---------------------------------------------------------------- rounds, budget, accounting


def test_runs_exactly_num_rounds(tmp_path):
    trainer = build(tmp_path, num_rounds=3)
    generated = count_generated(trainer)
    trainer.train()
    assert trainer.state.global_step == 3
    assert trainer.allocator.counters["rounds"] == 3
    assert generated["n"] == trainer.allocator.counters["responses"] == 3 * 2 * 4  # 2 prompts × k=4 per round
    assert trainer.round_log_path == str(tmp_path / "allocation" / "rounds.jsonl")
    log = read_round_log(trainer.round_log_path)  # one line per round, written as the round is recorded
    assert [r["round"] for r in log] == [0, 1, 2] and [len(r["groups"]) for r in log] == [2, 2, 2]
    assert log[-1] == json.loads(json.dumps(trainer.allocator.last_round_log))
    logged = [h for h in trainer.state.log_history if "alloc/responses_spent" in h]
    assert [h["alloc/responses_spent"] for h in logged] == [8.0, 16.0, 24.0]
    assert logged[-1]["alloc/responses_remaining"] == 0.0


def test_stops_when_budget_exhausted_with_final_save(tmp_path):
    trainer = build(tmp_path, num_rounds=5, rollout_budget=16, save_strategy="steps", save_steps=100)
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.allocator.budget_exhausted
    assert trainer.allocator.counters["responses"] == 16 and trainer.allocator.pacer.remaining_responses == 0
    state = json.loads((tmp_path / "checkpoint-2" / ALLOCATION_STATE_NAME).read_text())
    assert state["pacer"]["remaining_responses"] == 0 and state["counters"]["rounds"] == 2


@pytest.mark.parametrize("pacing,filling", [("cero", "sara"), ("uniform", "sara"), ("uniform", "dynamic_sampling"),
                                            ("cero", "full"), ("knapsack", "full")])
def test_never_generates_past_the_budget(tmp_path, pacing, filling):
    budget = 40
    trainer = build(tmp_path, pacing=pacing, filling=filling, num_rounds=6, rollout_budget=budget,
                    max_generation_batches=50)
    generated = count_generated(trainer)
    trainer.train()
    spent = budget - trainer.allocator.pacer.remaining_responses
    assert generated["n"] == trainer.allocator.counters["responses"] == spent <= budget
    assert trainer.state.global_step == trainer.allocator.counters["rounds"] <= 6
    log = read_round_log(trainer.round_log_path)
    assert len(log) == trainer.allocator.counters["rounds"]
    for entry in log:  # every loss group was generated in its own round
        asked = {pid for ids, _ in entry["requests"] for pid in ids}
        assert set(entry["groups"]) <= asked
    for h in trainer.allocator.history:  # what the planner fits a drift to, and the prompts a round trained
        assert 0 <= h["successes"] <= h["scored"] <= h["responses"] and h["truncated"] <= h["responses"]
        assert set(h["signal_pids"]) <= set(h["trained_pids"]) and len(h["trained_pids"]) <= h["committed"]
    assert sum(h["scored"] for h in trainer.allocator.history) > 0
    if filling == "sara":  # SARA's own statistics reach the log (alloc/sara/*)
        logged = {k for x in trainer.state.log_history for k in x}
        assert {"alloc/sara/mean_rollouts_to_decide", "alloc/sara/expected_lost_groups",
                "alloc/sara/unfinished"} <= logged


def test_empty_round_leaves_parameters_unchanged(tmp_path):
    # ν1 = 1 prices every prompt out (margins 4q̂ − 1 <= 0), and no catch-up forces spending.
    trainer = build(tmp_path, pacing="cero", filling="full", num_rounds=1, init_price=1.0, catch_up=False,
                    weight_decay=0.1)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.allocator.counters["empty_rounds"] == 1
    assert read_round_log(trainer.round_log_path) == [{"round": 0, "requests": [], "groups": []}]
    for a, b in zip(before, trainer.model.parameters()):
        assert torch.equal(a, b)
    assert trainer._saved_lrs is None  # the zero-lr step was undone


def test_variable_group_sizes_reach_the_loss(tmp_path):
    """CERO + full with g=2, N_max=2: groups of 2 and 4 responses in one round, each normalised alone."""
    trainer = build(tmp_path, pacing="cero", filling="full", num_rounds=2, num_generations=4, unit_size=2,
                    max_units=2, round_capacity=3, rollout_budget=12)
    batches = {}
    inner = trainer._build_loss_batches

    def spy(rows, groups):
        out = inner(rows, groups)
        batches.setdefault("sizes", []).append([sum(r["pid"] == g for r in rows) for g in groups])
        return out

    trainer._build_loss_batches = spy
    trainer.train()
    assert any(sorted(s) == [2, 4] for s in batches["sizes"])


def test_dapo_trainer_adds_overlong_shaping(tmp_path):
    model, tok, ds, reward = tiny_setup()
    args = AllocDAPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                           max_completion_length=5, report_to=[], bf16=False, use_cpu=True,
                           gradient_checkpointing=False, save_strategy="no", num_rounds=2, max_generation_batches=20)
    assert (args.epsilon, args.epsilon_high, args.loss_type, args.filling) == (0.2, 0.28, "dapo", "dynamic_sampling")
    assert args.overlong_buffer == 1
    trainer = AllocDAPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    assert trainer.reward_func_names[-1] == "soft_overlong_punishment_reward"
    trainer.train()
    assert trainer.allocator.counters["rounds"] >= 1


# ---------------------------------------------------------------- checkpoint / resume


def test_resume_restores_allocator_and_reproduces_decisions(tmp_path):
    kw = dict(pacing="cero", filling="sara", num_rounds=4, rollout_budget=48, save_strategy="steps", save_steps=2)
    full = build(tmp_path / "full", **kw)
    full.train()
    ckpt = tmp_path / "full" / "checkpoint-2"
    saved = json.loads((ckpt / ALLOCATION_STATE_NAME).read_text())
    assert saved["counters"]["rounds"] == 2 and saved["pacer"]["round"] == 2
    full_log = read_round_log(full.round_log_path)
    assert [x["round"] for x in full_log] == [0, 1, 2, 3]

    resumed = build(tmp_path / "full", **kw)  # in the same output_dir: its round log goes on from checkpoint-2
    loaded = {}
    inner = resumed.load_allocation_state

    def spy(state, *args, **kwargs):
        inner(state, *args, **kwargs)
        loaded.update(json.loads(json.dumps(resumed.allocation_state(), default=_json_default)))  # a snapshot

    resumed.load_allocation_state = spy
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert loaded["pacer"] == saved["pacer"] and loaded["counters"] == saved["counters"]
    assert resumed.state.global_step == full.state.global_step
    # the same requests and groups as the uninterrupted run; rounds 2 and 3 are in the file once, not twice
    assert read_round_log(resumed.round_log_path) == full_log
    assert resumed.allocation_state()["pacer"] == full.allocation_state()["pacer"]


def test_resume_rejects_a_different_pipeline(tmp_path):
    first = build(tmp_path / "a", num_rounds=2, save_strategy="steps", save_steps=1)
    first.train()
    other = build(tmp_path / "b", pacing="cero", filling="full", num_rounds=2)
    with pytest.raises(ValueError, match="pacing="):
        other.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-1"))


# ---------------------------------------------------------------- config errors


@pytest.mark.parametrize("overrides,match", [
    (dict(pacing="bogus"), "unknown `pacing='bogus'`"),
    (dict(filling="nope"), "unknown `filling='nope'`"),
    (dict(pruning="arrol"), "pruning='none'"),
    (dict(commit_min=8), "commit_min"),
    (dict(probe=5), "probe"),
    (dict(tau_low=1.5), "tau_low"),
    (dict(steps_per_generation=3, gradient_accumulation_steps=2), "multiple of `gradient_accumulation_steps`"),
    (dict(pacing="knapsack", filling="sara"), "filling='full'"),
    (dict(pacing="random_matched"), "random_matched_reference"),
    (dict(pacing="cero", rollout_budget=10), "multiple of `unit_size`"),
    (dict(pacing="cero", num_rounds=2, round_capacity=2, rollout_budget=40), "exceeds what 2 rounds can spend"),
    (dict(pacing="uniform", filling="full", num_rounds=2, rollout_budget=100), "lower `rollout_budget`"),
    (dict(round_capacity=1), "round_capacity"),
    (dict(num_rounds=3, max_steps=5), "more optimizer steps than `num_rounds`"),
    (dict(vllm_dtype="fp32"), "unknown `vllm_dtype='fp32'`; choose one of auto, float32, bfloat16, float16"),
])
def test_bad_config_raises_helpful_error(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace("[", r"\[")):
        make_args(str(tmp_path), **overrides)


def test_colocate_engine_fields_without_the_colocate_engine_warn(tmp_path):
    with pytest.warns(UserWarning, match=r"vllm_dtype='float32' set, but only the colocate engine reads it "
                      r"\(use_vllm=False, vllm_mode='colocate'\)"):
        make_args(str(tmp_path), vllm_dtype="float32")
    with pytest.warns(UserWarning, match=r"vllm_enforce_eager=False, vllm_dtype='bfloat16' set, .*vllm_mode='server'"):
        make_args(str(tmp_path), use_vllm=True, vllm_mode="server", vllm_enforce_eager=False, vllm_dtype="bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_args(str(tmp_path), use_vllm=True, vllm_mode="colocate", vllm_dtype="float32")  # read: no warning


def test_bad_dataset_and_pool_errors(tmp_path):
    model, tok, ds, reward = tiny_setup()
    args = make_args(str(tmp_path), pacing="uniform", filling="full", per_device_train_batch_size=128,
                     num_rounds=1)
    with pytest.raises(ValueError, match="exceeds the 16 prompts"):
        AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    with pytest.raises(ValueError, match="indexable"):
        AllocGRPOTrainer(model=model, reward_funcs=reward, args=make_args(str(tmp_path)),
                         train_dataset=ds.to_iterable_dataset(), processing_class=tok)
    with pytest.raises(TypeError, match="AllocGRPOConfig"):
        AllocGRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True,
                                                                          bf16=False), train_dataset=ds,
                         processing_class=tok)


# ---------------------------------------------------------------- two processes under DeepSpeed (slow)


@pytest.mark.slow
@pytest.mark.parametrize("zero,mode,colocate", [("zero2", "deterministic", False), ("zero3", "deterministic", False),
                                                ("zero3", "events", False), ("zero3", "stream", False),
                                                ("zero2", "events", True), ("zero3", "stream", True)])
def test_two_process_deepspeed_ranks_agree(tmp_path, two_process_runs, zero, mode, colocate):
    """`accelerate launch` with 2 CPU processes: every rank logs the same decisions; budget is exact.
    probe=1 makes one-row requests, so some ranks have no share (ZeRO-3 pads, ZeRO-2 skips). In events mode
    the main process's event round drives batched generation on both ranks; in stream mode its stream does,
    and every rank holds the open groups' rows until they commit. With vLLM colocate, each rank steps its own
    engine on the rollouts the main process assigns it (rollout.colocate.RankedRollouts). The runs without vLLM
    share one launch per ZeRO stage (conftest.py `two_process_runs`); a colocate run has a launch of its own."""
    if colocate and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from helpers import SMOKE, launch_two_processes

    def decisions(log):  # the main process's round log, less the events (stream mode: with token_staleness)
        return [{k: v for k, v in x.items() if k != "events"} for x in log]

    if colocate:
        settings = {**SMOKE, "rollout_mode": mode, "colocate": True}
        ranks, out = launch_two_processes(zero, tmp_path, {mode: settings})[mode], tmp_path / mode
    else:
        ranks, out = two_process_runs(zero, mode)
    assert ranks[0]["world"] == 2 and "round_log" not in ranks[1]  # written by the main process only
    log = ranks[0]["round_log"]
    assert (ranks[0]["decided"] == ranks[1]["decided"] == decisions(log)
            and ranks[0]["counters"] == ranks[1]["counters"])
    if mode != "deterministic":  # the order of events is in the main process's file; no other rank received it
        assert all("events" in x for x in log) and all(ranks[0]["events_here"]) and not any(ranks[1]["events_here"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == ranks[0]["counters"]["rounds"]
    state = ranks[0]["allocation_state"]
    assert ranks[0]["counters"]["responses"] == 40 - state["pacer"]["remaining_responses"] <= 40
    if colocate:  # both ranks' engines ran the rollouts the main process assigned them, and nothing else
        assert all(r["rank_rollouts"] > 0 for r in ranks)
        assert sum(r["rank_rollouts"] for r in ranks) == ranks[0]["counters"]["responses"]
    sums = ranks[0]["param_sums"]  # before training, then after each round
    assert sums == ranks[1]["param_sums"] and len(sums) == len(log) + 1
    for i, entry in enumerate(log):  # a round without groups moves no parameter
        assert (sums[i + 1] == sums[i]) == (not entry["groups"]), (i, entry["groups"])
    saved = json.loads((out / "run" / "checkpoint-2" / ALLOCATION_STATE_NAME).read_text())
    assert saved["counters"]["rounds"] == 2
    if zero == "zero2":  # resuming on 2 ranks reproduces the uninterrupted run's decisions and weights
        if colocate:
            resume = {**settings, "resume_from_checkpoint": f"{mode}/run/checkpoint-2"}
            resumed = launch_two_processes(zero, tmp_path, {"resumed": resume})["resumed"]
        else:
            resumed = two_process_runs(zero, "deterministic-resumed")[0]
        assert resumed[0]["decided"] == resumed[1]["decided"] == decisions(resumed[0]["round_log"])
        if colocate:  # a fresh engine samples anew after a resume: the ranks agree and the budget holds
            spent = 40 - resumed[0]["allocation_state"]["pacer"]["remaining_responses"]
            assert resumed[0]["counters"]["responses"] == spent <= 40 and resumed[0]["global_step"] == 3
            return
        assert resumed[0]["round_log"] == log[2:]  # (its own output_dir: the rounds it ran)
        assert resumed[0]["param_sums"][-1] == sums[-1]
        assert resumed[0]["allocation_state"]["pacer"] == state["pacer"]


# ---------------------------------------------------------------- KL reference and vLLM IS correction paths


def test_kl_reference_model(tmp_path):
    model, tok, ds, reward = tiny_setup()
    model.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    args = make_args(str(tmp_path / "out"), pacing="uniform", filling="full", num_rounds=2, beta=0.04)
    trainer = AllocGRPOTrainer(model=str(tmp_path / "policy"), reward_funcs=reward, args=args, train_dataset=ds,
                               processing_class=tok)
    scripted_generation(trainer).train()
    assert any("kl" in h for h in trainer.state.log_history)


def test_importance_sampling_correction_batch(tmp_path):
    """With vLLM's sampling log-probs (faked here), micro-batches carry TRL's IS ratio and old log-probs."""
    trainer = build(tmp_path, pacing="uniform", filling="full", num_rounds=1)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.vllm_importance_sampling_mode = "token_truncate"
    trainer.vllm_importance_sampling_clip_max = 3.0

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return [list(SCRIPTED[i % 4]) for i in range(len(prompt_ids))], [[-2.0] * len(SCRIPTED[i % 4])
                                                                           for i in range(len(prompt_ids))]

    trainer._generate_single_turn = generate
    trainer.model.train()
    batch = trainer._run_round()[0]
    assert {"old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio"} <= set(batch)
    expected = torch.clamp(torch.exp(batch["old_per_token_logps"] + 2.0), max=3.0) * batch["completion_mask"]
    torch.testing.assert_close(batch["importance_sampling_ratio"] * batch["completion_mask"], expected)


@pytest.mark.parametrize("pacing,budget", [("uniform", None), ("cero", 96)])
def test_dynamic_sampling_cap_fails_clearly_and_keeps_what_was_trained(tmp_path, pacing, budget):
    """The rescue checkpoint holds the completed rounds only: the failed round is rolled back."""
    model, tok, ds, _ = tiny_setup()
    args = make_args(str(tmp_path), pacing=pacing, filling="dynamic_sampling", num_rounds=3, rollout_budget=budget,
                     max_generation_batches=1, save_strategy="steps", save_steps=100)
    calls = []

    def varied_then_never(completions, **kw):  # round 1: every group varies; afterwards none ever does
        calls.append(1)
        return [float(i % 2) for i in range(len(completions))] if len(calls) == 1 else [0.0] * len(completions)

    trainer = AllocGRPOTrainer(model=model, reward_funcs=varied_then_never, args=args, train_dataset=ds,
                               processing_class=tok)
    with pytest.raises(RuntimeError, match="max_generation_batches"):
        trainer.train()
    rescued = tmp_path / "checkpoint-1"
    assert (rescued / ALLOCATION_STATE_NAME).is_file() and (rescued / "model.safetensors").is_file()
    state = json.loads((rescued / ALLOCATION_STATE_NAME).read_text())
    assert state["counters"]["rounds"] == 1 and len(state["history"]) == 1
    if pacing == "cero":  # random_matched replays this log: one entry per completed round
        assert len(state["pacer"]["allocation_log"]) == 1 and state["pacer"]["round"] == 1


def test_prompt_column_required(tmp_path):
    model, tok, ds, reward = tiny_setup()
    with pytest.raises(ValueError, match="'prompt' column"):
        AllocGRPOTrainer(model=model, reward_funcs=reward, args=make_args(str(tmp_path)),
                         train_dataset=ds.rename_column("prompt", "question"), processing_class=tok)


@pytest.mark.parametrize("mode", ["deterministic", "events"])
def test_the_trainer_pulls_its_rounds_from_the_runner_and_a_pull_past_the_last_is_refused(tmp_path, mode):
    """`_run_round` takes each round from this session's round runner (`round_runner`, `allocation.rounds.Rounds`):
    two rounds, each recorded once, then a third pull names the problem instead of opening a round past the plan."""
    trainer = build(tmp_path, pacing="uniform", filling="full", num_rounds=2, rollout_mode=mode)
    trainer.model.train()
    for _ in range(2):
        assert trainer._run_round()
    assert trainer.allocator.counters["rounds"] == 2 and len(read_round_log(trainer.round_log_path)) == 2
    with pytest.raises(RuntimeError, match="asked for a round after the last one"):
        trainer._run_round()
    assert trainer.allocator.counters["rounds"] == 2
