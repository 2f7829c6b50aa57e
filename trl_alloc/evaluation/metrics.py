"""The metric math of held-out evaluation (pure): avg@k, pass@k (Chen et al., 2021), maj@k and
head-weighted maj@k over answer groups, and how a task's final answer is read (``AnswerSpec``).
See ``trl_alloc.evaluation`` for the definitions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..allocation.arrol import rank_weights, weighted_majority_vote
from ..allocation.success import SUCCESS_THRESHOLD, is_success
from ..tasks.rewards import (completion_text, extract_countdown_expression, extract_int, math_verify_timeout,
                             stated_answer)

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


def compute_metrics(rewards, groups, ks, scores=None,
                    threshold: float = SUCCESS_THRESHOLD) -> dict[int, dict[str, float]]:
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


def _math_answer(completion):
    try:
        parsed = stated_answer(completion_text(completion), math_verify_timeout())
    except Exception:  # noqa: BLE001
        return None
    return parsed or None


def _math_equal(a, b):
    from math_verify import verify

    return verify(a, b, timeout_seconds=math_verify_timeout())


def _math_show(parsed):
    return str(parsed[-1]) if isinstance(parsed, (list, tuple)) and parsed else str(parsed)


ANSWER_TYPES = ("arithmetic", "countdown", "math")


def answer_type(reward: str) -> str:
    """The answer type of a reward (its `--reward` name or function name): ``arithmetic`` and ``countdown`` their
    own; any other (``math``, ``math_number``) ``math``."""
    name = reward.removesuffix("_reward")
    return name if name in ANSWER_TYPES else "math"


def answer_spec(task: str) -> AnswerSpec:
    """The ``AnswerSpec`` of ``arithmetic``, ``countdown`` or ``math``."""
    if task == "arithmetic":
        return AnswerSpec("arithmetic", lambda c: extract_int(completion_text(c)))
    if task == "countdown":
        return AnswerSpec("countdown", _countdown_answer)
    if task == "math":
        return AnswerSpec("math", _math_answer, _math_equal, _math_show)
    raise ValueError(f"no answer extraction for task {task!r}; expected arithmetic, countdown or math.")
