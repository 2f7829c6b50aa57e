"""Event-driven filling: one round of an allocator's event round (`allocation.event_rounds`) run over a
rollout backend (`rollout.backends`), as slime and ROLL keep their engines full: rollouts are started within a
window of `max_inflight`, each is handed back as soon as it ends, the allocator decides on it at once, and
what it no longer wants (an abandoned prompt's siblings, everything once the round is done) is aborted.

    driver = RoundDriver(allocator, rollouts, prompt_ids_of, max_tokens, max_inflight)  # allocator: its round
    while (batch := driver.poll()) is not None:                            # started with start_round(events=True)
        driver.observe(score(batch))       # one row per rollout of the batch: pid, success (, pruned)

Accounting (exact): a rollout is spent when it is started (aborted ones included), so the round's budget
holds at every moment, in-flight rollouts included; every generated token is counted, an aborted rollout's
too; every started rollout ends exactly once. `events` records ("submit" | "prune" | "done" | "abort",
prompt id, rollout id) in the order they happened, for the round log.

In-stream pruning (ARROL's detection point, on backends that support it): with `detect_at`, each rollout
still running at that many tokens is handed to `on_detect` as a snapshot; the rollouts it names are aborted
in the engine and end as pruned (spent, no reward), the others go on in the same request. Snapshots are
decided a *cohort* at a time -- the rollouts of one submission (one prompt, started together) -- once each
of them has reached the point or ended, so a group's survival probabilities (docs/arrol.md) are computed over the
same rollouts as in the batched two-phase path; `snapshot.info["cohort"]` names it and
`snapshot.info["ended"]` marks one that ended while its cohort was incomplete (it can no longer be pruned).
"""

from __future__ import annotations

import collections
import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..allocation.event_rounds import BatchedEventRound
from ..allocation.rounds import Rounds

if TYPE_CHECKING:
    from ..allocation.allocator import Allocator
    from ..allocation.event_rounds import EventRound
    from ..allocation.rounds import ClosedRound
    from .backends import Rollout


