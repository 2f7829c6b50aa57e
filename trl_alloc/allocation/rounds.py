"""The round runner: a run's rounds, in one place, for every rollout mode and every caller (framework-free).

`Rounds` opens, drives and closes each round, hands it to its `record` hook, decides when the run stops (its
rounds done, or the budget spent: `Allocator.more_rounds`) and, in a stream, when the next round opens and when
the weights are pushed. The trainer (trainer/grpo.py; TRL pulls one round per generation batch, so it calls
`next()` on the same iterator), the engine model (`rollout.engine_model.simulate_engine`, scripts/plan.py), the
pool simulator (`allocation.simulate`), the rollout bench (`benchmarks.rollout`) and the tests all iterate it:

    rounds = Rounds.driven(allocator, num_rounds, drive, events, step, record)        # drive(i) runs round i
    rounds = backend_rounds(allocator, events, rollouts_for, prompt_ids_of, score, max_tokens, num_rounds)
    rounds = Rounds.stream(allocator, stream_driver, num_rounds, colocate, score, push=push, record=record)

(`rollout.drivers.backend_rounds`: `driven` rounds over a rollout backend, a `RoundDriver` each.)
    for rnd in rounds:          # a `ClosedRound`, already recorded: its summary, the filler's round, rows, result
        ...train on rnd.trained...

Each allocator call goes through `step(method, *args)` (the trainer's: made on its main process, the result
handed to every rank; the default makes it in place).

A stream (`rollout_mode="stream"`) keeps one `StreamDriver` across rounds, in `StreamRounds`' order:

    round i:  begin (opened now, unless it already is) → drive to the close → close → record(rnd)
              → a server: round i+1 opens now, generating while round i trains
              → yield rnd (the caller trains) → push(bump) after a round that trained (bump: one policy version
                on, called while the engine is still paused) → a colocate engine: round i+1 opens now

Rules (one copy of each): a round waits for its groups when it is the last one (nothing after it to carry them)
or on a colocate engine (it idles while the trainer trains, so closing early would overlap nothing); the next round
opens before the training step on a server and after the push on a colocate engine (so its fresh rollouts start
on the new weights); a round that trained nothing pushes nothing (its optimizer step ran at learning rate 0: no new
policy version, so the rollouts in flight grow no older).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .allocator import call_in_place

if TYPE_CHECKING:
    from .allocator import Allocator

Step = Callable[..., Any]
Driver = Any  # a rollout driver (`rollout.drivers.RoundDriver` / `StreamDriver`; duck-typed: this layer is numpy only)


class StreamRounds:
    """The order of a stream's rounds over one `StreamDriver` (module docstring); `Rounds.stream` drives it, on the
    main process."""

    def __init__(self, allocator: Allocator, driver: Driver, rounds: int, colocate: bool = False) -> None:
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

    def close(self) -> dict[str, Any]:
        """Close the open round (its driver polled and observed to the close); the allocator's summary."""
        self.is_open = False
        self.closed += 1
        return self.allocator.finish_round()

    def after_close(self) -> None:
        """On a server, the next round opens before the training step, so the engine generates while it trains."""
        if self.more and not self.colocate:
            self.open()

    def after_train(self, trained: bool) -> None:
        """After the training step (and the weight push, if it `trained`): one policy version on, only after a round
        that trained; then, on a colocate engine, the next round."""
        if trained:
            self.driver.push()
        if self.more and self.colocate and not self.is_open:
            self.open()


@dataclass
class ClosedRound:
    """One closed round, as `Rounds` yields it."""

    index: int                    # rounds closed before it in this loop
    summary: dict[str, Any]       # `Allocator.finish_round`'s
    closed: Any                   # the filler's closed round
    driver: Driver | None         # its rollout driver, if any
    trained: list[dict[str, Any]] = field(default_factory=list)  # the rows that reach the loss
    admitted: int = 0             # prompts the pacer admitted when the round opened
    result: Any = None            # what the round's `drive` returned
    recorded: Any = None          # what the run's `record` hook returned (the trainer: its loss batches)


