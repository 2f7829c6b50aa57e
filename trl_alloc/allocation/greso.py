"""GRESO (Zheng et al., "Act Only When It Pays: Efficient Reinforcement Learning for LLM Reasoning via Selective
Rollouts", arXiv 2506.02177): skip, before any rollout, prompts whose groups had zero reward variance in their
recent visits, with a probability that adapts so the zero-variance share of what is sampled stays near a target.

A pacer on plain GRPO's epoch order (`UniformPacer`): a prompt whose last z_i visits all had zero variance is kept
with probability p^z_i (skipped with 1 − p^z_i, the paper's eq. 3), p = p_easy when its last such visit was all
correct and p_hard when all wrong. After each round past the first epoch, p_easy falls by Δp when the round's
all-correct share of sampled prompts is at or above its target (α/3) and rises by Δp otherwise, within
[p_min, p_max]; p_hard likewise with target 2α/3 (GRESO's split of α = `target_zero_variance`, as in its code,
`Infini-AI-Lab/GRESO`). A skipped prompt is passed over for this epoch. Pair it with dynamic sampling (GRESO's
setting) or full groups.

Hyperparameters: `GRESOPacer.hyperparameters` (config fields `p_easy`, ..., docs/allocation.md#greso).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._checks import check_int
from .baselines import UniformPacer
from .hyperparameters import Hyperparameter, within
from .registry import register

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


@register("pacing", "greso")
class GRESOPacer(UniformPacer):
    """GRESO's pre-rollout filter on the uniform epoch order (module docstring); the budget is uniform pacing's."""

    hyperparameters = (  # GRESO's defaults (arXiv 2506.02177, its code's)
        Hyperparameter("p_easy", float, 0.5, "GRESO: starting keep probability of a prompt whose last zero-variance "
                       "visit was all correct (in [p_min, p_max]).", within(0, 1)),
        Hyperparameter("p_hard", float, 0.5, "GRESO: starting keep probability of a prompt whose last zero-variance "
                       "visit was all wrong (in [p_min, p_max]).", within(0, 1)),
        Hyperparameter("p_min", float, 0.05, "GRESO: lower bound of p_easy and p_hard.", within(0, 1)),
        Hyperparameter("p_max", float, 0.95, "GRESO: upper bound of p_easy and p_hard.", within(0, 1)),
        Hyperparameter("delta_p", float, 0.01, "GRESO: step Δp of p_easy / p_hard after each round.", within(0, 1)),
        Hyperparameter("target_zero_variance", float, 0.25, "GRESO: target share α of zero-variance prompts among "
                       "those sampled (α/3 all correct, 2α/3 all wrong).", within(0, 1)),
    )

    @classmethod
    def check_config(cls, args: Any) -> None:
        own = cls.settings(args)  # the rules between them, before a run starts
        cls(num_prompts=1, prompts_per_round=1, group_size=2, rounds=1, **own)

    def __init__(self, num_prompts: int, prompts_per_round: int, group_size: int, budget_responses: int | None = None,
                 rounds: int | None = None, seed: int = 0, p_easy: float = 0.5, p_hard: float = 0.5,
                 p_min: float = 0.05, p_max: float = 0.95, delta_p: float = 0.01,
                 target_zero_variance: float = 0.25) -> None:
        super().__init__(num_prompts, prompts_per_round, group_size, budget_responses, rounds, seed)
        for name, value in (("p_min", p_min), ("p_max", p_max), ("delta_p", delta_p),
                            ("target_zero_variance", target_zero_variance)):
            if not 0 <= float(value) <= 1:
                raise ValueError(f"GRESO's `{name}` must lie in [0, 1], got {value}.")
        if not p_min <= p_max:
            raise ValueError(f"GRESO's `p_min` ({p_min}) must not exceed `p_max` ({p_max}).")
        for name, value in (("p_easy", p_easy), ("p_hard", p_hard)):
            if not p_min <= value <= p_max:
                raise ValueError(f"GRESO's `{name}` ({value}) must lie in [p_min, p_max] = [{p_min}, {p_max}].")
        self.p_easy, self.p_hard, self.p_min, self.p_max = float(p_easy), float(p_hard), float(p_min), float(p_max)
        self.delta_p = float(delta_p)
        self.target_easy, self.target_hard = target_zero_variance / 3, 2 * target_zero_variance / 3
        self.zero_streak = np.zeros(self.num_prompts, np.int64)  # z_i: zero-variance visits in a row
        self.all_correct = np.zeros(self.num_prompts, bool)  # the last zero-variance visit was all correct (easy)
        self.skipped = 0  # prompts passed over so far
        self._stream = None

    def keep_probability(self) -> np.ndarray:
        """Per prompt, the chance its next visit is not skipped: p^z (eq. 3: skip with 1 − p^z)."""
        p = np.where(self.all_correct, self.p_easy, self.p_hard)
        return p ** self.zero_streak

    def _epoch_draws(self, epoch):
        return np.random.default_rng([self.seed, epoch, 1]).random(self.num_prompts)

    def _epoch_stream(self):
        """Plain GRPO's order from the cursor (this epoch's rest, then the next epoch) and its kept mask: one draw
        per prompt and epoch, so a decision does not change within an epoch unless the prompt's p^z does."""
        order = UniformPacer.ranked_prompts.fget(self)
        this_epoch = np.isin(order, self._order[self.cursor:])
        draws = np.where(this_epoch, self._epoch_draws(self.epoch)[order], self._epoch_draws(self.epoch + 1)[order])
        return order, draws < self.keep_probability()[order]

    @property
    def ranked_prompts(self) -> np.ndarray:
        """The kept prompts in epoch order (fixed for the round once drawn)."""
        if self._stream is None:
            order, kept = self._epoch_stream()
            self._stream = order[kept]
        return self._stream

    def update(self, successes: ArrayLike, failures: ArrayLike, responses: ArrayLike | None = None,
               prepaid: ArrayLike | None = None) -> None:
        s, f, spent = self._consume(successes, failures, responses, prepaid)
        order, kept = self._epoch_stream()
        epoch = self.epoch
        passed = self._advance_past(spent, order)
        self.skipped += int((~kept[:passed]).sum())
        observed = s + f > 0
        easy, hard = observed & (f == 0), observed & (s == 0)
        zero = easy | hard
        self.zero_streak[zero] += 1
        self.zero_streak[observed & ~zero] = 0
        self.all_correct[easy], self.all_correct[hard] = True, False
        seen = int(observed.sum())
        if epoch >= 1 and seen:  # as GRESO's code: the probabilities adapt from the second epoch on
            self.p_easy = self._adapt(self.p_easy, easy.sum() / seen >= self.target_easy)
            self.p_hard = self._adapt(self.p_hard, hard.sum() / seen >= self.target_hard)
        self._stream = None

    def _adapt(self, p, above_target):
        """Skip more (p down by Δp) while the share is at or above its target, less otherwise, within bounds."""
        return float(np.clip(p - self.delta_p if above_target else p + self.delta_p, self.p_min, self.p_max))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "p_easy": self.p_easy, "p_hard": self.p_hard, "skipped": self.skipped,
                "zero_streak": self.zero_streak.tolist(), "all_correct": self.all_correct.tolist()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.p_easy, self.p_hard = float(state["p_easy"]), float(state["p_hard"])
        self.skipped = check_int("skipped", state["skipped"], 0)
        self.zero_streak = np.asarray(state["zero_streak"], np.int64)
        self.all_correct = np.asarray(state["all_correct"], bool)
        self._stream = None