class RoundDriver:
    """Runs one event round. `allocator`: an `Allocator` whose round was started with `events=True`,
    or an event round itself (both have `submissions`, `observe_rollouts`, `done`)."""

    def __init__(self, allocator: Allocator | EventRound | BatchedEventRound | None, rollouts: Any,
                 prompt_ids_of: Callable[[int], Sequence[int]], max_tokens: int, max_inflight: int | None = None,
                 timeout: float | None = None, detect_at: int | None = None,
                 on_detect: Callable[[list[Rollout]], Iterable[int]] | None = None) -> None:
        self.allocator, self.rollouts, self.prompt_ids_of = allocator, rollouts, prompt_ids_of
        # in-stream pruning: `on_detect(snapshots)` -> rollout ids to prune, for rollouts at `detect_at` tokens
        self.detect_at, self.on_detect, self.pruned = detect_at, on_detect, set()
        self.pruned_count = 0  # rollouts pruned at the detection point (a stream keeps only current ids in `pruned`)
        self.max_tokens, self.timeout = int(max_tokens), timeout
        self.window = None if max_inflight is None else int(max_inflight)
        self.live, self.events, self.ended = {}, [], []  # live: rollout id -> prompt id
        self.spent = self.tokens = self.aborted = 0
        self.waited_s = 0.0  # seconds spent waiting for the rollout backend
        self._batch, self._held = [], []
        self._cohorts, self._cohort_of = itertools.count(), {}  # rid -> cohort id
        self._unresolved, self._snapshots = {}, {}  # cohort -> rids yet to reach the point or end; its snapshots

    def take_events(self) -> list[tuple[str, int, int]]:
        """The events recorded since the last call (for the round log), leaving none behind."""
        events, self.events = self.events, []
        return events

    def _done(self):
        a = self.allocator
        return a.round_done if hasattr(a, "round_done") else a.done

    def _refill(self):
        while (room := (1 << 62) if self.window is None else self.window - len(self.live)) > 0:
            asked = self.allocator.submissions(room)  # asked again while the window has room (a round may admit
            if not asked:                             # more once rollouts are in flight)
                return
            self._start(asked)

    def _start(self, asked):
        for pid, n in asked:
            extra = {"detect_at": self.detect_at} if self.detect_at else {}
            rids = self.rollouts.submit(self.prompt_ids_of(pid), n=n, max_tokens=self.max_tokens, tag=pid, **extra)
            for rid in rids:
                self.live[rid] = pid
                self.events.append(("submit", pid, rid))
            self._submitted(pid, rids)
            if self.detect_at:
                cohort = next(self._cohorts)
                self._cohort_of.update(dict.fromkeys(rids, cohort))
                self._unresolved[cohort] = set(rids)
            self.spent += n

    def _submitted(self, pid, rids):
        pass

    def poll(self) -> list[Rollout] | None:
        """Start what the allocator asks for, then return the rollouts that have ended (blocking until one
        has); None once the round is done and nothing is in flight."""
        if not self._done():
            self._refill()
        if self._held:
            batch, self._held = self._held, []
        elif not self.live:
            if not self._done():
                raise RuntimeError("the allocator's round is not done but asks for no rollout with none in flight.")
            return None
        else:
            t0 = time.perf_counter()
            batch = self.rollouts.next_completed(timeout=self.timeout)
            self.waited_s += time.perf_counter() - t0
            if not batch:
                raise TimeoutError(f"no rollout ended within {self.timeout} s ({len(self.live)} in flight); is the "
                                   "inference server alive? (raise the timeout for long generations)")
        failed = [r for r in batch if (r.finish_reason or "").startswith("error")]
        if failed:  # a rollout the rollout backend could not generate: the round cannot be decided on
            raise RuntimeError(f"rollout {failed[0].rid} (prompt {failed[0].tag}) failed in the rollout backend: "
                               f"{failed[0].finish_reason[len('error: '):]}")
        if self.detect_at:  # the detection point: prune (abort) or go on, a whole cohort at a time
            ready = self._ready_snapshots(batch)
            batch = [r for r in batch if r.finish_reason != "detect"]
            named = self.on_detect(ready) if self.on_detect and ready else ()
            doomed = [rid for rid in named if rid in self.live and rid not in self.pruned]
            for r in self.rollouts.abort(doomed) if doomed else ():  # all at once: the sooner, the fewer tokens
                if r.finish_reason == "abort":  # (one that ended before the abort took effect is kept, complete)
                    self.pruned.add(r.rid)
                    self.pruned_count += 1
                    self.events.append(("prune", r.tag, r.rid))
                self._held.append(r)
            if not batch:
                return self.poll()
        for r in batch:
            self.live.pop(r.rid, None)
        self._batch = batch
        return batch

    def _ready_snapshots(self, batch):
        """The snapshots of cohorts that became complete with this batch (see the module docstring)."""
        ended = {r.rid for r in batch if r.finish_reason != "detect"}
        for r in batch:
            cohort = self._cohort_of.get(r.rid)
            if cohort is None or cohort not in self._unresolved:
                continue
            self._unresolved[cohort].discard(r.rid)
            if r.finish_reason == "detect":
                r.info["cohort"] = cohort
                self._snapshots.setdefault(cohort, []).append(r)
        ready = [c for c, left in self._unresolved.items() if not left]
        out = []
        for c in ready:
            del self._unresolved[c]
            for r in self._snapshots.pop(c, []):
                r.info["ended"] = r.rid in ended or r.rid not in self.live
                out.append(r)
        return out

    def observe(self, rows: Sequence[dict]) -> None:
        """The rows of the last `poll`'s rollouts, in its order; aborts what the allocator no longer wants."""
        self._book(rows)
        cancelled = set(self.allocator.observe_rollouts(rows))
        if self._done():
            cancelled |= set(self.live.values())
        doomed = [rid for rid, pid in self.live.items() if pid in cancelled]
        if doomed:  # ended ones come back from abort finished; both kinds go through the next poll
            for r in self.rollouts.abort(doomed):
                self.live.pop(r.rid, None)
                self._held.append(r)

    def run(self, success: Callable[[Rollout], float]) -> RoundDriver:
        """Poll until the round is done, scoring each ended rollout with `success(rollout)` -> 1.0, 0.0 or NaN
        (an aborted one: NaN); returns the driver."""
        drive_round(self.poll, lambda batch: [
            {"pid": r.tag, "rid": r.rid, "completion_ids": r.token_ids,
             "success": float("nan") if r.finish_reason == "abort" else float(success(r))} for r in batch],
            self.observe)
        return self

    def _book(self, rows):
        """Flags, events and tokens of the last poll's rows (in its order)."""
        if len(rows) != len(self._batch):
            raise ValueError(f"`observe` needs one row per polled rollout ({len(self._batch)}), got {len(rows)}.")
        for r, row in zip(self._batch, rows):
            cut = r.finish_reason == "abort"
            at_detection = cut and r.rid in self.pruned  # pruned at the detection point: spent, no reward
            row["pruned"] = bool(row.get("pruned")) or at_detection  # (or by the caller's own two-phase pruning)
            row["aborted"] = cut and not at_detection
            row.setdefault("rid", r.rid)
            self.events.append(("abort" if cut else "done", r.tag, r.rid))
            self.tokens += len(row.get("completion_ids", r.token_ids))  # (the caller's, if it generated them)
            self.aborted += int(row["aborted"])
            self.ended.append(r)
        self._batch = []


