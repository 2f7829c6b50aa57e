"""What a lent GPU machine can check without vLLM or a model download (`scripts/gpu_check.sh`): AllocGRPOTrainer in
bf16 on CUDA with transformers generation, on a random-weight model of a real model's shape built from its
config, stock GRPO's allocation (uniform pacing, full groups) against CERO + SARA on the same rounds. Prints s/step,
responses, effective groups and peak memory per method, and their ratios; writes them as JSON.

The success signal is a coin the policy cannot learn in a few steps (a completion's character count is even), so
every prompt is near p = 0.5 and SARA sees mixed groups as it would mid-run on a real task.

    python scripts/gpu_check.py --shape smollm2-135m --rounds 6          # on the GPU machine
    python scripts/gpu_check.py --shape tiny --cpu --rounds 2            # a smoke run anywhere
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SHAPES = {  # architecture fields of the public configs (no weights): random init at that size
    "smollm2-135m": dict(arch="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=2048,
                         tie_word_embeddings=True, rope_theta=100000.0),
    "qwen2.5-0.5b": dict(arch="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1000000.0),
    "tiny": dict(arch="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=512, max_position_embeddings=512, tie_word_embeddings=True),
}
METHODS = {"stock": ("uniform", "full"), "cero_sara": ("cero", "sara")}


def random_model(shape: str, tokenizer: PreTrainedTokenizerBase, dtype: torch.dtype) -> PreTrainedModel:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    fields = dict(SHAPES[shape])
    arch = fields.pop("arch")
    fields["vocab_size"] = max(fields["vocab_size"], len(tokenizer))
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_cls(**fields, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    return model_cls(config).to(dtype)


def even_length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """1 when the completion has an even number of characters: p ≈ 0.5 for every prompt."""
    return [float(len(c) % 2 == 0) for c in completions]


def run_method(method: str, args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase,
               dataset: Dataset) -> dict[str, Any]:
    import torch

    from ..trainer import AllocGRPOConfig, AllocGRPOTrainer

    pacing, filling = METHODS[method]
    k = args.num_generations
    config = AllocGRPOConfig(
        output_dir=f"{args.output_dir}/{method}", pacing=pacing, filling=filling, num_rounds=args.rounds,
        rollout_budget=args.rounds * args.prompts_per_round * k, num_generations=k,
        per_device_train_batch_size=args.prompts_per_round * k, max_completion_length=args.max_completion_length,
        learning_rate=1e-6, bf16=not args.cpu, use_cpu=args.cpu, report_to=[], save_strategy="no", logging_steps=1,
        rollout_mode="deterministic", temperature=1.0, seed=0, tau_low=0.45, gradient_checkpointing=False)
    model = random_model(args.shape, tokenizer, torch.float32 if args.cpu else torch.bfloat16)
    trainer = AllocGRPOTrainer(model=model, reward_funcs=even_length_reward, args=config, train_dataset=dataset,
                               processing_class=tokenizer)
    cuda = torch.cuda.is_available() and not args.cpu
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer.train()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    summary = trainer.allocation_summary
    steps = max(trainer.state.global_step, 1)
    return {"s_per_step": seconds / steps, "steps": trainer.state.global_step, "seconds": seconds,
            "responses": summary["responses_spent"], "effective_groups": summary["effective_groups"],
            "s_per_effective_group": seconds / max(summary["effective_groups"], 1),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
            "device": torch.cuda.get_device_name(0) if cuda else "cpu"}


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--prompts_per_round", type=int, default=16)
    p.add_argument("--num_generations", type=int, default=8)
    p.add_argument("--max_completion_length", type=int, default=128)
    p.add_argument("--cpu", action="store_true", help="run on the CPU (a smoke run of this script)")
    p.add_argument("--output_dir", default="outputs/gpu_check")
    args = p.parse_args(argv)
    import os

    import torch
    from transformers import AutoTokenizer

    from ..tasks.data import load_prompt_dataset
    from ..tasks.tiny import get_tiny_model_dir

    if not args.cpu and not torch.cuda.is_available():
        p.error("no CUDA device: this check is for a GPU machine (add --cpu for a smoke run).")
    os.makedirs(args.output_dir, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(get_tiny_model_dir(task="arithmetic", progress=False))
    dataset = load_prompt_dataset("builtin:arithmetic")
    results = {}
    for method in METHODS:
        results[method] = run_method(method, args, tokenizer, dataset)
        print(f"[gpu_check] {method}: {json.dumps(results[method])}", flush=True)
    stock, ours = results["stock"], results["cero_sara"]
    ratios = {"s_per_step": ours["s_per_step"] / stock["s_per_step"],
              "s_per_effective_group": ours["s_per_effective_group"] / stock["s_per_effective_group"],
              "peak_memory": ours["peak_memory_gib"] / stock["peak_memory_gib"] if not args.cpu else float("nan")}
    print(f"[gpu_check] {args.shape} on {stock['device']}, {args.rounds} rounds of {args.prompts_per_round} x "
          f"{args.num_generations} (<= {args.max_completion_length} tokens): CERO+SARA / stock s/step "
          f"{ratios['s_per_step']:.2f}, s per effective group {ratios['s_per_effective_group']:.2f}, peak memory "
          f"{ratios['peak_memory']:.2f}")
    import transformers
    import trl

    from ..trainer.trl_compat import installed_vllm_version
    versions = {"torch": torch.__version__, "trl": trl.__version__, "transformers": transformers.__version__,
                "vllm": installed_vllm_version()}
    with open(os.path.join(args.output_dir, "gpu_check.json"), "w") as f:
        json.dump({"args": vars(args), "versions": versions, "results": results, "ratios": ratios}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
