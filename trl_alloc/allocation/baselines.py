"""The papers' baselines as pacers and fillers: plain GRPO, DAPO dynamic sampling, KnapsackRL
(docs/allocation.md#baselines)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._checks import check_counts, check_int
from .base import Filler, Pacer, RunContext
from .event_rounds import EventRound
from .hyperparameters import Hyperparameter, at_least
from .registry import method_class, register

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


class _BudgetedPacer(Pacer):
    """Budget bookkeeping shared by every pacer: remaining responses, per-prompt counts, validation."""

    def __init__(self, num_prompts: int, unit_size: int, budget_responses: int) -> None:
        self.num_prompts = check_int("num_prompts", num_prompts, 1)
        self.unit_size = check_int("unit_size", unit_size, 1)
        self.budget_responses = check_int("budget", budget_responses, 0)
        self.remaining_responses = self.budget_responses
        self.round = 0
        self.last_units = np.zeros(self.num_prompts, np.int64)

    def _consume(self, successes, failures, responses, prepaid=None):
        s = check_counts("successes", successes, self.num_prompts)
        f = check_counts("failures", failures, self.num_prompts)
        spent = s + f if responses is None else check_counts("responses", responses, self.num_prompts)
        paid = 0 if prepaid is None else check_counts("prepaid", prepaid, self.num_prompts)
        if np.any(s + f > spent + paid):
            raise ValueError("`successes + failures` exceeds `responses` for some prompt: every observed "
                             "reward must belong to a spent response.")
        total = int(spent.sum())
        if total > self.remaining_responses:
            raise ValueError(f"this round spent {total} responses but only {self.remaining_responses} remain "
                             "in the global budget; never generate past `propose()`.")
        self.remaining_responses -= total
        self.round += 1
        return s, f, spent

    def _base_state(self):
        return {"remaining_responses": self.remaining_responses, "round": self.round,
                "last_units": self.last_units.tolist()}

    def _load_base_state(self, state):
        self.remaining_responses = int(state["remaining_responses"])
        self.round = int(state["round"])
        self.last_units = np.asarray(state["last_units"], np.int64)


@register("pacing", "uniform")
class UniformPacer(_BudgetedPacer):
    """Plain GRPO: a seeded shuffled pass over the pool, `prompts_per_round` prompts, one group each.

    One unit = one group of `group_size` responses. The stream continues through the epoch order,
    so a filler that uses more prompts (SARA, dynamic sampling) advances the cursor past them.
    """

    @classmethod
    def from_config(cls, args: Any, context: RunContext) -> Pacer:
        ppr = args.nominal_prompts_per_round
        if ppr > context.num_prompts:
            raise ValueError(f"`prompts_per_round` ({ppr}) exceeds the {context.num_prompts} prompts of the training "
                             "dataset; lower it (or `per_device_train_batch_size`), or use a larger dataset.")
        return cls(context.num_prompts, prompts_per_round=ppr, group_size=args.num_generations,
                   budget_responses=context.budget, seed=context.seed, **cls.constructor_arguments(args))

    @classmethod
    def constructor_arguments(cls, args: Any) -> dict[str, Any]:
        """The constructor's keyword arguments from the method's hyperparameters (same names by default)."""
        return cls.settings(args)

    @classmethod
    def budget_for(cls, args: Any, num_rounds: int) -> int:
        """Stock GRPO's responses: `prompts_per_round` groups of k per round."""
        return num_rounds * args.nominal_prompts_per_round * args.num_generations

    @classmethod
    def max_round_responses(cls, args: Any, num_rounds: int, filler_cls: type[Filler]) -> int:
        """The filler's cap over `prompts_per_round` prompts (a full group each, or its oversampling cap)."""
        return filler_cls.max_round_responses(args, args.nominal_prompts_per_round)

    def __init__(self, num_prompts: int, prompts_per_round: int, group_size: int, budget_responses: int | None = None,
                 rounds: int | None = None, seed: int = 0) -> None:
        self.prompts_per_round = check_int("prompts_per_round", prompts_per_round, 1)
        if budget_responses is None:
            if rounds is None:
                raise ValueError("UniformPacer needs `budget_responses` or `rounds`.")
            budget_responses = check_int("rounds", rounds, 1) * self.prompts_per_round * group_size
        super().__init__(num_prompts, group_size, budget_responses)
        self.seed = int(seed)
        self.epoch, self.cursor = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch):
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_prompts)

    @property
    def ranked_prompts(self) -> np.ndarray:
        """The rest of this epoch, then the next epoch (prompts repeat only across epochs)."""
        nxt = self._epoch_order(self.epoch + 1)
        rest = self._order[self.cursor:]
        return np.concatenate([rest, nxt[~np.isin(nxt, rest)]])

    def propose(self) -> np.ndarray:
        n = min(self.prompts_per_round, self.remaining_budget)
        units = np.zeros(self.num_prompts, np.int64)
        units[self.ranked_prompts[:n]] = 1
        self.last_units = units
        return units

    def update(self, successes: ArrayLike, failures: ArrayLike, responses: ArrayLike | None = None,
               prepaid: ArrayLike | None = None) -> None:
        _, _, spent = self._consume(successes, failures, responses, prepaid)
        self._advance_past(spent, self.ranked_prompts)

    def _advance_past(self, spent, order):
        """Move the cursor past the last prompt of `order` (the epoch order from the cursor) that spent anything;
        returns how many prompts of `order` it passed."""
        used = np.flatnonzero(spent[order] > 0)
        advance = passed = int(used[-1]) + 1 if used.size else 0
        while advance > 0:
            step = min(advance, self.num_prompts - self.cursor)
            self.cursor += step
            advance -= step
            if self.cursor >= self.num_prompts:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
        return passed

    def state_dict(self) -> dict:
        return {**self._base_state(), "epoch": self.epoch, "cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self._load_base_state(state)
        self.seed, self.epoch, self.cursor = int(state["seed"]), int(state["epoch"]), int(state["cursor"])
        self._order = self._epoch_order(self.epoch)


@register("pacing", "knapsack")
class KnapsackPacer(UniformPacer):
    """KnapsackRL: each round's `prompts_per_round × group_size` responses are split over the round's
    prompts by an exact knapsack on value(p, N) = (1 - p^N - (1-p)^N) · p(1-p)^2.

    p is the mean of the prompt's last `history` rewards (0.5 before any). Prompts with 0 < p < 1
    get `min_n` and extras up to `max_n`; p = 0 or 1 prompts get `min_n`; spare budget goes to p = 0.
    One unit = one response.
    """

    hyperparameters = (
        Hyperparameter("knapsack_min_n", int, 2, "KnapsackRL minimum responses per prompt.", at_least(1)),
        Hyperparameter("knapsack_max_n", int | None, None, "KnapsackRL maximum responses per prompt. None = 4 × "
                       "num_generations.", at_least(1)),
    )

    @classmethod
    def constructor_arguments(cls, args: Any) -> dict[str, Any]:
        own = cls.settings(args)
        return {"min_n": own["knapsack_min_n"], "max_n": own["knapsack_max_n"]}

    @classmethod
    def check_config(cls, args: Any) -> None:
        if method_class("filling", args.filling).adaptive:
            raise ValueError("pacing='knapsack' sets each prompt's response count itself; use filling='full'.")

    def __init__(self, num_prompts: int, prompts_per_round: int, group_size: int, budget_responses: int | None = None,
                 rounds: int | None = None, min_n: int = 2, max_n: int | None = None, history: int = 16,
                 seed: int = 0) -> None:
        super().__init__(num_prompts, prompts_per_round, group_size, budget_responses, rounds, seed)
        self.group_size, self.unit_size = group_size, 1
        self.min_n = check_int("min_n", min_n, 1)
        self.max_n = check_int("max_n", max_n if max_n is not None else 4 * group_size, self.min_n)
        if self.min_n > group_size:
            raise ValueError(f"`min_n` ({self.min_n}) must not exceed `group_size` ({group_size}).")
        self.history = check_int("history", history, 1)
        self.hist_sum = np.zeros(self.num_prompts)
        self.hist_len = np.zeros(self.num_prompts, np.int64)

    def success_rate(self) -> np.ndarray:
        return np.where(self.hist_len > 0, self.hist_sum / np.maximum(self.hist_len, 1), 0.5)

    @staticmethod
    def value(p: float | np.ndarray, n: int | np.ndarray) -> float | np.ndarray:
        """KnapsackRL's value of giving n responses to a prompt with success rate p."""
        return (1.0 - p ** n - (1.0 - p) ** n) * p * (1.0 - p) ** 2

    def _allocate(self, p, budget):
        """Exact 0/1-group knapsack by dynamic programming over the extras above `min_n`."""
        m = p.size
        alloc = np.full(m, self.min_n, np.int64)
        budget -= self.min_n * m
        if budget <= 0:
            return self._trim(alloc, budget + self.min_n * m)
        open_ = np.flatnonzero((p > 0) & (p < 1))
        extras = np.arange(min(self.max_n - self.min_n, budget) + 1)
        best = np.zeros(budget + 1)
        choice = np.zeros((open_.size, budget + 1), np.int64)
        for row, i in enumerate(open_):
            gain = self.value(p[i], self.min_n + extras) - self.value(p[i], self.min_n)
            cand = np.full((extras.size, budget + 1), -np.inf)
            for e in extras:
                cand[e, e:] = best[: budget + 1 - e] + gain[e]
            choice[row] = cand.argmax(0)
            best = cand.max(0)
        b = int(best.argmax())
        for row in range(open_.size - 1, -1, -1):
            e = choice[row, b]
            alloc[open_[row]] += e
            b -= e
        spare = budget - int((alloc - self.min_n).sum())
        zeros = np.flatnonzero(p == 0)
        if spare > 0 and zeros.size:
            room = self.max_n - alloc[zeros]
            for j in np.argsort(-room, kind="stable"):
                give = min(room[j], spare)
                alloc[zeros[j]] += give
                spare -= give
        return alloc

    @staticmethod
    def _trim(alloc, budget):
        """Fewer responses than minimums: give `min_n` to as many prompts as fit, in order."""
        out = np.zeros_like(alloc)
        cum = np.cumsum(alloc)
        out[cum <= budget] = alloc[cum <= budget]
        return out

    def propose(self) -> np.ndarray:
        round_budget = min(self.prompts_per_round * self.group_size, self.remaining_responses)
        prompts = self.ranked_prompts[: self.prompts_per_round]
        units = np.zeros(self.num_prompts, np.int64)
        units[prompts] = self._allocate(self.success_rate()[prompts], round_budget)
        self.last_units = units
        return units

    def update(self, successes: ArrayLike, failures: ArrayLike, responses: ArrayLike | None = None,
               prepaid: ArrayLike | None = None) -> None:
        s = check_counts("successes", successes, self.num_prompts)
        f = check_counts("failures", failures, self.num_prompts)
        super().update(s, f, responses, prepaid)
        seen = np.flatnonzero(s + f > 0)
        n = s[seen] + f[seen]
        keep = np.minimum(n, self.history)
        # The buffer keeps the most recent `history` rewards; a round's rewards are exchangeable.
        old = np.maximum(0, np.minimum(self.hist_len[seen], self.history - keep))
        rate_old = self.hist_sum[seen] / np.maximum(self.hist_len[seen], 1)
        self.hist_sum[seen] = rate_old * old + s[seen] / n * keep
        self.hist_len[seen] = old + keep

    def state_dict(self) -> dict:
        return {**super().state_dict(), "hist_sum": self.hist_sum.tolist(), "hist_len": self.hist_len.tolist()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.hist_sum = np.asarray(state["hist_sum"], float)
        self.hist_len = np.asarray(state["hist_len"], np.int64)


@register("filling", "full")
class FullFiller(Filler):
    """Plain GRPO filling: every admitted prompt's responses in one call; every group reaches the loss."""

    adaptive = False

    def __init__(self, group_size: int) -> None:
        self.group_size = check_int("group_size", group_size, 1)

    @classmethod
    def from_config(cls, args: Any, context: RunContext) -> Filler:
        return cls(group_size=args.num_generations)

    def round_arguments(self, pacer: Pacer, units: np.ndarray, spend: int, target_groups: int | None = None) -> dict:
        """Every prompt of the stream gets the responses the pacer proposed for it (`counts`)."""
        stream = np.asarray(pacer.ranked_prompts, np.int64)
        return {"stream": stream, "budget": spend, "target_groups": None, "counts": units[stream] * pacer.unit_size}

    def start_event_round(self, stream: ArrayLike, budget: int, target_groups: int | None = None,
                          counts: ArrayLike | None = None, carry: dict[int, dict] | None = None,
                          wait_for_groups: bool = False) -> FullRound:
        return FullRound(stream, budget, self.group_size, target_groups, counts, carry, wait_for_groups)


class FullRound(EventRound):
    """Full groups: each prompt's `counts` rollouts (default k; the first `target_groups` prompts with a count, as
    long as whole groups fit the budget) are started as the window has room, and a group is committed as its last
    rollout ends. Over a synchronous backend, one call of every group (stock GRPO). As a stream (the way verl's and
    AReaL's asynchronous trainers run stock GRPO) the round closes once it has as many groups as it has prompts; a
    group still running then goes on into the next round (`carry`), which counts it among its own."""

    def __init__(self, stream: ArrayLike, budget: int, group_size: int, target_groups: int | None = None,
                 counts: ArrayLike | None = None, carry: dict[int, dict] | None = None,
                 wait_for_groups: bool = False) -> None:
        super().__init__(budget, carry, wait_for_groups)
        stream = np.asarray(stream, np.int64)
        counts = np.full(stream.size, group_size) if counts is None else np.asarray(counts, np.int64)
        if counts.shape != stream.shape:
            raise ValueError("`counts` must give one response count per stream prompt.")
        stream, counts = stream[counts > 0], counts[counts > 0]
        if target_groups is not None:
            stream, counts = stream[:target_groups], counts[:target_groups]
        fits = np.cumsum(counts) <= self.budget  # whole groups only
        fresh = ~np.isin(stream[fits], [int(p) for p in carry or {}])  # carried groups are resumed, not restarted
        self.queue = [[int(p), int(n)] for p, n in zip(stream[fits][fresh], counts[fits][fresh])]
        self.target = len(self.queue)
        self.size, self.results = {}, {}  # prompt id -> its group's size; outcomes so far
        self._adopt_carry(carry)

    def _adopt(self, pid, state):
        self.size[pid], self.results[pid] = int(state["size"]), list(state["results"])
        if state["unstarted"]:
            self.queue.insert(0, [pid, int(state["unstarted"])])

    def _open_groups(self):
        unstarted = dict(self.queue)
        return {pid: {"size": self.size[pid], "results": list(got), "unstarted": unstarted.get(pid, 0),
                      "need": unstarted.get(pid, 0)}
                for pid, got in self.results.items() if pid not in set(self.groups)}

    def _next(self, room):
        out = []
        while room > 0 and self.queue and len(self.groups) < self.target:
            pid, n = self.queue[0]
            take = min(n, room, self.budget - self.spent - sum(t for _, t in out))
            if take <= 0:
                break
            if pid not in self.size:
                self.size[pid], self.results[pid] = n, []
            out.append((pid, take))
            room -= take
            if take == n:
                self.queue.pop(0)
            else:
                self.queue[0][1] -= take
        return out

    def _exhausted(self):
        return not self.queue or self.spent >= self.budget

    def _on_rollout(self, pid, observed):
        got = self.results[pid]
        got.append(observed)
        if len(got) < self.size[pid]:
            return
        seen = [x for x in got if x is not None]
        self.groups.append(pid)
        self.effective += int(0 < sum(seen) < len(seen))
        if len(self.groups) >= self.target:
            self._close()


@register("filling", "dynamic_sampling")
class DynamicSamplingFiller(Filler):
    """DAPO dynamic sampling: full groups for batches of `batch_prompts` stream prompts, keep groups whose
    rewards vary (std > 0), repeat until `target_groups` are kept; more than `max_generation_batches`
    batches is an error (DAPO's cap)."""

    def __init__(self, group_size: int, max_generation_batches: int = 10, batch_prompts: int | None = None) -> None:
        self.group_size = check_int("group_size", group_size, 2)
        self.max_generation_batches = check_int("max_generation_batches", max_generation_batches, 1)
        self.batch_prompts = batch_prompts

    hyperparameters = (
        Hyperparameter("max_generation_batches", int, 10, "Dynamic sampling: generation batches allowed per round "
                       "before the run fails (DAPO's cap).", at_least(1)),
    )

    @classmethod
    def from_config(cls, args: Any, context: RunContext) -> Filler:
        return cls(group_size=args.num_generations, **cls.settings(args))

    @classmethod
    def max_round_responses(cls, args: Any, prompts: int) -> int:
        return cls.settings(args)["max_generation_batches"] * (args.target_groups or prompts) * args.num_generations

    @property
    def oversample(self) -> int:
        return self.max_generation_batches

    def start_event_round(self, stream: ArrayLike, budget: int, target_groups: int, counts: ArrayLike | None = None,
                          carry: dict[int, dict] | None = None,
                          wait_for_groups: bool = False) -> DynamicSamplingRound:
        target = check_int("target_groups", target_groups, 0)
        return DynamicSamplingRound(stream, budget, self.group_size, target, self.max_generation_batches,
                                    self.batch_prompts or target, carry, wait_for_groups)


class DynamicSamplingRound(EventRound):
    """DAPO's dynamic sampling: whole groups of k, started prompt after prompt while the window has room for one
    and fewer than `batch_prompts` groups run; a group is kept when its k-th rollout ends with varied outcomes.
    Over a synchronous backend that is DAPO's loop exactly: batches of `batch_prompts` groups until the target is
    kept. Needing more than `max_batches` × `batch_prompts` prompts is DAPO's cap: an error that names the fix."""

    def __init__(self, stream: ArrayLike, budget: int, group_size: int, target: int, max_batches: int,
                 batch_prompts: int, carry: dict[int, dict] | None = None, wait_for_groups: bool = False) -> None:
        super().__init__(budget, carry, wait_for_groups)
        stream = np.asarray(stream, np.int64)
        self.stream = stream[~np.isin(stream, [int(p) for p in carry or {}])]  # carried groups are resumed
        self.k, self.target, self.batch_prompts = group_size, target, max(int(batch_prompts), 1)
        self.max_prompts, self.next = max_batches * self.batch_prompts, 0
        self.results, self.rejected = {}, []
        self._adopt_carry(carry)

    def _adopt(self, pid, state):
        self.results[pid] = list(state["results"])

    def _open_groups(self):
        return {pid: {"results": list(got), "need": 0} for pid, got in self.results.items() if len(got) < self.k}

    def _next(self, room):
        out, running = [], sum(len(got) < self.k for got in self.results.values())  # (the open groups)
        while (room >= self.k and self.next < min(self.stream.size, self.max_prompts) and running < self.batch_prompts
               and self.spent + (len(out) + 1) * self.k <= self.budget and len(self.groups) < self.target):
            pid = int(self.stream[self.next])
            self.next += 1
            self.results[pid] = []
            out.append((pid, self.k))
            room, running = room - self.k, running + 1
        if not out and not self.in_flight and len(self.groups) < self.target and self.next >= self.max_prompts:
            raise RuntimeError(
                f"dynamic sampling kept {len(self.groups)} of {self.target} groups after "
                f"{self.max_prompts // self.batch_prompts} generation batches of {self.batch_prompts} prompts "
                "(`max_generation_batches`); raise the cap or use `filling='sara'`, which abandons saturated prompts "
                "early.")
        return out

    def _on_rollout(self, pid, observed):
        got = self.results[pid]
        got.append(observed)
        if len(got) < self.k:
            return
        seen = [x for x in got if x is not None]
        if len(seen) > 1 and 0 < sum(seen) < len(seen):
            self.groups.append(pid)
            self.effective += 1
            if len(self.groups) >= self.target:
                self._close()
        else:
            self.rejected.append(pid)
