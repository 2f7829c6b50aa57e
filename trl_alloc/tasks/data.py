"""Datasets and reward functions for `scripts/train.py`: a Hub name, a local jsonl/json/parquet/csv
file, or a built-in synthetic task (`builtin:arithmetic`, `builtin:countdown`).

`load_train_and_test` also picks the held-out split honestly: a given test file or split, else a
seeded, disjoint fraction of the training rows. Test rows whose prompt is also a training prompt
are dropped, so accuracy is never measured on prompts the policy trained on.
"""

import functools
import json
import os
from typing import NamedTuple

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_prompt_dataset(name, split="train", config=None, prompt_column="prompt", answer_column="answer",
                        num_builtin=2000, seed=0, levels=None):
    """The prompt pool with `prompt` and `answer` columns (renamed from the given ones); `levels`
    restricts a built-in task to those difficulty levels. A local file is read whole (`split` only
    names it)."""
    if name.startswith("builtin:"):
        from .builtin import TASKS, build_dataset
        task = name.split(":", 1)[1]
        if task not in TASKS:
            raise ValueError(f"unknown built-in task {task!r} in dataset_name={name!r}; choose one of "
                             + ", ".join(f"builtin:{t}" for t in TASKS) + ".")
        ds = build_dataset(task, n=num_builtin, seed=seed, split=split, levels=levels)
    elif levels:
        raise ValueError(f"difficulty levels ({', '.join(map(str, levels))}; --builtin_levels) pick the problems of "
                         f"a built-in task, and {name!r} is not one (builtin:...); drop --builtin_levels, or filter "
                         "your dataset's rows yourself.")
    elif is_local_file(name):
        ds = _load_local_file(name)
    elif os.path.isfile(name):
        raise ValueError(f"dataset file {name!r} has an extension trl-alloc does not read; give a "
                         f"{'/'.join(sorted(LOCAL_FORMATS))} file (one row per prompt, with 'prompt' and 'answer').")
    else:
        from datasets import load_dataset
        ds = load_dataset(name, config, split=split)
    return _standardise(ds, name, split, prompt_column, answer_column)


def is_local_file(name):
    return os.path.splitext(name)[1] in LOCAL_FORMATS


def _load_local_file(path):
    from datasets import load_dataset

    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file {path!r} does not exist; give a path to a .jsonl/.json/.parquet/"
                                ".csv file, a Hub dataset name, or builtin:arithmetic.")
    if os.path.getsize(path) == 0:
        raise ValueError(f"dataset file {path!r} is empty; it needs one row per prompt (with 'prompt' and "
                         "'answer' columns).")
    try:
        return load_dataset(LOCAL_FORMATS[os.path.splitext(path)[1]], data_files={"train": path}, split="train")
    except Exception as exc:  # datasets wraps the parser's error without the file or line
        where = _first_bad_json_line(path) if path.endswith(".jsonl") else None
        detail = where or f"{type(exc).__name__}: {exc.__cause__ or exc}"
        raise ValueError(f"dataset file {path!r} could not be read: {detail}. Fix the file (one JSON object "
                         "per line for .jsonl) and run again.") from exc


