"""Datasets and reward functions for `scripts/train.py`: a Hub name, a local jsonl/json/parquet/csv
file, or a built-in synthetic task (`builtin:arithmetic`, `builtin:countdown`)."""

import functools
import math
import os

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_prompt_dataset(name, split="train", config=None, prompt_column="prompt", answer_column="answer",
                        num_builtin=2000, seed=0, levels=None):
    """The prompt pool with `prompt` and `answer` columns (renamed from the given ones); `levels`
    restricts a built-in task to those difficulty levels."""
    from datasets import load_dataset

    if name.startswith("builtin:"):
        from .tasks import TASKS, build_dataset
        task = name.split(":", 1)[1]
        if task not in TASKS:
            raise ValueError(f"unknown built-in task {task!r} in dataset_name={name!r}; choose one of "
                             + ", ".join(f"builtin:{t}" for t in TASKS) + ".")
        ds = build_dataset(task, n=num_builtin, seed=seed, split=split, levels=levels)
    elif os.path.splitext(name)[1] in LOCAL_FORMATS:
        if not os.path.isfile(name):
            raise FileNotFoundError(f"dataset file {name!r} does not exist; give a path to a .jsonl/.json/.parquet/"
                                    ".csv file, a Hub dataset name, or builtin:arithmetic.")
        ds = load_dataset(LOCAL_FORMATS[os.path.splitext(name)[1]], data_files={split: name}, split=split)
    else:
        ds = load_dataset(name, config, split=split)
    missing = [c for c in (prompt_column, answer_column) if c not in ds.column_names]
    if missing:
        raise ValueError(f"dataset {name!r} ({split}) has no column {missing[0]!r}; its columns are "
                         f"{ds.column_names}. Set --prompt_column / --answer_column to the right names.")
    if len(ds) == 0:
        raise ValueError(f"dataset {name!r} ({split}) is empty; the prompt pool needs at least one prompt.")
    for old, new in ((prompt_column, "prompt"), (answer_column, "answer")):
        if old != new:
            if new in ds.column_names:
                ds = ds.remove_columns(new)
            ds = ds.rename_column(old, new)
    if not isinstance(ds[0]["answer"], str):
        ds = ds.map(lambda row: {"answer": str(row["answer"])})
    return ds


def checked_reward(fn):
    """Wrap a TRL reward function so a raise or a None/NaN for a sample names the function and the sample."""
    name = getattr(fn, "__name__", type(fn).__name__)

    @functools.wraps(fn)
    def wrapper(prompts, completions, **kwargs):
        try:
            out = fn(prompts, completions, **kwargs)
        except Exception as exc:
            raise RuntimeError(f"reward function {name!r} raised {type(exc).__name__}: {exc} (first prompt of the "
                               f"batch: {prompts[0]!r}); fix the function or the dataset row.") from exc
        if out is None or len(out) != len(completions):
            raise ValueError(f"reward function {name!r} must return one float per completion "
                             f"({len(completions)}), got {None if out is None else len(out)}.")
        for i, value in enumerate(out):
            if value is None or (isinstance(value, float) and math.isnan(value)):
                raise ValueError(f"reward function {name!r} returned {value!r} for sample {i} (prompt "
                                 f"{prompts[i]!r}, completion {completions[i]!r}); every sample needs a number.")
        return out

    wrapper.__name__ = name
    return wrapper


def reward_for_dataset(name, reward="auto"):
    """`auto`: the exact verifier of a built-in task, else math answers via math-verify."""
    from .rewards import reward_for_task
    if reward == "auto":
        reward = name.split(":", 1)[1] if name.startswith("builtin:") else "math"
    return checked_reward(reward_for_task(reward))
