"""GRPO advantages over groups of any size, as a pure function of the rewards and a group index array.

TRL normalises each prompt's k rewards together; a round's committed groups have different sizes (SARA
commits at n < k, pruned rollouts leave a group), so each group is normalised over its own members.
The formulas are TRL's (GRPOConfig `multi_objective_aggregation`, `scale_rewards`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from trl.trainer.utils import nanstd


def _group_std(values: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    return torch.cat([nanstd(c).expand(len(c)) if len(c) > 1 else torch.zeros(len(c))
                      for c in torch.split(values, sizes)])


def group_advantages(rewards_per_func: torch.Tensor, group_ids: torch.Tensor | Sequence[int], weights: torch.Tensor,
                     aggregation: str = "sum_then_normalize",
                     scale_rewards: str = "group") -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, zero_std) per row.

    rewards_per_func: (rows, functions) rewards, NaN where a function could not score a row;
    group_ids: (rows,) the group each row belongs to (any order; rows of one group keep their order);
    weights: (functions,) reward weights. zero_std marks rows whose group's rewards do not vary.
    """
    group_ids = torch.as_tensor(group_ids)
    order = torch.sort(group_ids, stable=True).indices
    _, sizes = torch.unique_consecutive(group_ids[order], return_counts=True)
    sizes = sizes.tolist()
    rpf = rewards_per_func[order]
    unscorable = torch.isnan(rpf).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (rpf * weights).nansum(dim=1)
        rewards[unscorable] = float("nan")
        mean = torch.cat([torch.nanmean(c).expand(len(c)) for c in torch.split(rewards, sizes)])
        group_std = _group_std(rewards, sizes)
        if scale_rewards == "batch":
            std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        else:
            std = group_std
        advantages = rewards - mean
        if scale_rewards != "none":
            advantages = advantages / (std + 1e-4)
    else:  # normalize_then_sum
        parts = []
        for c in torch.split(rpf, sizes):
            std_k = nanstd(c, dim=0, keepdim=True) if len(c) > 1 else torch.zeros(1, c.size(1))
            parts.append((c - torch.nanmean(c, dim=0, keepdim=True)) / (std_k + 1e-4))
        rewards = (torch.cat(parts) * weights).nansum(dim=1)
        rewards[unscorable] = float("nan")
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std + 1e-4)
        group_std = _group_std(rewards, sizes)
    zero_std = torch.isclose(torch.nan_to_num(group_std, nan=0.0), torch.zeros_like(group_std))
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return torch.nan_to_num(advantages, nan=0.0)[inverse], zero_std[inverse]
