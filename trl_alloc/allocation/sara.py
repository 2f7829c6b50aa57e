"""SARA ("Early Verdicts, Better Budgets"): fill one round by probing prompts, committing mixed groups and abandoning
decided-saturated ones, with the freed budget going to the next prompts of the stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import betaln

from ._checks import check_int, check_open_unit, check_prior
from .base import Filler, Pacer, Round, RunContext
from .beta import BetaState
from .event_rounds import EventRound
from .registry import register

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def effective_probability(n: ArrayLike, s: ArrayLike, k: ArrayLike, prior: tuple[ArrayLike, ArrayLike] = (1.0, 1.0),
                          failures: ArrayLike | None = None) -> np.ndarray:
    """Posterior-predictive probability that the completed group of size k is mixed (eq. 2).

    1 if the prefix is mixed; otherwise 1 − 1[s=0]·B(a, b+r)/B(a, b) − 1[f=0]·B(a+r, b)/B(a, b) with
    the posterior (a, b) = (α0+s, β0+f) and r = k − n (both terms apply before any rollout).
    Uniform prior, s = 0: (k − n)/(k + 1). `prior` may hold per-prompt arrays.
    `failures` f defaults to n − s; with ARROL pruning n counts generated rollouts (pruned ones
    included, they fill the group) while s + f counts only the observed ones (s + f <= n).
    """
    n, s, k = (np.asarray(x, dtype=float) for x in (n, s, k))
    f = n - s if failures is None else np.asarray(failures, dtype=float)
    if np.any(s < 0) or np.any(f < 0) or np.any(s + f > n) or np.any(n > k):
        raise ValueError("`effective_probability` needs 0 <= s <= n <= k (and 0 <= s + failures <= n).")
    a = np.asarray(prior[0], float) + s
    b = np.asarray(prior[1], float) + f
    r = k - n
    all_fail = np.exp(betaln(a, b + r) - betaln(a, b))
    all_pass = np.exp(betaln(a + r, b) - betaln(a, b))
    p = 1.0 - np.where(s == 0, all_fail, 0.0) - np.where(f == 0, all_pass, 0.0)
    return np.where((s >= 1) & (f >= 1), 1.0, np.clip(p, 0.0, 1.0))


COMMIT, ABANDON, CONTINUE = 1, -1, 0


def decide(n: ArrayLike, s: ArrayLike, k: int, tau_low: float | np.ndarray = 0.45, commit_min: int | None = None,
           prior: tuple[ArrayLike, ArrayLike] = (1.0, 1.0),
           failures: ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The rule of eq. 3: COMMIT a mixed group of size >= commit_min, ABANDON when p_eff < τ_low
    or the group is full (n = k) without being committed, else CONTINUE. Returns (decision array,
    p_eff array). `failures`: see `effective_probability`."""
    commit_min = k if commit_min is None else commit_min
    n, s = np.asarray(n), np.asarray(s)
    f = n - s if failures is None else np.asarray(failures)
    p = effective_probability(n, s, k, prior, f)
    mixed = (s >= 1) & (f >= 1)
    out = np.where(mixed & (n >= commit_min), COMMIT, np.where((p < tau_low) | (n >= k), ABANDON, CONTINUE))
    return out, p