def _first_bad_json_line(path):
    """'line N: what is wrong' for the first line of a .jsonl file that is not a JSON object, or None."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                return f"line {number} is not valid JSON ({exc.msg} at column {exc.colno})"
            if not isinstance(row, dict):
                return f"line {number} is a JSON {type(row).__name__}, not an object with 'prompt' and 'answer'"
    return None


def _standardise(ds, name, split, prompt_column, answer_column):
    missing = [c for c in (prompt_column, answer_column) if c not in ds.column_names]
    if missing:
        raise ValueError(f"dataset {name!r} ({split}) has no column {missing[0]!r}; its columns are "
                         f"{ds.column_names}. Set --prompt_column / --answer_column to the right names.")
    if len(ds) == 0:
        raise ValueError(f"dataset {name!r} ({split}) is empty; the prompt pool needs at least one prompt.")
    unanswered = [i for i, a in enumerate(ds[answer_column]) if a is None]
    if unanswered:
        raise ValueError(f"dataset {name!r} ({split}) has {len(unanswered)} row(s) whose {answer_column!r} is null "
                         f"(rows {_rows(unanswered)}); they can never succeed. Fill in or remove those rows.")
    check_prompts(ds[prompt_column], f"dataset {name!r} ({split})")
    for old, new in ((prompt_column, "prompt"), (answer_column, "answer")):
        if old != new:
            if new in ds.column_names:
                ds = ds.remove_columns(new)
            ds = ds.rename_column(old, new)
    if not isinstance(ds[0]["answer"], str):
        ds = ds.map(lambda row: {"answer": str(row["answer"])})
    return ds


CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}


def check_prompts(prompts, where):
    """Refuse empty prompts (plain or conversational), naming the rows; warn about chat prompts with an unknown
    role or no user turn (a chat template may drop or reject them)."""
    empty, odd_roles, no_user = [], {}, []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if not prompt.strip():
                empty.append(i)
            continue
        messages = prompt if isinstance(prompt, list) else []
        if not any(str((m or {}).get("content") or "").strip() for m in messages):
            empty.append(i)
            continue
        roles = [(m or {}).get("role") for m in messages]
        for role in set(roles) - CHAT_ROLES:
            odd_roles.setdefault(role, []).append(i)
        if "user" not in roles:
            no_user.append(i)
    if empty:
        raise ValueError(f"{where} has {len(empty)} empty prompt(s) (rows {_rows(empty)}); remove them or give them "
                         "text: an empty prompt has nothing to generate from.")
    for role, rows in odd_roles.items():
        _warn_once(("role", role, repr([prompts[i] for i in rows[:3]])),
                   f"[trl-alloc] WARNING: {where}: {len(rows)} chat prompt(s) with role {role!r} (rows "
                   f"{_rows(rows)}); chat templates know {sorted(CHAT_ROLES)} and may drop or reject others.")
    if no_user:
        _warn_once(("no user", repr([prompts[i] for i in no_user[:3]])),
                   f"[trl-alloc] WARNING: {where}: {len(no_user)} chat prompt(s) with no 'user' turn (rows "
                   f"{_rows(no_user)}); the model is asked to answer nothing a user said.")


_WARNED = set()


def _warn_once(key, message):
    """Print a data warning once per process: the CLI checks the dataset it loads, then the trainer checks the same
    rows again."""
    if key not in _WARNED:
        _WARNED.add(key)
        print(message)


def check_prompt_lengths(prompts, tokenize, max_completion_length, positions, candidates=32):
    """Refuse prompts that leave no room for a completion in the model's `positions`, naming the longest. Only the
    `candidates` longest by characters are tokenized (`tokenize(list of prompts) -> token id lists`)."""
    if not positions:
        return
    def chars(p):
        return len(p) if isinstance(p, str) else sum(len(str((m or {}).get("content") or "")) for m in p or [])
    order = sorted(range(len(prompts)), key=lambda i: -chars(prompts[i]))[:candidates]
    lengths = [len(ids) for ids in tokenize([prompts[i] for i in order])]
    row, longest = max(zip(order, lengths), key=lambda x: x[1])
    if longest + max_completion_length > positions:
        raise ValueError(f"prompt row {row} is {longest} tokens: with max_completion_length={max_completion_length} "
                         f"that exceeds the model's {positions} positions (max_position_embeddings); remove or "
                         "shorten the long prompts, or lower max_completion_length.")


def _rows(rows, most=5):
    return ", ".join(map(str, rows[:most])) + (f", ... ({len(rows) - most} more)" if len(rows) > most else "")


class Splits(NamedTuple):
    train: object
    test: object  # None when no evaluation is asked for
    test_source: str  # what the held-out rows are, in words (summary.json and the model card)


def load_train_and_test(name, train_split="train", test_split="test", test_name=None, test_fraction=0.1,
                        num_test=None, num_builtin=2000, seed=0, **kw):
    """The prompt pool and a held-out set that shares no prompt with it.

    The held-out rows are, in order of preference: `test_name` (a file or Hub dataset, its
    `test_split` for a Hub dataset); the dataset's own `test_split`; else a seeded `test_fraction`
    of the training rows, removed from the pool. `test_split=None` (or `test_fraction=0` where a
    hold-out would be needed) skips evaluation. `num_test` caps the held-out rows.
    """
    builtin = name.startswith("builtin:")
    train = load_prompt_dataset(name, train_split, num_builtin=num_builtin, seed=seed, **kw)
    if test_split is None and test_name is None:
        return Splits(train, None, "none")
    if test_name is not None:
        test = load_prompt_dataset(test_name, test_split or "test", num_builtin=num_test or num_builtin,
                                   seed=seed, **kw)
        source = f"{test_name}" + ("" if is_local_file(test_name) else f" ({test_split} split)")
    elif builtin:
        test = load_prompt_dataset(name, "test", num_builtin=num_test or num_builtin, seed=seed, **kw)
        source = f"{name} test split (disjoint from train by construction)"
    else:
        test = None if is_local_file(name) else _hub_split_or_none(name, test_split, seed=seed, **kw)
        source = f"{name} ({test_split} split)"
        if test is None:
            if not 0 <= test_fraction < 1:
                raise ValueError(f"`test_fraction` must lie in [0, 1), got {test_fraction}.")
            if test_fraction == 0:
                return Splits(train, None, "none (no test split and test_fraction=0)")
            if len(train) < 2:
                raise ValueError(f"dataset {name!r} has {len(train)} row: too few to hold out a test set; give "
                                 "--test_dataset_name or set --eval_samples 0.")
            parts = train.train_test_split(test_size=test_fraction, seed=seed, shuffle=True)
            train, test = parts["train"], parts["test"]
            source = (f"{len(test)} rows held out of {name} ({test_fraction:.0%}, seed {seed}); the pool is the "
                      f"other {len(train)}")
    test = drop_training_prompts(test, train)
    if len(test) == 0:
        raise ValueError(f"every held-out prompt of {source} is also a training prompt; give a separate test set "
                         "with --test_dataset_name.")
    if num_test is not None:
        test = test.select(range(min(len(test), int(num_test))))
    return Splits(train, test, source)


def _hub_split_or_none(name, split, seed=0, **kw):
    try:
        return load_prompt_dataset(name, split, seed=seed, **kw)
    except ValueError as exc:  # datasets: "Unknown split ..."
        if "split" in str(exc).lower():
            return None
        raise


def prompt_key(prompt):
    """A hashable key of a prompt (plain text or a list of chat messages)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def load_prompt_counts(path, prompts):
    """Per-prompt (successes, failures) of a probe pass over the pool `prompts`, from a JSON file with `prompts`,
    `successes` and `failures` lists (`scripts/arrol_study.py` writes `probe_counts.json`); prompts are matched by
    text, unmatched ones get zeros. Returns (successes, failures, matched)."""
    import numpy as np

    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    missing = [k for k in ("prompts", "successes", "failures") if k not in data]
    if missing or not len(data["prompts"]) == len(data["successes"]) == len(data["failures"]):
        raise ValueError(f"{path} is not a probe-counts file: it needs equal-length `prompts`, `successes` and "
                         f"`failures` lists (missing: {', '.join(missing) or 'none'}); scripts/arrol_study.py writes "
                         "one as probe_counts.json.")
    counts = {prompt_key(p): (float(s), float(f)) for p, s, f in zip(data["prompts"], data["successes"],
                                                                       data["failures"])}
    rows = [counts.get(prompt_key(p)) for p in prompts]
    matched = sum(r is not None for r in rows)
    if not matched:
        raise ValueError(f"none of the {len(data['prompts'])} prompts in {path} is in this training set: the probe "
                         "pass must run over the same prompts (same dataset, levels and seed).")
    s = np.array([r[0] if r else 0.0 for r in rows])
    f = np.array([r[1] if r else 0.0 for r in rows])
    return s, f, matched


