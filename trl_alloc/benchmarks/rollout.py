"""The rollout benchmark's parts (`scripts/bench_rollout.py`): each method's rounds run against one vLLM server,
synchronously (every call submitted whole, decided when its last rollout ends, as TRL's and verl's loops do) or
as events (`rollout.drivers.RoundDriver`), scored as rollouts end, with the engine's occupancy sampled from
the server's own `/metrics` gauge (`vllm:num_requests_running`). With pruning (ARROL in the stream), the
quality head is sent to the server each round, the worker scores each rollout at the detection point, and
the head learns from the round's completed rollouts as in the trainer (`rollout.pruning.RolloutPruner`).
The policy stays fixed; `train_s` stands in for the trainer's step after each round: synchronous and event
rounds wait for it (the engine idles), a stream (`rollout.drivers.StreamDriver`) keeps generating through it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import requests
from scipy.optimize import nnls

from ..allocation.allocator import Allocator
from ..allocation.rounds import Rounds
from ..rollout.backends import VLLMServerRollouts
from ..rollout.drivers import StreamDriver, backend_rounds
from ..rollout.pruning import RolloutPruner

if TYPE_CHECKING:
    from vllm import LLM

    from ..rollout.backends import Rollout
    from ..rollout.colocate import VLLMColocateRollouts
    from ..rollout.quality_head import QualityHead
    from ..trainer.config import AllocGRPOConfig

ARROL = {"pruning": "arrol", "pruning_min_auc": 0.0}  # the paper's ARROL: prune from the cold start's end
# name -> (pacing, filling, rollout mode: "sync" | "events" | "stream", other config fields)
ROLLOUT_METHODS = {
    "stock": ("uniform", "full", "sync", {}),
    "stock_arrol_events": ("uniform", "full", "events", ARROL),
    "stock_stream": ("uniform", "full", "stream", {}),
    "dapo_sync": ("uniform", "dynamic_sampling", "sync", {}),
    "dapo_events": ("uniform", "dynamic_sampling", "events", {}),
    "dapo_stream": ("uniform", "dynamic_sampling", "stream", {}),
    "sara_sync": ("uniform", "sara", "sync", {}),
    "sara_events": ("uniform", "sara", "events", {}),
    "cero_sara_events": ("cero", "sara", "events", {}),
    "cero_sara_stream": ("cero", "sara", "stream", {}),
    "cero_sara_arrol_stream": ("cero", "sara", "stream", ARROL),
    "cero_sara_arrol_events": ("cero", "sara", "events", ARROL),
    "cero_sara_arrol_mixed_events": ("cero", "sara", "events", {**ARROL, "prune_undecided": False}),
}


class ServerBackend:
    """Rollouts as streamed requests to a vLLM server; occupancy from its `/metrics`."""

    colocate = False

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def rollouts(self, config: AllocGRPOConfig, window: int,
                 quality_head: QualityHead | None = None) -> VLLMServerRollouts:
        return VLLMServerRollouts(self.base_url, temperature=config.temperature, top_p=config.top_p,
                                  max_inflight=window, request_timeout=600, quality_head=quality_head)

    def monitor(self, window: int) -> EngineMonitor:
        return EngineMonitor(self.base_url, window)


class ColocateBackend:
    """Rollouts of a colocate `vllm.LLM` in this process (`rollout.colocate`), stepped by the driver: the engine only
    runs while a round polls it (no occupancy gauge: idle and occupancy are reported as NaN)."""

    colocate = True

    def __init__(self, llm: LLM) -> None:
        self.llm = llm

    def rollouts(self, config: AllocGRPOConfig, window: int,
                 quality_head: QualityHead | None = None) -> VLLMColocateRollouts:
        from ..rollout.colocate import VLLMColocateRollouts

        return VLLMColocateRollouts(self.llm, temperature=config.temperature, top_p=config.top_p,
                                    quality_head=quality_head)

    def monitor(self, window: int) -> _NoMonitor:
        return _NoMonitor()


class _NoMonitor:
    active, idle, occupancy = False, float("nan"), float("nan")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class EngineMonitor:
    """Samples the server's running-request gauge every `period` s while active: `idle` is the share of
    samples with nothing running, `occupancy` the mean running requests over `slots`."""

    def __init__(self, base_url: str, slots: int, period: float = 0.1) -> None:
        self.url, self.slots, self.period = base_url.rstrip("/") + "/metrics", int(slots), period
        self.samples, self._stop, self._thread = [], threading.Event(), None
        self.active = False  # sample only while a round runs

    def _running(self):
        text = requests.get(self.url, timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:num_requests_running"))

    def __enter__(self):
        def loop():
            while not self._stop.is_set():
                try:
                    if self.active:
                        self.samples.append(self._running())
                except requests.RequestException:
                    pass
                self._stop.wait(self.period)
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def idle(self) -> float:
        return float(np.mean(np.asarray(self.samples) == 0)) if self.samples else float("nan")

    @property
    def occupancy(self) -> float:
        return float(np.mean(self.samples) / self.slots) if self.samples else float("nan")


def run_rounds(method: str, config: AllocGRPOConfig, backend: ServerBackend | ColocateBackend,
               prompt_ids_of: Callable[[int], Sequence[int]], score: Callable[[Rollout], float], rounds: int,
               num_prompts: int, hidden_size: int | None = None, train_s: float = 0.0) -> dict[str, Any]:
    """`rounds` rounds of `method` (a ROLLOUT_METHODS name) on `backend` (`ServerBackend` or `ColocateBackend`); the
    policy stays fixed.

    config: an `AllocGRPOConfig` with the method's pacing, filling (and pruning); prompt_ids_of(pid) -> token
    ids; score(rollout) -> its success (1/0); hidden_size: the served model's (for the quality head); train_s:
    the trainer's step after each round (module docstring). Returns per-round figures, the engine's occupancy
    and, with pruning, the scored snapshots of the last round."""
    mode = ROLLOUT_METHODS[method][2]
    if mode == "stream":
        return _run_stream(config, backend, prompt_ids_of, score, rounds, num_prompts, train_s, hidden_size)
    events = mode == "events"
    plan = {"pacing": config.pacing, "filling": config.filling, "pruning": config.pruning}
    pruner = None if not config.prunes else RolloutPruner(config, hidden_size=hidden_size, seed=config.seed)
    allocator = Allocator.from_config(config, num_prompts, config.num_rounds, plan=plan, pruner=pruner)
    window = config.rollout_window
    per_round, snapshots, head_state = [], [], None

    def on_detect(snaps):
        snapshots.extend(snaps)
        return pruner.decide_snapshots(snaps, allocator.current_round)

    completed, score = _recording(score)

    def rollouts_for(_):  # a fresh backend each round; the engine is watched while the round runs
        nonlocal head_state
        snapshots.clear()
        head_state = None if pruner is None else {k: v.clone() for k, v in pruner.head.state_dict().items()}
        monitor.active = True
        return backend.rollouts(config, window, None if pruner is None else pruner.head)
    with backend.monitor(window) as monitor:
        t0 = time.perf_counter()
        for rnd in backend_rounds(allocator, events, rollouts_for, prompt_ids_of, score,
                                      config.max_completion_length, rounds, close_rollouts=True, max_inflight=window,
                                      timeout=600, detect_at=pruner and pruner.detect_length,
                                      on_detect=pruner and on_detect):
            driver, rollouts, summary = rnd.driver, rnd.driver.rollouts, rnd.summary
            time.sleep(train_s)  # the trainer's step: the engine waits (and is watched)
            monitor.active = False
            stats = summary["stats"]
            per_round.append({"s": time.perf_counter() - t0, "responses": driver.spent, "tokens": driver.tokens,
                              "aborted": driver.aborted, "pruned": driver.pruned_count,
                              "effective_groups": stats["effective_groups"], "groups": stats["groups"],
                              "submissions": stats["generation_calls"], "scored": rollouts.scored,
                              "scoring_s": rollouts.scoring_s + rollouts.hook_s, **summary.get("pruning", {})})
            t0 = time.perf_counter()
    return {"rounds": per_round, "idle": monitor.idle, "occupancy": monitor.occupancy, "head_state": head_state,
            "snapshots": [{"prompt_ids": r.prompt_ids, "token_ids": r.token_ids, "score": r.info["score"]}
                          for r in snapshots if "score" in r.info], "completed": completed}


def _recording(score):
    """`score`, keeping (prompt id, tokens, success) of every scored rollout (the engine model's calibration)."""
    completed = []

    def scored(r):
        value = float(score(r))
        completed.append((int(r.tag), len(r.token_ids), value))
        return value
    return completed, scored


def _run_stream(config, backend, prompt_ids_of, score, rounds, num_prompts, train_s, hidden_size=None):
    """`run_rounds` as one stream across rounds: the next round opens and submits before the trainer's step (on a
    colocate engine, which idles meanwhile, after it; and each round waits for its groups). With pruning, ARROL in
    the stream: the head (trained at each close) is re-sent to the engine after each push."""
    plan = {"pacing": config.pacing, "filling": config.filling, "pruning": config.pruning}
    pruner = None if not config.prunes else RolloutPruner(config, hidden_size=hidden_size, seed=config.seed)
    allocator = Allocator.from_config(config, num_prompts, config.num_rounds, plan=plan, pruner=pruner)
    window = config.rollout_window
    rollouts = backend.rollouts(config, window, None if pruner is None else pruner.head)
    detect = {} if pruner is None else {
        "detect_at": pruner.detect_length, "on_observe": pruner.record,
        "on_detect": lambda snaps: pruner.decide_snapshots(snaps, allocator.current_round)}
    driver = StreamDriver(rollouts, prompt_ids_of, config.max_completion_length, window, timeout=600,
                          max_staleness=config.max_staleness, **detect)
    per_round, staleness = [], []
    completed, score = _recording(score)

    def train_step(bump):  # the trainer's step (a server generates meanwhile), then the head the close trained
        time.sleep(train_s)
        if pruner is not None:
            rollouts.load_head(pruner.head)
        bump()
    with backend.monitor(window) as monitor:
        monitor.active = True
        try:
            t0, spent0, tokens0, aborted0, pruned0 = time.perf_counter(), 0, 0, 0, 0

            def figures(rnd):  # a round's cycle: from the end of the last one's to the end of its own training step
                nonlocal t0, spent0, tokens0, aborted0, pruned0
                staleness.extend(row["staleness"] for row in rnd.trained)
                stats = rnd.summary["stats"]
                per_round.append({"s": time.perf_counter() - t0, "responses": stats["responses"],
                                  "tokens": driver.tokens - tokens0, "aborted": driver.aborted - aborted0,
                                  "pruned": driver.pruned_count - pruned0,
                                  "effective_groups": stats["effective_groups"],
                                  "groups": stats["groups"],
                                  "submissions": stats["generation_calls"], "carried": driver.carried,
                                  "stale_aborted": stats["expired"], "started": driver.spent - spent0})
                t0, spent0, tokens0 = time.perf_counter(), driver.spent, driver.tokens
                aborted0, pruned0 = driver.aborted, driver.pruned_count
            for _ in Rounds.stream(allocator, driver, rounds, backend.colocate, score, push=train_step,
                                   after_round=figures):
                pass  # (nothing to train: the policy stays fixed)
        finally:
            monitor.active = False
            driver.finish()
            rollouts.close()
    return {"rounds": per_round, "idle": monitor.idle, "occupancy": monitor.occupancy, "head_state": None,
            "snapshots": [], "staleness": {int(k): staleness.count(k) for k in sorted(set(staleness))},
            "completed": completed}


def measure_step_time(base_url: str, prompt_ids: Sequence[int], running: Iterable[int] = (1, 8, 16, 32, 64),
                      tokens: int = 48) -> dict[str, Any]:
    """Seconds of one decode step with n rollouts running on the live server: n streamed requests of exactly
    `tokens` tokens (EOS ignored) at once, wall seconds / tokens (one prefill included), after one warm-up
    request; then the non-negative least-squares line a + b·n that
    `rollout.engine_model.SimulatedRollouts(step_s=(a, b))` takes."""
    points = []
    for i, n in enumerate((1, *running)):  # the first run warms the server up (its first requests are slower)
        rollouts = VLLMServerRollouts(base_url, temperature=1.0, max_inflight=n, request_timeout=600,
                                      extra={"min_tokens": tokens, "ignore_eos": True})
        try:
            t0, done = time.perf_counter(), 0
            rollouts.submit(prompt_ids, n=n, max_tokens=tokens, tag=0)
            while done < n:
                done += len(rollouts.next_completed(timeout=600))
            if i:
                points.append((n, (time.perf_counter() - t0) / tokens))
        finally:
            rollouts.close()
    # non-negative least squares (a step time and its growth with the batch cannot be negative; on a tiny model the
    # timings' noise can tilt a plain fit below zero); the same as the plain fit whenever that one is non-negative
    (a, b), _ = nnls(np.array([[1.0, n] for n, _ in points]), np.array([t for _, t in points]))
    return {"points": points, "a_s": float(a), "b_s": float(b)}


def predict_rounds(method: str, config: AllocGRPOConfig, result: dict[str, Any], step: tuple[float, float],
                   rounds: int, num_prompts: int, train_s: float = 0.0, seed: int = 0) -> dict[str, float]:
    """The engine model's s/round for a measured run of `method` (same configuration, window and rounds): rollout
    lengths drawn from the run's completed rollouts, each prompt's success at its observed rate (the run's mean
    for prompts it never scored), decode steps of `step` = (a, b) seconds (`measure_step_time`)."""
    from ..rollout.engine_model import SimulatedRollouts

    mode = ROLLOUT_METHODS[method][2]
    lengths = np.asarray([n for _, n, _ in result["completed"]], float)
    rate, seen = np.full(num_prompts, np.mean([x for *_, x in result["completed"]])), {}
    for pid, _, x in result["completed"]:
        seen.setdefault(pid, []).append(x)
    for pid, xs in seen.items():
        rate[pid] = np.mean(xs)

    def outcome(pid, rng):
        return lengths[rng.integers(lengths.size)], rng.random() < rate[pid]

    plan = {"pacing": config.pacing, "filling": config.filling, "pruning": "none"}
    allocator = Allocator.from_config(config, num_prompts, config.num_rounds, plan=plan)
    window = config.rollout_window
    sim = SimulatedRollouts(outcome, window, step, seed=seed)
    success = lambda r: r.info["success"]  # noqa: E731
    seconds, t0 = [], sim.clock_s

    def cycle_ends(_):  # a round's seconds: from the end of the last one's cycle to the end of its training step
        nonlocal t0
        seconds.append(sim.clock_s - t0)
        t0 = sim.clock_s
    if mode == "stream":
        driver = StreamDriver(sim, lambda pid: [], config.max_completion_length, window,
                              max_staleness=config.max_staleness)

        def train(bump):  # the trainer's step (the engine decodes meanwhile), then the push
            sim.run_for(train_s)
            bump()
        for _ in Rounds.stream(allocator, driver, rounds, success=success, push=train, after_round=cycle_ends):
            pass
    else:
        for rnd in backend_rounds(allocator, mode == "events", lambda _: sim, lambda pid: [], success,
                                      config.max_completion_length, rounds, max_inflight=window):
            sim.pause_for(train_s)  # the trainer's step: the engine waits
            cycle_ends(rnd)
    return {"s_per_round": float(np.mean(seconds)) if seconds else float("nan"), "rounds": len(seconds)}


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Totals and per-effective-group figures of one method's rounds."""
    r = result["rounds"]
    eff = sum(x["effective_groups"] for x in r)
    total = {key: sum(x[key] for x in r) for key in ("s", "responses", "tokens", "aborted", "pruned")}
    per = (lambda v: v / eff) if eff else (lambda v: float("nan"))
    extra = {"carried": sum(x.get("carried", 0) for x in r), "staleness": result.get("staleness")}
    return {**extra, "rounds": len(r), "s_per_round": total["s"] / max(len(r), 1), "effective_groups": eff,
            "responses": total["responses"], "aborted": total["aborted"], "pruned": total["pruned"],
            "responses_per_eff": per(total["responses"]), "tokens_per_eff": per(total["tokens"]),
            "s_per_eff": per(total["s"]), "idle": result["idle"], "occupancy": result["occupancy"]}


__all__ = ["ROLLOUT_METHODS", "ServerBackend", "ColocateBackend", "EngineMonitor", "run_rounds", "summarise",
           "measure_step_time", "predict_rounds"]