class StreamDriver(RoundDriver):
    """One rollout stream across rounds (`rollout_mode="stream"`): the engine's window stays full while rounds
    close and open. A round closes when its event round does (target met, budget reached); its open groups go
    on into the next round with their rollouts still running (carried, as APRIL does: neither aborted nor
    waited for), and the next round's submissions start at once, before the caller trains on the closed one.

        driver = StreamDriver(rollouts, prompt_ids_of, max_tokens, max_inflight, max_staleness=1)
        while rounds remain:
            driver.start(filler.start_event_round(..., carry=driver.carry))   # resumes the carried, submits
            driver.run(success)                               # (or poll / observe, scoring the rows elsewhere)
            train on driver.trained; push the weights; driver.push()          # the engine generates meanwhile
        driver.finish()

    Versions: `version` is the policy version the engine generates with (`push` after each weight update).
    Every token records the version that produced it: a rollout starts at the version of its submission, and
    each `push` notes how many tokens each rollout in flight has generated so far (the backend's
    `generated_tokens()`, taken while the engine is paused), so its later tokens belong to the next version.
    `trained`: the closed round's rows of committed groups, each with its `staleness` (version now − the
    version of its oldest token) and `token_staleness` (one entry per completion token); `token_staleness`
    (the driver's): the closed round's trained tokens counted by staleness. At a close, an open group whose
    first rollout was submitted before version + 1 − `max_staleness` could only be trained too stale: it is
    dropped (`expired`), its rollouts in flight are aborted (`stale_aborted`). So no trained token is more
    than `max_staleness` versions older than the policy that trains it. Every started rollout ends exactly
    once: `spent` = ended + in flight, always.

    Memory: the driver holds what is in flight and the current round, never the run's history. `start` clears
    `events` and `ended` (the caller takes a round's from them before opening the next), and a close forgets the
    ids of rollouts that are gone (`pruned`, the detection cohorts); the run's totals are counters (`spent`,
    `tokens`, `aborted`, `pruned_count`, `ended_count`, `carried_total`, `stale_aborted`).
    """

    def __init__(self, rollouts: Any, prompt_ids_of: Callable[[int], Sequence[int]], max_tokens: int,
                 max_inflight: int | None = None, timeout: float | None = None, max_staleness: int = 1,
                 detect_at: int | None = None, on_detect: Callable[[list[Rollout]], Iterable[int]] | None = None,
                 on_observe: Callable[[list[dict]], Any] | None = None) -> None:
        """`on_observe(rows)`: also told every observed batch (a stream's event rounds are fed directly, so the
        pruner that learns from ended rollouts, which an events round's allocator feeds, is fed here)."""
        super().__init__(None, rollouts, prompt_ids_of, max_tokens, max_inflight, timeout, detect_at, on_detect)
        self.on_observe = on_observe
        self.max_staleness = int(max_staleness)
        if self.max_staleness < 1:
            raise ValueError(f"`max_staleness` must be >= 1 in stream mode (got {max_staleness}): rollouts started "
                             "while a round trains are one version old; use rollout_mode='events' to stay on-policy.")
        self.version = 0
        self.started_at, self.group_version = {}, {}  # rid -> version at submission; pid -> its group's first
        self.marks = {}  # rid -> its token count at each push since its submission (tokens from there on: newer)
        self.token_staleness = collections.Counter()  # the closed round's trained tokens by staleness
        self.carry, self.held, self.trained = {}, {}, []  # handed-over groups; pid -> rows held; the last round's
        self.stale_aborted = self.carried = self.carried_total = self.ended_count = 0
        self.replay, self._closed = [], True  # rows that ended after a close, for the next round
        self._orphans = {}  # rid -> the closed round that dropped it, for rollouts still to come back

    def _submitted(self, pid, rids):
        self.group_version.setdefault(pid, self.version)
        self.started_at.update(dict.fromkeys(rids, self.version))

    def start(self, allocator: EventRound) -> None:
        """Open the next round: an event round started with `carry=driver.carry`; the rows that ended after the
        last close are replayed into it, then its first submissions start."""
        self.allocator, self.trained, self._closed = allocator, [], False
        self.events, self.ended = [], []  # this round's (the class docstring: Memory)
        rows, self.replay = self.replay, []
        if rows:
            self._after_observe(self.allocator.observe_rollouts(rows))
        if not self._closed and not self._done():
            self._refill()

    def push(self) -> None:
        """The engine generates with the next policy version from now on: call after each weight push, while the
        engine is still paused (its rollouts in flight have exactly the tokens the old version generated)."""
        counts = self.rollouts.generated_tokens()
        for rid in self.live:
            if rid in counts:  # (not there: ended in the engine, not yet handed back -- all its tokens are older)
                self.marks.setdefault(rid, []).append(int(counts[rid]))
        self.version += 1

    def _versioned(self, row):
        """`row` with its `staleness` and `token_staleness` (module docstring: Versions)."""
        marks, now, v0 = self.marks.get(row["rid"], ()), self.version, self.started_at[row["rid"]]
        tokens = np.arange(len(row.get("completion_ids", ())))  # token i is older by the pushes at marks <= i
        per_token = (now - v0 - np.searchsorted(np.sort(np.asarray(marks, np.int64)), tokens, side="right")).tolist()
        return dict(row, staleness=now - v0 - sum(m == 0 for m in marks), token_staleness=per_token)

    def poll(self) -> list[Rollout] | None:
        if self._closed:
            return None
        while not self._done():
            batch = super().poll()
            if batch is None:
                break
            batch = self._drop_orphans(batch)
            if batch:
                self._batch = batch
                return batch
        self._close_round()
        return None

    def _drop_orphans(self, batch):
        """Rollouts a closed round dropped that ended before its abort reached them (the rollout backend hands
        them back later): observed there as aborted, never shown to the caller."""
        keep = []
        for r in batch:
            old = self._orphans.pop(r.rid, None)
            if old is None:
                keep.append(r)
                continue
            self._discard(old, r)
        return keep

    def _discard(self, rnd, r):
        pruned = r.rid in self.pruned
        rnd.observe_rollout(r.tag, math.nan, pruned=pruned, aborted=not pruned)
        self.events.append(("prune" if pruned else "abort", r.tag, r.rid))
        self.tokens += len(r.token_ids)
        self.aborted += int(not pruned)
        self.ended_count += 1

    def observe(self, rows: Sequence[dict]) -> None:
        self._book(rows)
        self.ended_count += len(rows)
        for row in rows:
            if not row["aborted"]:
                self.held.setdefault(int(row["pid"]), []).append(row)
        if self.on_observe is not None:
            self.on_observe([row for row in rows if not row["aborted"]])
        self._after_observe(self.allocator.observe_rollouts(rows))

    def _after_observe(self, cancelled):
        if self._done():
            return self._close_round()
        cancelled = set(cancelled)
        doomed = [rid for rid, pid in self.live.items() if pid in cancelled]
        if doomed:
            for r in self.rollouts.abort(doomed):
                self.live.pop(r.rid, None)
                self._held.append(r)

    def _close_round(self):
        if self._closed:
            return
        self._closed = True
        rnd, bound = self.allocator, self.version + 1 - self.max_staleness
        expire = {pid for pid, v in self.group_version.items() if v < bound}
        self.carry = rnd.hand_over(expire)
        carried = set(self.carry)
        self.replay, rnd.after_close = rnd.after_close, []
        held_back = [r for r in self._held if r.tag not in carried]  # ended, not yet observed: not wanted now
        self._held = [r for r in self._held if r.tag in carried]
        doomed = [rid for rid, pid in self.live.items() if pid not in carried]
        for r in (self.rollouts.abort(doomed) if doomed else []) + held_back:
            self.live.pop(r.rid, None)
            self._discard(rnd, r)
            self.stale_aborted += int(r.tag in expire)
        for rid in doomed:  # ended before the abort reached it: it comes back through a later poll
            if rid in self.live:
                self._orphans[rid] = rnd
                self.stale_aborted += int(self.live[rid] in expire)
        self.trained = [self._versioned(row) for pid in rnd.groups for row in self.held.get(int(pid), ())]
        self.token_staleness = collections.Counter()
        for row in self.trained:
            self.token_staleness.update(row["token_staleness"])
        self.held = {pid: rows for pid, rows in self.held.items() if pid in carried}
        self.group_version = {pid: v for pid, v in self.group_version.items() if pid in carried}
        self.carried = sum(state["live"] for state in self.carry.values())
        self.carried_total += self.carried
        keep = set(self.live) | {row["rid"] for rows in self.held.values() for row in rows}
        self.started_at = {rid: v for rid, v in self.started_at.items() if rid in keep}
        self.marks = {rid: m for rid, m in self.marks.items() if rid in keep}
        self._forget_gone(set(self.live) | set(self._orphans) | {r.rid for r in self._held})

    def _forget_gone(self, coming):
        """Keep the pruning ids and detection cohorts of the rollouts still to come back (`coming`) only."""
        self.pruned &= coming
        self._cohort_of = {rid: c for rid, c in self._cohort_of.items() if rid in coming}
        for cohort, left in list(self._unresolved.items()):
            left &= coming
            if not left:  # its prompt is gone: nothing more of it is decided on
                del self._unresolved[cohort]
                self._snapshots.pop(cohort, None)

    def finish(self) -> list[Rollout]:
        """End the stream: abort what is still running (spent by the rounds that started it); returns them."""
        out = self.rollouts.abort(list(self.live)) if self.live else []
        while len(out) < len(self.live):  # ended before the abort reached them: already handed back
            batch = [r for r in self.rollouts.next_completed(timeout=self.timeout or 60)
                     if r.finish_reason != "detect"]
            if not batch:
                break
            out += [r for r in batch if r.rid in self.live]
        for r in out:
            self.live.pop(r.rid, None)
            self.events.append(("abort", r.tag, r.rid))
            self.tokens += len(r.token_ids)
            self.ended_count += 1
        self.carry, self.held = {}, {}
        return out


