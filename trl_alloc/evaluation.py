"""Held-out evaluation: avg@k, pass@k, maj@k and quality-head-weighted maj@k.

For every prompt, ``n`` completions are sampled (transformers ``generate`` or a vLLM server) and
scored with the task's reward. With ``c`` of the ``n`` samples correct (reward >= ``threshold``):

* **avg@k** -- expected mean reward of k samples. Its unbiased estimate does not depend on k: the
  mean reward over all n samples.
* **pass@k** -- probability that at least one of k samples is correct, by the unbiased estimator
  ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021), computed as a stable product.
* **maj@k** -- the final answers of k samples are extracted and grouped (equal answers form one
  group), the group with the most votes wins, and the prompt counts as solved when the winning
  group is correct. Ties go to the larger plain count, then to the answer seen first
  (``arrol.weighted_majority_vote``). Samples without an extractable answer do not vote; a block
  in which nobody votes scores 0. With n > k the n samples are cut into ``n // k`` disjoint
  blocks of k (in sampling order) and the blocks' outcomes are averaged (leftover samples are not
  used by maj@k).
* **head-maj@k** -- the same vote, each candidate weighted by ``arrol.rank_weights`` of its
  quality-head score within its block (the best-scored candidate weighs 1, the worst 0).

Answer extraction (``AnswerSpec``): arithmetic -- the first integer (``rewards.extract_int``);
countdown -- the expression (``rewards.extract_countdown_expression``, spaces removed); math --
``math_verify.parse``, grouped by ``math_verify.verify`` against each group's first member. A
winning group is correct when its first member (in the block) is correct.

``score_fn(prompts, completions, **kwargs) -> scores`` plugs in any per-candidate scorer; when it
accepts them, kwargs carry ``prompt_ids`` and ``completion_ids`` (token ids). ``head_score_fn``
builds one from a saved ``trl_alloc.quality_head.QualityHead``.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .allocation.arrol import rank_weights, weighted_majority_vote
from .allocation.base import SUCCESS_THRESHOLD, is_success
from .rewards import completion_text, extract_countdown_expression, extract_int

__all__ = [
    "AnswerSpec", "answer_spec", "pass_at_k", "group_answers", "vote", "maj_at_k", "compute_metrics",
    "Samples", "TransformersBackend", "VLLMServerBackend", "generate_samples", "score_samples", "evaluate",
    "EvalResult", "markdown_table", "write_outputs", "head_score_fn", "quality_head_available",
]

# ---------------------------------------------------------------- metric math (pure)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: ``1 - C(n-c, k)/C(n, k)``.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (no large binomials). Requires ``1 <= k <= n``.
    """
    n, c, k = int(n), int(c), int(k)
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}; sample at least k completions per prompt.")
    if not 0 <= c <= n:
        raise ValueError(f"the number of correct samples c={c} must lie in [0, n={n}].")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def group_answers(answers, equal: Callable[[Any, Any], bool] | None = None) -> list[int | None]:
    """Group ids of ``answers`` (None = no answer -> None): equal answers get the same id, ids in
    order of first appearance. ``equal=None`` groups by ``==`` on hashable keys; otherwise each
    answer joins the first group whose first member it is ``equal`` to."""
    ids: list[int | None] = []
    if equal is None:
        seen: dict = {}
        for a in answers:
            if a is None:
                ids.append(None)
            else:
                ids.append(seen.setdefault(a, len(seen)))
        return ids
    reps: list = []
    for a in answers:
        if a is None:
            ids.append(None)
            continue
        for g, rep in enumerate(reps):
            try:
                same = bool(equal(rep, a))
            except Exception:  # noqa: BLE001 - an unparseable comparison is "different"
                same = False
            if same:
                ids.append(g)
                break
        else:
            ids.append(len(reps))
            reps.append(a)
    return ids


def vote(groups, weights=None) -> int | None:
    """Index (into ``groups``) of the first member of the winning group, or None when nobody votes.

    ``groups``: group id per candidate (None = no answer); ``weights``: per-candidate vote weights
    (None = one vote each). Ties: larger plain count, then earlier first appearance.
    """
    groups = list(groups)
    winner = weighted_majority_vote(groups, weights)
    return None if winner is None else groups.index(winner)


