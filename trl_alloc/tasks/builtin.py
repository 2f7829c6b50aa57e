"""Synthetic verifiable tasks, built locally and deterministically from a seed.

Two tasks for the tiny model in TRL's standard (non-conversational) format: a plain-string
``prompt`` and a string ``answer`` column, plus a ``difficulty`` column (and ``numbers``/``target``
for Countdown, which the Countdown reward reads from the reward-function kwargs). A third,
``arithmetic-chat`` (``word_problems.py``), is for real instruct models: conversational prompts,
answers in ``\\boxed{}``.

* ``arithmetic``: ``"12+7="`` -> ``"19"``; +, - (non-negative results) and * over 1-3 digit
  numbers, difficulty 1 (one-digit sums) to 5 (three-digit sums and differences, two-digit
  products); see ``ARITH_LEVEL_OPS``.
* ``countdown``: ``"use 3 5 7 to make 22:"`` -> ``"3*5+7"``; any expression that uses each
  number at most once, with + - * / and parentheses, and evaluates exactly to the target.

Train and test are disjoint for every ``n`` and ``seed``: a prompt's split is fixed by a hash of
its text, so a problem can only ever appear in one split.
"""

from __future__ import annotations

import hashlib
import random
import re
from fractions import Fraction

from .word_problems import LEVELS as WORD_PROBLEM_LEVELS
from .word_problems import chat_prompt, word_problem

TASKS = ("arithmetic", "countdown", "arithmetic-chat")
TEST_FRACTION = 0.2
# difficulty -> (operator, digits of a, digits of b) choices, each equally likely
ARITH_LEVEL_OPS = {
    1: [("+", 1, 1)],
    2: [("-", 1, 1)],
    3: [("*", 1, 1), ("+", 2, 1)],
    4: [("-", 2, 1), ("+", 2, 2), ("-", 2, 2), ("*", 2, 1)],
    5: [("+", 3, 2), ("+", 3, 3), ("-", 3, 3), ("*", 2, 2)],
}
ARITH_LEVELS = tuple(ARITH_LEVEL_OPS)
COUNTDOWN_LEVELS = (1, 2, 3)  # 2..4 numbers
CHAT_LEVELS = tuple(WORD_PROBLEM_LEVELS)
COUNTDOWN_PROMPT_RE = re.compile(r"use ([\d ]+) to make (\d+):")


def split_of(task: str, prompt: str) -> str:
    """``"test"`` for a fixed ~20% of all possible prompts (by hash), else ``"train"``."""
    h = int.from_bytes(hashlib.sha256(f"{task}\x00{prompt}".encode()).digest()[:8], "big")
    return "test" if h / 2**64 < TEST_FRACTION else "train"


# ---------------------------------------------------------------- arithmetic
def _rand(rng: random.Random, digits: int) -> int:
    """A number with exactly ``digits`` digits (one-digit numbers include 0)."""
    return rng.randint(0, 9) if digits == 1 else rng.randint(10 ** (digits - 1), 10**digits - 1)


def arithmetic_problem(rng: random.Random, difficulty: int) -> tuple[str, str]:
    """One ``(prompt, answer)`` pair at ``difficulty`` 1..5."""
    op, da, db = rng.choice(ARITH_LEVEL_OPS[difficulty])
    a, b = _rand(rng, da), _rand(rng, db)
    if op == "-" and a < b:
        a, b = b, a
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a}{op}{b}=", str(value)


# ---------------------------------------------------------------- countdown
def _paren(expr: str) -> str:
    return expr if expr.isdigit() else f"({expr})"


def countdown_problem(rng: random.Random, difficulty: int) -> tuple[str, str, list[int], int]:
    """One Countdown problem with ``difficulty + 1`` numbers (so 2..4) in 1..12.

    The target is the value of a random expression over all the numbers (a positive integer
    <= 200, every intermediate value a positive integer), which is kept as the reference answer.
    """
    k = difficulty + 1
    while True:
        nums = [rng.randint(1, 12) for _ in range(k)]
        terms = [(str(n), n) for n in nums]
        rng.shuffle(terms)
        ok = True
        while len(terms) > 1 and ok:
            (ea, va), (eb, vb) = terms.pop(), terms.pop()
            op = rng.choice("+-*/")
            if op == "-" and va < vb:
                (ea, va), (eb, vb) = (eb, vb), (ea, va)
            if op == "+":
                v = va + vb
            elif op == "-":
                v = va - vb
            elif op == "*":
                v = va * vb
            else:
                v = va // vb if va % vb == 0 else 0
            if v <= 0:
                ok = False
                break
            terms.append((f"{_paren(ea)}{op}{_paren(eb)}", v))
        if ok and terms[0][1] <= 200:
            expr, target = terms[0]
            prompt = f"use {' '.join(map(str, nums))} to make {target}:"
            return prompt, expr, nums, target


