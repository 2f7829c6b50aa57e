"""`train.py --eval_every N`: the learning curve in the user's currency, held-out accuracy against the responses
spent and the run's seconds (generation and training; the evaluations' own seconds excluded)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trl_alloc.trainer import AllocGRPOTrainer


class HeldOutCurve(TrainerCallback):
    """Held-out accuracy every `every` rounds. `evaluate(when)` runs on every rank and returns the accuracy on the
    main process (None elsewhere); `points` (main process): round, step, responses spent, seconds, accuracy, when."""

    def __init__(self, every: int, trainer: AllocGRPOTrainer, evaluate: Callable[[str], float | None]) -> None:
        self.every, self.trainer, self.evaluate = int(every), trainer, evaluate
        self.points: list[dict[str, Any]] = []
        self.started: float | None = None
        self.ended: float | None = None  # the run's seconds at the end of the last optimizer step
        self.eval_s = 0.0
        self._last_round = 0

    def seconds(self, now: float | None = None) -> float:
        """The run's seconds so far, evaluations excluded."""
        if self.started is None:
            return 0.0
        return (time.perf_counter() if now is None else now) - self.started - self.eval_s

    def add(self, when: str, accuracy: float | None, seconds: float | None = None) -> None:
        """One point of the curve at the trainer's counters now (nothing on the other ranks)."""
        if accuracy is None:
            return
        counters = self.trainer.allocator.counters
        self.points.append({"round": counters["rounds"], "step": self.trainer.state.global_step,
                            "responses": counters["responses"], "tokens": counters["tokens"],
                            "seconds": self.seconds() if seconds is None else seconds, "accuracy": accuracy,
                            "when": when})

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self.ended = self.seconds()
        rounds = self.trainer.allocator.counters["rounds"]
        last = state.global_step >= state.max_steps or self.trainer.allocator.budget_exhausted
        if rounds % self.every or rounds == self._last_round or last:  # the last round: the "after" point
            return
        self._last_round, t0 = rounds, time.perf_counter()
        when = f"round-{rounds}"
        accuracy = self.evaluate(when)
        self.add(when, accuracy, self.seconds(t0))
        self.eval_s += time.perf_counter() - t0