def maj_at_k(correct, groups, k: int, scores=None) -> float:
    """One prompt's maj@k (or head-weighted maj@k when ``scores`` is given), averaged over the
    ``len(groups) // k`` disjoint blocks of ``k`` samples in order.

    ``correct``: bool per sample; ``groups``: group id per sample (None = no answer); ``scores``:
    per-sample head scores (rank-weighted within each block).
    """
    n, k = len(groups), int(k)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n, got k={k}, n={n}.")
    if len(correct) != n or (scores is not None and len(scores) != n):
        raise ValueError("`correct`, `groups` and `scores` must have one entry per sample.")
    outcomes = []
    for b in range(n // k):
        sl = slice(b * k, (b + 1) * k)
        block = list(groups[sl])
        w = None if scores is None else rank_weights(np.asarray(scores[sl], dtype=float))
        i = vote(block, w)
        outcomes.append(0.0 if i is None else float(bool(correct[sl][i])))
    return float(np.mean(outcomes))


def compute_metrics(rewards, groups, ks, scores=None, threshold: float = SUCCESS_THRESHOLD) -> dict[int, dict[str, float]]:
    """Dataset-level metrics per k: ``{k: {"avg": ..., "pass": ..., "maj": ..., ["head_maj": ...]}}``.

    ``rewards``: (P, n) rewards; ``groups``: P lists of n group ids; ``scores``: optional (P, n)
    head scores. A sample is correct when its reward >= ``threshold``.
    """
    r = np.asarray(rewards, dtype=float)
    if r.ndim != 2 or r.shape[0] == 0:
        raise ValueError(f"`rewards` must be a non-empty (num_prompts, n) array, got shape {r.shape}.")
    P, n = r.shape
    correct = is_success(r, threshold)
    out = {}
    for k in sorted({int(k) for k in ks}):
        if not 1 <= k <= n:
            raise ValueError(f"k={k} needs at least k samples per prompt (n={n}); raise --num_samples or lower --k.")
        row = {
            "avg": float(np.nanmean(r)),
            "pass": float(np.mean([pass_at_k(n, int(c), k) for c in correct.sum(axis=1)])),
            "maj": float(np.mean([maj_at_k(correct[p], groups[p], k) for p in range(P)])),
        }
        if scores is not None:
            s = np.asarray(scores, dtype=float)
            row["head_maj"] = float(np.mean([maj_at_k(correct[p], groups[p], k, s[p]) for p in range(P)]))
        out[k] = row
    return out


# ---------------------------------------------------------------- answer extraction


@dataclass
class AnswerSpec:
    """How to read a final answer from a completion, and when two answers are the same."""

    name: str
    extract: Callable[[Any], Any]  # completion -> answer (None = no answer)
    equal: Callable[[Any, Any], bool] | None = None  # None: hashable answers compared with ==
    show: Callable[[Any], str] = str  # answer -> JSON-able text


def _countdown_answer(completion):
    expr = extract_countdown_expression(completion_text(completion)).replace(" ", "")
    return expr or None


def _math_timeout():
    main = threading.current_thread() is threading.main_thread()
    if not main:
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)
    return 5 if main else None


def _math_answer(completion):
    from math_verify import parse

    try:
        parsed = parse(completion_text(completion), parsing_timeout=_math_timeout())
    except Exception:  # noqa: BLE001
        return None
    return parsed or None


def _math_equal(a, b):
    from math_verify import verify

    return verify(a, b, timeout_seconds=_math_timeout())


def _math_show(parsed):
    return str(parsed[-1]) if isinstance(parsed, (list, tuple)) and parsed else str(parsed)


