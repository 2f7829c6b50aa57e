"""The round's loss batch: its committed groups, with group-normalised advantages, padded into the
micro-batches TRL's loss reads (the layout of TRL's `_generate_and_score_completions` output)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import pad, use_adapter

from .advantages import group_advantages
from .trl_compat import per_token_logps


class LossBatchMixin:
    """Loss micro-batches of an AllocGRPOTrainer round (pruned rollouts never reach the loss)."""

    def _build_loss_batches(self, rows: list[dict[str, Any]], groups: Sequence[int]) -> list[dict[str, Any]]:
        """The round's committed groups as this rank's `gradient_accumulation_steps` micro-batches
        (pruned rollouts never reach the loss; a group is its survivors)."""
        by_pid = defaultdict(list)
        for i, row in enumerate(rows):
            if not (row.get("pruned") or row.get("aborted")):
                by_pid[row["pid"]].append(i)
        groups = [g for g in dict.fromkeys(groups) if by_pid[g]]
        loss_rows = [rows[i] for g in groups for i in by_pid[g]]
        sizes = [len(by_pid[g]) for g in groups]
        state = self.round_state
        state.loss_rows, state.zero_std, state.sampling, state.flat_groups = loss_rows, None, {}, 0
        state.empty = not loss_rows
        nominal = self.args.generation_batch_size  # the rows stock GRPO's step would average over
        state.loss_scale = (min(1.0, len(loss_rows) / nominal)
                            if self.args.loss_normalization == "nominal" and loss_rows else 1.0)
        split = self.args.steps_per_generation
        if not loss_rows:
            return [self._collate([], torch.zeros(0), 1) for _ in range(split)]
        rewards = torch.stack([r["rewards"] for r in loss_rows])
        group_index = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
        advantages, zero_std = group_advantages(rewards, group_index, self.reward_weights.cpu(),
                                                self.multi_objective_aggregation, self.scale_rewards)
        state.advantages, state.zero_std = advantages, zero_std
        success = [{s for i in by_pid[g] if (s := float(rows[i].get("success", "nan"))) == s} for g in groups]
        state.flat_groups = sum(len(s) > 1 and bool(z.all()) for s, z in zip(success, torch.split(zero_std, sizes)))
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
        state.sampling = _sampling_stats(batches)
        return batches

    def _collate(self, rows: list[dict[str, Any]], advantages: torch.Tensor, num_items: int,
                 keep: Any = None) -> dict[str, Any]:
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

    def _importance_ratio(self, batch: dict[str, Any]) -> torch.Tensor:
        """TRL's vLLM importance-sampling ratio (token or sequence level, truncated or masked); the ratio before
        the cap goes to `batch["raw_importance_sampling_ratio"]` (for the mismatch metrics, not the loss)."""
        mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        diff = torch.nan_to_num((batch["old_per_token_logps"] - batch["sampling_per_token_logps"]) * mask, nan=0.0)
        mode = self.vllm_importance_sampling_mode
        ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
        batch["raw_importance_sampling_ratio"] = ratio
        lo, hi = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if mode.endswith("truncate"):
            return torch.clamp(ratio, min=lo, max=hi)
        lo = -math.inf if lo is None else lo
        hi = math.inf if hi is None else hi
        return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)

    @torch.no_grad()
    def _policy_logps(self, batch: dict[str, Any], model: Any) -> torch.Tensor:
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            return per_token_logps(self, model, ids, mask, batch["completion_ids"].size(1))

    def _ref_logps(self, batch: dict[str, Any]) -> torch.Tensor:
        """Reference-model log-probabilities for the KL term (TRL's rule: ref model, or PEFT adapters off)."""
        if self.ref_model is not None:
            return self._policy_logps(batch, self.ref_model)
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._policy_logps(batch, self.model)


MISMATCH_QUANTILES = (0.05, 0.5, 0.95)


def _sampling_stats(batches: list[dict[str, Any]]) -> dict[str, float]:
    """The engine-trainer mismatch over this rank's loss tokens: TRL's `sampling/*` metrics of the vLLM
    importance-sampling correction (|Δ log-prob| per token, the capped ratio), plus the uncapped ratio's quantiles
    and the share of ratios (tokens, or sequences in TRL's sequence modes) the cap truncated or masked."""
    if not batches or "importance_sampling_ratio" not in batches[0]:
        return {}
    capped, raw, diff = [], [], []
    for b in batches:
        mask = (b["completion_mask"] * b.get("tool_mask", 1)).bool()

        def per_item(t: torch.Tensor, mask: torch.Tensor = mask) -> torch.Tensor:
            # one value per loss token, or per sequence for a sequence-level ratio
            return t[mask.any(-1)].flatten() if t.size(-1) == 1 else t[mask]

        capped.append(per_item(b["importance_sampling_ratio"]))
        raw.append(per_item(b["raw_importance_sampling_ratio"]))
        diff.append((b["old_per_token_logps"] - b["sampling_per_token_logps"]).abs()[mask])
    capped, raw, diff = torch.cat(capped).double(), torch.cat(raw).double(), torch.cat(diff)
    if not diff.numel():
        return {}
    quantiles = torch.quantile(raw, torch.tensor(MISMATCH_QUANTILES, dtype=torch.float64))
    return {"sampling/sampling_logp_difference/mean": diff.mean().item(),
            "sampling/sampling_logp_difference/max": diff.max().item(),
            "sampling/importance_sampling_ratio/min": capped.min().item(),
            "sampling/importance_sampling_ratio/mean": capped.mean().item(),
            "sampling/importance_sampling_ratio/max": capped.max().item(),
            **{f"sampling/raw_importance_sampling_ratio/p{round(q * 100):02d}": v.item()
               for q, v in zip(MISMATCH_QUANTILES, quantiles)},
            "sampling/importance_sampling_capped_share": (capped != raw).double().mean().item()}
