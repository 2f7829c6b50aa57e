"""The rollout benchmark's parts (`scripts/bench_rollout.py`): each method's rounds run against one vLLM server,
synchronously (every call submitted whole, decided when its last rollout ends, as TRL's and verl's loops do) or
as events (`rollout.streaming.RoundDriver`), scored as rollouts end, with the engine's occupancy sampled from
the server's own `/metrics` gauge (`vllm:num_requests_running`). With pruning (ARROL in the stream), the
quality head is sent to the server each round, the worker scores each rollout at the detection point, and
the head learns from the round's completed rollouts as in the trainer (`rollout.pruning.RolloutPruner`).
"""

import threading
import time

import numpy as np
import requests

from ..allocation.engine import AllocationEngine
from ..allocation.event_rounds import BatchedEventRound
from ..rollout.events import VLLMServerRollouts
from ..rollout.pruning import RolloutPruner
from ..rollout.streaming import run_round

ARROL = {"pruning": "arrol"}
# name -> (pacing, filling, events, other config fields)
ROLLOUT_METHODS = {
    "stock": ("uniform", "full", False, {}),
    "stock_arrol_events": ("uniform", "full", True, ARROL),
    "dapo_sync": ("uniform", "dynamic_sampling", False, {}),
    "dapo_events": ("uniform", "dynamic_sampling", True, {}),
    "sara_sync": ("uniform", "sara", False, {}),
    "sara_events": ("uniform", "sara", True, {}),
    "cero_sara_events": ("cero", "sara", True, {}),
    "cero_sara_arrol_events": ("cero", "sara", True, ARROL),
    "cero_sara_arrol_mixed_events": ("cero", "sara", True, {**ARROL, "prune_undecided": False}),
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


def run_rounds(method, config, base_url, prompt_ids_of, score, rounds, num_prompts, hidden_size=None):
    """`rounds` rounds of `method` (a ROLLOUT_METHODS name) on the server; the policy stays fixed.

    config: an `AllocGRPOConfig` with the method's pacing, filling (and pruning); prompt_ids_of(pid) -> token
    ids; score(rollout) -> its success (1/0); hidden_size: the served model's (for the quality head). Returns
    per-round figures, the engine's occupancy and, with pruning, the scored snapshots of the last round."""
    events = ROLLOUT_METHODS[method][2]
    plan = {"pacing": config.pacing, "filling": config.filling, "pruning": config.pruning}
    pruner = None if config.pruning == "none" else RolloutPruner(config, hidden_size=hidden_size, seed=config.seed)
    engine = AllocationEngine.from_config(config, num_prompts, config.num_rounds, plan=plan, pruner=pruner)
    window = config.rollout_max_inflight or config.generation_batch_size
    per_round, snapshots, head_state = [], [], None

    def on_detect(snaps):
        snapshots.extend(snaps)
        return pruner.decide_snapshots(snaps, engine.current_round)

    with EngineMonitor(base_url, window) as monitor:
        for _ in range(rounds):
            if engine.pacer.finished:
                break
            t0 = time.perf_counter()
            engine.start_round(events=events)
            allocator = engine if events else BatchedEventRound(engine.current_round)
            rollouts = VLLMServerRollouts(base_url, temperature=config.temperature, top_p=config.top_p,
                                          max_inflight=window, request_timeout=600,
                                          quality_head=None if pruner is None else pruner.head)
            snapshots.clear()
            head_state = None if pruner is None else {k: v.clone() for k, v in pruner.head.state_dict().items()}
            monitor.active = True
            try:
                driver = run_round(allocator, rollouts, prompt_ids_of, score, config.max_completion_length, window,
                                   timeout=600, detect_at=pruner and pruner.detect_length,
                                   on_detect=pruner and on_detect)
            finally:
                monitor.active = False
                rollouts.close()
            summary = engine.finish_round()
            stats = summary["stats"]
            per_round.append({"s": time.perf_counter() - t0, "responses": driver.spent, "tokens": driver.tokens,
                              "aborted": driver.aborted, "pruned": len(driver.pruned),
                              "effective_groups": stats["effective_groups"], "groups": stats["groups"],
                              "submissions": stats["generation_calls"], "scored": rollouts.scored,
                              "scoring_s": rollouts.scoring_s + rollouts.hook_s, **summary.get("pruning", {})})
    return {"rounds": per_round, "idle": monitor.idle, "occupancy": monitor.occupancy, "head_state": head_state,
            "snapshots": [{"prompt_ids": r.prompt_ids, "token_ids": r.token_ids, "score": r.info["score"]}
                          for r in snapshots if "score" in r.info]}


def summarise(result):
    """Totals and per-effective-group figures of one method's rounds."""
    r = result["rounds"]
    eff = sum(x["effective_groups"] for x in r)
    total = {key: sum(x[key] for x in r) for key in ("s", "responses", "tokens", "aborted", "pruned")}
    per = (lambda v: v / eff) if eff else (lambda v: float("nan"))
    return {"rounds": len(r), "s_per_round": total["s"] / max(len(r), 1), "effective_groups": eff,
            "responses": total["responses"], "aborted": total["aborted"], "pruned": total["pruned"],
            "responses_per_eff": per(total["responses"]), "tokens_per_eff": per(total["tokens"]),
            "s_per_eff": per(total["s"]), "idle": result["idle"], "occupancy": result["occupancy"]}


__all__ = ["ROLLOUT_METHODS", "EngineMonitor", "run_rounds", "summarise"]