def drive_round(poll: Callable[[], Sequence[Any] | None], score: Callable[[Sequence[Any]], list[dict]],
                observe: Callable[[list[dict]], Any]) -> list[dict]:
    """The inner loop of every event round, in one copy: `poll()` the ended rollouts until the round is done,
    `score` each batch into rows, `observe` them (the allocator decides). `RoundDriver.run` passes the driver's own
    methods; the trainer passes them wrapped to run on its main process, and scores across its ranks
    (trainer/event_modes.py). Returns every row scored."""
    rows: list[dict] = []
    while (batch := poll()) is not None:
        new = score(batch)
        rows.extend(new)
        observe(new)
    return rows


def run_round(allocator: Allocator | EventRound | BatchedEventRound, rollouts: Any,
              prompt_ids_of: Callable[[int], Sequence[int]], success: Callable[[Rollout], float], max_tokens: int,
              max_inflight: int | None = None, timeout: float | None = None, detect_at: int | None = None,
              on_detect: Callable[[list[Rollout]], Iterable[int]] | None = None) -> RoundDriver:
    """Run a whole event round with `success(rollout)` -> 1.0, 0.0 or NaN as the score; returns the driver
    (its `ended` rollouts, `events`, `spent`, `tokens`, `aborted`, `pruned`)."""
    driver = RoundDriver(allocator, rollouts, prompt_ids_of, max_tokens, max_inflight, timeout, detect_at, on_detect)
    return driver.run(success)


