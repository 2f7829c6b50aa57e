"""The whole held-out evaluation: sample, score, extract answers, aggregate (``evaluate``), and write
the table and per-prompt samples (``write_outputs``)."""

from __future__ import annotations

import inspect
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..allocation.arrol import rank_weights
from ..allocation.success import SUCCESS_THRESHOLD, is_success
from ..allocation.allocator import json_default
from ..tasks.rewards import completion_text
from .backends import Samples, generate_samples, tokenize_prompts
from .metrics import AnswerSpec, compute_metrics, group_answers, vote

def score_texts(reward_fn, prompts: list, texts: list[list[str]], columns: dict[str, list]) -> np.ndarray:
    """(P, n) rewards: ``reward_fn(prompts, completions, **columns)`` over n texts per prompt at once (each prompt
    and column value repeated n times, as TRL passes them; a conversational prompt's texts as assistant messages)."""
    from trl.data_utils import is_conversational

    P = len(texts)
    n = len(texts[0]) if P else 0
    conversational = bool(prompts) and is_conversational({"prompt": prompts[0]})
    flat = [t for ts in texts for t in ts]
    completions = [[{"role": "assistant", "content": t}] for t in flat] if conversational else flat
    cols = {c: [v for v in vals for _ in range(n)] for c, vals in columns.items()}
    rewards = reward_fn([p for p in prompts for _ in range(n)], completions, **cols)
    r = np.array([np.nan if x is None else float(x) for x in rewards], dtype=float).reshape(P, n)
    return np.nan_to_num(r, nan=0.0)


def score_samples(reward_fn, dataset, samples: Samples) -> np.ndarray:
    """(P, n) rewards of ``samples`` on the first P rows of ``dataset`` (`score_texts`, with every dataset column)."""
    rows = dataset[:len(samples.texts)]
    return score_texts(reward_fn, list(rows["prompt"]), samples.texts,
                       {c: vals for c, vals in rows.items() if c != "prompt"})


def regrade(samples_path: str, reward_fn) -> float:
    """avg@k of a written ``samples.jsonl`` scored again by ``reward_fn`` on its stored prompts, ``answer`` and
    completions: a corrected verifier applied to an evaluation without sampling it again."""
    with open(samples_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise ValueError(f"{samples_path} holds no samples; nothing to regrade.")
    return float(score_texts(reward_fn, [r["prompt"] for r in rows], [r["completions"] for r in rows],
                             {"answer": [r.get("answer") for r in rows]}).mean())


def _call_score_fn(score_fn, prompts, completions, prompt_ids, completion_ids):
    try:
        params = inspect.signature(score_fn).parameters
    except (TypeError, ValueError):
        params = {}
    extra = {}
    accepts_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name, value in (("prompt_ids", prompt_ids), ("completion_ids", completion_ids)):
        if accepts_kw or name in params:
            extra[name] = value
    scores = score_fn(prompts, completions, **extra)
    scores = np.asarray([float(s) for s in scores], dtype=float)
    if scores.shape != (len(completions),):
        raise ValueError(f"score_fn must return one score per completion ({len(completions)}), got {scores.shape}.")
    if not np.isfinite(scores).all():
        raise ValueError("score_fn returned a non-finite score; rank weights need finite scores.")
    return scores


def head_score_fn(head, model, tokenizer, at: str = "detect", batch_size: int = 32, device=None):
    """A ``score_fn`` from a ``QualityHead``: its logit on the policy's last-layer hidden state at
    the last token of ``prompt + completion[:L]`` (``at="detect"``: L = the head's
    ``detect_length``, what it was trained on; the full completion when it has none) or of the
    whole ``prompt + completion`` (``at="final"``). Rank weights only use the order of the scores,
    so raw logits need no calibration."""
    if at not in ("detect", "final"):
        raise ValueError(f"`at` must be 'detect' or 'final', got {at!r}.")
    from ..rollout.quality_head import last_hidden_states

    length = getattr(head, "detect_length", None) if at == "detect" else None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def score(prompts, completions, prompt_ids=None, completion_ids=None):
        import torch

        if prompt_ids is None or completion_ids is None:  # re-tokenize: prompt as TRL does, completion plainly
            prompt_ids = tokenize_prompts(tokenizer, prompts)
            completion_ids = [tokenizer(completion_text(c), add_special_tokens=False)["input_ids"]
                              for c in completions]
        seqs = [list(p) + list(c if length is None else c[:length]) for p, c in zip(prompt_ids, completion_ids)]
        feats = last_hidden_states(model, seqs, pad_id, batch_size=batch_size, device=device)
        head.eval()
        with torch.no_grad():
            return head(feats).float().cpu().tolist()

    score.detect_length = length
    return score


# ---------------------------------------------------------------- the whole evaluation


@dataclass
class EvalResult:
    metrics: dict[int, dict[str, float]]
    info: dict[str, Any]
    per_prompt: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"metrics": {str(k): v for k, v in self.metrics.items()}, "info": self.info, "notes": self.notes}


