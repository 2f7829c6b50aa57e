"""A model of a continuous-batching inference engine on a virtual clock, as a `rollout.events` backend: what
`scripts/plan.py` and the tests use to compare synchronous and event-driven rounds at any scale.

At most `max_num_seqs` rollouts decode at once (the rest wait, first in first out); every running rollout
gains one token per engine step; a step lasts `step_s` seconds whatever the batch (decoding is memory-bound),
prefill is not modelled. `outcome(tag, rng) -> (length, success)` draws a rollout's response length (cut at
its `max_tokens`) and its success, reported in `Rollout.info["success"]`. `busy` counts sequence-steps, so
`idle_fraction` is the share of the engine's slots left empty while the clock ran. `submit(detect_at=L)`:
a rollout longer than L is also delivered as a snapshot (finish reason "detect") when it reaches L tokens,
as `rollout.events.VLLMServerRollouts` does; aborting it frees its slot at once.
"""

import collections
import heapq
import itertools

import numpy as np

from ..allocation.arrol import RandomPruning
from ..allocation.event_rounds import BatchedEventRound
from ..allocation.pipeline import round_arguments
from ..allocation.simulate import DriftingPool, build_method
from .events import Rollout
from .streaming import run_round


class SimulatedRollouts:
    def __init__(self, outcome, max_num_seqs=256, step_s=1.0, seed=0):
        self.outcome, self.slots, self.step_s = outcome, int(max_num_seqs), float(step_s)
        self.rng = np.random.default_rng(seed)
        self._ids = itertools.count()
        self.waiting = collections.deque()
        self.running = {}  # rid -> (rollout, step it started)
        self._ends = []    # heap of (step, 0 = detection point | 1 = end, rid) of running rollouts
        self.steps = self.busy = 0

    @property
    def clock_s(self):
        return self.steps * self.step_s

    @property
    def idle_fraction(self):
        return 1.0 - self.busy / max(self.steps * self.slots, 1)

    @property
    def in_flight(self):
        return len(self.waiting) + len(self.running)

    def submit(self, prompt_ids, n=1, max_tokens=16, tag=None, detect_at=None):
        rids = []
        for _ in range(int(n)):
            r = Rollout(next(self._ids), tag, list(prompt_ids), int(max_tokens))
            length, success = self.outcome(tag, self.rng)
            r.info = {"length": max(min(int(length), r.max_tokens), 1), "success": float(success),
                      "truncated": int(length) > r.max_tokens, "detect_at": detect_at}
            self.waiting.append(r)
            rids.append(r.rid)
        self._admit()
        return rids

    def _admit(self):
        while self.waiting and len(self.running) < self.slots:
            r = self.waiting.popleft()
            if r.finish_reason == "abort":  # aborted while waiting
                continue
            self.running[r.rid] = (r, self.steps)
            heapq.heappush(self._ends, (self.steps + r.info["length"], 1, r.rid))
            at = r.info["detect_at"]
            if at and r.info["length"] > at:
                heapq.heappush(self._ends, (self.steps + at, 0, r.rid))

    def next_completed(self, timeout=None):
        """Advance the clock to the next step at which a rollout ends (or reaches its detection point); return
        the rollouts ending then (and the snapshots)."""
        while self._ends and self._ends[0][2] not in self.running:  # (aborted)
            heapq.heappop(self._ends)
        if not self._ends:
            return []
        end = self._ends[0][0]
        self.busy += (end - self.steps) * len(self.running)
        self.steps = end
        out = []
        while self._ends and self._ends[0][0] == end:
            _, kind, rid = heapq.heappop(self._ends)
            if kind == 0 and rid in self.running:
                r, _ = self.running[rid]
                at = r.info["detect_at"]
                out.append(Rollout(rid, r.tag, r.prompt_ids, r.max_tokens, [0] * at, None, "detect", {"detect_at": at}))
            elif rid in self.running:
                r, _ = self.running.pop(rid)
                r.token_ids = [0] * r.info["length"]
                r.finish_reason = "length" if r.info["truncated"] else "stop"
                out.append(r)
        self._admit()
        return out

    def abort(self, rids):
        out, waiting = [], {w.rid: w for w in self.waiting if w.finish_reason is None}
        for rid in rids:
            if rid in self.running:
                r, started = self.running.pop(rid)
                r.token_ids = [0] * (self.steps - started)
            elif rid in waiting:
                r = waiting[rid]
            else:
                continue
            r.finish_reason = "abort"
            out.append(r)
        self.waiting = collections.deque(w for w in self.waiting if w.finish_reason is None)
        self._admit()
        return out

    def close(self):
        self.waiting.clear()
        self.running.clear()
        self._ends.clear()


def simulate_engine(method, events, args, rounds, prune_keep=None):
    """`rounds` rounds of `method` (plan.py's names, e.g. 'cero+sara') on the engine model, synchronously (each
    filler call submitted whole and decided when its last rollout ends) or as events; the pool is
    `allocation.simulate.DriftingPool`, response lengths lognormal (median `args.length_median`, σ
    `args.length_sigma`) cut at `args.max_tokens`. `prune_keep` (events only): pruning in the stream at
    `args.detect_length` tokens, each cohort's rollouts kept with probability κ = prune_keep (random pruning:
    ARROL's compute saving without its selection, since the model has no head). Returns engine seconds,
    responses, tokens, effective groups, pruned rollouts and the idle share of the engine's slots."""
    pacer, filler, filling = build_method(method, args)
    k = args.units_per_group * args.unit_size
    pool = DriftingPool(args.prompts, args.rounds, drift=args.drift, seed=args.seed)
    total = dict.fromkeys(("engine_s", "responses", "tokens", "aborted", "pruned", "effective_groups", "busy",
                           "slots"), 0)
    pruning = None if prune_keep is None else RandomPruning(keep_ratio=prune_keep, cold_start_rounds=0, seed=args.seed)

    def on_detect(snaps):
        cut = pruning.prune([s.info["cohort"] for s in snaps])
        return [s.rid for s, c in zip(snaps, cut) if c and not s.info["ended"]]

    for i in range(rounds):
        if pacer.finished:
            break
        kw = round_arguments(pacer, pacer.propose(), filling, k, history_decay=args.history_decay)
        rnd = filler.start_event_round(**kw) if events else BatchedEventRound(filler.start_round(**kw))
        p = pool.success_rate()

        def outcome(pid, rng):
            return rng.lognormal(np.log(args.length_median), args.length_sigma), rng.random() < p[pid]

        engine = SimulatedRollouts(outcome, args.engine_seqs, args.step_ms / 1e3, seed=[args.seed, i])
        driver = run_round(rnd, engine, lambda pid: [], lambda r: r.info["success"], args.max_tokens,
                           max_inflight=args.window or None, detect_at=pruning and args.detect_length,
                           on_detect=pruning and on_detect)
        pacer.update(*rnd.outcomes(pacer.num_prompts))
        pool.step(rnd)
        for key, value in (("engine_s", engine.clock_s), ("responses", driver.spent), ("tokens", driver.tokens),
                           ("aborted", driver.aborted), ("pruned", len(driver.pruned)),
                           ("effective_groups", rnd.stats()["effective_groups"]),
                           ("busy", engine.busy), ("slots", engine.steps * engine.slots)):
            total[key] += value
    total["rounds"] = i + 1 if rounds else 0
    total["idle"] = 1.0 - total.pop("busy") / max(total.pop("slots"), 1)
    return total


__all__ = ["SimulatedRollouts", "simulate_engine"]
