"""One colocate scenario in a process of its own (a vLLM `LLM` holds process-wide state: distributed groups, its
share of the memory), run by test_colocate.py: `python colocate_child.py SCENARIO OUT_DIR [JSON overrides]`.
Writes OUT_DIR/result.json with what the test asserts on."""

import json
import os
import sys
import warnings
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def prompts_and_reward():
    from datasets import Dataset

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]

    def first_digit_reward(completions, answer, **kwargs):
        return [float(c[:1] == a[:1]) for c, a in zip(completions, answer)]

    return Dataset.from_list(rows), first_digit_reward


def backend(out):
    """The colocate rollout backend on TRL's own VLLMGeneration: greedy tokens equal LLM.generate's, arrival by
    length, abort keeps the partial tokens, snapshots scored by the quality head in the engine."""
    from accelerate import Accelerator
    from helpers import build_served_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.generation.vllm_generation import VLLMGeneration
    from vllm import SamplingParams

    from trl_alloc.rollout.colocate import VLLMColocateRollouts
    from trl_alloc.rollout.quality_head import QualityHead
    from trl_alloc.trainer.trl_compat import patch_trl_colocate_llm

    model_dir = os.path.join(out, "tiny")
    build_served_model(model_dir)
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    with patch_trl_colocate_llm(enforce_eager=True):  # (as AllocGRPOTrainer builds it on CPU)
        vg = VLLMGeneration(model, Accelerator(cpu=True), tok, mode="colocate", gpu_memory_utilization=0.2,
                            max_completion_length=12)
    prompt = tok("3+4=")["input_ids"]
    reference = vg.llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=12,
                                                                              ignore_eos=True), use_tqdm=False)
    result = {"reference": list(reference[0].outputs[0].token_ids), "cpu": cpu_features(vg.llm)}

    rollouts = VLLMColocateRollouts(vg.llm, temperature=0, extra={"ignore_eos": True})
    long_rids = rollouts.submit(prompt, n=2, max_tokens=12, tag="long")
    short_rids = rollouts.submit(prompt, n=2, max_tokens=3, tag="short")
    order = []
    first = rollouts.next_completed()
    order += [(r.tag, r.rid, r.finish_reason, list(r.token_ids), len(r.logprobs)) for r in first]
    aborted = rollouts.abort([long_rids[0]])
    result["aborted"] = [(r.rid, r.finish_reason, list(r.token_ids)) for r in aborted]
    while rollouts.in_flight:
        order += [(r.tag, r.rid, r.finish_reason, list(r.token_ids), len(r.logprobs))
                  for r in rollouts.next_completed()]
    result.update(order=order, long=long_rids, short=short_rids, in_flight=rollouts.in_flight)
    rollouts.close()

    head = QualityHead(hidden_size=model.config.hidden_size, head_hidden_size=16, detect_length=4)
    scored = VLLMColocateRollouts(vg.llm, temperature=1.0, extra={"ignore_eos": True}, quality_head=head)
    rids = scored.submit(prompt, n=3, max_tokens=10, tag=0, detect_at=4)
    ended = []
    while scored.in_flight:
        ended += scored.next_completed()
    snaps = [r for r in ended if r.finish_reason == "detect"]
    with __import__("torch").no_grad():  # the trainer's score of the same prompt + partial
        mine = head.score(model, [prompt + list(r.token_ids) for r in snaps], pad_id=tok.pad_token_id).tolist()
    result["snapshots"] = [{"rid": r.rid, "tokens": len(r.token_ids), "score": r.info["score"], "mine": m,
                            "hidden": len(r.info["hidden"])} for r, m in zip(snaps, mine)]
    result["scored_rids"], result["ended"] = rids, Counter(r.rid for r in ended if r.finish_reason != "detect")
    scored.close()
    return result


def cpu_features(llm):
    """The engine worker's `cpu_features` (AMX permission, attention kernels, dtype), and the attention kernel vLLM
    would choose for this engine on a CPU with AMX (`isa_with_amx`: this machine may have none)."""
    from unittest import mock

    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from trl_alloc.rollout.colocate import extend_worker

    extend_worker(llm)
    config = llm.llm_engine.vllm_config
    with mock.patch("torch.cpu._is_amx_tile_supported", return_value=True):
        isa = _get_attn_isa(config.model_config.dtype, config.cache_config.block_size,
                            config.model_config.get_head_size())
    return {**llm.collective_rpc("cpu_features")[0], "isa_with_amx": isa}