@register("filling", "sara")
class SARAFiller(Filler):
    """Algorithm 1 of SARA ("Early Verdicts, Better Budgets") as a generator-agnostic state machine (see
    `base.Round`).

    Defaults: k = 8, n0 = 2, τ_low = 0.45 (or "auto", see `threshold`), commit_min = k, Beta(1, 1),
    safety budget 6·B·k; in event rounds `overcommit` = 1.5 (see `SARAEventRound`). With
    `warm_start_decay` (and `num_prompts`) each prompt's posterior carries across rounds, discounted
    toward the prior by that factor (the paper's optional history warm-start).
    """

    @classmethod
    def from_config(cls, args: Any, context: RunContext) -> Filler:
        # SARA keeps its own history only when the pacer has no Beta states to lend it (`round_arguments`).
        own_history = args.history_decay and not hasattr(context.pacer, "beta")
        return cls(group_size=args.num_generations, probe=args.probe, tau_low=args.tau_low,
                   commit_min=args.commit_min, prior=(args.prior_alpha, args.prior_beta),
                   safety_factor=args.sara_safety_factor,
                   warm_start_decay=args.history_decay if own_history else None,
                   num_prompts=context.num_prompts if own_history else None, overcommit=args.sara_overcommit)

    @classmethod
    def smallest_group(cls, args: Any) -> int:
        return args.commit_min or args.num_generations

    @classmethod
    def max_round_responses(cls, args: Any, prompts: int) -> int:
        return args.sara_safety_factor * (args.target_groups or prompts) * args.num_generations

    @property
    def group_size(self) -> int:
        return self.k

    @property
    def oversample(self) -> int:
        return self.safety_factor

    def round_arguments(self, pacer: Pacer, units: np.ndarray, spend: int, target_groups: int | None = None,
                        history_decay: float | None = None) -> dict:
        """`Filler.round_arguments`, with each prompt's prior from the pacer's Beta state discounted by
        `history_decay` (CERO's posteriors, when the pacer has them)."""
        kwargs = super().round_arguments(pacer, units, spend, target_groups)
        if history_decay is not None and hasattr(pacer, "beta"):
            kwargs["prior_a"], kwargs["prior_b"] = pacer.beta.discounted(history_decay, kwargs["stream"])
        return kwargs

    def __init__(self, group_size: int = 8, probe: int = 2, tau_low: float | str = 0.45, commit_min: int | None = None,
                 prior: Sequence[float] = (1.0, 1.0), safety_factor: int = 6, warm_start_decay: float | None = None,
                 num_prompts: int | None = None, overcommit: float = 1.5) -> None:
        self.k = check_int("group_size", group_size, 2)
        self.probe = check_int("probe", probe, 1)
        if self.probe > self.k:
            raise ValueError(f"`probe` (n0 = {self.probe}) must not exceed `group_size` (k = {self.k}).")
        self.auto_tau = tau_low == "auto"
        self.tau_low = None if self.auto_tau else check_open_unit("tau_low", tau_low)
        self.commit_min = self.k if commit_min is None else check_int("commit_min", commit_min, 2)
        if self.commit_min > self.k:
            raise ValueError(f"`commit_min` ({self.commit_min}) must not exceed `group_size` ({self.k}).")
        self.prior = check_prior("prior", prior)
        self.safety_factor = check_int("safety_factor", safety_factor, 1)
        self.overcommit = float(overcommit)
        if not self.overcommit >= 1.0:
            raise ValueError(f"`overcommit` must be >= 1 (got {overcommit}): event rounds admit prompts while the "
                             "groups expected from them stay below overcommit × target_groups.")
        # Measured effective groups per response (for tau_low="auto"); starts at the prior's prediction.
        self.yield_groups = float(effective_probability(0, 0, self.k, self.prior))
        self.yield_responses = float(self.k)
        self.history = None
        if warm_start_decay is not None:
            if num_prompts is None:
                raise ValueError("`warm_start_decay` needs `num_prompts` (the pool size) to keep posteriors.")
            self.history = BetaState(num_prompts, self.prior, warm_start_decay)

    def start_round(self, stream: ArrayLike, budget: int | None = None, target_groups: int = 64,
                    counts: ArrayLike | None = None, prior_a: ArrayLike | None = None,
                    prior_b: ArrayLike | None = None) -> SARARound:
        """A round over `stream` that stops at `target_groups` committed groups, `budget` responses
        (default: the safety cap 6·B·k) or the end of the stream."""
        return SARARound(self, *self._round_args(stream, budget, target_groups, prior_a, prior_b))

    def start_event_round(self, stream: ArrayLike, budget: int | None = None, target_groups: int = 64,
                          counts: ArrayLike | None = None, prior_a: ArrayLike | None = None,
                          prior_b: ArrayLike | None = None, carry: dict[int, dict] | None = None,
                          wait_for_groups: bool = False) -> SARAEventRound:
        """`start_round`'s round, fed one rollout at a time (`SARAEventRound`); `carry` and `wait_for_groups`: see
        `event_rounds`."""
        return SARAEventRound(self, *self._round_args(stream, budget, target_groups, prior_a, prior_b), carry=carry,
                              wait_for_groups=wait_for_groups)

    def _round_args(self, stream, budget, target_groups, prior_a, prior_b):
        target = check_int("target_groups", target_groups, 0)
        budget = self.safety_factor * target * self.k if budget is None else check_int("budget", budget, 0)
        stream = np.asarray(stream, np.int64)
        if prior_a is None and self.history is not None:
            prior_a, prior_b = self.history.a[stream], self.history.b[stream]
        a = np.full(stream.size, self.prior[0]) if prior_a is None else np.asarray(prior_a, float)
        b = np.full(stream.size, self.prior[1]) if prior_b is None else np.asarray(prior_b, float)
        if a.shape != stream.shape or b.shape != stream.shape:
            raise ValueError("`prior_a` / `prior_b` must give one value per stream prompt.")
        return stream, a, b, budget, target

    def threshold(self, n: ArrayLike) -> float | np.ndarray:
        """τ_low for prompts with n rollouts. With tau_low="auto" (the paper's parameter-free variant) it is
        the break-even point (k − n)·η: abandon when p_eff is below what the k − n freed rollouts are
        expected to buy elsewhere, η being the measured effective groups per response."""
        if not self.auto_tau:
            return self.tau_low
        return (self.k - np.asarray(n)) * self.yield_groups / self.yield_responses

    def _round_done(self, rnd):
        self.yield_groups += rnd.effective
        self.yield_responses += rnd.spent
        if self.history is not None:
            s, f, _ = rnd.outcomes(self.history.num_prompts)
            self.history.update(s, f)

    def state_dict(self) -> dict:
        return {"history": None if self.history is None else self.history.state_dict(),
                "yield": [self.yield_groups, self.yield_responses]}

    def load_state_dict(self, state: dict) -> None:
        self.yield_groups, self.yield_responses = state["yield"]
        if self.history is not None and state.get("history") is not None:
            self.history.load_state_dict(state["history"])


