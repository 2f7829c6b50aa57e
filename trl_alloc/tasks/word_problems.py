"""`builtin:arithmetic-chat`: arithmetic word problems for real instruct models.

Conversational prompts (TRL's format: a list with one user message) that ask for the answer in
`\\boxed{}`, checked by math-verify (`rewards.math_reward`). Five levels over 1-3 digit numbers
with + - x, one step (levels 1-3) and two steps (levels 4-5):

1. one-digit sums and differences;  2. two-digit ± one-digit, one-digit products;
3. two-digit ± two-digit, two-digit × one-digit;  4. a + b − c and a × b + c;
5. three-digit a + b − c, two-digit × one-digit − c.

Results are never negative. Train and test are disjoint by construction (`tasks.split_of` hashes
the question).
"""

from __future__ import annotations

import random

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo")
ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "coins", "stamps", "shells", "cards")
INSTRUCTION = "Put the final answer in \\boxed{}."

# level -> (kind, digits) choices; kind names the template below
LEVELS = {
    1: [("add", (1, 1)), ("sub", (1, 1))],
    2: [("add", (2, 1)), ("sub", (2, 1)), ("mul", (1, 1))],
    3: [("add", (2, 2)), ("sub", (2, 2)), ("mul", (2, 1))],
    4: [("add_sub", (2, 2, 1)), ("mul_add", (1, 1, 2))],
    5: [("add_sub", (3, 3, 2)), ("mul_sub", (2, 1, 2))],
}

TEMPLATES = {
    "add": "{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?",
    "sub": "{name} has {a} {item} and gives {b} of them away. How many {item} does {name} have left?",
    "mul": "There are {a} boxes with {b} {item} in each box. How many {item} are there in total?",
    "add_sub": "{name} has {a} {item}, buys {b} more and then gives {c} to a friend. How many {item} does "
               "{name} have now?",
    "mul_add": "A shop packs {a} bags of {b} {item} and has {c} loose {item}. How many {item} does the shop "
               "have in all?",
    "mul_sub": "There are {a} rows of {b} {item}. Then {c} {item} are taken away. How many {item} are left?",
}


def _number(rng: random.Random, digits: int) -> int:
    low = 1 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def word_problem(rng: random.Random, level: int) -> tuple[str, str]:
    """One (question, answer) pair at `level` 1..5."""
    kind, digits = rng.choice(LEVELS[level])
    a, b, *rest = (_number(rng, d) for d in digits)
    c = rest[0] if rest else None
    if kind == "sub" and a < b:
        a, b = b, a
    if kind in ("add_sub", "mul_sub"):  # never take away more than there is
        c = min(c, a + b if kind == "add_sub" else a * b)
    value = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
             "add_sub": lambda: a + b - c, "mul_add": lambda: a * b + c, "mul_sub": lambda: a * b - c}[kind]()
    question = TEMPLATES[kind].format(name=rng.choice(NAMES), item=rng.choice(ITEMS), a=a, b=b, c=c)
    return question, str(value)


def chat_prompt(question: str) -> list[dict]:
    """The conversational prompt: one user message with the question and the \\boxed{} instruction."""
    return [{"role": "user", "content": f"{question} {INSTRUCTION}"}]
