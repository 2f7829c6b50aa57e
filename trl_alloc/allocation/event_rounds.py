"""Rounds fed one rollout at a time: the event-driven form of the fillers (numpy only). The rollout layer's
driver (`rollout.streaming.RoundDriver`) runs them over a rollout engine:

    rnd = filler.start_event_round(stream, budget, target_groups, ...)
    while not rnd.done (then until nothing is in flight):
        for pid, n in rnd.submissions(room):          # start n rollouts of prompt pid (room: free window)
        for each rollout that ends:
            rnd.observe_rollout(pid, success, pruned=..., aborted=...)
        abort the in-flight rollouts of every prompt in rnd.cancelled (all of them once rnd.done)

Accounting (exact, in both modes): a rollout is spent when it is submitted, so `spent <= budget` at every
moment and what is in flight is already reserved against the budget; every submitted rollout is observed
exactly once. An aborted rollout is a spent response without reward (`aborted`), like a pruned one.

- `sara.SARAEventRound`: SARA's rule (seed 002 eq. 3) applied as each rollout arrives; the next rollout of the
  prompt is started at once (the rest of its group once it is mixed), a fresh prompt of the stream as soon
  as the budget, the target and the window allow; an abandoned prompt's in-flight rollouts are aborted.
- `baselines.DynamicSamplingEventRound`: DAPO's dynamic sampling: whole groups, each judged as its k-th rollout ends.
- `BatchedEventRound`: any batched `Round` as events (each of its requests is one submission).
"""

from collections import Counter

import numpy as np

from .base import Round, is_success


class EventRound(Round):
    """Accounting and the submission protocol shared by the event rounds; subclasses implement `_next(room)`
    (the (pid, n) to start now) and `_on_rollout(pid, observed)` (observed: 0/1, or None for a rollout that
    ended without a reward: pruned, unscored)."""

    def __init__(self, budget):
        super().__init__(budget)
        self.aborted = {}
        self.live = Counter()  # prompt id -> rollouts in flight
        self.cancelled = set()  # prompts whose in-flight rollouts are no longer wanted
        self._closed = False

    @property
    def done(self):
        return self._closed

    @property
    def in_flight(self):
        return sum(self.live.values())

    def submissions(self, room):
        """The rollouts to start now, as (prompt id, n), at most `room` in all; counted as spent."""
        out = [] if self._closed else [(int(p), int(n)) for p, n in self._next(int(room)) if n > 0]
        for pid, n in out:
            self.live[pid] += n
            self.spent += n
        if self.spent > self.budget:
            raise RuntimeError(f"an event round started {self.spent} rollouts on a budget of {self.budget}.")
        if out:
            self.generation_calls += 1
        elif not self.in_flight:
            self._close()  # nothing running and nothing left to start
        return out

    def observe_rollout(self, pid, success, pruned=False, aborted=False):
        """One ended rollout of `pid`: `success` 1/0 (NaN: unscored), or pruned / aborted (no reward)."""
        pid = int(pid)
        if self.live[pid] <= 0:
            raise ValueError(f"prompt {pid} has no rollout in flight; every submitted rollout is observed once.")
        self.live[pid] -= 1
        if not self.live[pid]:
            del self.live[pid]
            self.cancelled.discard(pid)
        observed = None
        if aborted:
            self.aborted[pid] = self.aborted.get(pid, 0) + 1
        elif pruned:
            self.pruned[pid] = self.pruned.get(pid, 0) + 1
        elif np.isnan(float(success)):
            self.unscored[pid] = self.unscored.get(pid, 0) + 1
        else:
            observed = int(is_success(float(success), self.success_threshold))
            book = self.successes if observed else self.failures
            book[pid] = book.get(pid, 0) + 1
        if not self._closed and not aborted:
            self._on_rollout(pid, observed)

    def observe_rollouts(self, rows):
        """`observe_rollout` for rows (dicts with pid, success, pruned, aborted); returns the prompts to abort."""
        for r in rows:
            self.observe_rollout(r["pid"], r["success"], pruned=r.get("pruned", False), aborted=r.get("aborted", False))
        return sorted(self.cancelled)

    def mixed(self, pid):
        """Whether `pid` has both a success and a failure observed this round (its group has signal)."""
        return self.successes.get(int(pid), 0) >= 1 and self.failures.get(int(pid), 0) >= 1

    def _cancel(self, pid):
        if self.live[pid] > 0:
            self.cancelled.add(pid)

    def _close(self):
        if not self._closed:
            self._closed = True
            self.cancelled |= set(self.live)
            self._closed_hook()

    def _closed_hook(self):
        pass

    def outcomes(self, num_prompts):
        s, f, spent = super().outcomes(num_prompts)
        for pid, v in self.aborted.items():
            spent[pid] += v
        return s, f, spent

    def stats(self):
        return {**super().stats(), "aborted": int(sum(self.aborted.values()))}


class BatchedEventRound:
    """A batched `Round` driven as events: each of its requests is submitted (within the window) and observed
    once all its rollouts have ended, in request order; so its decisions are the batched round's."""

    def __init__(self, rnd):
        self.round, self.cancelled, self.live = rnd, set(), Counter()
        self._queue, self._request, self._results = [], None, {}

    def __getattr__(self, name):  # groups, effective, spent, budget, abandoned, ...: the round's
        return getattr(self.__dict__["round"], name)

    @property
    def done(self):
        return self.round.done and not self._queue and not self.in_flight

    @property
    def in_flight(self):
        return sum(self.live.values())

    def submissions(self, room):
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

    def observe_rollout(self, pid, success, pruned=False, aborted=False):
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

    observe_rollouts = EventRound.observe_rollouts

    def outcomes(self, num_prompts):
        return self.round.outcomes(num_prompts)

    def stats(self):
        return {**self.round.stats(), "aborted": 0}


__all__ = ["EventRound", "BatchedEventRound"]
