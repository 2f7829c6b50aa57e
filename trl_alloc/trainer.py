"""`AllocGRPOTrainer` / `AllocDAPOTrainer`: TRL's GRPOTrainer with an allocating sampling step.

Only the sampling step changes. One scheduler round collects one generation batch (and takes
`steps_per_round` optimizer steps on it, one by default):

    units = pacer.propose(); rnd = filler.start_round(...)
    while not rnd.done: generate rnd.requests() with TRL's generation path, score with TRL's reward
                        functions, rnd.observe(rewards)
    pacer.update(*rnd.outcomes(num_prompts))

and only the round's committed groups reach TRL's loss, with advantages normalised inside each group
by its own size. The allocators see each response's success (`success_reward_funcs` >=
`success_threshold`, NaN when no reward function could score it). The loss, optimizer, logging and
saving are TRL's.

Distributed contract: the allocator is driven on the main process only; every request and the
round's summary are broadcast, so all ranks act on identical decisions (the pacer/filler objects on
other ranks are built but never advanced). Each rank generates a contiguous share of a request's
rows and scores it; completions and rewards are gathered so every rank holds the whole round, then
the loss rows are split evenly over ranks. Ranks whose share is empty skip generation, except where
generation is collective (ZeRO-3, FSDP, vLLM): there they generate throwaway padding rows that are
never counted, scored or trained on.
"""

import contextlib
import copy
import json
import math
import os
import shutil
import time
from collections import defaultdict

import numpy as np
import torch
from accelerate.utils import broadcast_object_list, gather_object
from datasets import IterableDataset
from torch.utils.data import DataLoader
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.data_utils import is_conversational
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import nanstd, pad, use_adapter

from .allocation.base import is_success
from .allocation_factory import build_filler, build_pacer, resolve_num_rounds, round_kwargs
from .checkpointing import (ALLOCATION_STATE_NAME, STATE_VERSION, check_same_plan, dataset_fingerprint,
                            disk_full_error, earlier_checkpoint, is_disk_full, read_allocation_state,
                            write_json_atomic)
from .config import AllocDAPOConfig, AllocGRPOConfig
from .data import checked_reward
from .hub import HubMixin
from .pruning import build_pruner, generate_with_pruning

TRL_REWARD_KWARGS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                     "environments"}


class _Ticks(torch.utils.data.Dataset):
    """The train 'dataloader' only paces the loop: one item per micro-step; the round picks prompts."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"tick": i}


def _as_list(batch):
    return batch


class _AllocationCallback(TrainerCallback):
    """Stops training (with a final log and save) once the budget is spent; undoes a zero-lr step;
    writes the allocation report at the end (unless nothing ran since a finished checkpoint)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        if t._saved_lrs is not None:  # schedulers that set the lr each step have already overwritten 0
            for group, lr in zip(t.optimizer.param_groups, t._saved_lrs):
                if group["lr"] == 0.0:
                    group["lr"] = lr
            t._saved_lrs = None
        round_done = state.global_step % t.steps_per_round == 0  # the round's later steps still train
        if t.budget_exhausted and round_done and state.global_step < state.max_steps:
            control.should_training_stop = True
            control.should_log = True
            if args.save_strategy != "no":
                control.should_save = True
        return control


    def on_train_end(self, args, state, control, **kwargs):
        t = self.trainer
        if t.accelerator.is_main_process and t.history and t._rounds_this_session:
            t.allocation_summary = t.write_allocation_report()