def evaluate(backend, tokenizer, dataset, reward_fn, spec: AnswerSpec, ks=(1,), num_samples: int | None = None,
             temperature: float = 1.0, max_new_tokens: int = 16, seed: int = 0, threshold: float = SUCCESS_THRESHOLD,
             score_fn=None, top_p: float = 1.0, top_k: int = 0, progress: bool = True,
             info: dict | None = None) -> EvalResult:
    """Sample ``num_samples`` (default ``max(ks)``) completions per prompt of ``dataset``, score
    them with ``reward_fn``, extract answers with ``spec``, optionally score candidates with
    ``score_fn``, and compute avg@k / pass@k / maj@k / head-maj@k for every k in ``ks``."""
    ks = sorted({int(k) for k in ks})
    n = int(num_samples or max(ks))
    if ks[0] < 1 or ks[-1] > n:
        raise ValueError(f"every k must lie in [1, num_samples={n}], got {ks}.")
    if len(dataset) == 0:
        raise ValueError("the evaluation dataset is empty.")
    prompts = list(dataset["prompt"])
    samples = generate_samples(backend, tokenizer, prompts, n, max_new_tokens, temperature, seed, top_p, top_k,
                               progress)
    t0 = time.perf_counter()
    rewards = score_samples(reward_fn, dataset, samples)
    answers = [[spec.extract(t) for t in ts] for ts in samples.texts]
    groups = [group_answers(a, spec.equal) for a in answers]
    scoring_s = time.perf_counter() - t0
    scores, head_s = None, 0.0
    if score_fn is not None:
        t1 = time.perf_counter()
        flat_scores = _call_score_fn(
            score_fn, [p for p in prompts for _ in range(n)], [t for ts in samples.texts for t in ts],
            [p for p in samples.prompt_ids for _ in range(n)], [c for cs in samples.completion_ids for c in cs])
        scores = flat_scores.reshape(len(prompts), n)
        head_s = time.perf_counter() - t1
    metrics = compute_metrics(rewards, groups, ks, scores, threshold)

    lengths = [len(c) for cs in samples.completion_ids for c in cs]
    answered = [a is not None for row in answers for a in row]
    truncated = [r == "length" for row in samples.finish_reasons for r in row]
    golds = list(dataset["answer"]) if "answer" in dataset.column_names else [None] * len(prompts)
    per_prompt = []
    for p in range(len(prompts)):
        i = vote(groups[p])
        rec = {"prompt": prompts[p], "answer": golds[p], "completions": samples.texts[p],
               "rewards": rewards[p].tolist(),
               "answers": [None if a is None else spec.show(a) for a in answers[p]], "groups": groups[p],
               "finish_reasons": samples.finish_reasons[p],
               "num_correct": int(is_success(rewards[p], threshold).sum()),
               "majority_answer": None if i is None else spec.show(answers[p][i]),
               "majority_correct": bool(i is not None and is_success(rewards[p][i], threshold))}
        if scores is not None:
            j = vote(groups[p], rank_weights(scores[p]))
            rec["head_scores"] = scores[p].tolist()
            rec["head_majority_answer"] = None if j is None else spec.show(answers[p][j])
        per_prompt.append(rec)
    out_info = {
        **(info or {}), "num_prompts": len(prompts), "num_samples": n, "ks": ks, "temperature": temperature,
        "max_new_tokens": max_new_tokens, "seed": seed, "threshold": threshold, "answer_type": spec.name,
        "reward": getattr(reward_fn, "__name__", type(reward_fn).__name__),
        "backend": backend.name, "answer_rate": float(np.mean(answered)) if answered else 0.0,
        "mean_completion_tokens": float(np.mean(lengths)) if lengths else 0.0,
        "truncated_rate": float(np.mean(truncated)) if truncated else 0.0,
        "solved_any": int(sum(r["num_correct"] > 0 for r in per_prompt)),
        "generation_s": round(samples.seconds, 3), "scoring_s": round(scoring_s, 3), "head_s": round(head_s, 3),
        "head_weighted": scores is not None,
    }
    return EvalResult(metrics, out_info, per_prompt)


