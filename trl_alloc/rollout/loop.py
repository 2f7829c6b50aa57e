"""The rounds of a run over a rollout backend, in one place.

`Rounds`: a run's rounds in one rollout mode, as the engine model (`rollout.engine_model.simulate_engine`,
scripts/plan.py) and the rollout bench (`benchmarks.rollout`) drive them; it opens, drives and closes each round and
decides when the run stops (its rounds done, or the budget spent):

    rounds = Rounds.synchronous(allocator, events, rollouts_for, prompt_ids_of, score, max_tokens, num_rounds)
    rounds = Rounds.stream(allocator, stream_driver, num_rounds, colocate, push=train_and_push)
    for rnd in rounds:          # a `ClosedRound`: its summary, the filler's closed round, its driver, trained rows
        ...record and learn from rnd...

In a stream, after the loop's body the next round opens (on a server, before the training step) and `push` runs
after a round that trained (`StreamRounds` below). (The trainer's own rounds go through TRL's generation step across
its ranks: trainer/grpo.py, trainer/event_modes.py, with `StreamRounds` for a stream.)

`StreamRounds`: the order of a stream's rounds (`rollout_mode="stream"`); the trainer (trainer/event_modes.py), the
engine model and the rollout bench all drive their `StreamDriver` through it.

    rounds = StreamRounds(allocator, driver, num_rounds, colocate)
    while True:
        admitted = rounds.begin()               # the round to run: opened now, unless it already is
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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..allocation.event_rounds import BatchedEventRound
from .drivers import RoundDriver, run_round

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
        self.admitted = 0  # prompts the pacer admitted to the open (or last) round

    @property
    def more(self) -> bool:
        """Another round follows the last closed one (rounds left and budget left)."""
        return self.allocator.more_rounds(self.closed, self.rounds)

    def open(self) -> int:
        """The next round, with the groups the last one left open (the number of prompts admitted)."""
        last = self.closed + 1 >= self.rounds
        self.admitted = self.allocator.start_round(True, carry=self.driver.carry,
                                                   wait_for_groups=self.colocate or last)
        self.driver.start(self.allocator.current_round)
        self.is_open = True
        return self.admitted

    def begin(self) -> int:
        """The round to run: the one already open (a server opens it at the last close, a colocate engine after the
        push), else opened now (the first round, or the first after a resume). The prompts admitted to it."""
        return self.admitted if self.is_open else self.open()

    def close(self, score: Callable[[Rollout], float] | None = None) -> dict[str, Any]:
        """Run the open round to its close with `score` (None: the caller polled and observed the driver itself);
        the allocator's summary."""
        if score is not None:
            self.driver.run(score)
        self.is_open = False
        self.closed += 1
        return self.allocator.finish_round()

    def after_close(self) -> None:
        """On a server, the next round opens before the training step, so the engine generates while it trains."""
        if self.more and not self.colocate:
            self.open()

    def after_train(self, trained: bool, push: Callable[[], None] | None = None) -> None:
        """After the training step: the new weights (`push()`, e.g. the weight sync) and one version on, only after
        a round that trained; then, on a colocate engine, the next round."""
        if trained:
            if push is not None:
                push()
            self.driver.push()
        if self.more and self.colocate and not self.is_open:
            self.open()


@dataclass
class ClosedRound:
    """One closed round, as `Rounds` yields it."""

    index: int                    # rounds closed before it in this loop
    summary: dict[str, Any]       # `Allocator.finish_round`'s
    closed: Any                   # the filler's closed round
    driver: RoundDriver | StreamDriver
    trained: list[dict[str, Any]] = field(default_factory=list)  # the rows that reach the loss
    admitted: int = 0             # prompts the pacer admitted when the round opened


class Rounds:
    """A run's rounds over a rollout backend, in one rollout mode (module docstring); build it with `synchronous`
    or `stream`. It stops after `rounds` rounds or once the pacer has spent the budget (`Allocator.more_rounds`).
    Between synchronous rounds, `resume(allocator)` goes on with another allocator (one a checkpoint's state was
    loaded into, as a resumed run's)."""

    def __init__(self, allocator: Allocator, rounds: int) -> None:
        self.allocator, self.rounds = allocator, int(rounds)
        self._iterate: Callable[[], Iterator[ClosedRound]] = lambda: iter(())

    @classmethod
    def synchronous(cls, allocator: Allocator, events: bool, rollouts_for: Callable[[int], Any],
                    prompt_ids_of: Callable[[int], Sequence[int]], success: Callable[[Rollout], float],
                    max_tokens: int, rounds: int, close_rollouts: bool = False, **driver_kwargs: Any) -> Rounds:
        """Deterministic (each filler call submitted whole) or events rounds, each over `rollouts_for(i)`, the
        backend of round i (closed after it with `close_rollouts`). `driver_kwargs`: `RoundDriver`'s."""
        self = cls(allocator, rounds)

        def iterate() -> Iterator[ClosedRound]:
            i = 0
            while self.allocator.more_rounds(i, self.rounds):
                rollouts = rollouts_for(i)

                def drive() -> RoundDriver:  # events: each rollout decided as it ends; else each call submitted whole
                    driven = self.allocator if events else BatchedEventRound(self.allocator.current_round)
                    return run_round(driven, rollouts, prompt_ids_of, success, max_tokens, **driver_kwargs)
                try:
                    admitted, driver, summary = self.allocator.one_round(drive, events)
                finally:
                    if close_rollouts:
                        rollouts.close()
                closed = self.allocator.closed_round
                kept = set(summary["groups"])
                trained = [{"pid": r.tag, "completion_ids": r.token_ids, "pruned": r.rid in driver.pruned,
                            "aborted": r.finish_reason == "abort", "success": r.info.get("success")}
                           for r in driver.ended if r.tag in kept]
                yield ClosedRound(i, summary, closed, driver, trained, admitted)
                i += 1
        self._iterate = iterate
        return self

    @classmethod
    def stream(cls, allocator: Allocator, driver: StreamDriver, rounds: int, colocate: bool = False,
               success: Callable[[Rollout], float] | None = None, push: Callable[[], None] | None = None,
               after_round: Callable[[ClosedRound], None] | None = None) -> Rounds:
        """One `StreamDriver` across rounds (`StreamRounds`): each round run to its close with `success`; after the
        loop's body the next round opens (a server) or `push` runs and then it opens (colocate); `after_round(rnd)`
        ends the round's cycle (after its push: what a round's seconds include)."""
        self = cls(allocator, rounds)

        def iterate() -> Iterator[ClosedRound]:
            loop = StreamRounds(allocator, driver, self.rounds, colocate)
            i = 0
            while True:
                admitted = loop.begin()
                closed = allocator.current_round
                summary = loop.close(success)
                trained = driver.trained
                rnd = ClosedRound(i, summary, closed, driver, trained, admitted)
                yield rnd
                i += 1
                loop.after_close()  # (a server: the next round generates while this one trains)
                loop.after_train(bool(trained), push)  # an empty round: no policy update, nothing pushed
                if after_round is not None:
                    after_round(rnd)
                if not loop.more:
                    break
        self._iterate = iterate
        return self

    def resume(self, allocator: Allocator) -> None:
        """The rounds after this one run on `allocator` (synchronous rounds; a stream keeps its driver's rollouts in
        flight, which a checkpoint does not hold)."""
        self.allocator = allocator

    def __iter__(self) -> Iterator[ClosedRound]:
        return self._iterate()


__all__ = ["ClosedRound", "Rounds", "StreamRounds"]
