"""How a pacer and a filler join in one round (docs/architecture.md#one-round-through-the-code).

CERO's ranked positive-margin list is the filler's stream and its executed units × g the round's
response budget; plain pacers (uniform, knapsack) fix prompts, not spend, so an adaptive filler may
oversample up to its own cap (`Filler.round_arguments`). SARA's prior for a prompt is the pacer's Beta
state, discounted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .base import Filler, Pacer


def round_arguments(pacer: Pacer, filler: Filler, units: np.ndarray, target_groups: int | None = None,
                    carry: dict[int, dict] | None = None,
                    wait_for_groups: bool = False) -> dict:
    """Keyword arguments of `filler.start_round` for the pacer's proposal `units`. With `carry` (stream mode: the
    open groups of the last round, see `event_rounds`), also `start_event_round`'s: the round's budget is at least
    what those groups may still start (`need`), within what the pacer has left, so a carried group can finish even
    in a round the pacer gives nothing (their rest is started first, so it comes out of the proposal's spend). The
    round waits for its groups when told (`wait_for_groups`) or when it may spend all the pacer has left."""
    spend = int(np.sum(units)) * pacer.unit_size
    if carry is not None:
        need = sum(int(state.get("need", 0)) for state in carry.values())
        spend = min(max(spend, need), int(pacer.remaining_responses))
    kwargs = filler.round_arguments(pacer, units, spend, target_groups=target_groups)
    if carry is not None:
        last = kwargs["budget"] >= pacer.remaining_responses
        kwargs.update(carry=carry, wait_for_groups=bool(wait_for_groups or last))
    return kwargs


__all__ = ["round_arguments"]
