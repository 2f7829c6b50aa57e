"""Evaluate a policy on a held-out set: avg@k, pass@k, maj@k and quality-head-weighted maj@k.

    python scripts/eval.py --model tiny --dataset builtin:arithmetic --split test --num_prompts 200 --k 1 4 8
    python scripts/eval.py --model outputs/tiny_cpu --dataset builtin:arithmetic --head outputs/tiny_cpu/quality_head
    python scripts/eval.py --model Qwen/Qwen2.5-0.5B-Instruct --dataset data/math500.jsonl --max_new_tokens 1024 \\
        --vllm_server_url http://127.0.0.1:8000

Backends: transformers ``generate`` (default, batched) or a running trl-alloc vLLM server
(``--vllm_server_url``; ``--model`` then only supplies the tokenizer, and the weights too when
``--head`` needs the policy's hidden states). Prints a markdown table and writes
``eval_results.json``, ``eval_table.md`` and ``samples.jsonl`` to ``--output_dir``. Metric
definitions: ``trl_alloc/evaluation/__init__.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from trl_alloc.evaluation import EvalResult

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TASK_DEFAULT_TOKENS = {"arithmetic": 16, "countdown": 32}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="tiny", help="model directory, Hub id, a registered name "
                   "(smollm2-135m-instruct, trl_alloc.tasks.models) or `tiny` (the embedded tiny model of "
                   "the built-in task)")
    p.add_argument("--dataset", default="builtin:arithmetic",
                   help="builtin:arithmetic | builtin:countdown | a .jsonl/.json/.parquet/.csv file | a Hub dataset")
    p.add_argument("--dataset_config", default=None)
    p.add_argument("--split", default="test")
    p.add_argument("--prompt_column", default="prompt")
    p.add_argument("--answer_column", default="answer")
    p.add_argument("--num_prompts", type=int, default=200, help="first N prompts of the split (all if <= 0)")
    p.add_argument("--builtin_levels", type=int, nargs="+", default=None,
                   help="a built-in task's difficulty levels (train.py's --builtin_levels: with the run's --seed "
                        "and --num_prompts its num_eval_prompts, the held-out set the run evaluated)")
    p.add_argument("--k", type=int, nargs="+", default=[1, 4, 8], help="k values of the metrics")
    p.add_argument("--num_samples", type=int, default=None, help="samples per prompt n (default: max k)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (<= 0: greedy)")
    p.add_argument("--top_p", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=0)
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help="default: 16 for builtin:arithmetic, 32 for builtin:countdown, 1024 otherwise")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch_size", type=int, default=64,
                   help="sequences per generate call (prompts per call = batch_size // n)")
    p.add_argument("--reward", default="auto", choices=["auto", "arithmetic", "countdown", "math", "math_number"],
                   help="reward function (auto: the built-in task's verifier, else math-verify; math_number: math "
                   "whose stated result must be a number)")
    p.add_argument("--answer_type", default="auto", choices=["auto", "arithmetic", "countdown", "math"],
                   help="final-answer extraction for maj@k (auto: follows --reward)")
    p.add_argument("--threshold", type=float, default=0.5, help="a sample is correct when its reward >= this")
    p.add_argument("--vllm_server_url", default=None, help="generate with this vLLM server instead of transformers")
    p.add_argument("--head", default=None, help="quality-head folder (QualityHead.save_pretrained) for head-weighted "
                   "maj@k; needs trl_alloc.rollout.quality_head")
    p.add_argument("--head_at", default="detect", choices=["detect", "final"],
                   help="score candidates at the head's detection length (what it was trained on) or at the end")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="model dtype")
    p.add_argument("--output_dir", default=None, help="default: outputs/eval/<model>-<dataset>-<split>")
    p.add_argument("--no_progress", action="store_true", help="no tqdm bar")
    args = p.parse_args(argv)
    if args.num_samples is not None and args.num_samples < max(args.k):
        p.error(f"--num_samples ({args.num_samples}) must be >= the largest --k ({max(args.k)})")
    if min(args.k) < 1:
        p.error("--k values must be >= 1")
    return args


def _task(dataset):
    return dataset.split(":", 1)[1] if dataset.startswith("builtin:") else None


def _slug(text):
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text.strip("/").split("/")[-1]) or "model"


def load_head(path: str, model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase, at: str,
              device: str) -> tuple[Callable[..., list[float]] | None, str | None]:
    """(score_fn, note): a head-scoring function, or None and why it was skipped."""
    from trl_alloc.evaluation import head_score_fn

    if model is None:
        return None, "head-weighted maj@k skipped: the head needs the policy's weights (--model) to score candidates."
    from trl_alloc.rollout.quality_head import QualityHead

    if not os.path.isdir(path):
        raise SystemExit(f"--head {path!r} is not a folder; give the quality_head/ folder a trl-alloc run saved "
                         "(next to its checkpoints and final model).")
    head = QualityHead.from_pretrained(path).float().eval()  # CPU float32, as in training
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if hidden is not None and head.hidden_size != hidden:
        raise SystemExit(f"the quality head at {path} reads hidden states of size {head.hidden_size}, but --model "
                         f"has hidden_size {hidden}; pass the policy the head was trained with.")
    return head_score_fn(head, model, tokenizer, at=at, device=device), None


def main(argv: Sequence[str] | None = None) -> EvalResult:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.tasks.data import load_prompt_dataset, reward_for_dataset
    from trl_alloc.evaluation import (TransformersBackend, VLLMServerBackend, answer_spec, answer_type, evaluate,
                                      markdown_table, write_outputs)

    task = _task(args.dataset)
    model_path = args.model
    if model_path == "tiny":
        if task is None:
            raise SystemExit("--model tiny is the embedded model of the built-in tasks; use --dataset builtin:...")
        from trl_alloc.tasks.tiny import get_tiny_model_dir

        model_path = get_tiny_model_dir(task=task)
    else:
        from trl_alloc.tasks.models import resolve_model

        model_path = resolve_model(model_path)  # e.g. smollm2-135m-instruct
    num_builtin = max(args.num_prompts, 1) if args.num_prompts > 0 else 2000
    dataset = load_prompt_dataset(args.dataset, args.split, config=args.dataset_config,
                                  prompt_column=args.prompt_column, answer_column=args.answer_column,
                                  num_builtin=num_builtin, seed=args.seed,
                                  levels=tuple(args.builtin_levels) if args.builtin_levels else None)
    if args.num_prompts > 0:
        dataset = dataset.select(range(min(len(dataset), args.num_prompts)))
    reward_name = args.reward if args.reward != "auto" else (task if task in ("arithmetic", "countdown") else "math")
    reward_fn = reward_for_dataset(args.dataset, reward_name)
    spec = answer_spec(answer_type(reward_name) if args.answer_type == "auto" else args.answer_type)
    max_new_tokens = args.max_new_tokens or TASK_DEFAULT_TOKENS.get(task, 1024)

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    need_model = args.vllm_server_url is None or args.head is not None
    model = None
    if need_model:
        dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    if args.vllm_server_url:
        backend = VLLMServerBackend.from_url(args.vllm_server_url, batch_size=max(args.batch_size, 256))
    else:
        backend = TransformersBackend(model, tokenizer, batch_size=args.batch_size, device=device)

    notes, score_fn = [], None
    if args.head is not None:
        score_fn, note = load_head(args.head, model, tokenizer, args.head_at, device)
        if note:
            notes.append(note)
            print(f"[eval] {note}", file=sys.stderr)

    info = {"model": args.model if args.model != "tiny" else f"tiny ({model_path})", "dataset": args.dataset,
            "split": args.split, "head": args.head if score_fn is not None else None,
            "head_at": args.head_at if score_fn is not None else None, "reward": reward_name,
            "top_p": args.top_p, "top_k": args.top_k}
    result = evaluate(backend, tokenizer, dataset, reward_fn, spec, ks=args.k, num_samples=args.num_samples,
                      temperature=args.temperature, max_new_tokens=max_new_tokens, seed=args.seed,
                      threshold=args.threshold, score_fn=score_fn, top_p=args.top_p, top_k=args.top_k,
                      progress=not args.no_progress, info=info)
    result.notes.extend(notes)
    table = markdown_table(result)
    output_dir = args.output_dir or os.path.join(
        "outputs", "eval", f"{_slug(args.model)}-{_slug(args.dataset)}-{args.split}")
    paths = write_outputs(result, output_dir, table)
    print(table)
    print(f"\n[eval] wrote {paths['table']}, {paths['json']}, {paths['samples']}")
    return result


if __name__ == "__main__":
    main()
