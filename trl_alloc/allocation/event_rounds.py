"""The fillers' rounds (numpy only). Every filler has one round, an `EventRound` fed one rollout at a time, with one
admission rule; the rollout layer's driver (`rollout.drivers.RoundDriver`) runs it over a rollout backend:

    rnd = filler.start_event_round(stream, budget, target_groups, ...)
    while not rnd.done (then until nothing is in flight):
        for pid, n in rnd.submissions(room):          # start n rollouts of prompt pid (room: free window)
        for each batch of rollouts that end:
            rnd.observe_rollouts(rows)                # pid, success (, pruned, aborted); decided on together
        abort the in-flight rollouts of every prompt in rnd.cancelled (all of them once rnd.done)

Deterministic mode runs the same round over a synchronous backend (`SynchronousRound`, `filler.start_round`): an
unlimited window, everything pending generated in one batched call, its rollouts observed together.

Accounting (exact, in both modes): a rollout is spent when it is submitted, so `spent <= budget` at every
moment and what is in flight is already reserved against the budget; every submitted rollout is observed
exactly once. An aborted rollout is a spent response without reward (`aborted`), like a pruned one.

- `sara.SARARound`: SARA's Algorithm 1 (probe, decide by eq. 3, refill, advance by p_eff), per batch of arrivals;
  an abandoned prompt's in-flight rollouts are aborted.
- `baselines.DynamicSamplingRound`: DAPO's dynamic sampling: whole groups, each judged as its k-th rollout ends.
- `baselines.FullRound`: full groups (stock GRPO).
- `BatchedEventRound`: a `SynchronousRound` driven as events (each of its requests is one submission, observed once
  all its rollouts have ended): deterministic mode's timing on the engine model and in the rollout benchmark.

Carry-over (`rollout_mode="stream"`, APRIL-style; a round started with `carry=...`, `{}` for the first): the round
closes as soon as it has its groups or has started its whole budget and observed a rollout (so it never waits on
its slowest rollouts), and its open groups are not aborted. `hand_over(expire)` gives them, with their rollouts
still in flight and what they observed so far, to the next round (`start_event_round(..., carry=...)`), which
resumes them first and excludes them from its fresh stream; so a group may straddle a round boundary. Accounting
stays exact across rounds: a rollout is spent by the round that started it (`outcomes` reports what each prompt
*started* this round, in-flight ones included, so the pacer reserves them), and observed by the round in which it
ends (`prepaid`: the rollouts a round adopted, paid for by an earlier one). A round started with
`wait_for_groups` closes only once it has its groups (or nothing is left to start and nothing runs), carrying only
what runs past that: the stream's last round (nothing after it would carry them), and every round of an engine that
idles while the trainer trains (colocate), where closing early would overlap nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .success import SUCCESS_THRESHOLD, is_success

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

UNLIMITED = 1 << 62  # a synchronous backend's window


class Round:
    """The accounting every filler's round shares (its state machine: `event_rounds.EventRound`).

    Attributes filled as the round runs: ``spent`` (responses generated), ``groups`` (prompt ids
    whose responses go to the loss, in commit order), ``effective`` (how many of those are mixed),
    ``abandoned`` (prompt ids dropped), ``successes`` / ``failures`` (dict prompt id -> count),
    ``pruned`` (dict prompt id -> responses pruned mid-generation, ARROL, docs/arrol.md), ``unscored``
    (dict prompt id -> responses whose reward is NaN: no reward function could score them).

    Pruned and unscored responses are spent budget with no reward: they count in ``spent`` and in the
    ``responses`` of ``outcomes``, never as a success or a failure; fillers decide on the observed
    (completed) rewards only.
    """

    success_threshold = SUCCESS_THRESHOLD

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        self.spent = 0
        self.groups, self.abandoned = [], []
        self.effective = 0
        self.successes, self.failures, self.pruned, self.unscored = {}, {}, {}, {}
        self.generation_calls = 0

    @property
    def done(self) -> bool:
        raise NotImplementedError

    def outcomes(self, num_prompts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-prompt (successes, failures, responses) arrays over the whole pool, for ``Pacer.update``;
        ``responses`` = successes + failures + pruned + unscored."""
        s, f, cut = (np.zeros(num_prompts, np.int64) for _ in range(3))
        for arr, counts in ((s, self.successes), (f, self.failures), (cut, self.pruned), (cut, self.unscored)):
            for pid, v in counts.items():
                arr[pid] += v
        return s, f, s + f + cut

    def stats(self) -> dict[str, float]:
        return {"responses": self.spent, "groups": len(self.groups), "effective_groups": self.effective,
                "abandoned": len(self.abandoned), "generation_calls": self.generation_calls,
                "pruned": int(sum(self.pruned.values())), "unscored": int(sum(self.unscored.values()))}


