"""What AllocGRPOTrainer checks of its inputs before TRL builds anything: unsupported features first (they change what
a dataset must be), then the reward functions and the prompt pool (docs/reliability.md)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from datasets import IterableDataset

from ..tasks.data import check_prompts, checked_reward

if TYPE_CHECKING:
    from datasets import Dataset
    from trl.trainer.grpo_trainer import RewardFunc

TRL_REWARD_KWARGS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                     "environments"}


def check_inputs(cls_name: str, reward_funcs: RewardFunc | Sequence[RewardFunc] | None, train_dataset: Any,
                 kwargs: dict[str, Any]) -> None:
    """Refuse what the trainer cannot take, naming the fix."""
    for name in ("tools", "rollout_func", "environment_factory"):  # first: they change what a dataset must be
        if kwargs.get(name):
            raise ValueError(f"`{name}` is not supported by {cls_name}: the allocators decide on one "
                             "single-turn response per rollout (multi-turn tools, custom rollout functions and "
                             f"environments are not), so use TRL's GRPOTrainer for `{name}`.")
    if reward_funcs is None or (isinstance(reward_funcs, (list, tuple)) and not reward_funcs):
        raise ValueError("No reward source provided: `reward_funcs` is required, the allocators count successes "
                         "from your verifier's reward (e.g. trl_alloc.tasks.data.reward_for_dataset(...), a function, "
                         "or a model id).")
    if isinstance(train_dataset, list) and train_dataset and isinstance(train_dataset[0], dict):
        raise TypeError("`train_dataset` is a list of dicts; wrap it as datasets.Dataset.from_list(rows) (the "
                        "prompt pool must be an indexable `datasets.Dataset`).")
    if train_dataset is None:
        raise ValueError("`train_dataset` is required: it is the prompt pool the allocators choose from (a "
                         "`datasets.Dataset` with a 'prompt' column).")
    if isinstance(train_dataset, IterableDataset) or not hasattr(train_dataset, "__len__") \
            or not hasattr(train_dataset, "column_names"):
        raise ValueError("`train_dataset` is the prompt pool and must be an indexable `datasets.Dataset` (not "
                         f"{type(train_dataset).__name__}; an IterableDataset "
                         "cannot be sampled by prompt id: load it without streaming=True).")
    if "prompt" not in train_dataset.column_names:
        raise ValueError(f"`train_dataset` needs a 'prompt' column (it has {train_dataset.column_names}).")
    check_prompts(train_dataset["prompt"], "`train_dataset`")


def checked_reward_funcs(reward_funcs: RewardFunc | Sequence[RewardFunc]) -> RewardFunc | list[RewardFunc]:
    """Plain-function rewards wrapped so a wrong output names the function (async ones are TRL's)."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    out = [f if isinstance(f, (str, torch.nn.Module)) or inspect.iscoroutinefunction(f)
           or getattr(f, "trl_alloc_checked", False) else checked_reward(f) for f in funcs]
    return out if isinstance(reward_funcs, (list, tuple)) else out[0]


def warn_missing_reward_columns(reward_funcs: Sequence[Callable[..., Any] | torch.nn.Module], names: Sequence[str],
                                dataset: Dataset) -> None:
    """A reward function taking a keyword the dataset has no column for would get None: say so at the start."""
    for func, name in zip(reward_funcs, names):
        if isinstance(func, torch.nn.Module):
            continue
        wanted = set(_parameters(func)) - TRL_REWARD_KWARGS - set(dataset.column_names)
        if wanted:
            print(f"[trl-alloc] WARNING: reward function {name!r} takes {', '.join(sorted(wanted))}, which the "
                  f"dataset has no column for (columns: {', '.join(dataset.column_names)}): it will get None. "
                  "Add the column (e.g. --answer_column) or fix the function.")


def _parameters(func: Callable[..., Any]) -> list[str]:
    try:
        return [name for name, p in inspect.signature(func).parameters.items()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    except (TypeError, ValueError):
        return []


__all__ = ["check_inputs", "checked_reward_funcs", "warn_missing_reward_columns", "TRL_REWARD_KWARGS"]
