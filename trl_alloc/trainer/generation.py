"""One generation request of a round: its rows generated across ranks (TRL's generation backend, or
ARROL's two-phase generation), scored with TRL's reward step, and gathered so every rank holds them; and,
in event mode, the scoring of rollouts that ended in the rollout backend (`_score_rollouts`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from trl.data_utils import is_conversational

from ..allocation.success import is_success
from ..rollout.pruning import generate_with_pruning
from .trl_compat import calculate_rewards, generate, generation_host, take_extra_columns, tokenize_prompts


class RequestGenerationMixin:
    """Generates and scores the rows of one `(prompt ids, counts)` request (every rank)."""

    def _generate_and_score_request(self, prompt_ids: Sequence[int],
                                    counts: Sequence[int]) -> list[dict[str, Any]]:
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
            tokenized = tokenize_prompts(self, [examples[pid]["prompt"] for pid in gen]) if gen else []
            shares = [(r * share, min((r + 1) * share, flat.size)) for r in range(world)]
            completion_ids, logprobs, pruned = generate_with_pruning(
                generation_host(self, self._collective_generation), self.pruner, tokenized, len(local),
                flat.tolist(), rank * share, shares)
            prompt_tok = [list(map(int, p)) for p in tokenized[:len(local)]]
        elif gen:
            prompts = [examples[pid]["prompt"] for pid in gen]
            tokenized = tokenize_prompts(self, prompts)
            completion_ids, sampling_logps = generate(self, tokenized)
            completion_ids = [list(map(int, c)) for c in completion_ids[:len(local)]]
            prompt_tok = [list(map(int, p)) for p in tokenized[:len(local)]]
            if sampling_logps is not None:  # vLLM: kept for the importance-sampling correction
                logprobs = [[float("nan") if x is None else float(x) for x in lp]
                            for lp in sampling_logps[:len(local)]]
        return self._score_share(flat, share, local, examples, prompt_tok, completion_ids, logprobs, pruned)

    def _score_rollouts(self, rollouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Score ended rollouts (event mode; the same list on every rank): each rank scores a contiguous share.
        Aborted rollouts get no reward, like pruned ones; returns rows as `_generate_and_score_request`'s."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        flat = np.asarray([r["pid"] for r in rollouts], np.int64)
        share = math.ceil(flat.size / world)
        mine = rollouts[rank * share:(rank + 1) * share]
        local = [r["pid"] for r in mine]
        examples = {pid: self.train_dataset[int(pid)] for pid in set(local) | {int(flat[0])}}
        rows = self._score_share(flat, share, local, examples, [r["prompt_ids"] for r in mine],
                                 [r["token_ids"] for r in mine], [r["logprobs"] for r in mine],
                                 [r["finish_reason"] == "abort" for r in mine])
        for row, r in zip(rows, rollouts):
            row["rid"] = r["rid"]  # (the pruner's key in the stream)
            row["aborted"] = r["finish_reason"] == "abort"
            row["pruned"] = False  # (aborted, not pruned: it was scored as cut only to get no reward)
        return rows

    def _score_share(self, flat: Sequence[int], share: Sequence[int], local: Any, examples: list[dict[str, Any]],
                     prompt_tok: Any, completion_ids: list[list[int]], logprobs: Any,
                     pruned: Any) -> list[dict[str, Any]]:
        """Score this rank's share `local` of the rows `flat` with TRL's reward step; gather every share."""
        world = self.accelerator.num_processes
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
        rewards_per_func = calculate_rewards(
            self, inputs, [x["prompt"] for x in inputs], scored + [empty] * n_pad, scored_ids + [[]] * n_pad)
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

    def _gather_extra_columns(self, n_local: int) -> Any:
        """The `log_extra` columns reward functions wrote for this request: this rank's real rows only
        (not the padding), gathered in request order."""
        pending, columns = take_extra_columns(self), {}
        for column in sorted(set(gather_object(list(pending)))):
            values = pending.get(column, [])[:n_local]
            columns[column] = gather_object(values + [None] * (n_local - len(values)))
        return columns
