"""Per-prompt Beta states with forgetting (CERO, arXiv 2610.09679, eq. 5) and the reward-variation proxy (eq. 6)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._checks import check_counts, check_open_unit, check_prior
from .hyperparameters import Hyperparameter, positive

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def variance_proxy(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    """q̂ = E[P(1-P)] = ab / ((a+b)(a+b+1)) in [0, 1/4] (eq. 6), elementwise.

    This is the expected within-group reward variance (Prop. 3.1), not Var(P).
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    s = a + b
    return a * b / (s * (s + 1.0))


# The Beta prior of every prompt's success rate: CERO's states (eq. 5) and SARA's priors both start from it.
PRIOR_ALPHA = Hyperparameter("prior_alpha", float, 1.0, "Beta prior a0 of every prompt's success rate.", positive)
PRIOR_BETA = Hyperparameter("prior_beta", float, 1.0, "Beta prior b0 of every prompt's success rate.", positive)


class BetaState:
    """Beta(a_i, b_i) over every prompt's success rate, updated for the whole pool each round (eq. 5):

    a <- a0 + ρ(a - a0) + S,   b <- b0 + ρ(b - b0) + F   (S = F = 0 for prompts not sampled).
    """

    def __init__(self, num_prompts: int, prior: Sequence[float] = (1.0, 1.0), forgetting: float = 1.0) -> None:
        self.a0, self.b0 = check_prior("prior", prior)
        self.forgetting = check_open_unit("forgetting", forgetting, high_closed=True)
        self.num_prompts = int(num_prompts)
        self.a = np.full(self.num_prompts, self.a0)
        self.b = np.full(self.num_prompts, self.b0)

    def update(self, successes: ArrayLike, failures: ArrayLike) -> None:
        """Eq. 5 for all prompts at once."""
        s = check_counts("successes", successes, self.num_prompts)
        f = check_counts("failures", failures, self.num_prompts)
        rho = self.forgetting
        self.a = self.a0 + rho * (self.a - self.a0) + s
        self.b = self.b0 + rho * (self.b - self.b0) + f

    @property
    def mean(self) -> np.ndarray:
        """Predictive success rate m = a / (a + b)."""
        return self.a / (self.a + self.b)

    def proxy(self) -> np.ndarray:
        """q̂ for every prompt (eq. 6)."""
        return variance_proxy(self.a, self.b)

    def discounted(self, decay: float, index: ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) shrunk toward the prior by `decay` in [0, 1]: a0 + decay (a - a0) (SARA's history prior)."""
        idx = slice(None) if index is None else np.asarray(index)
        a = self.a0 + decay * (self.a[idx] - self.a0)
        b = self.b0 + decay * (self.b[idx] - self.b0)
        return a, b

    def state_dict(self) -> dict:
        return {"a": self.a.tolist(), "b": self.b.tolist(), "prior": [self.a0, self.b0],
                "forgetting": self.forgetting}

    def load_state_dict(self, state: dict) -> None:
        a, b = np.asarray(state["a"], float), np.asarray(state["b"], float)
        if a.shape != (self.num_prompts,) or b.shape != (self.num_prompts,):
            raise ValueError(f"Beta state holds {a.shape[0]} prompts but this pool has {self.num_prompts}; "
                             "resume with the same training dataset.")
        self.a, self.b = a, b
        self.a0, self.b0 = check_prior("prior", state["prior"])
        self.forgetting = check_open_unit("forgetting", state["forgetting"], high_closed=True)