class EventRound(Round):
    """Accounting and the submission protocol shared by the event rounds; subclasses implement `_next(room)`
    (the (pid, n) to start now) and `_on_rollout(pid, observed)` (observed: 0/1, or None for a rollout that
    ended without a reward: pruned, unscored)."""

    def __init__(self, budget: int, carry: dict[int, dict] | None = None, wait_for_groups: bool = False) -> None:
        super().__init__(budget)
        self.aborted = {}
        self.live = Counter()  # prompt id -> rollouts in flight
        self.cancelled = set()  # prompts whose in-flight rollouts are no longer wanted
        self.started = Counter()  # prompt id -> rollouts this round started (spent)
        self.prepaid = Counter()  # prompt id -> rollouts adopted from an earlier round (spent there)
        self.carries = carry is not None  # stream mode: open groups go on into the next round
        self.after_close = []  # rows that ended after the close, not observed (the driver hands them on)
        self.expired = []  # open groups dropped at the close (too stale to carry)
        self.observed = 0  # rollouts observed by this round (a stream round closes after its first, at the earliest)
        self.wait_for_groups = bool(wait_for_groups)  # a stream round that does not close on its budget alone
        self._closed = False

    def _adopt_carry(self, carry):
        """Take over an earlier round's open groups (`hand_over`): their in-flight rollouts, already spent."""
        for pid, state in (carry or {}).items():
            pid = int(pid)
            if state["live"]:
                self.live[pid] += int(state["live"])
                self.prepaid[pid] += int(state["live"])
            self._adopt(pid, state)

    def _adopt(self, pid, state):
        raise NotImplementedError(f"{type(self).__name__} cannot adopt carried groups.")

    def _open_groups(self):
        """{prompt id: JSON-able state} of the groups neither committed nor dropped (subclasses)."""
        return {}

    def hand_over(self, expire: Iterable[int] = ()) -> dict[int, dict]:
        """At the close of a carrying round: the open groups that go on into the next round, as {prompt id:
        state} (their rollouts in flight move with them). Groups in `expire` are dropped instead (their
        in-flight rollouts join `cancelled`). Rows held in `after_close` of dropped or decided prompts are
        observed here; the carried prompts' rows stay there for the driver to replay into the next round."""
        if not (self.carries and self._closed):
            raise RuntimeError("`hand_over` is for a closed round started with `carry=`.")
        expire = {int(p) for p in expire}
        carry = {}
        for pid, state in self._open_groups().items():
            if pid in expire:
                self.expired.append(pid)
                if self.live[pid] > 0:
                    self.cancelled.add(pid)
                continue
            state["live"] = int(self.live.pop(pid, 0))
            carry[pid] = state
        self.cancelled -= set(carry)
        rows, self.after_close = self.after_close, []
        for r in rows:
            if int(r["pid"]) in carry:
                self.after_close.append(r)
            else:
                self.observe_rollout(r["pid"], r["success"], pruned=r.get("pruned", False),
                                     aborted=r.get("aborted", False))
        return carry

    @property
    def done(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return sum(self.live.values())

    def submissions(self, room: int) -> list[tuple[int, int]]:
        """The rollouts to start now, as (prompt id, n), at most `room` in all; counted as spent."""
        out = [] if self._closed else [(int(p), int(n)) for p, n in self._next(int(room)) if n > 0]
        for pid, n in out:
            self.live[pid] += n
            self.started[pid] += n
            self.spent += n
        if self.spent > self.budget:
            raise RuntimeError(f"an event round started {self.spent} rollouts on a budget of {self.budget}.")
        if out:
            self.generation_calls += 1
        elif not self.in_flight:
            self._close()  # nothing running and nothing left to start
        if self.carries and not self.wait_for_groups and self._exhausted() and self.observed:
            self._close()  # stream mode: its budget is all started; what runs goes on into the next round
        return out

    def _exhausted(self):
        """Nothing more will be started this round (stream mode closes it then)."""
        return self.spent >= self.budget

    def observe_rollout(self, pid: int, success: float, pruned: bool = False, aborted: bool = False) -> None:
        """One ended rollout of `pid`: `success` 1/0 (NaN: unscored), or pruned / aborted (no reward)."""
        self._record(pid, success, pruned, aborted)
        self._settle()

    def observe_rollouts(self, rows: Sequence[dict]) -> list[int]:
        """`observe_rollout` for rows (dicts with pid, success, pruned, aborted), decided on together (`_settle`:
        what ends in one batch is one decision step); returns the prompts to abort. A carrying round keeps the rows
        that follow its close in `after_close` (see `hand_over`)."""
        for i, r in enumerate(rows):
            if self._closed and self.carries:
                self.after_close.extend(rows[i:])
                break
            self._record(r["pid"], r["success"], r.get("pruned", False), r.get("aborted", False))
        self._settle()
        return sorted(self.cancelled)

    def _record(self, pid, success, pruned, aborted):
        pid = int(pid)
        if self.live[pid] <= 0:
            raise ValueError(f"prompt {pid} has no rollout in flight; every submitted rollout is observed once.")
        self.live[pid] -= 1
        self.observed += 1
        if not self.live[pid]:
            del self.live[pid]
            self.cancelled.discard(pid)
        observed = None
        if aborted:
            self.aborted[pid] = self.aborted.get(pid, 0) + 1
        elif pruned:
            self.pruned[pid] = self.pruned.get(pid, 0) + 1
        elif math.isnan(success := float(success)):
            self.unscored[pid] = self.unscored.get(pid, 0) + 1
        else:
            observed = int(is_success(success, self.success_threshold))
            self.successes[pid] = self.successes.get(pid, 0) + observed
            self.failures[pid] = self.failures.get(pid, 0) + 1 - observed
        if not self._closed and not aborted:
            self._on_rollout(pid, observed)

    def _settle(self):
        """After a batch of ended rollouts: decide on them (fillers that decide per batch, like SARA)."""

    def mixed(self, pid: int) -> bool:
        """Whether `pid` has both a success and a failure observed this round (its group has signal)."""
        return self.successes.get(int(pid), 0) >= 1 and self.failures.get(int(pid), 0) >= 1

    def _cancel(self, pid):
        if self.live[pid] > 0:
            self.cancelled.add(pid)

    def _close(self):
        if not self._closed:
            self._closed = True
            open_groups = set(self._open_groups()) if self.carries else set()
            self.cancelled |= {p for p in self.live if p not in open_groups}
            self._closed_hook()

    def _closed_hook(self):
        pass

    def outcomes(self, num_prompts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-prompt (successes, failures, responses started this round): ended rollouts' outcomes, and the
        spend of every rollout this round started (in flight ones too: reserved against the budget)."""
        s, f, _ = super().outcomes(num_prompts)
        spent = np.zeros(num_prompts, np.int64)
        for pid, v in self.started.items():
            spent[pid] += v
        return s, f, spent

    def prepaid_counts(self, num_prompts: int) -> np.ndarray:
        """Per-prompt rollouts this round adopted from an earlier one (`Pacer.update`'s `prepaid`)."""
        out = np.zeros(num_prompts, np.int64)
        for pid, v in self.prepaid.items():
            out[pid] += v
        return out

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "aborted": int(sum(self.aborted.values())),
                "carried_in": int(sum(self.prepaid.values())), "expired": len(self.expired)}


class SynchronousRound:
    """An event round over a synchronous backend (deterministic mode): an unlimited window, everything pending
    generated in one batched call, whose rollouts all end together and are decided on together. So every filler
    has one round, one admission rule, and one `_settle`, whichever way it is driven::

        rnd = filler.start_round(stream, budget, target_groups, ...)   # = SynchronousRound(start_event_round(...))
        while not rnd.done:
            prompt_ids, counts = rnd.requests()      # one batched generation call
            rnd.observe(rewards, pruned=None)        # reward arrays aligned with the request (+ ARROL's pruned masks)
    """

    def __init__(self, rnd: EventRound) -> None:
        self.round = rnd
        self._pending = self._take()

    def __getattr__(self, name: str) -> Any:  # groups, effective, spent, budget, outcomes, stats, ...: the round's
        return getattr(self.__dict__["round"], name)

    @property
    def done(self) -> bool:
        return self.round.done

    def _take(self):
        asked = {}
        for pid, n in self.round.submissions(UNLIMITED):
            asked[pid] = asked.get(pid, 0) + n
        return np.asarray(list(asked), np.int64), np.asarray(list(asked.values()), np.int64)

    def requests(self) -> tuple[np.ndarray, np.ndarray]:
        """(prompt_ids, counts) to generate now, in one batched call; empty arrays when done."""
        return self._pending

    def observe(self, rewards: Sequence[ArrayLike], pruned: Sequence[ArrayLike] | None = None) -> None:
        """Rewards for the last request: a list aligned with ``prompt_ids``, entry j of length counts[j].

        ``pruned`` (optional, aligned like ``rewards``): boolean masks of the responses pruned before they finished
        (ARROL). Their reward entries are ignored (any value, NaN included); they are spent responses but neither
        successes nor failures. A NaN reward of a finished response is an unscored response, treated the same way
        and counted in ``unscored``."""
        ids, counts = self._pending
        if len(rewards) != len(ids):
            raise ValueError(f"`rewards` must hold one array per requested prompt ({len(ids)}), got {len(rewards)}.")
        if pruned is not None and len(pruned) != len(ids):
            raise ValueError(f"`pruned` must hold one mask per requested prompt ({len(ids)}), got {len(pruned)}.")
        rows = []
        for j, (pid, n) in enumerate(zip(ids.tolist(), counts.tolist())):
            r = np.asarray(rewards[j], dtype=float).reshape(-1)
            if r.size != n:
                raise ValueError(f"prompt {pid}: expected {n} rewards, got {r.size}.")
            cut = np.zeros(n, bool) if pruned is None else np.asarray(pruned[j], dtype=bool).reshape(-1)
            if cut.size != n:
                raise ValueError(f"prompt {pid}: expected a pruned mask of {n} entries, got {cut.size}.")
            rows += [{"pid": pid, "success": float(x), "pruned": bool(c)} for x, c in zip(r.tolist(), cut.tolist())]
        self.round.observe_rollouts(rows)
        self._pending = self._take()

    def stats(self) -> dict[str, float]:
        """The round's stats, less what a synchronous round never has (aborted, carried or expired rollouts)."""
        return {key: v for key, v in self.round.stats().items() if key not in ("aborted", "carried_in", "expired")}


class BatchedEventRound:
    """A synchronous round driven as events: each of its requests is submitted (within the window) and observed
    once all its rollouts have ended, in request order; so its decisions are deterministic mode's."""

    def __init__(self, rnd: SynchronousRound) -> None:
        self.round, self.cancelled, self.live = rnd, set(), Counter()
        self._queue, self._request, self._results = [], None, {}

    def __getattr__(self, name: str) -> Any:  # groups, effective, spent, budget, abandoned, ...: the round's
        return getattr(self.__dict__["round"], name)

    @property
    def done(self) -> bool:
        return self.round.done and not self._queue and not self.in_flight

    @property
    def in_flight(self) -> int:
        return sum(self.live.values())

    def submissions(self, room: int) -> list[tuple[int, int]]:
        if self._request is None and not self.round.done:
            ids, counts = self.round.requests()
            if len(ids):
                if len(set(ids.tolist())) != len(ids):
                    raise ValueError("a batched round asked twice for one prompt in one request.")
                self._request = (ids, counts)
                self._queue = [int(p) for p, n in zip(ids.tolist(), counts.tolist()) for _ in range(n)]
                self._results = {int(p): [] for p in ids.tolist()}
        take, self._queue = self._queue[:max(int(room), 0)], self._queue[max(int(room), 0):]
        out = []
        for pid in take:
            if out and out[-1][0] == pid:
                out[-1] = (pid, out[-1][1] + 1)
            else:
                out.append((pid, 1))
            self.live[pid] += 1
        return out

    def observe_rollout(self, pid: int, success: float, pruned: bool = False, aborted: bool = False) -> None:
        pid = int(pid)
        if self.live[pid] <= 0 or aborted:
            raise ValueError(f"prompt {pid}: no rollout in flight to observe (a batched round never aborts).")
        self.live[pid] -= 1
        self._results[pid].append((float(success), bool(pruned)))
        if self._queue or any(self.live.values()):
            return
        ids, counts = self._request
        self._request = None
        got = [self._results[p] for p in ids.tolist()]
        self.round.observe([[r for r, _ in g] for g in got], pruned=[[c for _, c in g] for g in got])

    def observe_rollouts(self, rows: Sequence[dict]) -> list[int]:
        for r in rows:
            self.observe_rollout(r["pid"], r["success"], pruned=r.get("pruned", False),
                                 aborted=r.get("aborted", False))
        return sorted(self.cancelled)

    def outcomes(self, num_prompts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.round.outcomes(num_prompts)

    def stats(self) -> dict[str, float]:
        return {**self.round.stats(), "aborted": 0}


__all__ = ["EventRound", "SynchronousRound", "BatchedEventRound"]
