"""A model of a continuous-batching inference engine on a virtual clock, as a `rollout.events` backend: what
`scripts/plan.py` and the tests use to compare synchronous and event-driven rounds at any scale.

At most `max_num_seqs` rollouts decode at once (the rest wait, first in first out); every running rollout
gains one token per engine step; a step lasts `step_s` seconds whatever the batch (decoding is memory-bound),
prefill is not modelled. `outcome(tag, rng) -> (length, success)` draws a rollout's response length (cut at
its `max_tokens`) and its success, reported in `Rollout.info["success"]`. `busy` counts sequence-steps, so
`idle_fraction` is the share of the engine's slots left empty while the clock ran.
"""

import itertools

import numpy as np

from .events import Rollout


class SimulatedRollouts:
    def __init__(self, outcome, max_num_seqs=256, step_s=1.0, seed=0):
        self.outcome, self.slots, self.step_s = outcome, int(max_num_seqs), float(step_s)
        self.rng = np.random.default_rng(seed)
        self._ids = itertools.count()
        self.waiting, self.running = [], {}  # running: rid -> [rollout, tokens left]
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

    def submit(self, prompt_ids, n=1, max_tokens=16, tag=None):
        rids = []
        for _ in range(int(n)):
            r = Rollout(next(self._ids), tag, list(prompt_ids), int(max_tokens))
            length, success = self.outcome(tag, self.rng)
            r.info = {"length": min(int(length), r.max_tokens), "success": float(success),
                      "truncated": int(length) > r.max_tokens}
            self.waiting.append(r)
            rids.append(r.rid)
        self._admit()
        return rids

    def _admit(self):
        while self.waiting and len(self.running) < self.slots:
            r = self.waiting.pop(0)
            self.running[r.rid] = [r, max(r.info["length"], 1)]

    def next_completed(self, timeout=None):
        """Advance the clock to the next step at which a rollout ends; return the rollouts ending then."""
        if not self.running:
            return []
        dt = min(left for _, left in self.running.values())
        self.steps += dt
        self.busy += dt * len(self.running)
        out = []
        for rid in list(self.running):
            r, left = self.running[rid]
            self.running[rid][1] = left - dt
            if left == dt:
                del self.running[rid]
                r.token_ids = [0] * r.info["length"]
                r.finish_reason = "length" if r.info["truncated"] else "stop"
                out.append(r)
        self._admit()
        return out

    def abort(self, rids):
        out = []
        for rid in rids:
            if rid in self.running:
                r, left = self.running.pop(rid)
                r.token_ids = [0] * (max(r.info["length"], 1) - left)
            else:
                match = [w for w in self.waiting if w.rid == rid]
                if not match:
                    continue
                r = match[0]
                self.waiting.remove(r)
            r.finish_reason = "abort"
            out.append(r)
        self._admit()
        return out

    def close(self):
        self.waiting.clear()
        self.running.clear()


__all__ = ["SimulatedRollouts"]
