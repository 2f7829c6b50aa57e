"""The order of a stream's rounds (`rollout_mode="stream"`), in one place: the trainer (trainer/event_modes.py), the
engine model (`rollout.engine_model.simulate_engine`, scripts/plan.py) and the rollout bench
(`benchmarks.rollout`) all drive a `StreamDriver` through `StreamRounds`.

    rounds = StreamRounds(allocator, driver, num_rounds, colocate)
    rounds.open()                               # the first round
    while True:
        summary = rounds.close(score)           # or the driver's poll/observe by hand, then close(None)
        trained = driver.trained                # the rows to train (with their staleness)
        rounds.after_close()                    # a server: the next round opens now and generates while we train
        ...train on `trained`...
        rounds.after_train(bool(trained))       # the push (one policy version on), then, colocate, the next round
        if not rounds.more: break
    driver.finish()

Rules (one copy of each): a round waits for its groups when it is the last one (nothing after it to carry them)
or on a colocate engine (it idles while the trainer trains, so closing early would overlap nothing); the next round
opens before the training step on a server and after the push on a colocate engine (so its fresh rollouts start
on the new weights); a round that trained nothing pushes nothing (its optimizer step ran at learning rate 0: no new
policy version, so the rollouts in flight grow no older).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..allocation.allocator import Allocator
    from .backends import Rollout
    from .drivers import StreamDriver


class StreamRounds:
    """A run's stream rounds over one `StreamDriver` (module docstring); lives on the main process."""

    def __init__(self, allocator: Allocator, driver: StreamDriver, rounds: int, colocate: bool = False) -> None:
        self.allocator, self.driver, self.rounds, self.colocate = allocator, driver, int(rounds), bool(colocate)
        self.closed = 0  # rounds closed so far in this session (a resumed run counts from its resume)
        self.is_open = False

    @property
    def more(self) -> bool:
        """Another round follows the last closed one (rounds left and budget left)."""
        return self.closed < self.rounds and not self.allocator.pacer.finished

    def open(self) -> int:
        """The next round, with the groups the last one left open (the number of prompts admitted)."""
        last = self.closed + 1 >= self.rounds
        admitted = self.allocator.start_round(True, carry=self.driver.carry, wait_for_groups=self.colocate or last)
        self.driver.start(self.allocator.current_round)
        self.is_open = True
        return admitted

    def close(self, score: Callable[[Rollout], float] | None = None) -> dict[str, Any]:
        """Run the open round to its close with `score` (None: the caller polled and observed the driver itself);
        the allocator's summary."""
        if score is not None:
            self.driver.run(score)
        self.is_open = False
        self.closed += 1
        return self.allocator.finish_round()

    def after_close(self) -> int | None:
        """On a server, the next round opens before the training step, so the engine generates while it trains (the
        number of prompts it admitted; None when nothing opened)."""
        return self.open() if self.more and not self.colocate else None

    def after_train(self, trained: bool, push: Callable[[], None] | None = None) -> int | None:
        """After the training step: the new weights (`push()`, e.g. the weight sync) and one version on, only after
        a round that trained; then, on a colocate engine, the next round (the prompts it admitted, or None)."""
        if trained:
            if push is not None:
                push()
            self.driver.push()
        return self.open() if self.more and self.colocate and not self.is_open else None


__all__ = ["StreamRounds"]
