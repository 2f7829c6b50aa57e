"""The figures an AllocGRPOTrainer round logs through TRL's metrics (`alloc/*`, `pruning/*`, `arrol/*`, and
TRL's own completion, reward and table columns), and the warning when nothing trains."""

from __future__ import annotations

import resource
import sys
from typing import Any

import numpy as np
import psutil
import torch
from accelerate.utils import gather_object
from trl.trainer.utils import nanstd

from .trl_compat import completion_log, take_pending_metrics, train_metrics

# Round.stats() keys every filler reports; the rest are the filler's own (logged as alloc/<filling>/<key>)
BASE_STATS = ("responses", "groups", "effective_groups", "abandoned", "generation_calls", "pruned", "unscored",
              "aborted")
# a stream round's own figures (trainer/event_modes.py), logged as alloc/<key>
STREAM_ENTRY_KEYS = ("carried", "stale_aborted", "in_flight", "staleness_mean", "staleness_max", "stale_token_share")
CALLS_NOTE_ROUNDS = 3  # rounds averaged before the note on generation calls (transformers generation only)
CALLS_NOTE_ABOVE = 1.5  # mean generation calls a round above which it is printed (full groups take 1)
MEMORY_WARN_SHARE = 0.8  # a CPU run's peak memory share of the machine above which it warns once


# the round's engine-trainer mismatch (`sampling/*`, loss_batch._sampling_stats) kept in its history entry
MISMATCH_RECORD = {"sampling/sampling_logp_difference/mean": "logp_difference_mean",
                   "sampling/sampling_logp_difference/max": "logp_difference_max",
                   "sampling/importance_sampling_capped_share": "is_capped_share",
                   "sampling/raw_importance_sampling_ratio/p05": "is_ratio_p05",
                   "sampling/raw_importance_sampling_ratio/p50": "is_ratio_p50",
                   "sampling/raw_importance_sampling_ratio/p95": "is_ratio_p95"}


