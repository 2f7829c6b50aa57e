"""`train.py --eval_every N`: the learning curve in the user's currency, held-out accuracy against the responses
spent and the run's seconds (generation and training; the evaluations' own seconds excluded), wall and CPU. Each
checkpoint keeps the curve so far (`held_out_curve.json`), so a resumed run goes on with it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil
from transformers import TrainerCallback

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trl_alloc.trainer import AllocGRPOTrainer


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its children, live and ended: a run's cost that other jobs on
    the machine do not inflate, unlike its wall seconds."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, ended children's user and system
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # ended meanwhile
            pass
    return total


CURVE_NAME = "held_out_curve.json"  # in each checkpoint folder


def saved_curve(checkpoint: str | None) -> dict[str, Any] | None:
    """The curve a checkpoint kept (`HeldOutCurve.state_dict`), or None."""
    path = os.path.join(checkpoint, CURVE_NAME) if checkpoint else None
    if path is None or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class HeldOutCurve(TrainerCallback):
    """Held-out accuracy every `every` rounds and, with `every_responses`, after the round in which the responses
    spent pass another multiple of it (0 turns either off). `evaluate(when)` runs on every rank and returns the
    accuracy on the main process (None elsewhere); `points` (main process): round, step, responses spent, tokens,
    seconds and CPU seconds (`cpu_seconds`, on the main process and its children), accuracy, when."""

    def __init__(self, every: int, trainer: AllocGRPOTrainer, evaluate: Callable[[str], float | None],
                 every_responses: int = 0) -> None:
        self.every, self.trainer, self.evaluate = int(every), trainer, evaluate
        self.every_responses = int(every_responses)
        self._last_mark = 0  # multiples of every_responses evaluated so far
        self.points: list[dict[str, Any]] = []
        self.started: tuple[float, float] | None = None  # (wall, CPU) at the start of training
        self.ended: tuple[float, float] = (0.0, 0.0)  # the run's (seconds, CPU seconds) after its last optimizer step
        self.excluded = [0.0, 0.0]  # the evaluations' own (seconds, CPU seconds)
        self._last_round = 0
        self.carried = (0.0, 0.0)  # (seconds, CPU seconds) of the run before it was resumed

    @staticmethod
    def _clocks() -> tuple[float, float]:
        return time.perf_counter(), cpu_seconds()

    def elapsed(self, now: tuple[float, float] | None = None) -> tuple[float, float]:
        """The run's (seconds, CPU seconds) so far, evaluations excluded."""
        if self.started is None:
            return 0.0, 0.0
        now = self._clocks() if now is None else now
        return tuple(c + n - s - e for c, n, s, e in zip(self.carried, now, self.started, self.excluded))

    def state_dict(self) -> dict[str, Any]:
        """The curve so far and the run's seconds, for a checkpoint."""
        return {"points": self.points, "elapsed": list(self.elapsed()), "last_mark": self._last_mark,
                "last_round": self._last_round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from a checkpoint's curve: its points, its marks, and its seconds carried into this run's."""
        self.points = list(state["points"])
        self.carried = tuple(float(x) for x in state["elapsed"])
        self._last_mark, self._last_round = int(state["last_mark"]), int(state["last_round"])

    def before_accuracy(self) -> float | None:
        """The accuracy before training, from the points (None when there is none)."""
        return next((p["accuracy"] for p in self.points if p["when"] == "before"), None)

    def add(self, when: str, accuracy: float | None, at: tuple[float, float] | None = None) -> None:
        """One point of the curve at the trainer's counters now (nothing on the other ranks); `at`: its (seconds,
        CPU seconds), by default the run's so far."""
        if accuracy is None:
            return
        counters = self.trainer.allocator.counters
        seconds, cpu = self.elapsed() if at is None else at
        self.points.append({"round": counters["rounds"], "step": self.trainer.state.global_step,
                            "responses": counters["responses"], "tokens": counters["tokens"],
                            "seconds": seconds, "cpu_seconds": cpu, "accuracy": accuracy, "when": when})

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.started = self._clocks()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self.trainer.args.should_save:  # the checkpoint folder is complete and renamed into place by now
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            with open(os.path.join(folder, CURVE_NAME), "w", encoding="utf-8") as f:
                json.dump(self.state_dict(), f)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        t0 = self._clocks()
        self.ended = self.elapsed(t0)
        counters = self.trainer.allocator.counters
        rounds, mark = counters["rounds"], counters["responses"] // self.every_responses if self.every_responses else 0
        last = state.global_step >= state.max_steps or self.trainer.allocator.budget_exhausted
        due = (self.every and rounds % self.every == 0) or mark > self._last_mark
        if not due or rounds == self._last_round or last:  # the last round: the "after" point
            return
        self._last_round, self._last_mark = rounds, mark
        when = f"round-{rounds}"
        accuracy = self.evaluate(when)
        self.add(when, accuracy, self.ended)
        for i, (after, before) in enumerate(zip(self._clocks(), t0)):
            self.excluded[i] += after - before