def answer_spec(task: str) -> AnswerSpec:
    """The ``AnswerSpec`` of ``arithmetic``, ``countdown`` or ``math``."""
    if task == "arithmetic":
        return AnswerSpec("arithmetic", lambda c: extract_int(completion_text(c)))
    if task == "countdown":
        return AnswerSpec("countdown", _countdown_answer)
    if task == "math":
        return AnswerSpec("math", _math_answer, _math_equal, _math_show)
    raise ValueError(f"no answer extraction for task {task!r}; expected arithmetic, countdown or math.")


# ---------------------------------------------------------------- generation backends


@dataclass
class Samples:
    """``n`` completions per prompt (prompt-major lists of lists)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[list[int]]]
    texts: list[list[str]]
    finish_reasons: list[list[str]]
    seconds: float = 0.0


def tokenize_prompts(tokenizer, prompts) -> list[list[int]]:
    """Token ids of each prompt as TRL's GRPOTrainer makes them: the chat template (with the
    generation prompt) for message lists, the tokenizer's defaults for plain strings."""
    from trl.data_utils import is_conversational

    prompts = list(prompts)
    if prompts and is_conversational({"prompt": prompts[0]}):
        out = tokenizer.apply_chat_template(conversation=prompts, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)
        return [list(map(int, x)) for x in out["input_ids"]]
    return [list(map(int, x)) for x in tokenizer(text=prompts)["input_ids"]]


def _cut_at_eos(ids, eos_ids, pad_id):
    """Completion ids up to and including the first EOS (trailing padding dropped), and the finish reason."""
    for j, t in enumerate(ids):
        if t in eos_ids:
            return ids[:j + 1], "stop"
    while ids and pad_id is not None and ids[-1] == pad_id and pad_id not in eos_ids:
        ids = ids[:-1]
    return ids, "length"


def _eos_ids(model, tokenizer) -> set[int]:
    eos = set()
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if src is None:
            continue
        eos.update(src if isinstance(src, (list, tuple)) else [src])
    return {int(e) for e in eos}


class TransformersBackend:
    """Sampling with ``model.generate`` (left padding, ``num_return_sequences=n``), batched by rows."""

    name = "transformers"

    def __init__(self, model, tokenizer, batch_size: int = 64, device=None):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = max(1, int(batch_size))
        self.device = device or next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = _eos_ids(model, tokenizer)

    def prompts_per_call(self, n: int) -> int:
        return max(1, self.batch_size // max(1, n))

    def generate(self, prompt_ids, n: int, max_new_tokens: int, temperature: float, seed: int | None = None,
                 top_p: float = 1.0, top_k: int = 0):
        """(completion ids per prompt (n lists each), finish reasons per prompt) for one call."""
        import torch

        width = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompt_ids):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        greedy = temperature is None or temperature <= 0
        n_gen = 1 if greedy else n  # greedy: one decode per prompt, replicated n times (as the vLLM client does)
        kw = dict(max_new_tokens=int(max_new_tokens), num_return_sequences=n_gen, pad_token_id=self.pad_id,
                  eos_token_id=sorted(self.eos_ids) or None)
        if greedy:
            kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        else:
            kw.update(do_sample=True, temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
        if seed is not None:
            torch.manual_seed(int(seed))
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kw)
        comp = out[:, width:].tolist()
        if n_gen != n:
            comp = [row for row in comp for _ in range(n)]
        ids_out, reasons = [], []
        for i in range(len(prompt_ids)):
            cs, rs = [], []
            for row in comp[i * n:(i + 1) * n]:
                c, reason = _cut_at_eos(row, self.eos_ids, self.pad_id)
                cs.append(c)
                rs.append(reason)
            ids_out.append(cs)
            reasons.append(rs)
        return ids_out, reasons


