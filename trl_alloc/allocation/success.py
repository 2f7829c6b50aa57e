"""The one success rule: the allocators (CERO's Beta states, SARA's verdicts, ARROL's labels), the benchmarks and the
evaluation all count a response as a success when its success score is >= the threshold (docs/reliability.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

SUCCESS_THRESHOLD = 0.5  # default: a response succeeds when its success score is >= 0.5


def is_success(scores: ArrayLike, threshold: float = SUCCESS_THRESHOLD) -> np.ndarray | np.bool_ | bool:
    """The one success rule (allocators, ARROL labels, benchmarks, evaluation): score >= threshold."""
    if isinstance(scores, float):  # (one rollout's score, the event rounds' case: no array to build)
        return scores >= threshold
    return np.asarray(scores, dtype=float) >= threshold