class Rounds:
    """A run's rounds (module docstring); build it with `driven` (or `rollout.drivers.backend_rounds`) or
    `stream`. It stops after `rounds` rounds or once the pacer has spent the budget (`Allocator.more_rounds`).
    Between synchronous rounds, `resume(allocator)` goes on with another allocator (one a checkpoint's state was
    loaded into, as a resumed run's)."""

    def __init__(self, allocator: Allocator, rounds: int, record: Callable[[ClosedRound], Any] | None = None,
                 min_responses: int = 1) -> None:
        self.allocator, self.rounds, self.min_responses = allocator, int(rounds), int(min_responses)
        self.record = record or (lambda rnd: None)
        self._iterate: Callable[[], Iterator[ClosedRound]] = lambda: iter(())

    @classmethod
    def driven(cls, allocator: Allocator, rounds: int, drive: Callable[[int], Any], events: bool = False,
               step: Step = call_in_place, record: Callable[[ClosedRound], Any] | None = None,
               min_responses: int = 1) -> Rounds:
        """Synchronous (`events` False: each filler call submitted whole) or event-driven rounds: each opened,
        `drive(i)` run inside it (its result is the round's `result`), closed (`Allocator.one_round`) and recorded
        (`record(rnd)`), then yielded. The run stops with fewer than `min_responses` of the budget left (the
        planner: one group)."""
        self = cls(allocator, rounds, record, min_responses)

        def iterate() -> Iterator[ClosedRound]:
            i = 0
            while self.allocator.more_rounds(i, self.rounds, self.min_responses):
                admitted, result, summary = self.allocator.one_round(lambda: drive(i), events, step)
                rnd = ClosedRound(i, summary, self.allocator.closed_round, None, [], admitted, result)
                rnd.recorded = self.record(rnd)
                yield rnd
                i += 1
        self._iterate = iterate
        return self

    @classmethod
    def stream(cls, allocator: Allocator, driver: Driver | None, rounds: int, colocate: bool = False,
               success: Callable[[Any], float] | None = None,
               push: Callable[[Callable[[], None]], None] | None = None,
               after_round: Callable[[ClosedRound], None] | None = None, *, drive: Callable[[], Any] | None = None,
               step: Step = call_in_place, record: Callable[[ClosedRound], Any] | None = None,
               push_first: bool = False) -> Rounds:
        """One `StreamDriver` across rounds, in `StreamRounds`' order (module docstring). Each round is driven to its
        close by `drive()` (default: the driver's own poll and observe, scored by `success`), closed and
        recorded; the caller trains in the loop's body. `push(bump)`: after a round that trained, the new weights to
        the engine, then `bump()` while the engine is still paused (default: `bump()` alone); `push_first`: a push
        before the first round too (a resumed run's engine gets the checkpoint's weights). `after_round(rnd)` ends
        the round's cycle (after its push: what a round's seconds include). `driver` is None off the trainer's main
        process, where `step` makes no call."""
        self = cls(allocator, rounds, record)
        run = drive or (lambda: driver.run(success))
        pushed = push or (lambda bump: bump())

        def iterate() -> Iterator[ClosedRound]:
            loop = StreamRounds(allocator, driver, self.rounds, colocate)

            def after_train(trained: bool) -> None:
                if trained:
                    pushed(lambda: step(loop.after_train, True))
                else:  # an empty round: no policy update, nothing pushed
                    step(loop.after_train, False)
            if push_first:
                after_train(True)
            i = 0
            while True:
                admitted = step(loop.begin)
                closed = allocator.current_round
                result = run()
                summary = step(loop.close)
                rnd = ClosedRound(i, summary, closed, driver, [] if driver is None else driver.trained, admitted,
                                  result)
                rnd.recorded = self.record(rnd)
                more = allocator.more_rounds(i + 1, self.rounds)  # (the rule `loop.more` applies, on every rank)
                if more:
                    step(loop.after_close)  # a server: the next round generates while this one trains
                yield rnd
                i += 1
                after_train(bool(rnd.trained))
                if after_round is not None:
                    after_round(rnd)
                if not more:
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
