"""The per-round state the trainer's mixins share, declared in one place: `loss_batch` writes it when it builds the
round's loss batch, `grpo` and `metrics` read it (and tests inspect it as `trainer.round_state`)."""

from dataclasses import dataclass, field

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
    allocator_s: float = 0.0  # seconds spent in the allocator (main process)
