"""The engine model: a simulation of a continuous-batching vLLM engine on a virtual clock (no vLLM, no model, no
device), behind the rollout backend's interface (`rollout.backends`): what `scripts/plan.py` and the tests use to
compare synchronous and event-driven rounds at any scale. "The engine" below is that simulated vLLM engine.

At most `max_num_seqs` rollouts decode at once (the rest wait, first in first out); every running rollout gains one
token per engine step; a step lasts `step_s` seconds whatever the batch (a GPU: decoding is memory-bound), or `a +
b · running` for `step_s=(a, b)` (a CPU: compute-bound, fitted on the live server by `scripts/bench_rollout.py
--calibrate`); prefill is not modelled. `outcome(tag, rng) -> (length, success)` draws a rollout's response length
(cut at its `max_tokens`) and its success, reported in `Rollout.info["success"]`. `busy_s` counts slot-seconds
used, so `idle_fraction` is the share of the engine's slots left empty while the clock ran. `submit(detect_at=L)`:
a rollout longer than L is also delivered as a snapshot (finish reason "detect") when it reaches L tokens, as
`rollout.backends.VLLMServerRollouts` does; aborting it frees its slot at once.

The trainer's side of a round: `run_for(s)` lets the engine decode for s seconds while the trainer trains
(overlap: what it finishes is buffered for `next_completed`); `pause_for(s)` holds it idle, its running
rollouts frozen with their KV cache (a weight push with vLLM's `/pause?mode=keep`, or a trainer that needs
the device, or a synchronous trainer's engine waiting for its step).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..allocation.arrol import RandomPruning
from ..allocation.allocator import Allocator, json_default
from ..allocation.rounds import Rounds
from ..allocation.simulate import DriftingPool, plan_allocator
from .backends import Rollout
from .drivers import StreamDriver, backend_rounds


class SimulatedRollouts:
    """The engine model: a simulated vLLM engine on a virtual clock, behind the rollout backend's interface (module
    docstring)."""

    def __init__(self, outcome: Callable[[Any, np.random.Generator], tuple[float, float]], max_num_seqs: int = 256,
                 step_s: float | tuple[float, float] = 1.0, seed: int | Sequence[int] = 0) -> None:
        self.outcome, self.slots = outcome, int(max_num_seqs)
        self.step_a, self.step_b = (float(step_s), 0.0) if isinstance(step_s, (int, float)) else map(float, step_s)
        self.rng = np.random.default_rng(seed)
        self._ids = itertools.count()
        self.waiting = collections.deque()
        self.running = {}  # rid -> (rollout, step it started)
        self._ends = []    # heap of (step, 0 = detection point | 1 = end, rid) of running rollouts
        self._ended = []   # ended while the trainer trained (`run_for`), not yet handed back
        self.steps = 0
        self.decode_s = self.paused_s = self.busy_s = 0.0  # busy_s: slot-seconds in which a rollout decoded

    @property
    def clock_s(self) -> float:
        return self.decode_s + self.paused_s

    @property
    def idle_fraction(self) -> float:
        """The share of the engine's slot-seconds in which no rollout decoded (paused time included)."""
        return 1.0 - self.busy_s / max(self.clock_s * self.slots, 1e-12)

    def step_time(self) -> float:
        """Seconds of one decode step with the rollouts running now."""
        return self.step_a + self.step_b * len(self.running)

    @property
    def in_flight(self) -> int:
        return len(self.waiting) + len(self.running)

    def submit(self, prompt_ids: Sequence[int], n: int = 1, max_tokens: int = 16, tag: Any = None,
               detect_at: int | None = None) -> list[int]:
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

    def generated_tokens(self) -> dict[int, int]:
        """{rollout id: tokens generated so far} of the rollouts waiting or running."""
        out = {r.rid: 0 for r in self.waiting if r.finish_reason is None}
        out.update({rid: min(self.steps - started, r.info["length"]) for rid, (r, started) in self.running.items()})
        return out

    def next_completed(self, timeout: float | None = None) -> list[Rollout]:
        """Advance the clock to the next step at which a rollout ends (or reaches its detection point); return
        the rollouts ending then (and the snapshots), or what ended during `run_for` first."""
        if self._ended:
            out, self._ended = self._ended, []
            return out
        return self._step(None) or []

    def run_for(self, seconds: float) -> None:
        """Decode for `seconds` (the trainer trains meanwhile); what ends is handed back by `next_completed`."""
        target = self.decode_s + float(seconds)
        while (out := self._step(target)) is not None:
            self._ended.extend(out)
        st = self.step_time()
        n = int((target - self.decode_s) // st) if self.running else 0  # whole steps before the target
        self.steps += n
        self.busy_s += n * st * len(self.running)
        self.decode_s = target

    def pause_for(self, seconds: float) -> None:
        """Hold the engine for `seconds`: nothing decodes, running rollouts keep their place."""
        self.paused_s += float(seconds)

    def _step(self, limit_s):
        """Advance to the next step at which something ends (not past `limit_s` seconds of decoding); its
        rollouts, or None."""
        while self._ends and self._ends[0][2] not in self.running:  # (aborted)
            heapq.heappop(self._ends)
        if not self._ends:
            return None
        end = self._ends[0][0]
        need = (end - self.steps) * self.step_time()  # the running set is the same until then
        if limit_s is not None and self.decode_s + need > limit_s + 1e-9:
            return None
        self.busy_s += need * len(self.running)
        self.decode_s += need
        self.steps = end
        out = []
        while self._ends and self._ends[0][0] == end:
            _, kind, rid = heapq.heappop(self._ends)
            if kind == 0 and rid in self.running:
                r, _ = self.running[rid]
                at = r.info["detect_at"]
                out.append(Rollout(rid, r.tag, r.prompt_ids, r.max_tokens, [0] * at, None, "detect",
                                   {"detect_at": at}))
            elif rid in self.running:
                r, _ = self.running.pop(rid)
                r.token_ids = [0] * r.info["length"]
                r.finish_reason = "length" if r.info["truncated"] else "stop"
                out.append(r)
        self._admit()
        return out

    def abort(self, rids: Iterable[int]) -> list[Rollout]:
        """Stop these rollouts; returns them (one that already ended comes back finished, as from vLLM)."""
        out, waiting = [], {w.rid: w for w in self.waiting if w.finish_reason is None}
        ended = {r.rid: r for r in self._ended if r.finish_reason != "detect"}
        for rid in rids:
            if rid in ended:
                out.append(ended[rid])
                continue
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
        gone = {r.rid for r in out}
        self._ended = [r for r in self._ended if r.rid not in gone]
        self._admit()
        return out

    def close(self) -> None:
        self._ended.clear()
        self.waiting.clear()
        self.running.clear()
        self._ends.clear()


class SimulatedTask:
    """The engine model's prompts: the success rates of an `allocation.simulate.DriftingPool` that learns from the
    trained groups, and lognormal response lengths (median `args.length_median`, σ `args.length_sigma`).
    `outcome(pid, rng)`: one rollout's (length, success), as `SimulatedRollouts` asks; `learn(rnd)`: after a round
    closes, its groups count as trained."""

    def __init__(self, args: Any, pool: DriftingPool | None = None) -> None:
        self.pool = pool or DriftingPool(args.prompts, args.rounds, drift=args.drift, seed=args.seed)
        self.rates = self.pool.success_rate()
        self.length_median, self.length_sigma = float(args.length_median), float(args.length_sigma)

    def outcome(self, pid: int, rng: np.random.Generator) -> tuple[float, bool]:
        return rng.lognormal(np.log(self.length_median), self.length_sigma), rng.random() < self.rates[pid]

    def learn(self, rnd: Any) -> None:
        self.pool.step(rnd)
        self.rates = self.pool.success_rate()


def learning_signal(rows: Sequence[dict]) -> float:
    """Σ over the trained groups of p(1 − p), p the group's success rate over its scored rows (neither pruned nor
    aborted, success not NaN): the within-group reward variance of 0/1 rewards, what GRPO's advantages are made of
    (a group with p = 0 or 1 teaches nothing; p = 1/2 the most)."""
    by_group = collections.defaultdict(list)
    for r in rows:
        if not (r.get("pruned") or r.get("aborted")) and not math.isnan(float(r["success"])):
            by_group[int(r["pid"])].append(float(r["success"]) >= 0.5)
    return float(sum(np.mean(s) * (1.0 - np.mean(s)) for s in by_group.values()))


def simulate_engine(method: str, mode: str, args: Any, rounds: int, prune_keep: float | None = None,
                    round_log_path: str | None = None, engine_class: type[SimulatedRollouts] | None = None,
                    on_close: Callable[[Any, Allocator], None] | None = None, resume_after: int | None = None,
                    pool: DriftingPool | None = None) -> dict:
    """`rounds` rounds of `method` (plan.py's names, e.g. 'cero+sara') on the engine model (a simulated vLLM
    engine), with the trainer in the loop. `mode`: "sync" (each filler call submitted whole and decided when its
    last rollout ends), "events" (one `RoundDriver` per round) or "stream" (one `StreamDriver` across rounds:
    carry-over, the next round generating while this one trains, `args.max_staleness`). The pool is
    `allocation.simulate.DriftingPool`, response lengths lognormal (median `args.length_median`, σ
    `args.length_sigma`) cut at `args.max_tokens`. Training a round takes its trained tokens ×
    `args.train_ms_per_token` / `args.train_gpus`, then `args.sync_s` for the weight push; sync and events
    leave the engine idle meanwhile, stream lets it decode through the training (the push pauses it). With
    `args.colocate` (TRL's colocate mode: one GPU generates and trains in turn) the engine is paused while the
    trainer trains in every mode, and stream rounds wait for their groups, carrying only what runs past them.
    `prune_keep` (events): pruning in the stream at `args.detect_length` tokens, each cohort's rollouts kept
    with probability κ = prune_keep (random pruning: ARROL's compute saving without its selection). The rounds are
    the trainer's: its `Allocator`, opened, fed and closed as trainer/event_modes.py does, its round log written to
    `round_log_path` (tests/rollout/test_engine_model_is_the_trainer.py). `engine_class`: another simulated engine
    (one that injects faults, tests/rollout/test_fault_simulation.py); `on_close(driver, allocator)`: called after
    each round is recorded. `resume_after` (sync, events): after that many rounds the allocator is checkpointed
    (its state through JSON) and resumed as a fresh one, as a run resumed from a checkpoint. `pool`: the prompts'
    success rates (a probe pass's, `DriftingPool.from_rates`), else one drawn from `args`. Returns
    wall seconds, responses, tokens, effective groups, the learning signal of the trained groups (`learning_signal`),
    aborted / carried / stale / pruned rollouts, the engine's idle share and the staleness histograms of the trained
    rollouts (their oldest token) and tokens."""
    allocator, config = plan_allocator(method, args, round_log_path=round_log_path)
    task = SimulatedTask(args, pool)
    train_ms, train_gpus = getattr(args, "train_ms_per_token", 0.0), max(getattr(args, "train_gpus", 1), 1)
    sync_s, colocate = getattr(args, "sync_s", 0.0), bool(getattr(args, "colocate", False))
    total = dict.fromkeys(("engine_s", "train_s", "responses", "tokens", "trained_tokens", "aborted", "carried",
                           "stale_aborted", "pruned", "effective_groups", "signal", "busy_s", "slot_s"), 0)
    total["staleness"], total["token_staleness"] = collections.Counter(), collections.Counter()
    pruning = None if prune_keep is None else RandomPruning(keep_ratio=prune_keep, cold_start_rounds=0, seed=args.seed)
    step = (args.step_ms / 1e3, getattr(args, "step_ms_per_seq", 0.0) / 1e3)

    def on_detect(snaps):
        cut = pruning.prune([s.info["cohort"] for s in snaps])
        return [s.rid for s, c in zip(snaps, cut) if c and not s.info["ended"]]

    def close_round(rnd, token_staleness=None):  # a `ClosedRound`; the ended rollouts and events: its driver's
        summary, trained, driver = rnd.summary, rnd.trained, rnd.driver
        ended = [{"pid": r.tag, "completion_ids": r.token_ids} for r in driver.ended]
        events = driver.take_events()
        allocator.record_round(summary, ended, admitted=rnd.admitted, requests=[],
                               loss_responses=len(trained), allocator_s=0.0, round_s=0.0, events=events,
                               responses=summary["stats"]["responses"] if mode == "stream" else None,
                               log_fields=None if token_staleness is None else {"token_staleness": {
                                   str(k): v for k, v in sorted(token_staleness.items())}})
        task.learn(rnd.closed)
        tokens = sum(len(r["completion_ids"]) for r in trained if not (r["pruned"] or r["aborted"]))
        total["trained_tokens"] += tokens
        total["effective_groups"] += summary["stats"]["effective_groups"]
        total["signal"] += learning_signal(trained)
        total["staleness"].update(r.get("staleness", 0) for r in trained)
        for r in trained:
            if not (r["pruned"] or r["aborted"]):
                if r.get("token_staleness"):
                    total["token_staleness"].update(r["token_staleness"])
                elif r["completion_ids"]:
                    total["token_staleness"][0] += len(r["completion_ids"])
        return tokens * train_ms / 1e3 / train_gpus

    def resumed(allocator: Allocator) -> Allocator:  # a fresh allocator, the checkpoint's state (JSON) loaded into it
        state = json.loads(json.dumps(allocator.state_dict(), default=json_default))
        fresh, _ = plan_allocator(method, args, round_log_path=round_log_path)
        fresh.load_state_dict(state, check_plan=False)
        return fresh

    detect = {"detect_at": pruning and args.detect_length, "on_detect": pruning and on_detect}
    success = lambda r: r.info["success"]  # noqa: E731
    i = 0
    if mode == "stream":
        engine = (engine_class or SimulatedRollouts)(task.outcome, args.engine_seqs, step, seed=args.seed)
        driver = StreamDriver(engine, lambda pid: [], args.max_tokens, max_inflight=config.rollout_window,
                              max_staleness=config.max_staleness, **detect)

        def record(rnd):  # at the close, before the next round opens (on a server): the round's training seconds
            train_s = close_round(rnd, driver.token_staleness)
            if on_close is not None:
                on_close(driver, allocator)
            total["train_s"] += train_s
            return train_s

        def train_and_sync(bump):  # the trainer's step, then the weight push (one version on while paused)
            if colocate:  # one GPU: the engine waits for the trainer
                engine.pause_for(train_s + sync_s)
            else:
                engine.run_for(train_s)
                engine.pause_for(sync_s)
            bump()
        for rnd in Rounds.stream(allocator, driver, rounds, colocate, success, push=train_and_sync, record=record):
            train_s = rnd.recorded
            i += 1
        driver.finish()
        total.update(engine_s=engine.clock_s, busy_s=engine.busy_s, slot_s=engine.clock_s * engine.slots,
                     responses=driver.spent, tokens=driver.tokens, aborted=driver.aborted,
                     carried=driver.carried_total,
                     stale_aborted=driver.stale_aborted, pruned=driver.pruned_count)
    else:
        def engine_for(index):  # a fresh engine each round (its own seed)
            return (engine_class or SimulatedRollouts)(task.outcome, args.engine_seqs, step, seed=[args.seed, index])
        rounds_ = backend_rounds(allocator, mode == "events", engine_for, lambda pid: [], success, args.max_tokens,
                                     rounds, max_inflight=config.rollout_window, **detect)
        for rnd in rounds_:
            driver, engine = rnd.driver, rnd.driver.rollouts
            train_s = close_round(rnd)
            if on_close is not None:
                on_close(driver, allocator)
            if resume_after is not None and rnd.index + 1 == resume_after:
                allocator = resumed(allocator)
                rounds_.resume(allocator)
            engine.pause_for(train_s + sync_s)  # the engine waits for the trainer and the push
            for key, value in (("engine_s", engine.clock_s), ("train_s", train_s), ("responses", driver.spent),
                               ("tokens", driver.tokens), ("aborted", driver.aborted), ("pruned", driver.pruned_count),
                               ("busy_s", engine.busy_s), ("slot_s", engine.clock_s * engine.slots)):
                total[key] += value
            i += 1
    total["rounds"] = i
    total["idle"] = 1.0 - total.pop("busy_s") / max(total.pop("slot_s"), 1e-12)
    for key in ("staleness", "token_staleness"):
        total[key] = {int(k): int(v) for k, v in sorted(total[key].items())}
    return total


__all__ = ["SimulatedRollouts", "SimulatedTask", "learning_signal", "simulate_engine"]