# ---------------------------------------------------------------- reporting

METRIC_NAMES = (("avg", "avg@k"), ("pass", "pass@k"), ("maj", "maj@k"), ("head_maj", "head-weighted maj@k"))


def markdown_table(result: EvalResult) -> str:
    """Metrics (rows) by k (columns), in percent, with a settings line and any notes."""
    ks = sorted(result.metrics)
    info = result.info
    lines = []
    desc = [f"{k}={info[k]}" for k in ("model", "dataset", "split", "backend") if info.get(k) is not None]
    desc += [f"prompts={info['num_prompts']}", f"n={info['num_samples']}", f"temperature={info['temperature']}",
             f"max_new_tokens={info['max_new_tokens']}", f"seed={info['seed']}"]
    lines.append("Evaluation: " + ", ".join(desc))
    lines.append("")
    lines.append("| metric | " + " | ".join(f"k={k}" for k in ks) + " |")
    lines.append("|---|" + "---|" * len(ks))
    for key, label in METRIC_NAMES:
        if all(key in result.metrics[k] for k in ks):
            lines.append(f"| {label} | " + " | ".join(f"{100 * result.metrics[k][key]:.2f}" for k in ks) + " |")
    lines.append("")
    lines.append(f"Answers extracted: {100 * info['answer_rate']:.1f}% of samples; mean completion "
                 f"{info['mean_completion_tokens']:.1f} tokens, {100 * info['truncated_rate']:.1f}% hit "
                 f"max_new_tokens; {info['solved_any']}/{info['num_prompts']} prompts solved at least once.")
    if info["num_samples"] > 1:
        lines.append(f"avg@k is the mean reward over all n={info['num_samples']} samples (its unbiased estimate "
                     f"for every k); pass@k is the unbiased estimator from n; maj@k averages the n // k disjoint "
                     f"blocks of k samples.")
    for note in result.notes:
        lines.append(f"Note: {note}")
    return "\n".join(lines)


def write_outputs(result: EvalResult, output_dir: str, table: str | None = None) -> dict[str, str]:
    """``eval_results.json`` (metrics, settings, notes), ``eval_table.md`` and ``samples.jsonl``
    (per prompt: completions, rewards, extracted answers, votes, head scores) in ``output_dir``."""
    os.makedirs(output_dir, exist_ok=True)
    table = table if table is not None else markdown_table(result)
    paths = {"json": os.path.join(output_dir, "eval_results.json"),
             "table": os.path.join(output_dir, "eval_table.md"),
             "samples": os.path.join(output_dir, "samples.jsonl")}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump({**result.to_json(), "table": table}, f, indent=1, default=json_default)
    with open(paths["table"], "w", encoding="utf-8") as f:
        f.write(table + "\n")
    with open(paths["samples"], "w", encoding="utf-8") as f:
        for rec in result.per_prompt:
            f.write(json.dumps(rec, default=json_default) + "\n")
    return paths