def drop_training_prompts(test, train):
    """`test` without the rows whose prompt is also in `train`."""
    seen = {prompt_key(p) for p in train["prompt"]}
    keep = [i for i, p in enumerate(test["prompt"]) if prompt_key(p) not in seen]
    return test if len(keep) == len(test) else test.select(keep)


def checked_reward(fn):
    """Wrap a TRL reward function so a raise, or an output that is not one value per completion,
    names the function and the sample. None or NaN for a sample is TRL's "no score" and passes."""
    name = getattr(fn, "__name__", type(fn).__name__)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # TRL passes prompts= and completions= by keyword
        prompts = kwargs.get("prompts", args[0] if args else None)
        completions = kwargs.get("completions", args[1] if len(args) > 1 else None)
        try:
            out = fn(*args, **kwargs)
        except Exception as exc:
            first = prompts[0] if prompts else None
            raise RuntimeError(f"reward function {name!r} raised {type(exc).__name__}: {exc} (first prompt of the "
                               f"batch: {first!r}); fix the function or the dataset row.") from exc
        check_reward_output(name, out, completions)
        return out

    wrapper.__name__ = name
    wrapper.trl_alloc_checked = True
    return wrapper


def check_reward_output(name, out, completions):
    """Raise a clear error unless `out` is one number (or None/NaN: unscored) per completion."""
    if out is None or not hasattr(out, "__len__") or len(out) != len(completions):
        got = "None" if out is None else (f"{len(out)} values" if hasattr(out, "__len__") else type(out).__name__)
        raise ValueError(f"reward function {name!r} must return a list of one float per completion "
                         f"({len(completions)}), got {got}; return None (or NaN) for a sample it cannot score.")
    for i, value in enumerate(out):
        if value is not None and not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
            raise ValueError(f"reward function {name!r} returned {value!r} for sample {i}; rewards are floats "
                             "(or None for a sample it cannot score).")


def reward_for_dataset(name, reward="auto"):
    """`auto`: the exact verifier of a built-in task, else math answers via math-verify."""
    from .rewards import reward_for_task
    if reward == "auto":  # the built-in tasks' own verifiers; arithmetic-chat answers in \boxed{}: math-verify
        task = name.split(":", 1)[1] if name.startswith("builtin:") else "math"
        reward = task if task in ("arithmetic", "countdown") else "math"
    return checked_reward(reward_for_task(reward))