def train(out, overrides, resume=None):
    """An AllocGRPOTrainer in colocate mode; what TRL's loss saw each round, the round log, the weight pushes."""
    from helpers import build_served_model, make_args
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.allocation.allocator import read_round_log
    from trl_alloc.serving.protocol import state_checksum
    from trl_alloc.trainer import AllocGRPOTrainer

    model_dir = os.path.join(os.path.dirname(out), "tiny")
    if not os.path.isdir(model_dir):
        build_served_model(model_dir)
    dataset, reward = prompts_and_reward()
    kw = dict(max_completion_length=16, rollout_max_inflight=8, use_vllm=True, vllm_mode="colocate",
              vllm_gpu_memory_utilization=0.2, learning_rate=1e-2, generation_kwargs=None)
    kw.update(overrides)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = AllocGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=reward,
                                   args=make_args(out, **kw), train_dataset=dataset,
                                   processing_class=AutoTokenizer.from_pretrained(model_dir))
    vg, pushes = trainer.vllm_generation, []
    push = vg.sync_weights

    def checked_push():  # what the trainer sent vs what the engine's worker received
        sent = state_checksum((n, p.detach()) for n, p in vg._iter_named_params())
        push()
        pushes.append(sent == vg.llm.collective_rpc("weights_checksum")[0]["last_push_checksum"])

    vg.sync_weights = checked_push
    seen, inner = [], trainer._build_loss_batches

    def spy(rows, groups):
        batches = inner(rows, groups)
        seen.append({"groups": list(groups), "rows": [
            {"rid": r.get("rid"), "pid": r["pid"], "staleness": r.get("staleness", 0),
             "aborted": bool(r.get("aborted")), "logps": len(r.get("sampling_logps") or []),
             "tokens": len(r["completion_ids"])}
            for r in trainer.round_state.loss_rows]})
        return batches

    trainer._build_loss_batches = spy
    trainer.train(resume_from_checkpoint=resume)
    allocator = trainer.allocator
    return {"budget": kw.get("rollout_budget"), "remaining": allocator.pacer.remaining_responses,
            "counters": allocator.counters, "history_responses": [h["responses"] for h in allocator.history],
            "events": [entry.get("events") or [] for entry in read_round_log(trainer.round_log_path)],
            "carried": sum(h.get("carried", 0) for h in allocator.history), "seen": seen, "pushes": pushes,
            "global_step": trainer.state.global_step,
            "updates": sum(h["loss_responses"] > 0 for h in allocator.history[:-1]),  # new weights
            "enforce_eager": vg.llm.llm_engine.vllm_config.model_config.enforce_eager, "cpu": cpu_features(vg.llm),
            "engine_dtype": str(vg.llm.llm_engine.vllm_config.model_config.dtype).removeprefix("torch."),
            "logp_difference_max": [x["sampling/sampling_logp_difference/max"] for x in trainer.state.log_history
                                    if "sampling/sampling_logp_difference/max" in x],
            "is_ratio": [[x[f"sampling/{key}"] for key in ("importance_sampling_ratio/min",
                                                            "importance_sampling_ratio/max",
                                                            "raw_importance_sampling_ratio/p05",
                                                            "raw_importance_sampling_ratio/p95",
                                                            "importance_sampling_capped_share")]
                         for x in trainer.state.log_history if "sampling/importance_sampling_capped_share" in x],
            "dtype_warnings": [str(w.message) for w in caught if "generates in" in str(w.message)],
            "engine": trainer.engine_description(),
            "history_mismatch": [{k: h.get(k) for k in ("logp_difference_max", "is_capped_share")}
                                 for h in allocator.history],
            "logged": sorted({k for x in trainer.state.log_history for k in x})}


if __name__ == "__main__":
    scenario, out_dir = sys.argv[1], sys.argv[2]
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    os.makedirs(out_dir, exist_ok=True)
    if scenario == "backend":
        got = backend(out_dir)
    else:
        got = train(out_dir, extra.get("args", {}), resume=extra.get("resume"))
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(got, f)