def parse_countdown_prompt(prompt: str) -> tuple[list[int], int] | None:
    """``(numbers, target)`` from a Countdown prompt, or None."""
    m = COUNTDOWN_PROMPT_RE.search(prompt)
    if not m:
        return None
    return [int(x) for x in m.group(1).split()], int(m.group(2))


# ---------------------------------------------------------------- datasets
def generate_problems(task: str = "arithmetic", n: int = 1000, seed: int = 0, split: str = "train",
                      levels: tuple[int, ...] | None = None) -> list[dict]:
    """``n`` problem rows of ``task`` in ``split``, difficulty cycling over ``levels``.

    Prompts are unique within the list while the level's problem space allows it (level 1 of
    arithmetic has only 100 problems); after that duplicates are allowed.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    valid = {"arithmetic": ARITH_LEVELS, "countdown": COUNTDOWN_LEVELS, "arithmetic-chat": CHAT_LEVELS}[task]
    levels = tuple(levels or valid)
    unknown = [lv for lv in levels if lv not in valid]
    if unknown:
        raise ValueError(f"builtin:{task} has no difficulty level {unknown[0]!r}; its levels are "
                         f"{', '.join(map(str, valid))} (--builtin_levels).")
    rng = random.Random(f"{task}:{seed}:{split}")
    rows, seen, exhausted = [], set(), set()
    for i in range(n):
        difficulty = levels[i % len(levels)]
        for attempt in range(1000):
            if task == "arithmetic":
                prompt, answer = arithmetic_problem(rng, difficulty)
                row = {"prompt": prompt, "answer": answer, "difficulty": difficulty}
            elif task == "arithmetic-chat":
                prompt, answer = word_problem(rng, difficulty)  # the question decides the split
                row = {"prompt": chat_prompt(prompt), "answer": answer, "difficulty": difficulty}
            else:
                prompt, answer, nums, target = countdown_problem(rng, difficulty)
                row = {"prompt": prompt, "answer": answer, "difficulty": difficulty,
                       "numbers": nums, "target": target}
            if split_of(task, prompt) != split:
                continue
            if prompt not in seen or difficulty in exhausted:
                break
            if attempt >= 100:  # this level's problem space in this split is used up
                exhausted.add(difficulty)
                break
        seen.add(prompt)
        rows.append(row)
    return rows


def build_dataset(task: str = "arithmetic", n: int = 1000, seed: int = 0, split: str = "train",
                  levels: tuple[int, ...] | None = None):
    """A ``datasets.Dataset`` of ``generate_problems(...)`` (columns prompt, answer, difficulty, ...)."""
    from datasets import Dataset

    return Dataset.from_list(generate_problems(task, n=n, seed=seed, split=split, levels=levels))


# ---------------------------------------------------------------- safe Countdown evaluation
_ALLOWED_EXPR_CHARS = re.compile(r"^[0-9+\-*/() ]+$")
MAX_EXPR_LEN = 100


def eval_countdown_expression(expr: str) -> tuple[Fraction, list[int]] | None:
    """Exact value and the numbers used by ``expr``, or None if it is not a plain expression.

    Only integer literals, binary + - * / and parentheses are accepted (checked on the ``ast``,
    nothing is ever ``eval``-ed); division is exact (``Fraction``); division by zero -> None.
    """
    import ast

    expr = expr.strip()
    if not expr or len(expr) > MAX_EXPR_LEN or not _ALLOWED_EXPR_CHARS.match(expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
    used: list[int] = []

    def walk(node):
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError(f"disallowed node {type(node).__name__}")

    try:
        return walk(tree.body), used
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def check_countdown(expr: str, numbers: list[int], target: int) -> bool:
    """True iff ``expr`` uses each of ``numbers`` at most once and equals ``target`` exactly."""
    res = eval_countdown_expression(expr)
    if res is None:
        return False
    value, used = res
    pool = list(numbers)
    for u in used:
        if u not in pool:
            return False
        pool.remove(u)
    return value == target
