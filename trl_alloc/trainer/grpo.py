"""`AllocGRPOTrainer` / `AllocDAPOTrainer`: TRL's GRPOTrainer with an allocating sampling step.

Only the sampling step changes. One scheduler round collects one generation batch (and takes
`steps_per_round` optimizer steps on it, one by default):

    allocator.start_round()                       # allocation.allocator.Allocator
    while (request := allocator.next_request()):  # generate with TRL's generation path, score with
        allocator.observe(rows, request)          # TRL's reward functions (generation.py)
    allocator.finish_round(); allocator.record_round(...)

or, with `rollout_mode="events"`, the rollouts of the round are started within a window and decided on one
at a time as they end (event_modes.py). The round runner (`allocation.rounds.Rounds`, built by `round_runner`)
runs these lines in every mode; `_run_round` pulls one round from it per generation batch.

and only the round's committed groups reach TRL's loss, with advantages normalised inside each group
by its own size. The allocators see each response's success (`success_reward_funcs` >=
`success_threshold`, NaN when no reward function could score it). The loss, optimizer, logging and
saving are TRL's.

Distributed contract: the allocator is driven on the main process only; every request and the
round's summary are broadcast, so all ranks act on identical decisions (the allocators of other ranks
are built but only `record_round` advances them, from the broadcast summary). The round log
(`output_dir/allocation/rounds.jsonl`, one line per round) is written by the main process; an event round's
order of events stays there and is not broadcast. Each rank generates a contiguous share of a request's
rows and scores it; completions and rewards are gathered so every rank holds the whole round, then
the loss rows are split evenly over ranks. Ranks whose share is empty skip generation, except where
generation is collective (ZeRO-3, FSDP, vLLM): there they generate throwaway padding rows that are
never counted, scored or trained on.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader
from transformers import TrainerCallback
from trl import GRPOTrainer

from ..allocation.allocator import Allocator, round_log_file
from ..allocation.factory import resolve_num_rounds
from ..allocation.rounds import ClosedRound, Rounds
from ..reporting.hub import HubMixin
from ..rollout.pruning import build_pruner
from ..tasks.data import check_prompt_lengths, load_prompt_counts
from .checkpointing import CheckpointMixin
from .config import AllocDAPOConfig, AllocGRPOConfig
from .generation import RequestGenerationMixin
from .inputs import check_inputs, checked_reward_funcs, warn_missing_reward_columns
from .loss_batch import LossBatchMixin
from .metrics import RoundMetricsMixin
from .on_policy import engine_dtype, trainer_compute_dtype, warn_mismatch
from .main_process import MainProcess
from .round_state import CollectedRound, RoundState
from .event_modes import EventRoundMixin, StreamRoundMixin
from .trl_compat import (check_trainer, check_trl, is_zero3, patch_trl_colocate_llm, patch_trl_vllm_client,
                         tokenize_prompts, train_metrics, use_inplace_colocate_push, vllm_version_notice)

if TYPE_CHECKING:
    from datasets import Dataset
    from peft import PeftModel
    from transformers import PreTrainedModel, TrainerControl, TrainerState, TrainingArguments
    from trl.trainer.grpo_trainer import RewardFunc

    from ..rollout.pruning import RolloutPruner


class _Ticks(torch.utils.data.Dataset):
    """The train 'dataloader' only paces the loop: one item per micro-step; the round picks prompts."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"tick": i}


def _as_list(batch: Any) -> list[Any]:
    return batch