class VLLMServerBackend:
    """Sampling from a running trl-alloc vLLM server through ``AllocVLLMClient.generate_groups``."""

    name = "vllm_server"

    def __init__(self, client, batch_size: int = 256):
        self.client = client
        self.batch_size = max(1, int(batch_size))

    @classmethod
    def from_url(cls, url: str, batch_size: int = 256, connection_timeout: float = 30.0):
        from .serving.client import AllocVLLMClient

        return cls(AllocVLLMClient(base_url=url, connection_timeout=connection_timeout), batch_size=batch_size)

    def prompts_per_call(self, n: int) -> int:
        return max(1, self.batch_size // max(1, n))

    def generate(self, prompt_ids, n: int, max_new_tokens: int, temperature: float, seed: int | None = None,
                 top_p: float = 1.0, top_k: int = 0):
        groups = self.client.generate_groups(prompt_ids, n=n, max_tokens=int(max_new_tokens),
                                             temperature=float(temperature if temperature is not None else 0.0),
                                             seed=seed, top_p=top_p, top_k=top_k)
        return ([[list(map(int, c)) for c in g.completion_ids] for g in groups],
                [[r or "stop" for r in g.finish_reasons] for g in groups])


def generate_samples(backend, tokenizer, prompts, n: int, max_new_tokens: int, temperature: float = 1.0,
                     seed: int = 0, top_p: float = 1.0, top_k: int = 0, progress: bool = True) -> Samples:
    """``n`` completions of every prompt, batched by ``backend.prompts_per_call(n)`` with a tqdm bar.

    Seeds: call ``b`` uses ``seed + first prompt index × n`` (so the vLLM server's per-prompt seeds
    never repeat across calls; transformers reseeds torch per call)."""
    from tqdm.auto import tqdm

    prompt_ids = tokenize_prompts(tokenizer, prompts)
    per = backend.prompts_per_call(n)
    comp, reasons = [], []
    t0 = time.perf_counter()
    starts = range(0, len(prompt_ids), per)
    for start in tqdm(starts, total=len(starts), desc=f"generate ({backend.name}, n={n})", unit="batch",
                      disable=not progress):
        chunk = prompt_ids[start:start + per]
        c, r = backend.generate(chunk, n, max_new_tokens, temperature,
                                seed=None if seed is None else int(seed) + start * n, top_p=top_p, top_k=top_k)
        comp += c
        reasons += r
    seconds = time.perf_counter() - t0
    texts = [tokenizer.batch_decode(cs, skip_special_tokens=True) for cs in comp]
    return Samples(prompt_ids, comp, texts, reasons, seconds)


def score_samples(reward_fn, dataset, samples: Samples) -> np.ndarray:
    """(P, n) rewards: ``reward_fn(prompts, completions, **columns)`` over all samples at once (each
    dataset column repeated n times, as TRL passes them)."""
    from trl.data_utils import is_conversational

    P = len(samples.texts)
    n = len(samples.texts[0]) if P else 0
    rows = dataset[:P]
    prompts = list(rows["prompt"])
    conversational = bool(prompts) and is_conversational({"prompt": prompts[0]})
    flat_prompts = [p for p in prompts for _ in range(n)]
    flat = [t for ts in samples.texts for t in ts]
    completions = [[{"role": "assistant", "content": t}] for t in flat] if conversational else flat
    cols = {c: [v for v in vals for _ in range(n)] for c, vals in rows.items() if c != "prompt"}
    rewards = reward_fn(flat_prompts, completions, **cols)
    r = np.array([np.nan if x is None else float(x) for x in rewards], dtype=float).reshape(P, n)
    return np.nan_to_num(r, nan=0.0)


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
    from .quality_head import last_hidden_states

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


def quality_head_available() -> bool:
    """Whether ``trl_alloc.quality_head`` can be imported (it provides ``QualityHead``)."""
    import importlib.util

    try:
        return importlib.util.find_spec("trl_alloc.quality_head") is not None
    except (ImportError, ValueError):
        return False


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
               "finish_reasons": samples.finish_reasons[p], "num_correct": int(is_success(rewards[p], threshold).sum()),
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
        json.dump({**result.to_json(), "table": table}, f, indent=1, default=_json_default)
    with open(paths["table"], "w", encoding="utf-8") as f:
        f.write(table + "\n")
    with open(paths["samples"], "w", encoding="utf-8") as f:
        for rec in result.per_prompt:
            f.write(json.dumps(rec, default=_json_default) + "\n")
    return paths


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return None if math.isnan(obj) else float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)