class SARARound(Round):
    """One round of SARA: probe, decide (eq. 3), refill from the stream, advance by p_eff priority."""

    def __init__(self, filler: SARAFiller, stream: np.ndarray, prior_a: np.ndarray, prior_b: np.ndarray, budget: int,
                 target: int) -> None:
        super().__init__(budget)
        self.filler, self.stream, self.prior_a, self.prior_b, self.target = filler, stream, prior_a, prior_b, target
        self.next = 0                               # stream position of the next fresh prompt
        self.pos = np.zeros(0, np.int64)            # active prompts, as stream positions
        self.n = np.zeros(0, np.int64)              # rollouts generated (pruned ones included)
        self.s = np.zeros(0, np.int64)              # observed successes
        self.fail = np.zeros(0, np.int64)           # observed failures (= n − s without pruning)
        self.decided_at, self.abandon_p = [], []    # rollouts at each decision; p_eff of abandoned
        self._finished = False
        self._plan(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @property
    def done(self) -> bool:
        return self._finished

    def _plan(self, cont, cont_counts):
        """Next batched call: continuing prompts first (in priority order), then fresh probes."""
        left = self.budget - self.spent
        # Budget-aware admission: a fresh prompt starts only if, after reserving what the active prompts
        # may still need (k − n each), a whole group of k fits; no group is started that cannot finish.
        reserve = int(np.sum(self.filler.k - self.n[self._index(cont)])) if cont.size else 0
        need = min(self.target - len(self.groups) - cont.size, max(left - reserve, 0) // self.filler.k)
        fresh = np.arange(self.next, min(self.next + max(need, 0), self.stream.size))
        self.next += fresh.size
        pos = np.concatenate([cont, fresh])
        want = np.concatenate([cont_counts, np.full(fresh.size, self.filler.probe)])
        give = np.clip(left - (np.cumsum(want) - want), 0, want)
        keep = give > 0
        fresh = fresh[keep[cont.size:]]             # fresh prompts the budget could not reach stay unread
        self.next = self.next - (keep.size - cont.size) + fresh.size
        self.pos = np.concatenate([self.pos, fresh])
        self.n = np.concatenate([self.n, np.zeros(fresh.size, np.int64)])
        self.s = np.concatenate([self.s, np.zeros(fresh.size, np.int64)])
        self.fail = np.concatenate([self.fail, np.zeros(fresh.size, np.int64)])
        self._pending = (self.stream[pos[keep]], give[keep].astype(np.int64))
        self._requested_pos = pos[keep]
        if not keep.any():
            self._close()

    def _close(self):
        self._finished = True
        self.filler._round_done(self)

    def _advance(self, ids, counts, successes, rewards):
        idx = self._index(self._requested_pos)
        self.n[idx] += counts
        self.s[idx] += successes
        self.fail[idx] += np.asarray([len(r) for r in rewards], np.int64) - successes
        verdict, p = decide(self.n, self.s, self.filler.k, self.filler.threshold(self.n), self.filler.commit_min,
                            (self.prior_a[self.pos], self.prior_b[self.pos]), self.fail)
        for j in np.flatnonzero(verdict == COMMIT):
            if len(self.groups) < self.target:
                self.groups.append(int(self.stream[self.pos[j]]))
                self.effective += 1
                self.decided_at.append(int(self.n[j]))
        for j in np.flatnonzero(verdict == ABANDON):
            self.abandoned.append(int(self.stream[self.pos[j]]))
            self.abandon_p.append(float(p[j]))
            self.decided_at.append(int(self.n[j]))
        live = verdict == CONTINUE
        self.pos, self.n, self.s, self.fail, p = self.pos[live], self.n[live], self.s[live], self.fail[live], p[live]
        if len(self.groups) >= self.target:
            return self._close()
        mixed = (self.s >= 1) & (self.fail >= 1)
        order = np.lexsort((-p, ~mixed))            # decided-mixed first, then by p_eff (a yield index)
        more = np.where(mixed, self.filler.commit_min - self.n, 1)[order]
        self._plan(self.pos[order], more)

    def _index(self, positions):
        lookup = {int(p): i for i, p in enumerate(self.pos)}
        return np.asarray([lookup[int(p)] for p in positions], np.int64)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "unfinished": len(self.pos),
                "expected_lost_groups": float(np.sum(self.abandon_p)),
                "mean_rollouts_to_decide": float(np.mean(self.decided_at)) if self.decided_at else 0.0}


class SARAEventRound(EventRound):
    """SARA (Algorithm 1) as events. Each arrival updates the prompt's (n, s, f) and applies
    eq. 3: COMMIT (mixed, n >= commit_min), ABANDON (p_eff < τ_low, eq. 2; its in-flight rollouts are
    aborted) or CONTINUE (a mixed prompt gets the rest of its group at once, an unmixed one its next rollout
    while fewer than n0 of its rollouts are running). A fresh prompt of the stream is admitted, with n0 probes,
    while the window has room, the budget left covers what the active prompts are expected to still start
    (k − started, weighted by p_eff) plus k·p_eff of the new one, and the groups committed plus those expected
    from the active prompts (the sum of their p_eff) stay below `overcommit` × target. (The batched round
    reserves a whole k per active prompt; as events that would cap what runs at once at budget / k prompts.)
    Over-admission keeps the engine full; what still runs when the target is reached is aborted (spent), and
    a mixed prompt the budget cannot complete stays unfinished. Not in the paper: the admission rule is ours;
    measured on the engine model in docs/benchmarks.md. With `carry` (stream mode), the groups an earlier round
    left open come first (with their own priors, (n, s, f) so far and rollouts in flight), so a group may
    straddle rounds; admission then needs only budget left (no reserve for the active prompts' rest: a later
    round pays for what goes on past this one), and the round closes once its budget is all started."""

    def __init__(self, filler: SARAFiller, stream: np.ndarray, prior_a: np.ndarray, prior_b: np.ndarray, budget: int,
                 target: int, carry: dict[int, dict] | None = None, wait_for_groups: bool = False) -> None:
        super().__init__(budget, carry, wait_for_groups)
        carried = np.asarray([int(p) for p in carry or {}], np.int64)
        if carried.size:  # resumed first; never a second group of one prompt
            fresh = ~np.isin(stream, carried)
            stream, prior_a, prior_b = (np.concatenate([np.asarray([carry[p][key] for p in carry], dtype), x[fresh]])
                                        for key, dtype, x in (("pid", np.int64, stream), ("a", float, prior_a),
                                                              ("b", float, prior_b)))
        self.filler, self.stream, self.prior_a, self.prior_b, self.target = filler, stream, prior_a, prior_b, target
        self.next = int(carried.size)
        self.active = {}   # prompt id -> [stream position, started, ended, successes, failures]
        self.want = {}     # prompt id -> rollouts to start as soon as the window has room
        self.decided_at, self.abandon_p = [], []
        self._adopt_carry(carry)

    def _adopt(self, pid, state):
        pos = int(np.flatnonzero(self.stream[: self.next] == pid)[0])
        self.active[pid] = [pos, int(state["started"]), int(state["ended"]), int(state["s"]), int(state["f"])]
        self._continue(pid)

    def _open_groups(self):
        return {pid: {"pid": pid, "started": started, "ended": n, "s": s, "f": fail, "a": float(self.prior_a[pos]),
                      "b": float(self.prior_b[pos]), "need": self.filler.k - started}
                for pid, (pos, started, n, s, fail) in ((int(p), [int(x) for x in v]) for p, v in self.active.items())}

    def _next(self, room):
        out, left = [], self.budget - self.spent
        for pid in list(self.want):  # continuations first, in the order they were asked for
            n = min(self.want[pid], room, left)
            if n:
                out.append((pid, n))
                self.active[pid][1] += n
                room, left = room - n, left - n
                self.want[pid] -= n
            if not self.want[pid]:
                del self.want[pid]
        k = self.filler.k
        expected, need = self._expected()
        cap = self.target * self.filler.overcommit
        while room > 0 and self.next < self.stream.size and len(self.groups) + expected < cap:
            pos = self.next
            fresh = float(effective_probability(0, 0, k, (self.prior_a[pos], self.prior_b[pos])))
            if left <= 0 or (need + k * fresh > left and not self.carries):  # what the active prompts are
                break  # expected to need, and its group (stream mode: a later round pays for what goes on past it)
            pid, n = int(self.stream[pos]), min(self.filler.probe, room, left)
            self.next += 1
            self.active[pid] = [pos, n, 0, 0, 0]
            if self.filler.probe > n:
                self.want[pid] = self.filler.probe - n
            out.append((pid, n))
            room, left = room - n, left - n
            expected, need = expected + fresh, need + (k - n) * fresh
        return out

    def _expected(self):
        """Groups the active prompts are expected to commit (the sum of their p_eff, eq. 2), and the rollouts
        they are expected to still start (k − started, weighted by p_eff)."""
        if not self.active:
            return 0.0, 0.0
        pos, started, n, s, fail = np.asarray(list(self.active.values())).T
        p = effective_probability(n, s, self.filler.k, (self.prior_a[pos], self.prior_b[pos]), fail)
        return float(p.sum()), float(np.sum(p * (self.filler.k - started)))

    def _on_rollout(self, pid, observed):
        a = self.active.get(pid)
        if a is None:  # decided already: an in-flight sibling of a committed or abandoned prompt
            return
        a[2] += 1
        if observed is not None:
            a[3 if observed else 4] += 1
        pos, started, n, s, fail = a
        verdict, p = decide([n], [s], self.filler.k, self.filler.threshold(np.asarray([n])), self.filler.commit_min,
                            (self.prior_a[[pos]], self.prior_b[[pos]]), [fail])
        verdict, p = int(verdict[0]), float(p[0])
        if verdict == COMMIT:
            self._decided(pid, n)
            if len(self.groups) < self.target:
                self.groups.append(pid)
                self.effective += 1
            if len(self.groups) >= self.target:
                self._close()
        elif verdict == ABANDON:
            self._decided(pid, n)
            self.abandoned.append(pid)
            self.abandon_p.append(p)
            self._cancel(pid)
        else:
            self._continue(pid)

    def _continue(self, pid):
        """CONTINUE: a mixed prompt gets the rest of its group (up to commit_min) at once; an undecided one keeps
        n0 rollouts running."""
        _, started, _, s, fail = self.active[pid]
        if s >= 1 and fail >= 1:
            more = self.filler.commit_min - started - self.want.get(pid, 0)
            if more > 0:
                self.want[pid] = self.want.get(pid, 0) + more
        elif self.live[pid] + self.want.get(pid, 0) < self.filler.probe and started < self.filler.k:
            self.want[pid] = self.want.get(pid, 0) + 1

    def _decided(self, pid, n):
        del self.active[pid]
        self.want.pop(pid, None)
        self.decided_at.append(int(n))

    def _closed_hook(self):
        self.want.clear()
        self.filler._round_done(self)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "unfinished": len(self.active),
                "expected_lost_groups": float(np.sum(self.abandon_p)),
                "mean_rollouts_to_decide": float(np.mean(self.decided_at)) if self.decided_at else 0.0}
