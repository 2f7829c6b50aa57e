"""SARA ("Early Verdicts, Better Budgets"): fill one round by probing prompts, committing mixed groups and abandoning
decided-saturated ones, with the freed budget going to the next prompts of the stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import betaln

from ._checks import check_int, check_open_unit, check_prior
from .base import Filler, Pacer, RunContext
from .beta import PRIOR_ALPHA, PRIOR_BETA, BetaState
from .event_rounds import EventRound
from .hyperparameters import Hyperparameter, at_least, within
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
    if not np.all((s >= 0) & (f >= 0) & (s + f <= n) & (n <= k)):
        raise ValueError("`effective_probability` needs 0 <= s <= n <= k (and 0 <= s + failures <= n).")
    a = np.asarray(prior[0], float) + s
    b = np.asarray(prior[1], float) + f
    r = k - n
    log_norm = betaln(a, b)
    all_fail = np.exp(betaln(a, b + r) - log_norm)
    all_pass = np.exp(betaln(a + r, b) - log_norm)
    p = 1.0 - np.where(s == 0, all_fail, 0.0) - np.where(f == 0, all_pass, 0.0)
    return np.where((s >= 1) & (f >= 1), 1.0, np.clip(p, 0.0, 1.0))


COMMIT, ABANDON, CONTINUE = 1, -1, 0


def _tau_rule(value: float | str) -> str | None:
    """τ_low: a number in (0, 1), or 'auto'."""
    ok = value == "auto" or (not isinstance(value, str) and 0 < value < 1)
    return None if ok else "be a number in (0, 1) or 'auto'"


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
    safety budget 6·B·k; `overcommit` = 1.5 (see `SARARound`). With
    `warm_start_decay` (and `num_prompts`) each prompt's posterior carries across rounds, discounted
    toward the prior by that factor (the paper's optional history warm-start).
    """

    hyperparameters = (
        Hyperparameter("probe", int, 2, "SARA probe size n0 (first rollouts per prompt).", at_least(1)),
        Hyperparameter("tau_low", float | str | None, 0.45, "SARA abandonment threshold: abandon a prompt when "
                       "P(group ends mixed) < tau_low; a number in (0, 1) or 'auto' (the break-even threshold from "
                       "the measured yield, docs/allocation.md).", _tau_rule, none_ok=False),
        Hyperparameter("commit_min", int | None, None, "SARA commits a mixed group once it has this many responses. "
                       "None = num_generations (k).", at_least(2)),
        Hyperparameter("sara_safety_factor", int, 6, "SARA safety budget per round, in units of target_groups × k "
                       "(pacing='uniform' only).", at_least(1)),
        Hyperparameter("history_decay", float | None, 0.5, "SARA prior = the prompt's Beta state shrunk toward the "
                       "prior by this factor in [0, 1] (a0 + decay·(a − a0)). None = flat prior Beta(prior_alpha, "
                       "prior_beta).", within(0, 1)),
        Hyperparameter("sara_overcommit", float, 1.5, "SARA in events and stream mode: admit prompts into the free "
                       "window while committed + expected groups (sum of p_eff) < this × target_groups. Higher fills "
                       "the engine sooner and aborts (events) or carries (stream) more; 3 suits a stream whose round "
                       "budget exceeds the window (docs/choosing-settings.md).", at_least(1)),
        Hyperparameter("replace_probes", bool, True, "SARA in events and stream mode: True = an undecided prompt's "
                       "ended rollout is replaced at once; False = its next rollout starts only once none of its "
                       "rollouts runs (Algorithm 1's pace; docs/allocation.md)."),
        PRIOR_ALPHA, PRIOR_BETA,
    )

    @classmethod
    def from_config(cls, args: Any, context: RunContext) -> Filler:
        # SARA keeps its own history only when the pacer has no Beta states to lend it (`round_arguments`).
        lent = context.pacer is not None and context.pacer.posterior is not None
        own = cls.settings(args)
        own_history = own["history_decay"] and not lent
        return cls(group_size=args.num_generations, probe=own["probe"], tau_low=own["tau_low"],
                   commit_min=own["commit_min"], prior=(own["prior_alpha"], own["prior_beta"]),
                   safety_factor=own["sara_safety_factor"],
                   warm_start_decay=own["history_decay"] if own_history else None,
                   num_prompts=context.num_prompts if own_history else None, overcommit=own["sara_overcommit"],
                   posterior_decay=own["history_decay"] if lent else None, replace_probes=own["replace_probes"])

    @classmethod
    def check_config(cls, args: Any) -> None:
        """The rules between its hyperparameters and k (probe, commit_min <= k): the constructor's, built once."""
        cls.from_config(args, RunContext(num_prompts=1, num_rounds=1, budget=0))

    @classmethod
    def smallest_group(cls, args: Any) -> int:
        return cls.settings(args)["commit_min"] or args.num_generations

    @classmethod
    def max_round_responses(cls, args: Any, prompts: int) -> int:
        return cls.settings(args)["sara_safety_factor"] * (args.target_groups or prompts) * args.num_generations

    @property
    def group_size(self) -> int:
        return self.k

    @property
    def oversample(self) -> int:
        return self.safety_factor

    def round_arguments(self, pacer: Pacer, units: np.ndarray, spend: int, target_groups: int | None = None) -> dict:
        """`Filler.round_arguments`, with each prompt's prior from the pacer's posterior (CERO's Beta states, when the
        pacer lends them) discounted by `posterior_decay` (the config's `history_decay`)."""
        kwargs = super().round_arguments(pacer, units, spend, target_groups)
        if self.posterior_decay is not None and pacer.posterior is not None:
            kwargs["prior_a"], kwargs["prior_b"] = pacer.posterior.discounted(self.posterior_decay, kwargs["stream"])
        return kwargs

    def __init__(self, group_size: int = 8, probe: int = 2, tau_low: float | str = 0.45, commit_min: int | None = None,
                 prior: Sequence[float] = (1.0, 1.0), safety_factor: int = 6, warm_start_decay: float | None = None,
                 num_prompts: int | None = None, overcommit: float = 1.5,
                 posterior_decay: float | None = None, replace_probes: bool = True) -> None:
        self.k = check_int("group_size", group_size, 2)
        self.probe = check_int("probe", probe, 1)
        if self.probe > self.k:
            raise ValueError(f"`probe` (n0 = {self.probe}) must not exceed `group_size` (k = {self.k}, the config's "
                             "`num_generations`); lower `probe`.")
        self.auto_tau = tau_low == "auto"
        self.tau_low = None if self.auto_tau else check_open_unit("tau_low", tau_low)
        self.commit_min = self.k if commit_min is None else check_int("commit_min", commit_min, 2)
        if self.commit_min > self.k:
            raise ValueError(f"`commit_min` ({self.commit_min}) must not exceed `group_size` ({self.k}, the config's "
                             "`num_generations`); lower `commit_min`.")
        self.prior = check_prior("prior", prior)
        self.safety_factor = check_int("safety_factor", safety_factor, 1)
        self.overcommit = float(overcommit)
        self.posterior_decay = posterior_decay  # discount of a lent posterior for the priors (`round_arguments`)
        if not isinstance(replace_probes, bool):
            raise ValueError(f"SARA's `replace_probes` must be true or false, got {replace_probes!r}.")
        self.replace_probes = replace_probes  # events: an undecided prompt's ended rollout is replaced at once
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

    def start_event_round(self, stream: ArrayLike, budget: int | None = None, target_groups: int = 64,
                          counts: ArrayLike | None = None, prior_a: ArrayLike | None = None,
                          prior_b: ArrayLike | None = None, carry: dict[int, dict] | None = None,
                          wait_for_groups: bool = False) -> SARARound:
        """A round over `stream` that stops at `target_groups` committed groups, `budget` responses (default: the
        safety cap 6·B·k) or the end of the stream (`SARARound`); `carry` and `wait_for_groups`: see
        `event_rounds`."""
        return SARARound(self, *self._round_args(stream, budget, target_groups, prior_a, prior_b), carry=carry,
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


class SARARound(EventRound):
    """SARA's round (Algorithm 1): probe, decide (eq. 3), refill from the stream, advance by p_eff priority.

    - **Decide.** Each batch of ended rollouts updates its prompts' (n, s, f); each of those prompts is then
      decided together, in admission order: COMMIT (mixed, n >= commit_min), ABANDON (p_eff < τ_low, eq. 2, or
      n = k; its rollouts still in flight are aborted) or CONTINUE.
    - **Advance** (line 11). A continuing prompt wants the rest of its group up to commit_min once it is mixed,
      else one more rollout once none of its rollouts runs; wants are served in priority order (mixed first, then
      by p_eff).
    - **Refill** (line 10). Fresh prompts, with n0 probes each, toward the remaining need (target − committed −
      active), each only if a whole group of k still fits the budget after reserving k − started for every
      active prompt: no group is started that cannot finish.

    Over a synchronous backend (deterministic mode) that is the paper's round-synchronous algorithm exactly. Fed
    one rollout at a time, the same rules run per batch of arrivals, and one rule is ours (not in the paper):
    while rollouts are in flight, free window slots go to extra fresh prompts as long as the groups committed
    plus those expected from the active prompts (the sum of their p_eff) stay below `overcommit` × target and
    the budget left covers what the active prompts are expected to still start (k − started, weighted by
    p_eff) plus k·p_eff of the new one. A synchronous backend has no free slot while it generates, so the rule
    never applies there. What still runs when the target is reached is aborted (spent); a mixed prompt the
    budget cannot complete stays unfinished; measured on the engine model in docs/benchmarks.md. With `carry`
    (stream mode), the groups an earlier round left open come first (with their own priors, (n, s, f) so far
    and rollouts in flight), so a group may straddle rounds; admission then needs only budget left (a later
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
        self.next = int(carried.size)  # stream position of the next fresh prompt
        self.active = {}   # prompt id -> [stream position, started, ended, successes, failures], in admission order
        self.want = {}     # prompt id -> rollouts to start as soon as the window has room, in priority order
        self.touched = set()  # prompts with a rollout ended since they were last decided
        self._p = {}  # prompt id -> p_eff (eq. 2) at its (n, s, f), which change only when one of its rollouts ends
        self.decided_at, self.abandon_p = [], []
        self._adopt_carry(carry)
        pids, p = self._p_eff()  # a carried unmixed prompt with fewer than n0 running gets one more
        self._advance(dict(zip(pids, p.tolist())), {pid for pid in pids if self.live[pid] < filler.probe})

    def _adopt(self, pid, state):
        pos = int(np.flatnonzero(self.stream[: self.next] == pid)[0])
        self.active[pid] = [pos, int(state["started"]), int(state["ended"]), int(state["s"]), int(state["f"])]

    def _open_groups(self):
        return {pid: {"pid": pid, "started": started, "ended": n, "s": s, "f": fail, "a": float(self.prior_a[pos]),
                      "b": float(self.prior_b[pos]), "need": self.filler.k - started}
                for pid, (pos, started, n, s, fail) in ((int(p), [int(x) for x in v]) for p, v in self.active.items())}

    def _state(self, pids):
        """(stream positions, ended n, successes s, failures f) of `pids`, as arrays."""
        pos, _, n, s, fail = np.asarray([self.active[pid] for pid in pids], np.int64).reshape(-1, 5).T
        return pos, n, s, fail

    def _decide(self, pids):
        """eq. 3 for `pids` (active, in admission order): (p_eff, verdicts); their p_eff is kept for `_p_eff`."""
        if not pids:
            return np.zeros(0), np.zeros(0, np.int64)
        pos, n, s, fail = self._state(pids)
        verdict, p = decide(n, s, self.filler.k, self.filler.threshold(n), self.filler.commit_min,
                            (self.prior_a[pos], self.prior_b[pos]), fail)
        self._p.update(zip(pids, p.tolist()))
        return p, verdict

    def _p_eff(self):
        """Every active prompt's p_eff (eq. 2), in admission order: (prompt ids, p_eff). Computed again only for
        the prompts a rollout of which ended since (nothing else changes a prompt's)."""
        pids = list(self.active)
        stale = [pid for pid in pids if pid not in self._p]
        if stale:
            pos, n, s, fail = self._state(stale)
            p = effective_probability(n, s, self.filler.k, (self.prior_a[pos], self.prior_b[pos]), fail)
            self._p.update(zip(stale, p.tolist()))
        return pids, np.array([self._p[pid] for pid in pids], float)

    def _on_rollout(self, pid, observed):
        a = self.active.get(pid)
        if a is None:  # decided already: an in-flight sibling of a committed or abandoned prompt
            return
        a[2] += 1
        if observed is not None:
            a[3 if observed else 4] += 1
        self.touched.add(pid)
        self._p.pop(pid, None)

    def _settle(self):
        if self._closed or not self.touched:
            return
        now = [pid for pid in self.active if pid in self.touched]  # in admission order
        self.touched.clear()
        p, verdict = self._decide(now)
        for pid, v in zip(now, verdict):
            if v == COMMIT:
                within = len(self.groups) < self.target  # (a commit past the target is dropped, not counted)
                if within:
                    self.groups.append(pid)
                    self.effective += 1
                self._decided(pid, within)
        for pid, v, p_pid in zip(now, verdict, p):
            if v == ABANDON:
                self.abandoned.append(pid)
                self.abandon_p.append(float(p_pid))
                self._decided(pid)
                self._cancel(pid)
        if len(self.groups) >= self.target:
            return self._close()
        pids, p_all = self._p_eff()
        self._advance(dict(zip(pids, p_all.tolist())), set(now))

    def _advance(self, p_eff, decided=()):
        """Line 11: each continuing prompt's want, in priority order (mixed first, then by p_eff). The rest of its
        probes, then the rest of its group once it is mixed; an unmixed prompt gets one more rollout per decision
        (`decided`: the prompts just decided): one per call over a synchronous backend; as events each ended
        rollout is replaced, so n0 keep running (ours), or with `replace_probes=False` one more only once none of
        its rollouts is in flight (Algorithm 1's pace: fewer siblings to abort when it is abandoned)."""
        k, probe, commit_min = self.filler.k, self.filler.probe, self.filler.commit_min
        pids, old = list(p_eff), self.want
        state = np.asarray([self.active[pid] for pid in pids], np.int64).reshape(-1, 5)
        mixed = (state[:, 3] >= 1) & (state[:, 4] >= 1)
        self.want = {}
        for j in np.lexsort((-np.asarray(list(p_eff.values())), ~mixed)):
            pid, started = pids[j], int(state[j, 1])
            if started < probe:
                more = probe - started
            elif mixed[j]:
                more = commit_min - started
            else:
                one = pid in decided and (self.filler.replace_probes or not self.live[pid])
                more = min(old.get(pid, 0) + one, k - started)
            if more > 0:
                self.want[pid] = more

    def _next(self, room):
        out, left = [], self.budget - self.spent
        spare = self.in_flight > 0  # window slots free while rollouts run (never over a synchronous backend)
        for pid in list(self.want):  # continuations first, in priority order
            n = min(self.want[pid], room, left)
            if n:
                out.append((pid, n))
                self.active[pid][1] += n
                room, left = room - n, left - n
                self.want[pid] -= n
            if not self.want[pid]:
                del self.want[pid]
        k, probe = self.filler.k, self.filler.probe
        reserve = sum(k - a[1] for a in self.active.values())
        fits = left if self.carries else max(left - reserve, 0) // k
        need = min(self.target - len(self.groups) - len(self.active), fits)
        while need > 0 and room > 0 and left > 0 and self.next < self.stream.size:  # line 10: the refill
            n = self._admit(min(probe, room, left))
            out.append(n)
            room, left, need = room - n[1], left - n[1], need - 1
        if not spare:
            return out
        expected, needed = self._expected()
        cap = self.target * self.filler.overcommit
        while room > 0 and left > 0 and self.next < self.stream.size and len(self.groups) + expected < cap:
            pos = self.next  # ours: extra prompts into the free window (see the class docstring)
            fresh = float(effective_probability(0, 0, k, (self.prior_a[pos], self.prior_b[pos])))
            if needed + k * fresh > left and not self.carries:
                break
            n = self._admit(min(probe, room, left))
            out.append(n)
            room, left = room - n[1], left - n[1]
            expected, needed = expected + fresh, needed + (k - n[1]) * fresh
        return out

    def _admit(self, n):
        """The next stream prompt, with its first `n` probes (the rest of them are wanted)."""
        pos, self.next = self.next, self.next + 1
        pid = int(self.stream[pos])
        self.active[pid] = [pos, n, 0, 0, 0]
        if self.filler.probe > n:
            self.want[pid] = self.filler.probe - n
        return pid, n

    def _expected(self):
        """Groups the active prompts are expected to commit (the sum of their p_eff, eq. 2), and the rollouts
        they are expected to still start (k − started, weighted by p_eff)."""
        _, p = self._p_eff()
        started = np.asarray([a[1] for a in self.active.values()], np.int64)
        return float(p.sum()), float(np.sum(p * (self.filler.k - started)))

    def _decided(self, pid, counted=True):
        ended = self.active.pop(pid)[2]
        self._p.pop(pid, None)
        if counted:
            self.decided_at.append(int(ended))
        self.want.pop(pid, None)

    def _closed_hook(self):
        self.want.clear()
        self.filler._round_done(self)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "unfinished": len(self.active),
                "expected_lost_groups": float(np.sum(self.abandon_p)),
                "mean_rollouts_to_decide": float(np.mean(self.decided_at)) if self.decided_at else 0.0}