class _AllocationCallback(TrainerCallback):
    """Stops training (with a final log and save) once the budget is spent; undoes a zero-lr step;
    writes the allocation report at the end (unless nothing ran since a finished checkpoint)."""

    def __init__(self, trainer: AllocGRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        t = self.trainer
        if t._saved_lrs is not None:  # schedulers that set the lr each step have already overwritten 0
            for group, lr in zip(t.optimizer.param_groups, t._saved_lrs):
                if group["lr"] == 0.0:
                    group["lr"] = lr
            t._saved_lrs = None
        round_done = state.global_step % t.steps_per_round == 0  # the round's later steps still train
        if not t.more_rounds and round_done and state.global_step < state.max_steps:
            control.should_training_stop = True
            control.should_log = True
            if args.save_strategy != "no":
                control.should_save = True
        return control

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        t = self.trainer
        t._end_stream()  # stream mode: what still runs is aborted (spent, never trained)
        if t.accelerator.is_main_process and t.allocator.history and t._rounds_this_session:
            t.allocation_summary = t.write_allocation_report()


class AllocGRPOTrainer(RequestGenerationMixin, EventRoundMixin, StreamRoundMixin, LossBatchMixin, RoundMetricsMixin,
                       CheckpointMixin, HubMixin, GRPOTrainer):
    """GRPOTrainer whose sampling step is a CERO/SARA-style allocation pipeline (see module docstring).

    Takes GRPOTrainer's arguments; `args` must be an `AllocGRPOConfig` and `train_dataset` an indexable
    `datasets.Dataset` (the prompt pool). `tools`, `rollout_func` and `environment_factory` are not supported.
    The allocation itself lives in `self.allocator` (`allocation.allocator.Allocator`); the mixins hold
    generation (generation.py), the loss batch (loss_batch.py), metrics (metrics.py) and checkpoints.
    """

    _tag_names = ["trl", "grpo", "trl-alloc"]
    config_class = AllocGRPOConfig

    def __init__(self, model: str | PreTrainedModel | PeftModel,
                 reward_funcs: RewardFunc | list[RewardFunc] | None = None, args: AllocGRPOConfig | None = None,
                 train_dataset: Dataset | None = None, **kwargs: Any) -> None:
        if args is None:
            args = self.config_class(output_dir="trl-alloc-output")
        if not isinstance(args, AllocGRPOConfig):
            raise TypeError(f"`args` must be an AllocGRPOConfig (got {type(args).__name__}); the allocation fields "
                            "live there.")
        check_inputs(type(self).__name__, reward_funcs, train_dataset, kwargs)
        args, reward_funcs = self._extra_reward_funcs(args, reward_funcs)
        reward_funcs = checked_reward_funcs(reward_funcs)
        if isinstance(model, str):  # a registered name (trl_alloc.tasks.models) becomes its local folder
            from ..tasks.models import resolve_model
            model = resolve_model(model)
        server_mode = args.use_vllm and args.vllm_mode == "server"
        check_trl()
        if server_mode:  # our client (NCCL weight sync on CUDA, an in-place reload elsewhere; clear timeouts)
            engine_setup = patch_trl_vllm_client()
        elif args.use_vllm:  # colocate: the engine eager or compiled
            eager = not torch.cuda.is_available() if args.vllm_enforce_eager is None else args.vllm_enforce_eager
            engine_setup = patch_trl_colocate_llm(enforce_eager=eager, dtype=lambda: engine_dtype(self.model, args))
        else:
            engine_setup = contextlib.nullcontext()
        with engine_setup:
            super().__init__(model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        check_trainer(self)
        self.on_main = MainProcess(self.accelerator)  # each allocator call: on the main process, shared with all ranks
        if args.use_vllm and args.vllm_mode == "colocate" and not torch.cuda.is_available():
            use_inplace_colocate_push(self)  # (TRL's own colocate push fails on vLLM-CPU)
        if self._is_vlm or "image" in train_dataset.column_names or "images" in train_dataset.column_names:
            raise ValueError(f"{type(self).__name__} supports text prompts only.")
        check_prompt_lengths(train_dataset["prompt"], lambda prompts: tokenize_prompts(self, prompts),
                             args.max_completion_length,
                             getattr(self.accelerator.unwrap_model(self.model).config,
                                     "max_position_embeddings", None))
        self._rollout_mode_notice()
        if args.use_vllm and self.accelerator.is_main_process:
            print(vllm_version_notice())  # (TRL's own version warnings are silenced: trl_alloc/__init__.py)
        if server_mode and self.accelerator.is_main_process:  # before the first push: the same architecture?
            self.vllm_generation.vllm_client.check_serves(self.accelerator.unwrap_model(self.model).config)
        self._check_engine_dtype()

        num_prompts = len(self.train_dataset)
        if num_prompts == 0:
            raise ValueError("`train_dataset` is empty; the prompt pool needs at least one prompt.")
        self.num_rounds = resolve_num_rounds(args, num_prompts)
        args.check_budget(self.num_rounds)
        self.steps_per_round = args.steps_per_round
        planned = self.num_rounds * self.steps_per_round
        if 0 < args.max_steps < planned and args.num_rounds is not None:
            if self.accelerator.is_main_process:
                print(f"[trl-alloc] max_steps={args.max_steps} stops the run after "
                      f"{math.ceil(args.max_steps / self.steps_per_round)} of {self.num_rounds} rounds; the budget is "
                      f"still paced over num_rounds={self.num_rounds} (set --num_rounds to plan a shorter run).")
        else:
            self.args.max_steps = planned
        if args.dataloader_num_workers and self.accelerator.is_main_process:
            print(f"[trl-alloc] dataloader_num_workers={args.dataloader_num_workers} has no effect: prompts are "
                  "picked from the in-memory pool by the allocator, not loaded per step (docs/trl-compatibility.md).")
        self.success_funcs = self._success_func_indices(args)
        warn_missing_reward_columns(self.reward_funcs, self.reward_func_names, train_dataset)
        world = self.accelerator.num_processes
        self.round_start_hooks = []  # callables run at the start of every round (benchmarks' per-round records)
        self._collective_generation = world > 1 and (self.use_vllm or is_zero3(self) or self.is_fsdp_enabled)
        # the allocator: pacer, filler, pruner (ARROL / random pruning, arXiv 2603.24840; None for 'none')
        self.allocator = Allocator.from_config(args, num_prompts, self.num_rounds, plan=self.run_plan,
                                                   pruner=build_pruner(args, self.model.config))
        if args.probe_counts:  # CERO's Beta states from a probe pass (arXiv 2610.09679 eq. 5 with its counts)
            successes, failures, matched = load_prompt_counts(args.probe_counts, self.train_dataset["prompt"])
            self.allocator.pacer.seed_counts(successes, failures)
            if self.accelerator.is_main_process:
                print(f"[trl-alloc] CERO starts from {args.probe_counts}: {matched} of {num_prompts} prompts seeded "
                      f"with {int(successes.sum() + failures.sum())} probe responses (not in the budget).")
        if self.accelerator.is_main_process:  # the round log is written by the main process only
            self.allocator.round_log_path = self.round_log_path
        self._rounds_this_session = 0
        self._rounds: Iterator[ClosedRound] | None = None  # this session's rounds (`round_runner`), pulled by TRL
        self._round_t0 = 0.0
        self._saved_lrs = None
        self.round_state = RoundState()  # what the last round left for the loss and the logs (round_state.py)
        self.add_callback(_AllocationCallback(self))

    @property
    def round_log_path(self) -> str:
        """The round log the main process writes, one JSON line per round: `output_dir/allocation/rounds.jsonl`
        (`allocation.allocator.read_round_log` reads it)."""
        return round_log_file(self.args.output_dir)

    @property
    def planned_rounds(self) -> int:
        """The rounds this run takes: `num_rounds`, fewer where `max_steps` stops it early (its last round may
        take fewer than `steps_per_round` steps)."""
        return min(self.num_rounds, math.ceil(self.args.max_steps / self.steps_per_round))

    @property
    def more_rounds(self) -> bool:
        """Another round follows the last recorded one (`Allocator.more_rounds`, the one stop rule)."""
        return self.allocator.more_rounds(self.allocator.counters["rounds"], self.planned_rounds)

    @property
    def pruner(self) -> RolloutPruner | None:
        """The allocator's rollout pruner (`rollout.pruning.RolloutPruner`), or None."""
        return self.allocator.pruner

    @staticmethod
    def _extra_reward_funcs(args: Any, reward_funcs: Any) -> tuple[Any, Any]:
        return args, reward_funcs

    def _success_func_indices(self, args: Any) -> list[int]:
        """Columns of `rewards_per_func` whose unweighted sum is the success score."""
        names = list(self.reward_func_names)
        if args.success_reward_funcs:
            unknown = [n for n in args.success_reward_funcs if n not in names]
            if unknown:
                raise ValueError(f"`success_reward_funcs` names {unknown[0]!r}, which is not a reward function of "
                                 f"this run ({', '.join(names)}).")
            return [names.index(n) for n in args.success_reward_funcs]
        verifiers = [i for i, f in enumerate(self.reward_funcs) if getattr(f, "trl_alloc_verifier", False)]
        return verifiers or [0]

    # ------------------------------------------------------------------ loop pacing
    def get_train_dataloader(self) -> DataLoader:
        """One tick per micro-step, K × steps_per_round × gradient_accumulation_steps in all, the same on every
        rank (not sharded)."""
        ticks = _Ticks(self.num_rounds * self.steps_per_round * self.args.gradient_accumulation_steps)
        return DataLoader(ticks, batch_size=1, shuffle=False, collate_fn=_as_list)

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        if not self.model.training:  # evaluation keeps TRL's path
            return super()._prepare_inputs(generation_batch)
        split = self.args.steps_per_generation  # micro-batches per round, each used num_iterations times
        if self._step % (split * self.num_iterations) == 0 or self._buffered_inputs is None:
            start = self._allocator_snapshot()
            try:
                self._buffered_inputs = self._run_round()
            except Exception:
                self._rescue_checkpoint(start)
                raise
        if self.round_state.empty and self._step % self.args.gradient_accumulation_steps == 0:
            self._zero_lr()  # every optimizer step of an empty round
        return self._buffered_inputs[self._step % split]

    # ------------------------------------------------------------------ one round
    def _check_engine_dtype(self) -> None:
        """Warn once (main process) where the vLLM engine samples in another dtype than the trainer computes in."""
        if not (self.use_vllm and self.accelerator.is_main_process):
            return
        trainer = trainer_compute_dtype(self.model, self.args)
        if self.vllm_mode == "server":
            served = self.vllm_generation.vllm_client.served_dtype()
            warn_mismatch(served, trainer, f"The vLLM server at {self.vllm_generation.vllm_client.base_url}",
                          f"Start it with `trl-alloc-serve --model ... --dtype {trainer}`, or train in {served}")
        else:
            engine = str(self.vllm_generation.llm.llm_engine.vllm_config.model_config.dtype).removeprefix("torch.")
            warn_mismatch(engine, trainer, f"The colocate vLLM engine (vllm_dtype={self.args.vllm_dtype!r})",
                          "Leave `vllm_dtype` unset: the engine then takes the trainer's dtype")

    def _run_round(self) -> list[dict[str, Any]]:
        """The run's next round, recorded (`_record_round`): this rank's `steps_per_generation` micro-batches. TRL
        pulls one round per generation batch from this session's round runner (`round_runner`), every rank."""
        self._round_t0 = time.perf_counter()
        for hook in self.round_start_hooks:
            hook()
        self.on_main.take_seconds()  # (what ran between rounds is not this round's)
        if self._rounds is None:
            self._rounds = iter(self.round_runner())
        rnd = next(self._rounds, None)
        if rnd is None:
            raise RuntimeError(f"The trainer asked for a round after the last one (round "
                               f"{self.allocator.counters['rounds']} of {self.planned_rounds}, budget spent: "
                               f"{self.allocator.budget_exhausted}); max_steps={self.args.max_steps} takes more "
                               "optimizer steps than the rounds planned. Leave max_steps unset (-1).")
        return rnd.recorded

    def round_runner(self) -> Rounds:
        """This session's rounds in the run's rollout mode (`allocation.rounds.Rounds`, the one round runner): each
        opened, driven, closed and recorded (`_record_round`); a stream's next round opened and its weights pushed in
        the runner's order. Every rank iterates it; each allocator call is made on the main process (`on_main`)."""
        left = self.planned_rounds - self.allocator.counters["rounds"]
        step, record, mode = self.on_main.allocate, self._record_round, self.args.rollout_mode
        if mode == "stream":
            return self._stream_runner(left, record)
        if mode == "events":
            return Rounds.driven(self.allocator, left, lambda i: self._event_round(), True, step, record)
        generate = self._generate_and_score_request  # deterministic: each filler request one batched generation
        return Rounds.driven(self.allocator, left, lambda i: self.allocator.drive_requests(generate, step), False,
                             step, record)

    def _record_round(self, rnd: ClosedRound) -> list[dict[str, Any]]:
        """A closed round (every rank): its loss batches built, the round recorded (`Allocator.record_round`: the
        round log) and logged; returns this rank's micro-batches."""
        r = self._collected(rnd)
        batches = self._build_loss_batches(r.trained, r.summary["groups"])
        state = self.round_state
        rnd.trained = state.loss_rows  # (a stream pushes new weights only after a round that trained)
        entry = self.allocator.record_round(
            r.summary, r.rows, r.admitted, r.requests, len(state.loss_rows), self.on_main.take_seconds(),
            time.perf_counter() - self._round_t0, events=None if r.log is None else r.log.get("events"),
            responses=r.responses, log_fields=r.log_fields)
        entry["flat_groups"] = state.flat_groups  # mixed by success, but a constant training reward
        entry.update(self._round_record(r.rows))
        if r.log is not None:
            entry["engine_wait_s"] = round(r.log["waited_s"], 6)
        if self.args.rollout_mode == "stream":  # its figures, and the state a checkpoint holds
            self._after_stream_round(r.summary, entry, r.log)
        self._rounds_this_session += 1
        self._log_round(r.rows, r.summary, entry)
        return batches

    def _collected(self, rnd: ClosedRound) -> CollectedRound:
        """A closed round's rows, what to train and its log, as its rollout mode collected them."""
        mode = self.args.rollout_mode
        if mode == "stream":
            return self._collect_stream_round(rnd)
        if mode == "events":
            rows, log = rnd.result
            return CollectedRound(rows=rows, trained=rows, summary=rnd.summary, admitted=rnd.admitted, log=log)
        rows, requests = rnd.result
        return CollectedRound(rows=rows, trained=rows, summary=rnd.summary, admitted=rnd.admitted,
                              requests=requests)

    # ------------------------------------------------------------------ empty rounds
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        if not (self.model.training and self.round_state.empty):
            return super()._compute_loss(model, inputs) * self.round_state.loss_scale  # (× 1.0 is exact)
        # An empty round: the zero loss still runs (collectives), but its metrics would only log zeros.
        metrics = train_metrics(self)
        before = {key: len(values) for key, values in metrics.items()}
        loss = super()._compute_loss(model, inputs)
        for key in list(metrics):
            del metrics[key][before.get(key, 0):]
            if not metrics[key]:
                del metrics[key]
        return loss

    def _zero_lr(self) -> None:
        """A round with no group: zero learning rate for this optimizer step, so no parameter moves
        (zero gradients alone would still move Adam parameters through momentum and weight decay)."""
        if self.optimizer is None or self._saved_lrs is not None:  # outside `train()`, or already zeroed
            return
        self._saved_lrs = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] = 0.0


class AllocDAPOTrainer(AllocGRPOTrainer):
    """AllocGRPOTrainer with DAPO's overlong reward shaping added to the reward functions
    (TRL's `get_soft_overlong_punishment`); use with `AllocDAPOConfig`."""

    _tag_names = ["trl", "dapo", "trl-alloc"]
    config_class = AllocDAPOConfig

    @staticmethod
    def _extra_reward_funcs(args: Any, reward_funcs: Any) -> tuple[Any, Any]:
        buffer = getattr(args, "overlong_buffer", 0) or 0
        if buffer <= 0:
            return args, reward_funcs
        from trl.rewards import get_soft_overlong_punishment

        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if args.reward_weights is not None and len(args.reward_weights) == len(funcs):
            args = copy.copy(args)  # the caller's config keeps its own weights
            args.reward_weights = list(args.reward_weights) + [1.0]
        return args, funcs + [get_soft_overlong_punishment(args.max_completion_length, buffer)]