class AllocGRPOTrainer(HubMixin, GRPOTrainer):
    """GRPOTrainer whose sampling step is a CERO/SARA-style allocation pipeline (see module docstring).

    Takes GRPOTrainer's arguments; `args` must be an `AllocGRPOConfig` and `train_dataset` an indexable
    `datasets.Dataset` (the prompt pool). `tools`, `rollout_func` and `environment_factory` are not supported.
    """

    _tag_names = ["trl", "grpo", "trl-alloc"]
    config_class = AllocGRPOConfig

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, **kwargs):
        if args is None:
            args = self.config_class(output_dir="trl-alloc-output")
        if not isinstance(args, AllocGRPOConfig):
            raise TypeError(f"`args` must be an AllocGRPOConfig (got {type(args).__name__}); the allocation fields "
                            "live there.")
        if train_dataset is None or isinstance(train_dataset, IterableDataset) or not hasattr(train_dataset, "__len__"):
            raise ValueError("`train_dataset` is the prompt pool and must be an indexable `datasets.Dataset` (not "
                             "None or an IterableDataset).")
        if "prompt" not in train_dataset.column_names:
            raise ValueError(f"`train_dataset` needs a 'prompt' column (it has {train_dataset.column_names}).")
        for name in ("tools", "rollout_func", "environment_factory"):
            if kwargs.get(name):
                raise ValueError(f"`{name}` is not supported by {type(self).__name__}: the allocator needs one "
                                 "single-turn response per request row.")
        args, reward_funcs = self._extra_reward_funcs(args, reward_funcs)
        reward_funcs = _checked_reward_funcs(reward_funcs)
        if isinstance(model, str):  # a registered name (trl_alloc.models) becomes its local folder
            from .models import resolve_model
            model = resolve_model(model)
        server_mode = args.use_vllm and args.vllm_mode == "server"
        if server_mode:  # our client: NCCL weight sync on CUDA, an in-place reload elsewhere; clear timeouts
            from .serving.client import patch_trl_vllm_client
        with patch_trl_vllm_client() if server_mode else contextlib.nullcontext():
            super().__init__(model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        if self._is_vlm or "image" in train_dataset.column_names or "images" in train_dataset.column_names:
            raise ValueError(f"{type(self).__name__} supports text prompts only.")
        if server_mode and self.accelerator.is_main_process:  # before the first push: the same architecture?
            self.vllm_generation.vllm_client.check_serves(self.accelerator.unwrap_model(self.model).config)

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
        self._warn_missing_reward_columns(train_dataset)
        self.pacer = build_pacer(args, num_prompts, self.num_rounds)
        self.filler = build_filler(args, num_prompts, self.pacer)
        self.budget_exhausted = False
        self.counters = {"rounds": 0, "responses": 0, "tokens": 0, "empty_rounds": 0, "rounds_without_signal": 0,
                         "unscored": 0}
        self._signal_streak = 0  # rounds in a row without a mixed group
        self._rounds_this_session = 0
        self.round_log = []  # per round: the broadcast decisions (identical on every rank)
        self.history = []  # per round: the allocation figures of `output_dir/allocation/summary.json`
        self.exposure = np.zeros(num_prompts, np.int64)  # responses per prompt over the run
        self._saved_lrs = None
        self._round_empty = False
        world = self.accelerator.num_processes
        self._collective_generation = world > 1 and (self.use_vllm or self._dist.is_zero3 or self.is_fsdp_enabled)
        self.pruner = build_pruner(self)  # ARROL / random pruning (SPEC §4), None for pruning='none'
        self.add_callback(_AllocationCallback(self))

    @staticmethod
    def _extra_reward_funcs(args, reward_funcs):
        return args, reward_funcs

    def _success_func_indices(self, args):
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

    def _warn_missing_reward_columns(self, dataset):
        for func, name in zip(self.reward_funcs, self.reward_func_names):
            if isinstance(func, torch.nn.Module):
                continue
            wanted = set(_parameters(func)) - TRL_REWARD_KWARGS - set(dataset.column_names)
            if wanted:
                print(f"[trl-alloc] WARNING: reward function {name!r} takes {', '.join(sorted(wanted))}, which the "
                      f"dataset has no column for (columns: {', '.join(dataset.column_names)}): it will get None. "
                      "Add the column (e.g. --answer_column) or fix the function.")

    # ------------------------------------------------------------------ loop pacing
    def get_train_dataloader(self):
        """One tick per micro-step, K × steps_per_round × gradient_accumulation_steps in all, the same on every
        rank (not sharded)."""
        ticks = _Ticks(self.num_rounds * self.steps_per_round * self.args.gradient_accumulation_steps)
        return DataLoader(ticks, batch_size=1, shuffle=False, collate_fn=_as_list)

    def _prepare_inputs(self, generation_batch):
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
        if self._round_empty and self._step % self.args.gradient_accumulation_steps == 0:
            self._zero_lr()  # every optimizer step of an empty round
        return self._buffered_inputs[self._step % split]

    # ------------------------------------------------------------------ one round
    def _broadcast(self, obj):
        if self.accelerator.num_processes == 1:
            return obj
        box = [obj]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def _main_call(self, fn):
        """Run allocator code on the main process; share its result, or its error, with every rank."""
        out, error = None, None
        if self.accelerator.is_main_process:
            try:
                out = ("ok", fn())
            except Exception as exc:  # raised on every rank below, so no rank hangs in a collective
                out, error = ("error", f"{type(exc).__name__}: {exc}"), exc
        status, value = self._broadcast(out)
        if status == "error":
            if error is not None:
                raise error
            raise RuntimeError(f"the allocator failed on the main process: {value}")
        return value

    def _run_round(self):
        """Run one scheduler round and return `gradient_accumulation_steps` local micro-batches."""
        t_round = time.perf_counter()
        alloc_time = [0.0]

        def timed(fn):
            def run():
                t0 = time.perf_counter()
                try:
                    return fn()
                finally:
                    alloc_time[0] += time.perf_counter() - t0
            return self._main_call(run)

        state = {}

        def start():
            units = self.pacer.propose()
            state["round"] = self.filler.start_round(**round_kwargs(self.args, self.pacer, units))
            return int((units > 0).sum())

        admitted = timed(start)
        rows, requests = [], []
        while True:
            def next_request():
                rnd = state["round"]
                if rnd.done:
                    return None
                ids, counts = rnd.requests()
                return (ids.tolist(), counts.tolist()) if len(ids) else None

            req = timed(next_request)
            if req is None:
                break
            requests.append(req)
            new = self._generate_and_score_request(*req)
            rows.extend(new)

            def observe(new=new, counts=req[1]):
                rewards = np.array([r["success"] for r in new], dtype=float)  # 0/1, NaN = unscored
                pruned = np.array([r.get("pruned", False) for r in new], dtype=bool)
                splits = np.cumsum(counts)[:-1]
                state["round"].observe(np.split(rewards, splits), pruned=np.split(pruned, splits))
                if self.pruner is not None:
                    self.pruner.record(new)

            timed(observe)

        def finish():
            rnd = state["round"]
            self.pacer.update(*rnd.outcomes(self.pacer.num_prompts))
            out = {"groups": [int(g) for g in rnd.groups], "stats": rnd.stats(),
                   "finished": bool(self.pacer.finished), "remaining": int(self.pacer.remaining_responses)}
            if hasattr(self.pacer, "pacing_gap"):
                out["pacing_gap"] = float(self.pacer.pacing_gap())
            if self.pruner is not None:
                out["pruning"] = self.pruner.end_round()
            return out

        summary = timed(finish)
        self.budget_exhausted = summary["finished"]
        self.round_log.append({"round": self.counters["rounds"], "requests": requests, "groups": summary["groups"]})
        batches = self._build_loss_batches(rows, summary["groups"])
        self._log_round(rows, summary, admitted, alloc_time[0], time.perf_counter() - t_round)
        return batches

    # ------------------------------------------------------------------ generation and scoring
    def _generate_and_score_request(self, prompt_ids, counts):
        """Generate `counts[j]` responses for dataset row `prompt_ids[j]` across ranks and score them.

        Returns the request's rows (in request order, identical on every rank), each a dict with
        pid, prompt_ids, completion_ids, completion, rewards (per function) and reward (weighted sum).
        """
        acc = self.accelerator
        flat = np.repeat(np.asarray(prompt_ids, np.int64), np.asarray(counts, np.int64))
        if flat.size == 0:
            return []
        world, rank = acc.num_processes, acc.process_index
        share = math.ceil(flat.size / world)
        local = flat[rank * share:(rank + 1) * share].tolist()
        examples = {pid: self.train_dataset[int(pid)] for pid in set(local) | {int(flat[0])}}

        gen = local + [int(flat[0])] * (share - len(local)) if self._collective_generation else local
        completion_ids, prompt_tok, logprobs = [], [], []
        pruned = [False] * len(local)
        if self.pruner is not None:  # two-phase generation, pruned at detect_length (every rank takes part)
            tokenized = self._tokenize_prompts([examples[pid]["prompt"] for pid in gen])[0] if gen else []
            shares = [(r * share, min((r + 1) * share, flat.size)) for r in range(world)]
            completion_ids, logprobs, pruned = generate_with_pruning(
                self, tokenized, len(local), flat.tolist(), rank * share, shares)
            prompt_tok = [list(map(int, p)) for p in tokenized[:len(local)]]
        elif gen:
            prompts = [examples[pid]["prompt"] for pid in gen]
            tokenized, _, _ = self._tokenize_prompts(prompts)
            completion_ids, sampling_logps = self._generate_single_turn(tokenized, None, {}, 1)
            completion_ids = [list(map(int, c)) for c in completion_ids[:len(local)]]
            prompt_tok = [list(map(int, p)) for p in tokenized[:len(local)]]
            if sampling_logps is not None:  # vLLM: kept for the importance-sampling correction
                logprobs = [[float("nan") if x is None else float(x) for x in lp] for lp in sampling_logps[:len(local)]]
        logprobs = logprobs or [None] * len(completion_ids)
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True) if completion_ids else []
        conversational = is_conversational({"prompt": examples[int(flat[0])]["prompt"]})
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts

        # TRL's reward step gathers equal-sized shares: pad with empty completions, dropped below.
        n_pad = share - len(local)
        filler_ex = examples[int(flat[0])]
        empty = [{"role": "assistant", "content": ""}] if conversational else ""
        inputs = [examples[pid] for pid in local] + [filler_ex] * n_pad
        scored = [empty if cut else c for c, cut in zip(completions, pruned)]  # pruned rollouts get no reward
        scored_ids = [[] if cut else c for c, cut in zip(completion_ids, pruned)]
        rewards_per_func = self._calculate_rewards(
            inputs, [x["prompt"] for x in inputs], scored + [empty] * n_pad, scored_ids + [[]] * n_pad)
        extra = self._gather_extra_columns(len(local))
        keep = torch.cat([torch.arange(r * share, r * share + len(flat[r * share:(r + 1) * share]))
                          for r in range(world)])
        rewards_per_func = rewards_per_func[keep.to(rewards_per_func.device)].cpu()

        gathered = gather_object(list(zip(prompt_tok, completion_ids, completions, logprobs, pruned)))
        cut = torch.tensor([g[4] for g in gathered], dtype=torch.bool)
        rewards_per_func[cut] = float("nan")
        weights = self.reward_weights.cpu()
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        reward = (rewards_per_func * weights).nansum(dim=1)
        reward[unscorable] = float("nan")
        score = rewards_per_func[:, self.success_funcs]
        success = torch.where(torch.isnan(score).all(dim=1), float("nan"),
                              torch.from_numpy(is_success(score.nansum(dim=1).numpy(), self.args.success_threshold))
                              .float())
        return [{"pid": int(pid), "prompt_ids": p, "completion_ids": c, "completion": text, "sampling_logps": lp,
                 "rewards": rewards_per_func[i], "reward": float(reward[i]), "success": float(success[i]),
                 "pruned": bool(x), "extra": {col: values[i] for col, values in extra.items()}}
                for i, (pid, (p, c, text, lp, x)) in enumerate(zip(flat.tolist(), gathered))]

    def _gather_extra_columns(self, n_local):
        """The `log_extra` columns reward functions wrote for this request: this rank's real rows only
        (not the padding), gathered in request order."""
        columns = {}
        for column in sorted(set(gather_object(list(self._pending_extra_logs)))):
            values = list(self._pending_extra_logs.get(column, []))[:n_local]
            columns[column] = gather_object(values + [None] * (n_local - len(values)))
        self._pending_extra_logs.clear()
        return columns

    # ------------------------------------------------------------------ loss batch
    def _group_advantages(self, rewards_per_func, sizes):
        """TRL's advantage formulas, with each group normalised over its own (possibly different) size."""
        weights = self.reward_weights.cpu()
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        chunks = lambda x: torch.split(x, sizes)  # noqa: E731
        if self.multi_objective_aggregation == "sum_then_normalize":
            rewards = (rewards_per_func * weights).nansum(dim=1)
            rewards[unscorable] = float("nan")
            mean = torch.cat([torch.nanmean(c).expand(len(c)) for c in chunks(rewards)])
            group_std = torch.cat([nanstd(c).expand(len(c)) if len(c) > 1 else torch.zeros(len(c))
                                   for c in chunks(rewards)])
            if self.scale_rewards == "batch":
                std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
            else:
                std = group_std
            advantages = rewards - mean
            if self.scale_rewards != "none":
                advantages = advantages / (std + 1e-4)
        else:  # normalize_then_sum
            parts = []
            for c in torch.split(rewards_per_func, sizes):
                std_k = nanstd(c, dim=0, keepdim=True) if len(c) > 1 else torch.zeros(1, c.size(1))
                parts.append((c - torch.nanmean(c, dim=0, keepdim=True)) / (std_k + 1e-4))
            rewards = (torch.cat(parts) * weights).nansum(dim=1)
            rewards[unscorable] = float("nan")
            std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
            advantages = (rewards - torch.nanmean(rewards)) / (std + 1e-4)
            group_std = torch.cat([nanstd(c).expand(len(c)) if len(c) > 1 else torch.zeros(len(c))
                                   for c in chunks(rewards)])
        zero_std = torch.isclose(torch.nan_to_num(group_std, nan=0.0), torch.zeros_like(group_std))
        return torch.nan_to_num(advantages, nan=0.0), zero_std

    def _build_loss_batches(self, rows, groups):
        """The round's committed groups as this rank's `gradient_accumulation_steps` micro-batches
        (pruned rollouts never reach the loss; a group is its survivors)."""
        by_pid = defaultdict(list)
        for i, row in enumerate(rows):
            if not row.get("pruned"):
                by_pid[row["pid"]].append(i)
        groups = [g for g in dict.fromkeys(groups) if by_pid[g]]
        loss_rows = [rows[i] for g in groups for i in by_pid[g]]
        sizes = [len(by_pid[g]) for g in groups]
        self._round_loss_rows, self._round_zero_std = loss_rows, None
        self._round_empty = not loss_rows
        split = self.args.steps_per_generation
        if not loss_rows:
            self.counters["empty_rounds"] += 1
            return [self._collate([], torch.zeros(0), 1) for _ in range(split)]
        rewards = torch.stack([r["rewards"] for r in loss_rows])
        advantages, zero_std = self._group_advantages(rewards, sizes)
        self._round_advantages, self._round_zero_std = advantages, zero_std
        eos_and_pad = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        keep = [not (self.mask_truncated_completions and (not r["completion_ids"] or r["completion_ids"][-1]
                                                          not in eos_and_pad)) for r in loss_rows]
        num_items = sum(len(r["completion_ids"]) for r, k in zip(loss_rows, keep) if k)
        # Even split over ranks (contiguous, as TRL slices a generation batch), shuffle, then micro-batches.
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        mine = np.array_split(np.arange(len(loss_rows)), world)[rank]
        mine = mine[torch.randperm(len(mine)).numpy()] if len(mine) else mine
        batches = []
        for part in np.array_split(mine, split):
            part = part.tolist()
            batches.append(self._collate([loss_rows[i] for i in part], advantages[part], num_items,
                                         [keep[i] for i in part]))
        return batches

    def _collate(self, rows, advantages, num_items, keep=None):
        """Pad a micro-batch like TRL's `_generate_and_score_completions` output. An empty micro-batch
        becomes one dummy row whose loss mask (`tool_mask`) is zero, so every rank still runs forward and
        backward (DeepSpeed/DDP collectives) while the loss and gradients stay exactly zero."""
        device = self.accelerator.device
        pad_id = self._tokenizer.pad_token_id
        dummy = not rows
        if dummy:  # two completion tokens: TRL treats a (B, 1) tensor as sequence-level in its metrics
            rows = [{"prompt_ids": [pad_id], "completion_ids": [self.eos_token_ids[0]] * 2}]
            advantages, keep = torch.zeros(1), [True]
        p = [torch.tensor(r["prompt_ids"], dtype=torch.long) for r in rows]
        c = [torch.tensor(r["completion_ids"], dtype=torch.long) for r in rows]
        mult = self.pad_to_multiple_of
        out = {
            "prompt_ids": pad(p, padding_value=pad_id, padding_side="left", pad_to_multiple_of=mult).to(device),
            "prompt_mask": pad([torch.ones_like(x) for x in p], padding_value=0, padding_side="left",
                               pad_to_multiple_of=mult).to(device),
            "completion_ids": pad(c, padding_value=pad_id, padding_side="right", pad_to_multiple_of=mult).to(device),
            "completion_mask": pad([torch.ones_like(x) for x in c], padding_value=0, padding_side="right",
                                   pad_to_multiple_of=mult).to(device),
            "advantages": advantages.to(device=device, dtype=torch.float32),
            "num_items_in_batch": torch.tensor(float(num_items), device=device),
        }
        if keep is not None and not all(keep):  # mask_truncated_completions
            out["completion_mask"] = out["completion_mask"] * torch.tensor(keep, device=device).unsqueeze(1).int()
        if dummy:
            out["tool_mask"] = torch.zeros_like(out["completion_mask"])
        if self.use_vllm and self.vllm_importance_sampling_correction:
            sampling = [torch.tensor(r.get("sampling_logps") or [0.0] * len(r["completion_ids"])) for r in rows]
            out["sampling_per_token_logps"] = pad(sampling, padding_value=0.0, padding_side="right",
                                                  pad_to_multiple_of=mult).to(device)
            out["old_per_token_logps"] = self._policy_logps(out, self.model)
            out["importance_sampling_ratio"] = self._importance_ratio(out)
        elif self.steps_per_round > 1 and not dummy:  # later steps see an older policy's samples (TRL's rule)
            out["old_per_token_logps"] = self._policy_logps(out, self.model)
        if self.beta != 0.0:
            out["ref_per_token_logps"] = self._ref_logps(out)
        return out

    def _importance_ratio(self, batch):
        """TRL's vLLM importance-sampling ratio (token or sequence level, truncated or masked)."""
        mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        diff = torch.nan_to_num((batch["old_per_token_logps"] - batch["sampling_per_token_logps"]) * mask, nan=0.0)
        mode = self.vllm_importance_sampling_mode
        ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
        lo, hi = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if mode.endswith("truncate"):
            return torch.clamp(ratio, min=lo, max=hi)
        lo = -math.inf if lo is None else lo
        hi = math.inf if hi is None else hi
        return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)

    @torch.no_grad()
    def _policy_logps(self, batch, model):
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            return self._get_per_token_logps_and_entropies(model, ids, mask, batch["completion_ids"].size(1))[0]

    def _ref_logps(self, batch):
        """Reference-model log-probabilities for the KL term (TRL's rule: ref model, or PEFT adapters off)."""
        if self.ref_model is not None:
            return self._policy_logps(batch, self.ref_model)
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._policy_logps(batch, self.model)

    def _compute_loss(self, model, inputs):
        if not (self.model.training and self._round_empty):
            return super()._compute_loss(model, inputs)
        # An empty round: the zero loss still runs (collectives), but its metrics would only log zeros.
        metrics = self._metrics["train"]
        before = {key: len(values) for key, values in metrics.items()}
        loss = super()._compute_loss(model, inputs)
        for key in list(metrics):
            del metrics[key][before.get(key, 0):]
            if not metrics[key]:
                del metrics[key]
        return loss

    def _zero_lr(self):
        """A round with no group: zero learning rate for this optimizer step, so no parameter moves
        (zero gradients alone would still move Adam parameters through momentum and weight decay)."""
        if self.optimizer is None or self._saved_lrs is not None:  # outside `train()`, or already zeroed
            return
        self._saved_lrs = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] = 0.0

    # ------------------------------------------------------------------ metrics
    def _log_round(self, rows, summary, admitted, alloc_time, round_time):
        m = self._metrics["train"]
        stats = summary["stats"]
        spent = len(rows)
        comp_tokens = sum(len(r["completion_ids"]) for r in rows)
        prompt_tokens = sum(len(r["prompt_ids"]) for r in rows)
        self.counters["rounds"] += 1
        self._rounds_this_session += 1
        self.counters["responses"] += spent
        unscored = int(stats.get("unscored", 0))
        self.counters["unscored"] += unscored
        self.counters["tokens"] += comp_tokens
        self.state.num_input_tokens_seen += prompt_tokens + comp_tokens
        m["num_tokens"] = [self.state.num_input_tokens_seen]
        touched = len({r["pid"] for r in rows})
        np.add.at(self.exposure, [r["pid"] for r in rows], 1)
        self.history.append({"round": self.counters["rounds"], "responses": spent, "tokens": comp_tokens,
                             "admitted": admitted, "groups": touched, "committed": stats["groups"],
                             "effective_groups": stats["effective_groups"], "abandoned": stats["abandoned"],
                             "pruned": stats.get("pruned", 0), "unscored": unscored,
                             "loss_responses": len(self._round_loss_rows),
                             "allocator_s": round(alloc_time, 6), "round_s": round(round_time, 6)})
        for key, value in {
            "alloc/round": self.counters["rounds"], "alloc/responses_spent": self.counters["responses"],
            "alloc/responses_remaining": summary["remaining"], "alloc/tokens_spent": self.counters["tokens"],
            "alloc/empty_rounds": self.counters["empty_rounds"], "alloc/responses_unscored": self.counters["unscored"],
        }.items():
            m[key] = [float(value)]
        m["alloc/round_responses"].append(float(spent))
        m["alloc/round_tokens"].append(float(comp_tokens))
        m["alloc/groups_admitted"].append(float(admitted))
        m["alloc/groups_committed"].append(float(stats["groups"]))
        m["alloc/groups_abandoned"].append(float(stats["abandoned"]))
        m["alloc/effective_groups"].append(float(stats["effective_groups"]))
        m["alloc/egr"].append(stats["effective_groups"] / touched if touched else 0.0)
        m["alloc/loss_responses"].append(float(len(self._round_loss_rows)))
        m["alloc/generation_calls"].append(float(stats["generation_calls"]))
        m["alloc/time_s"].append(alloc_time)
        m["alloc/time_share"].append(alloc_time / round_time if round_time > 0 else 0.0)
        if "pacing_gap" in summary:
            m["alloc/pacing_gap"] = [summary["pacing_gap"]]
        self._watch_signal(rows, stats)
        if "pruning" in summary:
            m["alloc/responses_pruned"].append(float(stats.get("pruned", 0)))
            for key, value in summary["pruning"].items():
                if key.endswith("_total"):
                    m[key] = [value]
                else:
                    m[key].append(value)
        rows = [r for r in rows if not r.get("pruned")]  # completion and reward figures: completed rollouts
        if not rows:
            return
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
        if self._round_zero_std is not None:
            m["frac_reward_zero_std"].append(self._round_zero_std.float().mean().item())
            loss_rows = self._round_loss_rows
            self._logs["prompt"].extend(self.train_dataset[[r["pid"] for r in loss_rows]]["prompt"])
            self._logs["completion"].extend(r["completion"] for r in loss_rows)
            for i, name in enumerate(self.reward_func_names):
                self._logs["rewards"][name].extend(float(r["rewards"][i]) for r in loss_rows)
            self._logs["advantages"].extend(self._round_advantages.tolist())
            for column in sorted({c for r in loss_rows for c in r["extra"]}):
                self._logs["extra"][column].extend(r["extra"].get(column) for r in loss_rows)
        for name in sorted(set(gather_object(list(self._pending_metrics)))):
            values = self._pending_metrics.get(name, [])
            stats_t = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=self.accelerator.device)
            total, count = self.accelerator.gather(stats_t).view(-1, 2).sum(dim=0).tolist()
            m[name].append(total / count if count else float("nan"))
        self._pending_metrics.clear()

    def _watch_signal(self, rows, stats):
        """Count rounds without a mixed group; warn, naming the likely cause, after `no_signal_warning_rounds`."""
        if stats["effective_groups"] > 0:
            self._signal_streak = 0
            return
        self.counters["rounds_without_signal"] += 1
        self._signal_streak += 1
        if self._signal_streak != self.args.no_signal_warning_rounds or not self.accelerator.is_main_process:
            return
        success = np.array([r["success"] for r in rows if not r.get("pruned")], dtype=float)
        reward = np.array([r["reward"] for r in rows if not r.get("pruned")], dtype=float)
        scored = success[~np.isnan(success)]
        names = [self.reward_func_names[i] for i in self.success_funcs]
        if not len(rows):
            cause = (f"no response was generated (responses left in the budget: {int(self.pacer.remaining_responses)}); "
                     "raise `rollout_budget`")
        elif not scored.size:
            cause = "every reward was None/NaN: no reward function could score the responses"
        elif scored.max() == 0:
            cause = (f"no response succeeded: success = {' + '.join(names)} >= success_threshold "
                     f"({self.args.success_threshold}), and the rewards seen lie in [{np.nanmin(reward):g}, "
                     f"{np.nanmax(reward):g}]. Check `success_threshold` / `success_reward_funcs`, the dataset's "
                     "answers, or use easier prompts")
        else:
            cause = "every response succeeded: the prompts are too easy for this policy"
        print(f"[trl-alloc] WARNING: {self._signal_streak} rounds in a row without one mixed group, so nothing is "
              f"trained. Likely cause: {cause}.")

    def _allocator_snapshot(self):
        """The allocator's state at the start of a round (a failed round is rolled back to it before the
        rescue checkpoint; without checkpoints there is nothing to roll back for)."""
        if not self.accelerator.is_main_process or self.args.save_strategy == "no":
            return None
        return json.loads(json.dumps(self.allocation_state(), default=_json_default))

    def _rescue_checkpoint(self, start_state=None):
        """A round failed (e.g. dynamic sampling hit its cap): roll the allocator back to the round's
        start, save what is trained so far, then re-raise (the failed round is not in the log)."""
        if start_state is not None:
            self.load_allocation_state(start_state, check=False)
        if self.args.save_strategy == "no" or self.state.global_step == 0:
            return
        folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        if not os.path.isfile(os.path.join(folder, ALLOCATION_STATE_NAME)):
            self._save_checkpoint(self.model, trial=None)
            if self.accelerator.is_main_process:
                print(f"[trl-alloc] the round failed; the policy trained so far is saved in {folder}")

    # ------------------------------------------------------------------ end-of-run report
    def write_allocation_report(self):
        """`output_dir/allocation/summary.json` and PNG plots of the run's allocation; returns the summary."""
        from .plots import write_allocation_report

        methods = {"pacing": self.args.pacing, "filling": self.args.filling, "pruning": self.args.pruning}
        trained = any(h["effective_groups"] > 0 for h in self.history)
        extra = {"methods": methods, "empty_rounds": self.counters["empty_rounds"],
                 "rounds_without_signal": self.counters["rounds_without_signal"],
                 "responses_unscored": self.counters["unscored"], "trained": trained,
                 "allocator_time_share": (sum(h["allocator_s"] for h in self.history)
                                          / max(sum(h["round_s"] for h in self.history), 1e-9))}
        budget = self.counters["responses"] + int(self.pacer.remaining_responses)
        calibration = None
        if self.pruner is not None:
            extra["pruning"] = dict(self.pruner.totals)
            calibration = self.pruner.calibration_curve()
        return write_allocation_report(self.args.output_dir, self.history, self.exposure, budget, extra,
                                       calibration=calibration)

    # ------------------------------------------------------------------ checkpointing
    def run_plan(self):
        """What fixes this run's plan; a checkpoint of another plan is refused (`checkpointing.PLAN_FIELDS`)."""
        a = self.args
        return {"pacing": a.pacing, "filling": a.filling, "pruning": a.pruning, "num_prompts": self.pacer.num_prompts,
                "num_rounds": self.num_rounds, "rollout_budget": int(a.budget_for(self.num_rounds)),
                "allocation_seed": a.seed if a.allocation_seed is None else a.allocation_seed,
                "dataset_fingerprint": self._fingerprint}

    @property
    def _fingerprint(self):
        if getattr(self, "_dataset_fingerprint", None) is None:
            self._dataset_fingerprint = dataset_fingerprint(self.train_dataset["prompt"])
        return self._dataset_fingerprint

    def allocation_state(self):
        """The allocator's state as plain JSON-serialisable data (what checkpoints hold), with the run's
        per-round history, so the report after a resume covers the whole run."""
        return {"version": STATE_VERSION, **self.run_plan(),
                "pacer": self.pacer.state_dict(), "filler": self.filler.state_dict(),
                "pruner": None if self.pruner is None else self.pruner.state_dict(),
                "counters": dict(self.counters), "budget_exhausted": self.budget_exhausted,
                "history": self.history, "exposure": self.exposure}

    def load_allocation_state(self, state, path=ALLOCATION_STATE_NAME, check=True):
        if check:
            old = {"pruning": "none"} if "pruning" not in state else {}
            check_same_plan({**state, **old}, self.run_plan(), path)
        self.pacer.load_state_dict(state["pacer"])
        self.filler.load_state_dict(state["filler"])
        if self.pruner is not None:
            self.pruner.load_state_dict(state["pruner"])
        self.counters.update(state["counters"])
        self.budget_exhausted = bool(state.get("budget_exhausted", False))
        self.history = [dict(h) for h in state.get("history", [])]
        if "exposure" in state:
            self.exposure = np.asarray(state["exposure"], np.int64)

    def save_model(self, output_dir=None, _internal_call=False):
        """TRL's save, plus `allocation_state.json` next to the weights (checkpoints and final saves)."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            output_dir = output_dir or self.args.output_dir
            os.makedirs(output_dir, exist_ok=True)
            write_json_atomic(os.path.join(output_dir, ALLOCATION_STATE_NAME), self.allocation_state(),
                              default=_json_default)
            if self.pruner is not None:  # the quality head as its own adapter folder, `quality_head/`
                self.pruner.save(output_dir)

    def _get_output_dir(self, trial):
        return getattr(self, "_staging_dir", None) or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        """TRL's checkpoint, written under `.partial-checkpoint-N/` and renamed into place once whole, so
        the newest `checkpoint-N` is always complete; a full disk gets a clear error."""
        run_dir = super()._get_output_dir(trial)
        final = os.path.join(run_dir, f"checkpoint-{self.state.global_step}")
        staging = os.path.join(run_dir, f".partial-checkpoint-{self.state.global_step}")
        main = self.args.should_save
        push, self.args.push_to_hub = self.args.push_to_hub, False  # pushed below, from the final folder
        self._staging_dir = staging
        try:
            super()._save_checkpoint(model, trial)
            self.accelerator.wait_for_everyone()
            if main:
                if os.path.isdir(final):  # an older save of the same step (a rescue, or a resumed run)
                    shutil.rmtree(final)
                os.replace(os.path.join(staging, os.path.basename(final)), final)
                shutil.rmtree(staging, ignore_errors=True)
        except Exception as exc:
            if main:
                shutil.rmtree(staging, ignore_errors=True)
            if is_disk_full(exc, run_dir):
                raise disk_full_error(exc, final, earlier_checkpoint(final)) from exc
            raise
        finally:
            self._staging_dir = None
            self.args.push_to_hub = push
        self.accelerator.wait_for_everyone()
        if main:
            from transformers.trainer_utils import rotate_checkpoints
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint)
        if push:
            self._push_from_checkpoint(final)

    def _save_optimizer_and_scheduler(self, output_dir):
        super()._save_optimizer_and_scheduler(output_dir)
        if self.pruner is not None and self.args.should_save:  # the head's optimizer, next to the policy's
            self.pruner.save_optimizer(output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        self.load_allocation_state(read_allocation_state(checkpoint), os.path.join(checkpoint, ALLOCATION_STATE_NAME))
        if self.pruner is not None:
            self.pruner.load(checkpoint)


class AllocDAPOTrainer(AllocGRPOTrainer):
    """AllocGRPOTrainer with DAPO's overlong reward shaping added to the reward functions
    (TRL's `get_soft_overlong_punishment`); use with `AllocDAPOConfig`."""

    _tag_names = ["trl", "dapo", "trl-alloc"]
    config_class = AllocDAPOConfig

    @staticmethod
    def _extra_reward_funcs(args, reward_funcs):
        buffer = getattr(args, "overlong_buffer", 0) or 0
        if buffer <= 0:
            return args, reward_funcs
        from trl.rewards import get_soft_overlong_punishment

        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if args.reward_weights is not None and len(args.reward_weights) == len(funcs):
            args = copy.copy(args)  # the caller's config keeps its own weights
            args.reward_weights = list(args.reward_weights) + [1.0]
        return args, funcs + [get_soft_overlong_punishment(args.max_completion_length, buffer)]


def _checked_reward_funcs(reward_funcs):
    """Plain-function rewards wrapped so a wrong output names the function (async ones are TRL's)."""
    import inspect

    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    out = [f if isinstance(f, (str, torch.nn.Module)) or inspect.iscoroutinefunction(f)
           or getattr(f, "trl_alloc_checked", False) else checked_reward(f) for f in funcs]
    return out if isinstance(reward_funcs, (list, tuple)) else out[0]


def _parameters(func):
    import inspect

    try:
        return [name for name, p in inspect.signature(func).parameters.items()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    except (TypeError, ValueError):
        return []


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"allocator state holds a {type(obj).__name__}, which is not JSON-serialisable.")