class RoundMetricsMixin:
    """Logs one round's allocation, completion and reward figures (called once per round, every rank)."""

    def _round_record(self, rows: list[dict]) -> dict:
        """What the round's history entry keeps beyond the allocator's figures: responses cut at
        `max_completion_length`, the successes among the scored responses (a stock run's give the planner the
        pool's drift: `allocation.simulate.fit_drift`), the prompts whose groups reached the loss (`trained_pids`)
        and those whose advantages were not all zero (`signal_pids`), the engine-trainer mismatch
        (`MISMATCH_RECORD`)."""
        state, cap = self.round_state, self.args.max_completion_length
        ends = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        truncated = sum(1 for r in rows if not (r.get("pruned") or r.get("aborted")) and
                        len(r["completion_ids"]) >= cap and r["completion_ids"][-1] not in ends)
        trained = sorted({r["pid"] for r in state.loss_rows})
        moved = state.advantages.abs() > 0 if state.loss_rows else []
        signal = sorted({r["pid"] for r, m in zip(state.loss_rows, moved) if m})
        mismatch = {short: float(f"{state.sampling[key]:.6g}") for key, short in MISMATCH_RECORD.items()
                    if key in state.sampling}
        success = [float(r["success"]) for r in rows if not (r.get("pruned") or r.get("aborted"))]
        scored = [x for x in success if x == x]  # (NaN: no reward could score it)
        return {"truncated": truncated, "successes": int(sum(x >= 1.0 for x in scored)), "scored": len(scored),
                "trained_pids": trained, "signal_pids": signal, **mismatch}

    def engine_description(self) -> dict:
        """Which engine generated the rollouts, in which dtype, beside the trainer's compute dtype."""
        from .on_policy import trainer_compute_dtype

        out = {"backend": f"vllm-{self.vllm_mode}" if self.use_vllm else "transformers",
               "trainer_dtype": trainer_compute_dtype(self.model, self.args)}
        if self.use_vllm and self.vllm_mode == "colocate":
            out["dtype"] = str(self.vllm_generation.llm.llm_engine.vllm_config.model_config.dtype).removeprefix(
                "torch.")
        elif self.use_vllm and self.accelerator.is_main_process:
            out["dtype"] = self.vllm_generation.vllm_client.served_dtype()
        else:
            out["dtype"] = out["trainer_dtype"]
        return out

    def _log_round(self, rows: list[dict[str, Any]], summary: dict[str, Any], entry: dict[str, Any]) -> None:
        m = train_metrics(self)
        stats, counters = summary["stats"], self.allocator.counters
        self.state.num_input_tokens_seen += sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
        m["num_tokens"] = [self.state.num_input_tokens_seen]
        for key, value in {
            "alloc/round": counters["rounds"], "alloc/responses_spent": counters["responses"],
            "alloc/responses_remaining": summary["remaining"], "alloc/tokens_spent": counters["tokens"],
            "alloc/empty_rounds": counters["empty_rounds"], "alloc/responses_unscored": counters["unscored"],
        }.items():
            m[key] = [float(value)]
        m["alloc/round_responses"].append(float(entry["responses"]))
        m["alloc/round_tokens"].append(float(entry["tokens"]))
        m["alloc/groups_admitted"].append(float(entry["admitted"]))
        m["alloc/groups_committed"].append(float(stats["groups"]))
        m["alloc/groups_abandoned"].append(float(stats["abandoned"]))
        m["alloc/effective_groups"].append(float(stats["effective_groups"]))
        m["alloc/egr"].append(stats["effective_groups"] / entry["groups"] if entry["groups"] else 0.0)
        m["alloc/loss_responses"].append(float(entry["loss_responses"]))
        m["alloc/generation_calls"].append(float(stats["generation_calls"]))
        if "aborted" in stats:  # event mode
            m["alloc/responses_aborted"].append(float(stats["aborted"]))
            m["alloc/engine_wait_s"].append(float(entry.get("engine_wait_s", 0.0)))
        for key in STREAM_ENTRY_KEYS:
            if key in entry:
                m[f"alloc/{key}"].append(float(entry[key]))
        for key, value in self.round_state.sampling.items():  # TRL's names
            m[key].append(value)
        for key in sorted(set(stats) - set(BASE_STATS)):  # e.g. SARA's mean_rollouts_to_decide
            m[f"alloc/{self.args.filling}/{key}"].append(float(stats[key]))
        m["alloc/time_s"].append(entry["allocator_s"])
        m["alloc/time_share"].append(entry["allocator_s"] / entry["round_s"] if entry["round_s"] > 0 else 0.0)
        if "pacing_gap" in summary:
            m["alloc/pacing_gap"] = [summary["pacing_gap"]]
        m["alloc/peak_memory_gb"].append(self._watch_memory())
        self._warn_without_signal(rows)
        self._warn_flat_groups(entry)
        self._note_generation_calls(stats["generation_calls"])
        if self.pruner is not None and self.accelerator.is_main_process:
            for line in self.pruner.take_notices():
                print(f"[trl-alloc] {line}")
        if "pruning" in summary:
            m["alloc/responses_pruned"].append(float(stats.get("pruned", 0)))
            for key, value in summary["pruning"].items():
                if key.endswith("_total"):
                    m[key] = [value]
                else:
                    m[key].append(value)
        rows = [r for r in rows if not (r.get("pruned") or r.get("aborted"))]  # figures of completed rollouts
        if not rows:
            return
        self._log_completions(m, rows)
        self._log_reward_metrics(m)

    def _log_completions(self, m: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        lengths = torch.tensor([len(r["completion_ids"]) for r in rows], dtype=torch.float)
        m["completions/mean_length"].append(lengths.mean().item())
        m["completions/min_length"].append(lengths.min().item())
        m["completions/max_length"].append(lengths.max().item())
        eos_and_pad = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        clipped = [not r["completion_ids"] or r["completion_ids"][-1] not in eos_and_pad for r in rows]
        m["completions/clipped_ratio"].append(float(np.mean(clipped)))
        rpf = torch.stack([r["rewards"] for r in rows])
        for i, name in enumerate(self.reward_func_names):
            m[f"rewards/{name}/mean"].append(torch.nanmean(rpf[:, i]).item())
            m[f"rewards/{name}/std"].append(nanstd(rpf[:, i]).item())
        reward = torch.tensor([r["reward"] for r in rows])
        m["reward"].append(torch.nanmean(reward).item())
        m["reward_std"].append(nanstd(reward).item())
        state = self.round_state
        if state.zero_std is None:
            return
        m["frac_reward_zero_std"].append(state.zero_std.float().mean().item())
        logs, loss_rows = completion_log(self), state.loss_rows
        logs["prompt"].extend(self.train_dataset[[r["pid"] for r in loss_rows]]["prompt"])
        logs["completion"].extend(r["completion"] for r in loss_rows)
        for i, name in enumerate(self.reward_func_names):
            logs["rewards"][name].extend(float(r["rewards"][i]) for r in loss_rows)
        logs["advantages"].extend(state.advantages.tolist())
        for column in sorted({c for r in loss_rows for c in r["extra"]}):
            logs["extra"][column].extend(r["extra"].get(column) for r in loss_rows)

    def _log_reward_metrics(self, m: dict[str, Any]) -> None:
        """What reward functions logged with `log_metric`, averaged over every rank's values."""
        pending = take_pending_metrics(self)
        for name in sorted(set(gather_object(list(pending)))):
            values = pending.get(name, [])
            stats_t = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=self.accelerator.device)
            total, count = self.accelerator.gather(stats_t).view(-1, 2).sum(dim=0).tolist()
            m[name].append(total / count if count else float("nan"))

    def _watch_memory(self) -> float:
        """This process's peak memory so far, in GiB (resident on a CPU run, allocated on its GPU); on a CPU run, the
        first time it passes MEMORY_WARN_SHARE of the machine's, one warning (`memory_warning`). (On a GPU a colocate
        engine allocates its share up front, and running out is torch's clear OutOfMemoryError: no warning.)"""
        if self.accelerator.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.accelerator.device) / 2**30
        # ru_maxrss: kilobytes on Linux, bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        message = memory_warning(peak, psutil.virtual_memory().total, self.args, self.allocator.counters["rounds"])
        if message and not getattr(self, "_warned_memory", False):  # (each process its own: every rank logs)
            self._warned_memory = True
            rank = f" (process {self.accelerator.process_index})" if self.accelerator.num_processes > 1 else ""
            print(message.replace("WARNING:", f"WARNING{rank}:", 1), flush=True)
        return peak / 2**30

    def _warn_flat_groups(self, entry: dict[str, Any]) -> None:
        """Once: committed groups the success signal calls mixed whose *training* reward is constant train nothing."""
        flat = entry.get("flat_groups", 0)
        if not flat or getattr(self, "_warned_flat", False) or not self.accelerator.is_main_process:
            return
        self._warned_flat = True
        weights = ", ".join(f"{n}={w:g}" for n, w in zip(self.reward_func_names, self.reward_weights.tolist()))
        print(f"[trl-alloc] WARNING: {flat} of {entry['effective_groups']} groups this round are mixed by the "
              f"success signal but have a constant training reward (reward weights: {weights}), so their advantages "
              "are zero and they train nothing. Give the success reward a non-zero weight, or name the reward the "
              "loss sees with --success_reward_funcs.")

    def _note_generation_calls(self, calls: int) -> None:
        """Once, with transformers generation: a filler that needs several `generate` calls a round (SARA's probe,
        continue and refill phases, Algorithm 1 of "Early Verdicts, Better Budgets") pays each call's latency."""
        if self.use_vllm or getattr(self, "_noted_calls", False) or not self.accelerator.is_main_process:
            return
        seen = self.__dict__.setdefault("_calls_per_round", [])
        seen.append(int(calls))
        if len(seen) < CALLS_NOTE_ROUNDS:
            return
        self._noted_calls, mean = True, sum(seen) / len(seen)
        if mean <= CALLS_NOTE_ABOVE:
            return
        print(f"[trl-alloc] NOTE: filling {self.args.filling!r} took {mean:.1f} generation calls a round over the "
              f"first {len(seen)} rounds (full groups take 1). With transformers generation each call costs about "
              "the decoding time of its longest completion whatever its batch, so a round's generation time grows "
              "with its calls (on an H200, CERO + SARA: 6-9 calls and 4.6-5.7x stock's seconds a round; "
              "docs/benchmarks.md, \"On an H200 with transformers generation\"). The rollout savings hold; for "
              "seconds, generate with vLLM (`use_vllm: true`; `rollout_mode: auto` then streams an adaptive filler "
              "on GPUs).")

    def _warn_without_signal(self, rows: list[dict[str, Any]]) -> None:
        """After `no_signal_warning_rounds` rounds in a row without a mixed group, or at the end of a shorter run that
        never had one: warn, naming the likely cause."""
        streak, limit = self.allocator.signal_streak, self.args.no_signal_warning_rounds
        last = not self.more_rounds
        short_run = last and streak < limit and streak == self.allocator.counters["rounds"]
        if not (streak == limit or short_run) or not self.accelerator.is_main_process:
            return
        success = np.array([r["success"] for r in rows if not r.get("pruned")], dtype=float)
        reward = np.array([r["reward"] for r in rows if not r.get("pruned")], dtype=float)
        scored = success[~np.isnan(success)]
        names = [self.reward_func_names[i] for i in self.success_funcs]
        if not len(rows):
            cause = ("no response was generated (responses left in the budget: "
                     f"{int(self.allocator.pacer.remaining_responses)}); raise `rollout_budget`")
        elif not scored.size:
            cause = "every reward was None/NaN: no reward function could score the responses"
        elif scored.max() == 0:
            cause = (f"no response succeeded: success = {' + '.join(names)} >= success_threshold "
                     f"({self.args.success_threshold}), and the rewards seen lie in [{np.nanmin(reward):g}, "
                     f"{np.nanmax(reward):g}]. Check `success_threshold` / `success_reward_funcs`, the dataset's "
                     "answers, or use easier prompts")
        else:
            cause = "every response succeeded: the prompts are too easy for this policy"
        print(f"[trl-alloc] WARNING: {streak} rounds in a row without one mixed group, so nothing is "
              f"trained. Likely cause: {cause}.")


def memory_warning(peak: int, total: int, args: Any, rounds: int) -> str | None:
    """The warning for a process whose peak memory (bytes) passed MEMORY_WARN_SHARE of `total`, else None. On a
    machine without swap such a run is killed by the system's out-of-memory killer at a slightly larger step, or slows
    down while the system reclaims the file pages it runs from (measured: SmolLM2-135M, 64 responses of 64 tokens in
    one micro-batch peaks at 19-20 GiB of 23 on a CPU; docs/reliability.md)."""
    if peak <= MEMORY_WARN_SHARE * total:
        return None
    return (f"[trl-alloc] WARNING: this process's memory peaked at {peak / 2**30:.1f} of {total / 2**30:.1f} GiB "
            f"({peak / total:.0%}) by round {rounds} (per_device_train_batch_size={args.per_device_train_batch_size}, "
            f"max_completion_length={args.max_completion_length}): a longer or larger step may be killed for lack "
            "of memory, or slow down while the system reclaims it. Train the same responses a round in smaller "
            "micro-batches: lower per_device_train_batch_size and raise gradient_accumulation_steps by the same "
            "factor, or set gradient_checkpointing: true.")