def backend_rounds(allocator: Allocator, events: bool, rollouts_for: Callable[[int], Any],
                   prompt_ids_of: Callable[[int], Sequence[int]], success: Callable[[Rollout], float], max_tokens: int,
                   rounds: int, close_rollouts: bool = False, record: Callable[[ClosedRound], Any] | None = None,
                   **driver_kwargs: Any) -> Rounds:
    """The round runner's synchronous rounds over a rollout backend (`allocation.rounds.Rounds.driven`): round i
    run by a `RoundDriver` (the round's `driver`) over `rollouts_for(i)` (closed after it with `close_rollouts`),
    each filler call submitted whole unless `events`; its trained rows the committed groups'. `driver_kwargs`:
    `RoundDriver`'s."""
    def drive(i: int) -> RoundDriver:
        rollouts = rollouts_for(i)
        try:  # events: each rollout decided as it ends; else each call submitted whole
            driven = runner.allocator if events else BatchedEventRound(runner.allocator.current_round)
            return run_round(driven, rollouts, prompt_ids_of, success, max_tokens, **driver_kwargs)
        finally:
            if close_rollouts:
                rollouts.close()

    def complete_and_record(rnd: ClosedRound) -> Any:  # its driver and committed groups' rows, then `record`
        rnd.driver, kept = rnd.result, set(rnd.summary["groups"])
        rnd.trained = [{"pid": r.tag, "completion_ids": r.token_ids, "pruned": r.rid in rnd.driver.pruned,
                        "aborted": r.finish_reason == "abort", "success": r.info.get("success")}
                       for r in rnd.driver.ended if r.tag in kept]
        return None if record is None else record(rnd)
    runner = Rounds.driven(allocator, rounds, drive, events, record=complete_and_record)
    return runner


__all__ = ["RoundDriver", "StreamDriver", "backend_rounds", "drive_round", "run_round"]
