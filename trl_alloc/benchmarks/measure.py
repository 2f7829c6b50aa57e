"""Shared pieces of the benchmark scripts (`scripts/bench*.py`) and the trainer tests."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from transformers import TrainerCallback

    from ..trainer.grpo import AllocGRPOTrainer


def cpu_run_kwargs(output_dir: str, batch: int, num_generations: int, max_completion_length: int, seed: int,
                   learning_rate: float = 1e-4, temperature: float = 1.0, **extra: Any) -> dict[str, Any]:
    """GRPOConfig keyword arguments every CPU benchmark run shares (stock TRL and trl-alloc alike)."""
    return dict(output_dir=output_dir, per_device_train_batch_size=batch, num_generations=num_generations,
                max_completion_length=max_completion_length, temperature=temperature, learning_rate=learning_rate,
                lr_scheduler_type="constant", beta=0.0, loss_type="dapo", logging_steps=1, report_to=[],
                save_strategy="no", bf16=False, use_cpu=True, gradient_checkpointing=False, seed=seed,
                disable_tqdm=True, **extra)


def parse_choices(parser: argparse.ArgumentParser, text: str, choices: Collection[str], what: str) -> list[str]:
    """A comma-separated subset of `choices`, or a parser error naming the unknown ones."""
    picked = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in picked if c not in choices]
    if unknown:
        parser.error(f"unknown {what}(s) {unknown}; choose from {list(choices)}")
    return picked


def check_batch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.batch % args.num_generations:
        parser.error(f"--batch ({args.batch}) must be a multiple of --num_generations ({args.num_generations})")


def quiet() -> None:
    """Silence library warnings and info logs so benchmark output is the figures only."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("transformers", "trl", "accelerate", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def step_timer() -> TrainerCallback:
    """A TrainerCallback recording each optimizer step's wall-clock (`steps`) and CPU time (`cpu`)."""
    import time

    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps, self.cpu, self._t, self._c, self.last_end = [], [], None, None, None

        def on_step_begin(self, args, state, control, **kwargs):
            self._t, self._c = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            if self._t is not None:
                self.last_end = time.perf_counter()
                self.steps.append(self.last_end - self._t)
                self.cpu.append(time.process_time() - self._c)
                self._t = None

    return StepTimer()


class RoundRecorder:
    """Rewards per round and prompt, whichever trainer produced them: `wrap(reward)` records every
    scored completion under the current round (`new_round()`); pruned rollouts (no completion ids)
    are skipped. Stock TRL scores one generation batch per step, so `per_call=True` makes each
    reward call a round; trl-alloc's trainers call `new_round()` at the start of each round (`round_start_hooks`)."""

    def __init__(self, prompts: Sequence[str | list[dict[str, Any]]]) -> None:
        from ..tasks.data import prompt_key

        self.index = {}
        for i, p in enumerate(prompts):
            self.index.setdefault(prompt_key(p), i)
        self.num_prompts = len(prompts)
        self.rounds = []  # per round: {prompt index: [rewards]}

    def new_round(self) -> None:
        self.rounds.append({})

    def wrap(self, reward: Callable[..., list[float]], per_call: bool = False) -> Callable[..., list[float]]:
        from ..tasks.data import prompt_key

        def recorded(prompts, completions, completion_ids=None, **kwargs):
            out = reward(prompts, completions, completion_ids=completion_ids, **kwargs)
            if per_call or not self.rounds:
                self.new_round()
            ids = completion_ids if completion_ids is not None else [None] * len(out)
            for prompt, cid, r in zip(prompts, ids, out):
                if cid is not None and len(cid) == 0:
                    continue
                self.rounds[-1].setdefault(self.index[prompt_key(prompt)], []).append(float(r))
            return out

        recorded.__name__ = getattr(reward, "__name__", "reward")
        return recorded

    def record_rounds_of(self, trainer: AllocGRPOTrainer) -> None:
        """Start a new round whenever a trl-alloc trainer starts one (its `round_start_hooks`)."""
        trainer.round_start_hooks.append(self.new_round)


def selection_figures(rounds: Iterable[dict[int, list[float]]], num_prompts: int, bins: int = 5,
                      variance_bins: int = 5) -> dict[str, Any]:
    """How a run chose prompts, judged by one method-independent observer: a Beta(1, 1) state per
    prompt (eq. 5, no forgetting) fed every observed reward (`allocation.is_success`: reward >= 0.5).

    Returns `lift` (per predicted-success bin of [0, 1]: the chosen prompts' share over the pool's
    share, 1 = no preference) and `variance` (per q̂ bin of [0, 1/4], by bin index: mean q̂ (eq. 6) and the mean
    observed within-group sample variance of groups of >= 2 responses; a calibrated q̂ matches it).
    Only prompts observed before a round count: an unseen prompt's prior mean 0.5 says nothing.
    """
    import numpy as np

    from ..allocation import BetaState
    from ..allocation.success import is_success

    beta = BetaState(num_prompts)
    seen = np.zeros(num_prompts, bool)
    edges = np.linspace(0.0, 1.0, bins + 1)
    pool, chosen = np.zeros(bins), np.zeros(bins)
    q_pred, var_obs = [], []
    for groups in rounds:
        mean, q = beta.mean, beta.proxy()
        ids = np.array([pid for pid in groups if seen[pid]], dtype=int)
        if seen.any():
            pool += np.histogram(mean[seen], edges)[0]
            chosen += np.histogram(mean[ids], edges)[0]
        succ, fail = np.zeros(num_prompts, np.int64), np.zeros(num_prompts, np.int64)
        for pid, rewards in groups.items():
            wins = is_success(rewards)
            succ[pid] += wins.sum()
            fail[pid] += wins.size - wins.sum()
            if seen[pid] and wins.size >= 2:
                q_pred.append(q[pid])
                var_obs.append(float(np.var(wins, ddof=1)))
        beta.update(succ, fail)
        seen[list(groups)] = True
    pool_share = pool / max(pool.sum(), 1)
    chosen_share = chosen / max(chosen.sum(), 1)
    lift = np.where(pool_share > 0, chosen_share / np.where(pool_share > 0, pool_share, 1), np.nan)
    q_pred, var_obs = np.asarray(q_pred), np.asarray(var_obs)
    q_edges = np.linspace(0.0, 0.25, variance_bins + 1)
    which = np.clip(np.digitize(q_pred, q_edges) - 1, 0, variance_bins - 1)
    variance = [{"bin": b, "q_hat": float(q_pred[which == b].mean()), "observed": float(var_obs[which == b].mean()),
                 "groups": int((which == b).sum())} for b in range(variance_bins) if (which == b).any()]
    return {"lift": lift.tolist(), "lift_edges": edges.tolist(), "chosen_per_bin": chosen.tolist(),
            "variance": variance}
