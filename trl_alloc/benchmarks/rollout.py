"""The rollout benchmark's parts (`scripts/bench_rollout.py`): each method's rounds run against one vLLM server,
synchronously (every call submitted whole, decided when its last rollout ends, as TRL's and verl's loops do) or
as events (`rollout.streaming.RoundDriver`), scored as rollouts end, with the engine's occupancy sampled from
the server's own `/metrics` gauge (`vllm:num_requests_running`).
"""

import threading
import time

import numpy as np
import requests

from ..allocation.engine import AllocationEngine
from ..allocation.event_rounds import BatchedEventRound
from ..rollout.events import VLLMServerRollouts
from ..rollout.streaming import run_round

# name -> (pacing, filling, events)
ROLLOUT_METHODS = {
    "stock": ("uniform", "full", False),
    "dapo_sync": ("uniform", "dynamic_sampling", False),
    "dapo_events": ("uniform", "dynamic_sampling", True),
    "sara_sync": ("uniform", "sara", False),
    "sara_events": ("uniform", "sara", True),
    "cero_sara_events": ("cero", "sara", True),
}


class EngineMonitor:
    """Samples the server's running-request gauge every `period` s while active: `idle` is the share of
    samples with nothing running, `occupancy` the mean running requests over `slots`."""

    def __init__(self, base_url, slots, period=0.1):
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
    def idle(self):
        return float(np.mean(np.asarray(self.samples) == 0)) if self.samples else float("nan")

    @property
    def occupancy(self):
        return float(np.mean(self.samples) / self.slots) if self.samples else float("nan")


def run_rounds(method, config, base_url, prompt_ids_of, score, rounds, num_prompts):
    """`rounds` rounds of `method` (a ROLLOUT_METHODS name) on the server; the policy stays fixed.

    config: an `AllocGRPOConfig` with the method's pacing and filling; prompt_ids_of(pid) -> token ids;
    score(rollout) -> its success (1/0). Returns per-round figures and the engine's occupancy."""
    _, _, events = ROLLOUT_METHODS[method]
    plan = {"pacing": config.pacing, "filling": config.filling, "pruning": "none"}
    engine = AllocationEngine.from_config(config, num_prompts, config.num_rounds, plan=plan)
    window = config.rollout_max_inflight or config.generation_batch_size
    per_round = []
    with EngineMonitor(base_url, window) as monitor:
        for _ in range(rounds):
            if engine.pacer.finished:
                break
            t0 = time.perf_counter()
            engine.start_round(events=events)
            allocator = engine if events else BatchedEventRound(engine.current_round)
            rollouts = VLLMServerRollouts(base_url, temperature=config.temperature, top_p=config.top_p,
                                          max_inflight=window, request_timeout=600)
            monitor.active = True
            try:
                driver = run_round(allocator, rollouts, prompt_ids_of, score, config.max_completion_length, window,
                                   timeout=600)
            finally:
                monitor.active = False
                rollouts.close()
            summary = engine.finish_round()
            stats = summary["stats"]
            per_round.append({"s": time.perf_counter() - t0, "responses": driver.spent, "tokens": driver.tokens,
                              "aborted": driver.aborted, "effective_groups": stats["effective_groups"],
                              "groups": stats["groups"], "submissions": stats["generation_calls"]})
    return {"rounds": per_round, "idle": monitor.idle, "occupancy": monitor.occupancy}


def summarise(result):
    """Totals and per-effective-group figures of one method's rounds."""
    r = result["rounds"]
    eff = sum(x["effective_groups"] for x in r)
    total = {key: sum(x[key] for x in r) for key in ("s", "responses", "tokens", "aborted")}
    per = (lambda v: v / eff) if eff else (lambda v: float("nan"))
    return {"rounds": len(r), "s_per_round": total["s"] / max(len(r), 1), "effective_groups": eff,
            "responses": total["responses"], "aborted": total["aborted"],
            "responses_per_eff": per(total["responses"]), "tokens_per_eff": per(total["tokens"]),
            "s_per_eff": per(total["s"]), "idle": result["idle"], "occupancy": result["occupancy"]}


__all__ = ["ROLLOUT_METHODS", "EngineMonitor", "run_rounds", "summarise"]
