"""Reward functions in TRL's signature ``fn(prompts, completions, **kwargs) -> list[float]``.

``kwargs`` carry the dataset columns (``answer``; ``numbers``/``target`` for Countdown).
Completions may be plain strings (standard format) or message lists (conversational format).
Every function returns one float per completion, 1.0 for correct and 0.0 otherwise; a
malformed sample scores 0.0 rather than raising.
"""

from __future__ import annotations

import logging
import re
import threading

from .builtin import check_countdown, parse_countdown_prompt

_INT_RE = re.compile(r"-?\d+")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
# after an extracted answer: more of the same arithmetic on its line ("70 x 8"), then "= result"
_EQUATION_TAIL_RE = re.compile(r"(?:[ \t+\-*/×xX·÷()^,]|\d|\.(?=\d))*\s*=([^\n]*)")


def completion_text(completion) -> str:
    """The text of one completion: a string, or the last message's content of a message list."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)) and completion:
        return completion_text(completion[-1])
    return ""


def _column(kwargs: dict, name: str, n: int) -> list:
    col = kwargs.get(name)
    if col is None:
        return [None] * n
    if len(col) != n:
        raise ValueError(f"column {name!r} has {len(col)} values for {n} completions")
    return list(col)


def extract_int(text: str) -> int | None:
    """The first integer in ``text`` (the completion's first answer token sequence), or None."""
    m = _INT_RE.search(text)
    return int(m.group()) if m else None


def arithmetic_reward(prompts, completions, answer=None, **kwargs) -> list[float]:
    """1.0 iff the first integer of the completion equals the integer ``answer``."""
    golds = _column({"answer": answer}, "answer", len(completions))
    out = []
    for c, gold in zip(completions, golds):
        pred = extract_int(completion_text(c))
        try:
            out.append(float(pred is not None and gold is not None and pred == int(str(gold).strip())))
        except ValueError:
            out.append(0.0)
    return out


def extract_countdown_expression(text: str) -> str:
    """The candidate expression: inside ``<answer>...</answer>`` if present, else the first
    non-empty line; a trailing ``= value`` is dropped."""
    m = _ANSWER_TAG_RE.search(text)
    if m:
        text = m.group(1)
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    return line.split("=")[0].strip()


def countdown_reward(prompts, completions, numbers=None, target=None, **kwargs) -> list[float]:
    """1.0 iff the completion's expression uses each number at most once and hits the target.

    ``numbers``/``target`` come from the dataset columns; without them they are parsed from the
    prompt. The expression is checked on its ``ast`` (numbers and + - * / only), never ``eval``-ed.
    """
    n = len(completions)
    nums_col = _column({"numbers": numbers}, "numbers", n)
    tgt_col = _column({"target": target}, "target", n)
    prompts = list(prompts) if prompts is not None else [None] * n
    out = []
    for c, p, nums, tgt in zip(completions, prompts, nums_col, tgt_col):
        if nums is None or tgt is None:
            parsed = parse_countdown_prompt(completion_text(p)) if p is not None else None
            if parsed is None:
                out.append(0.0)
                continue
            nums, tgt = parsed
        expr = extract_countdown_expression(completion_text(c))
        out.append(float(check_countdown(expr, list(nums), int(tgt))))
    return out


def _wrap_gold(gold: str) -> str:
    gold = str(gold).strip()
    if "$" in gold or "\\boxed" in gold or "\\(" in gold or "\\[" in gold:
        return gold
    return f"${gold}$"


def math_verify_timeout():
    """math-verify's timeout in seconds: 5 on the main thread, None elsewhere (its `signal.alarm` works only
    on the main thread, as in TRL's accuracy_reward; its timeout warnings are silenced there)."""
    if threading.current_thread() is threading.main_thread():
        return 5
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return None


def stated_answer(text: str, timeout: float | None = None) -> list:
    """math-verify's parse of the answer ``text`` states, an equation graded on its last right-hand side.

    math-verify grades a LaTeX equation (``$69 + 50 = 120$``) on its right-hand side, but its plain-text
    extraction stops at ``=`` (or at ``x``): "The final answer is 69 + 50 = 120." parses as ``69 + 50`` and would
    earn the reward for a wrong result. Where the extracted text goes on with arithmetic and ``=``, the value after
    the line's last ``=`` is parsed instead (nothing there, as in an answer cut at the token cap, states no answer).
    """
    from math_verify import parse

    pred = parse(text, parsing_timeout=timeout)
    if len(pred) < 2 or not isinstance(pred[1], str) or "\n" in pred[1]:
        return pred
    matched = pred[1].rstrip(". ")
    places = list(re.finditer(rf"(?<![\w.]){re.escape(matched)}(?!\d)", text)) if matched else []
    tail = _EQUATION_TAIL_RE.match(text, places[-1].end()) if places else None
    if tail is None:
        return pred
    right = tail.group(1).split("=")[-1].strip()
    return parse(right, parsing_timeout=timeout) if right else []


def math_reward(prompts, completions, answer=None, **kwargs) -> list[float]:
    """1.0 iff ``math_verify.verify`` finds the completion's `stated_answer` equal to the gold ``answer``.

    The gold is wrapped in ``$...$`` unless it already carries LaTeX delimiters or ``\\boxed``.
    Timeouts (``signal.alarm``) are only used on the main thread, as in TRL's accuracy_reward.
    """
    return _math_scores(completions, answer, numbers_only=False)


def math_number_reward(prompts, completions, answer=None, **kwargs) -> list[float]:
    """`math_reward` for answers that must be numbers: an answer stated as an expression ("so Dara has 90 - 4
    stickers left.") leaves the arithmetic to the verifier, which `math_reward` pays (math-verify evaluates
    ``90 - 4``, as TRL's accuracy_reward does); here it scores 0. A fraction or a decimal is a number."""
    return _math_scores(completions, answer, numbers_only=True)


def _math_scores(completions, answer, numbers_only: bool) -> list[float]:
    from math_verify import parse, verify

    timeout = math_verify_timeout()
    golds = _column({"answer": answer}, "answer", len(completions))
    out = []
    for c, gold in zip(completions, golds):
        try:
            gold_parsed = parse(_wrap_gold(gold), parsing_timeout=timeout) if gold is not None else []
            if not gold_parsed:
                out.append(0.0)
                continue
            pred = stated_answer(completion_text(c), timeout)
            if numbers_only and not (pred and getattr(pred[0], "is_Number", False)):
                out.append(0.0)
                continue
            out.append(float(bool(pred) and verify(gold_parsed, pred, timeout_seconds=timeout)))
        except Exception:  # noqa: BLE001 - a bad sample scores 0, never crashes a training step
            out.append(0.0)
    return out


# TRL logs each reward under `fn.__name__` (rewards/<name>/mean)
arithmetic_reward.__name__ = "arithmetic_reward"
countdown_reward.__name__ = "countdown_reward"
math_reward.__name__ = "math_reward"
math_number_reward.__name__ = "math_number_reward"

# trl-alloc's correctness verifiers: the default success signal of the trainers (`success_reward_funcs`)
VERIFIERS = {f.__name__: f for f in (arithmetic_reward, countdown_reward, math_reward, math_number_reward)}
for _verifier in VERIFIERS.values():
    _verifier.trl_alloc_verifier = True

# by `--reward` name; an answer type's own verifier is the reward of the same name
REWARDS = {"arithmetic": arithmetic_reward, "countdown": countdown_reward, "math": math_reward,
           "math_number": math_number_reward}


def reward_for_task(task: str):
    """The reward function named ``task`` (``arithmetic``, ``countdown``, ``math`` or ``math_number``)."""
    try:
        return REWARDS[task]
    except KeyError:
        raise ValueError(f"no reward for task {task!r}; expected one of {sorted(REWARDS)}") from None
