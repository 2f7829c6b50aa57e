"""The per-round state the trainer's mixins share, declared in one place: `CollectedRound` is what a rollout mode's
round hands back (event_modes.py, grpo.py); `RoundState` is what `loss_batch` writes when it builds the round's loss
batch, and `grpo` and `metrics` read (tests inspect it as `trainer.round_state`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RoundState:
    """What the last round left for the loss and the logs."""

    loss_rows: list = field(default_factory=list)  # the rows that reach the loss (committed groups' survivors)
    advantages: torch.Tensor | None = None  # one per loss row
    zero_std: torch.Tensor | None = None  # per loss row: its group's training reward does not vary
    flat_groups: int = 0  # groups mixed by the success signal whose training reward does not vary
    sampling: dict = field(default_factory=dict)  # TRL's importance-sampling statistics of the round
    empty: bool = False  # nothing reaches the loss: the round's optimizer steps move no parameter
    loss_scale: float = 1.0  # `loss_normalization="nominal"`: trained rows / nominal rows (at most 1)


@dataclass
class CollectedRound:
    """One closed round as a rollout mode collected it, on every rank (what `Allocator.record_round` records)."""

    rows: list[dict[str, Any]]      # every scored row that ended in the round
    trained: list[dict[str, Any]]   # the rows to train: the committed groups' (a stream's carry their staleness)
    summary: dict[str, Any]         # `Allocator.finish_round`'s
    admitted: int                   # prompts the pacer admitted
    requests: list[tuple[list[int], list[int]]] = field(default_factory=list)  # deterministic: (prompts, counts)
    log: dict[str, Any] | None = None  # events and stream: seconds waited; the main process's also `events`
    responses: int | None = None    # responses the round spent, where not len(rows) (a stream)
    log_fields: dict[str, Any] | None = None  # extra round-log fields (a stream: its token staleness)
