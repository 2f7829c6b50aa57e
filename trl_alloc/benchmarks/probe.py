"""A probe pass: `k` responses of the base model on each prompt of a seeded sample of the user's pool, scored by the
reward a run would use. It is where a plan on the user's own data starts (`scripts/plan.py --model M --dataset D`):
the pool's success rates, the share of prompts no group can teach (all-fail or all-pass at k), and the response
lengths; its counts are the `probe_counts.json` CERO starts from (`--probe_counts`, arXiv 2610.09679 eq. 5)."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..allocation.success import SUCCESS_THRESHOLD, is_success

if TYPE_CHECKING:
    from datasets import Dataset

    from ..evaluation import TransformersBackend, VLLMEngineBackend


def probe_model_dir(model: str, dataset: str) -> str:
    """A folder for `model`: `tiny` is the embedded model of a built-in task, a registered name its cached folder."""
    if model == "tiny":
        if not dataset.startswith("builtin:"):
            raise ValueError("--model tiny is the embedded model of the built-in tasks; use --dataset builtin:... "
                             "or give your model.")
        from ..tasks.tiny import get_tiny_model_dir

        return get_tiny_model_dir(task=dataset.split(":", 1)[1])
    from ..tasks.models import resolve_model

    return resolve_model(model)


def sample_pool(dataset: str, num_prompts: int, seed: int = 0, levels: list[int] | None = None,
                **load: Any) -> Dataset:
    """A seeded sample of `num_prompts` prompts of the dataset's train split (all of them if it has fewer)."""
    from ..tasks.data import load_prompt_dataset

    ds = load_prompt_dataset(dataset, "train", num_builtin=num_prompts, seed=seed, levels=levels, **load)
    if len(ds) > num_prompts:
        ds = ds.select(sorted(np.random.default_rng(seed).choice(len(ds), num_prompts, replace=False).tolist()))
    return ds


def probe_backend(kind: str, model_dir: str, tokenizer: Any, seed: int = 0,
                  gpu_memory_utilization: float = 0.3) -> TransformersBackend | VLLMEngineBackend:
    """The engine the probe samples from: a vLLM engine in this process in float32 on a CPU (the trainer's dtype;
    the checkpoint's on a GPU) or transformers' `generate`; `auto` takes vLLM where it is installed."""
    import importlib.util

    from ..evaluation import TransformersBackend, VLLMEngineBackend

    if kind == "auto":
        kind = "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"
    if kind == "vllm":
        import torch
        from vllm import LLM

        from ..serving.cpu_features import enable_amx

        cpu = not torch.cuda.is_available()
        enable_amx()
        llm = LLM(model=model_dir, dtype="float32" if cpu else "auto", gpu_memory_utilization=gpu_memory_utilization,
                  enforce_eager=cpu, enable_chunked_prefill=False if cpu else None, seed=seed)
        return VLLMEngineBackend(llm)
    if kind == "transformers":
        from transformers import AutoModelForCausalLM

        return TransformersBackend(AutoModelForCausalLM.from_pretrained(model_dir).eval(), tokenizer)
    raise ValueError(f"unknown probe backend {kind!r}; choose auto, vllm or transformers.")


def probe_pool(model: str, dataset: str, k: int = 8, num_prompts: int = 64, max_tokens: int = 256,
               temperature: float = 1.0, seed: int = 0, backend: str = "auto", reward: str = "auto",
               levels: list[int] | None = None, progress: bool = True, pool: Dataset | None = None) -> dict[str, Any]:
    """`k` responses to each of `num_prompts` sampled prompts (or to each row of `pool`, a prompt dataset already
    chosen), scored: per prompt its successes and failures (a response no reward could score is neither), with the
    probe's own cost (responses, tokens, seconds)."""
    from transformers import AutoTokenizer

    from ..evaluation import generate_samples, score_samples
    from ..tasks.data import reward_for_dataset

    model_dir = probe_model_dir(model, dataset)
    ds = sample_pool(dataset, num_prompts, seed=seed, levels=levels) if pool is None else pool
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = probe_backend(backend, model_dir, tokenizer, seed=seed)
    t0 = time.perf_counter()
    samples = generate_samples(engine, tokenizer, list(ds["prompt"]), k, max_tokens, temperature, seed=seed,
                               progress=progress)
    seconds = time.perf_counter() - t0
    rewards = np.asarray(score_samples(reward_for_dataset(dataset, reward), ds, samples), float)
    scored = ~np.isnan(rewards)
    wins = (is_success(np.nan_to_num(rewards, nan=-np.inf), SUCCESS_THRESHOLD) & scored).sum(1)
    lengths = [len(c) for cs in samples.completion_ids for c in cs]
    return {"model": model, "dataset": dataset, "backend": getattr(engine, "name", backend), "k": int(k),
            "max_tokens": int(max_tokens), "temperature": float(temperature), "seed": int(seed),
            "prompts": list(ds["prompt"]), "successes": wins.tolist(), "failures": (scored.sum(1) - wins).tolist(),
            "responses": int(rewards.size), "tokens": int(sum(lengths)), "seconds": float(seconds),
            "length_median": float(np.median(lengths)) if lengths else 0.0,
            "truncated_share": float(np.mean([len(c) >= max_tokens for cs in samples.completion_ids for c in cs]))}


def write_probe_counts(probe: dict[str, Any], path: str) -> str:
    """The probe as `probe_counts.json` (prompts, successes, failures), the file `--probe_counts` reads."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(probe, f)
    return path


def pool_rates(successes: Any, failures: Any) -> np.ndarray:
    """Each prompt's success rate in the probe (NaN for a prompt with no scored response)."""
    s, f = np.asarray(successes, float), np.asarray(failures, float)
    return np.divide(s, s + f, out=np.full(s.shape, np.nan), where=(s + f) > 0)


def pool_summary(successes: Any, failures: Any) -> dict[str, Any]:
    """What the probe says of the pool: the success rates' quantiles and histogram, and the share of prompts whose
    k responses all failed or all succeeded (a group of them would have taught nothing)."""
    s, f = np.asarray(successes, int), np.asarray(failures, int)
    rates = pool_rates(s, f)
    known = ~np.isnan(rates)
    edges = np.linspace(0, 1, 11)
    return {"prompts": int(s.size), "scored_prompts": int(known.sum()),
            "mean_rate": float(np.nanmean(rates)) if known.any() else float("nan"),
            "all_fail": float(np.mean((s == 0) & (f > 0))), "all_pass": float(np.mean((f == 0) & (s > 0))),
            "mixed": float(np.mean((s > 0) & (f > 0))),
            "quantiles": {q: float(np.nanquantile(rates, q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)} if known.any()
            else {}, "histogram": np.histogram(rates[known], edges)[0].tolist(), "edges": edges.tolist()}


__all__ = ["pool_rates", "pool_summary", "probe_model_dir", "probe_pool", "sample_pool", "write_probe_counts"]
