"""ARROL (arXiv 2603.24840; docs/arrol.md): survival probabilities for partial rollouts, the online score
calibrator of the quality head, the gate that keeps pruning off while the head ranks no better than a coin
(`AUCGate`), the pruning decision (`ARROLPruning`, `RandomPruning`), and rank-weighted majority voting at test
time. numpy/scipy only."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import norm, rankdata

from ._checks import check_finite, check_int, check_open_unit
from .base import ConfiguredMethod, RunContext
from .hyperparameters import Hyperparameter, at_least, positive, within
from .registry import register

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def _unit_interval(name, values):
    arr = check_finite(name, values)
    if arr.size and ((arr < 0).any() or (arr > 1).any()):
        raise ValueError(f"`{name}` must hold probabilities in [0, 1]; calibrate raw head logits with "
                         "ScoreCalibrator.calibrate first.")
    return arr


def survival_probabilities(q: ArrayLike, keep_ratio: float = 0.5, target_ratio: float = 0.5, slope: float = 0.5,
                           p_min: float = 0.1, p_max: float = 0.9, direction: str = "auto") -> np.ndarray:
    """p_i = clip(κ + δ + λ s (ρ − q_i), p_min, p_max) for one group, δ by bisection so mean(p) = κ.

    q: calibrated success probabilities of the group's partial rollouts; κ = keep_ratio,
    ρ = target_ratio, λ = slope. The paper's main-text formula is s = +1 (favour low q), which balances a
    group only when it is mostly correct. With ``direction="auto"`` (default) s = sign(mean(q) − ρ):
    a mostly-wrong group favours high q instead, so survivors move toward ρ either way (paper
    App. A.1: remove rollouts on the side of ρ the group's ratio is on). ``"fixed"``: always s = +1.
    keep_ratio = 1 returns all ones (no pruning).
    """
    q = np.atleast_1d(_unit_interval("q", q))
    if q.ndim != 1:
        raise ValueError(f"`q` must be 1-D (one group's rollouts), got shape {q.shape}.")
    kappa = check_open_unit("keep_ratio", keep_ratio, high_closed=True)
    rho = check_open_unit("target_ratio", target_ratio, low_closed=True, high_closed=True)
    lo = check_open_unit("p_min", p_min, low_closed=True, high_closed=True)
    hi = check_open_unit("p_max", p_max, low_closed=True, high_closed=True)
    lam = float(slope)
    if not lam >= 0:
        raise ValueError(f"`slope` must be >= 0 (0 disables the tilt), got {slope!r}.")
    if lo > hi:
        raise ValueError(f"`p_min` ({lo}) must not exceed `p_max` ({hi}).")
    if direction not in ("auto", "fixed"):
        raise ValueError(f"`direction` must be 'auto' or 'fixed', got {direction!r}.")
    if kappa == 1.0:
        return np.ones_like(q)
    if not lo <= kappa <= hi:
        raise ValueError(f"keep_ratio={kappa} cannot be met: every p_i is clipped to [p_min, p_max] = "
                         f"[{lo}, {hi}], so mean(p) must lie there too; choose keep_ratio in that range "
                         "or widen p_min/p_max (keep_ratio=1 disables pruning).")
    if q.size == 0:
        return q
    sign = 1.0 if direction == "fixed" else float(np.sign(q.mean() - rho))
    tilt = sign * lam * (rho - q)
    if kappa in (lo, hi) or not tilt.any():
        return np.full_like(q, kappa)

    def gap(delta):
        return np.clip(kappa + delta + tilt, lo, hi).mean() - kappa

    # gap is continuous and non-decreasing in δ; at these ends every p_i sits at p_min / p_max.
    a, b = lo - kappa - tilt.max() - 1.0, hi - kappa - tilt.min() + 1.0
    ga, gb = gap(a), gap(b)
    delta = a if ga >= 0 else b if gb <= 0 else brentq(gap, a, b, xtol=1e-14)
    return np.clip(kappa + delta + tilt, lo, hi)


def sample_survivors(p: ArrayLike, rng: np.random.Generator | int | None) -> np.ndarray:
    """Boolean mask: rollout i survives with probability p_i (is pruned with 1 − p_i)."""
    p = _unit_interval("p", p)
    return np.random.default_rng(rng).random(p.shape) < p


def rank_weights(scores: ArrayLike) -> np.ndarray:
    """w = (N − rank)/(N − 1) in [0, 1], rank 1 = highest score, ties get their average rank."""
    s = np.atleast_1d(check_finite("scores", scores))
    if s.size <= 1:
        return np.ones_like(s)
    return (s.size - rankdata(-s, method="average")) / (s.size - 1)


def vote_totals(answers: Iterable[Hashable | None],
                weights: ArrayLike | None = None) -> dict[Hashable, tuple[float, int, int]]:
    """{answer: (total weight, count, first index)}; None answers are skipped."""
    answers = list(answers)
    w = np.ones(len(answers)) if weights is None else np.atleast_1d(check_finite("weights", weights))
    if w.shape != (len(answers),):
        raise ValueError(f"`weights` must have one entry per answer ({len(answers)}), got shape {w.shape}.")
    totals = {}
    for i, (a, wi) in enumerate(zip(answers, w)):
        if a is not None:
            t, c, first = totals.get(a, (0.0, 0, i))
            totals[a] = (t + float(wi), c + 1, first)
    return totals


def weighted_majority_vote(answers: Iterable[Hashable | None], weights: ArrayLike | None = None) -> Hashable | None:
    """argmax_a Σ_{i: answer_i = a} w_i; ties -> larger plain count, then first appearance.

    weights=None is plain majority voting; returns None when no answer is given.
    """
    totals = vote_totals(answers, weights)
    if not totals:
        return None
    best = max(t for t, _, _ in totals.values())
    tied = [(a, c, f) for a, (t, c, f) in totals.items() if t >= best - 1e-9 * max(1.0, abs(best))]
    return min(tied, key=lambda x: (-x[1], x[2]))[0]


def _labels(labels):
    arr = np.asarray(labels)
    if arr.dtype != bool:
        arr = check_finite("labels", arr)
        if arr.size and not np.isin(arr, (0, 1)).all():
            raise ValueError("`labels` must be 0/1 (or bool) final rewards of completed rollouts.")
    return np.atleast_1d(arr.astype(np.int64))


def _paired(scores, labels, name="scores"):
    s = np.atleast_1d(check_finite(name, scores))
    y = _labels(labels)
    if s.shape != y.shape:
        raise ValueError(f"`{name}` and `labels` must have the same shape, got {s.shape} and {y.shape}.")
    return s, y


def binary_auc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Mann–Whitney AUC = (R_1 − N_1(N_1+1)/2)/(N_1 N_0); NaN when a class is missing."""
    s, y = _paired(scores, labels)
    n1 = int(y.sum())
    n0 = y.size - n1
    if n1 == 0 or n0 == 0:
        return float("nan")
    r1 = rankdata(s)[y == 1].sum()
    return float((r1 - n1 * (n1 + 1) / 2) / (n1 * n0))


def accuracy(scores: ArrayLike, labels: ArrayLike, threshold: float = 0.0) -> float:
    """Fraction of (score > threshold) == label (threshold 0 for logits, 0.5 for probabilities)."""
    s, y = _paired(scores, labels)
    return float(np.mean((s > threshold) == (y == 1))) if s.size else float("nan")


class ScoreCalibrator:
    """Head logits -> calibrated success probabilities q over a sliding buffer (docs/arrol.md).

    sigmoid(logit) -> bin b of B equal-width bins on [0, 1]; from the last `buffer_size` completed
    rollouts: P(b|1) = (n1[b] + α)/(N1 + αB), P(b|0) = (n0[b] + α)/(N0 + αB), π = (N1 + α)/(N + 2α),
    q = π P(b|1) / (π P(b|1) + (1 − π) P(b|0)). An empty buffer gives q = 0.5.
    """

    def __init__(self, num_bins: int = 10, buffer_size: int = 2048, alpha: float = 1.0) -> None:
        self.num_bins = check_int("num_bins", num_bins, minimum=1)
        self.buffer_size = check_int("buffer_size", buffer_size, minimum=1)
        self.alpha = float(alpha)
        if not self.alpha > 0:
            raise ValueError(f"`alpha` (Laplace smoothing) must be > 0, got {alpha!r}.")
        self._buffer = deque(maxlen=self.buffer_size)

    def __len__(self) -> int:
        return len(self._buffer)

    def bins(self, logits: ArrayLike) -> np.ndarray:
        x = np.atleast_1d(check_finite("logits", logits))
        return np.minimum((expit(x) * self.num_bins).astype(np.int64), self.num_bins - 1)

    def update(self, logits: ArrayLike, labels: ArrayLike) -> None:
        """Append (bin, label) of completed rollouts; the oldest fall out past `buffer_size`."""
        x, y = _paired(logits, labels, name="logits")
        self._buffer.extend(zip(self.bins(x).tolist(), y.tolist()))

    def calibrate(self, logits: ArrayLike) -> np.ndarray:
        b = self.bins(logits)
        B, a = self.num_bins, self.alpha
        n1, n0 = np.zeros(B), np.zeros(B)
        for bin_, label in self._buffer:
            (n1 if label else n0)[bin_] += 1
        N1, N0 = n1.sum(), n0.sum()
        like1 = (n1[b] + a) / (N1 + a * B)
        like0 = (n0[b] + a) / (N0 + a * B)
        prior = (N1 + a) / (N1 + N0 + 2 * a)
        return prior * like1 / (prior * like1 + (1 - prior) * like0)

    def state_dict(self) -> dict:
        bins, labels = (list(t) for t in zip(*self._buffer)) if self._buffer else ([], [])
        return {"num_bins": self.num_bins, "buffer_size": self.buffer_size, "alpha": self.alpha,
                "bins": bins, "labels": labels}

    def load_state_dict(self, state: dict) -> None:
        bins, labels = [int(b) for b in state["bins"]], [int(y) for y in state["labels"]]
        num_bins = check_int("num_bins", state["num_bins"], minimum=1)
        if len(bins) != len(labels) or any(not 0 <= b < num_bins for b in bins) \
                or any(y not in (0, 1) for y in labels):
            raise ValueError("calibrator state is corrupt: `bins` and `labels` must pair up, with bins "
                             f"in [0, {num_bins}) and 0/1 labels; resume from an intact checkpoint.")
        self.num_bins, self.alpha = num_bins, float(state["alpha"])
        self.buffer_size = check_int("buffer_size", state["buffer_size"], minimum=1)
        self._buffer = deque(zip(bins, labels), maxlen=self.buffer_size)


class AUCGate:
    """Prune only behind a head that ranks a group's rollouts better than a coin (docs/arrol.md, "The gate"; not
    in the paper).

    Holds (score, label, group) of the last `window` held-out rollouts: whole groups, scored by the head before it
    could train on them, never trained on, never pruned. Its AUC is over pairs of the *same* group
    (`within_group_auc`): survival probabilities are normalised inside each group (eq. 3), so ranking prompts
    against each other (what makes a pooled AUC high) buys pruning nothing. Open when at least `min_groups` groups
    are mixed, that AUC is >= `min_auc`, and a stratified Mann-Whitney test (each group's U under the null, pooled
    with the same pair weights, normal approximation) rejects 0.5 at level `alpha`. `min_auc = 0` disables it."""

    def __init__(self, min_auc: float = 0.7, window: int = 512, min_groups: int = 8, alpha: float = 0.001) -> None:
        self.min_auc = float(min_auc)
        if not 0 <= self.min_auc <= 1:
            raise ValueError(f"`min_auc` must lie in [0, 1] (0 turns the gate off), got {min_auc!r}.")
        self.window = check_int("window", window, minimum=1)
        self.min_groups = check_int("min_groups", min_groups, minimum=1)
        self.alpha = check_open_unit("alpha", alpha)
        self._items = deque(maxlen=self.window)
        self._figures = self._measure()

    @property
    def enabled(self) -> bool:
        return self.min_auc > 0

    @property
    def is_open(self) -> bool:
        return self._figures["open"]

    def figures(self) -> dict:
        """{"open", "auc" (within groups), "pooled_auc", "p_value", "mixed_groups", "rollouts"} of the window (the
        AUCs are NaN without a mixed group / without both labels)."""
        return dict(self._figures)

    def observe(self, scores: ArrayLike, labels: ArrayLike, groups: Iterable[Hashable]) -> None:
        """Held-out rollouts' head logits (from before the head saw them), 0/1 final rewards and group keys (a key
        names one group of one round)."""
        s, y = _paired(scores, labels)
        keys = [str(g) for g in groups]
        if len(keys) != s.size:
            raise ValueError(f"`groups` must name the group of each of the {s.size} rollouts, got {len(keys)}.")
        self._items.extend(zip(s.tolist(), y.tolist(), keys))
        self._figures = self._measure()

    def _measure(self):
        by = {}
        for score, label, key in self._items:
            by.setdefault(key, ([], []))[label].append(score)
        total = weight = var = 0.0
        mixed = 0
        for neg, pos in by.values():
            n1, n0 = len(pos), len(neg)
            if n1 and n0:
                mixed += 1
                w = n1 * n0
                total += w * binary_auc(pos + neg, [1] * n1 + [0] * n0)
                weight += w
                var += w * w * (n1 + n0 + 1) / (12.0 * n1 * n0)
        auc = total / weight if weight else float("nan")
        p = float(norm.sf((auc - 0.5) / (np.sqrt(var) / weight))) if weight else 1.0
        s = np.array([i[0] for i in self._items], float)
        y = np.array([i[1] for i in self._items], np.int64)
        pooled = binary_auc(s, y) if y.size else float("nan")
        is_open = not self.enabled or (mixed >= self.min_groups and auc >= self.min_auc and p <= self.alpha)
        return {"open": bool(is_open), "auc": auc, "pooled_auc": pooled, "p_value": p, "mixed_groups": mixed,
                "rollouts": len(self._items)}

    def reason(self) -> str:
        """Why it is closed (or that it is open), in words for a log line."""
        f = self._figures
        if not self.enabled:
            return "the gate is off (min_auc=0)"
        seen = f"{f['mixed_groups']} mixed groups among {f['rollouts']} held-out rollouts"
        if f["mixed_groups"] < self.min_groups:
            return f"{seen}; it needs {self.min_groups} mixed groups to measure the head"
        verdict = "open" if f["open"] else "closed"
        return (f"the quality head's held-out AUC within groups is {f['auc']:.3f} over {seen} (one-sided p = "
                f"{f['p_value']:.2g}; pooled across groups {f['pooled_auc']:.3f}); the gate is {verdict} at AUC >= "
                f"{self.min_auc:g} and p <= {self.alpha:g}")

    def state_dict(self) -> dict:
        return {"scores": [i[0] for i in self._items], "labels": [i[1] for i in self._items],
                "groups": [i[2] for i in self._items]}

    def load_state_dict(self, state: dict) -> None:
        """The held-out rollouts; the thresholds are this run's (a resumed run may change them)."""
        self._items.clear()
        if state["scores"]:
            self.observe(state["scores"], state["labels"], state["groups"])
        self._figures = self._measure()


@register("pruning", "arrol")
class ARROLPruning(ConfiguredMethod):
    """ARROL's pruning decision on one request's eligible partial rollouts (docs/arrol.md): head logits ->
    calibrated q (`ScoreCalibrator`) -> per-prompt-group survival probabilities (`survival_probabilities`)
    -> sampled survivors. Nothing is pruned during the first `cold_start_rounds` rounds, nor while the `AUCGate`
    is closed; a `heldout_fraction` of the eligible rollouts (drawn by `hold_out`) feeds that gate."""

    stage = "pruning"
    uses_head = True
    hyperparameters = (  # the paper's defaults (arXiv 2603.24840), and the gate's (docs/arrol.md)
        Hyperparameter("detect_length", int, 512, "ARROL detection length L_detect in tokens: every rollout generates "
                       "up to this many tokens, then the unfinished ones are scored once and pruned or continued. "
                       "Must be below max_completion_length.", at_least(1)),
        Hyperparameter("prune_undecided", bool, True, "Events mode: True (docs/arrol.md) = ARROL may prune any "
                       "eligible rollout; False = only rollouts of prompts already known to be mixed (a success and a "
                       "failure observed), so SARA's probes, whose outcomes decide a prompt, are never cut (with full "
                       "groups that leaves almost nothing to prune)."),
        Hyperparameter("keep_ratio", float, 0.5, "ARROL keep ratio κ: expected fraction of the rollouts reaching "
                       "detect_length that survive.", within(0, 1, low_open=True)),
        Hyperparameter("target_ratio", float, 0.5, "ARROL target positive ratio ρ that pruning steers each group's "
                       "survivors toward.", within(0, 1)),
        Hyperparameter("survival_slope", float, 0.5, "ARROL slope λ of the survival probability p = clip(κ + δ + "
                       "λ(ρ − q), p_min, p_max).", at_least(0)),
        Hyperparameter("survival_min", float, 0.1, "ARROL lower clip p_min of survival probabilities.", within(0, 1)),
        Hyperparameter("survival_max", float, 0.9, "ARROL upper clip p_max of survival probabilities.", within(0, 1)),
        Hyperparameter("cold_start_rounds", int, 20, "ARROL rounds without pruning at the start (the head and "
                       "calibrator learn from every rollout).", at_least(0)),
        Hyperparameter("cold_start_steps", int | None, None, "Deprecated name of `cold_start_rounds` (it counts "
                       "rounds, not optimizer steps)."),
        Hyperparameter("head_hidden_size", int, 256, "Width of the quality head's hidden layer (2-layer MLP on the "
                       "policy's last hidden state).", at_least(1)),
        Hyperparameter("head_learning_rate", float, 1e-3, "Learning rate of the quality head's own Adam optimizer "
                       "(one step per round).", positive),
        Hyperparameter("calibration_bins", int, 10, "Bins B of the quality head's score calibrator (sigmoid(logit) "
                       "binned on [0, 1]).", at_least(1)),
        Hyperparameter("calibration_buffer", int, 2048, "Sliding buffer of completed rollouts (bin, label) behind the "
                       "calibrator's per-bin counts.", at_least(1)),
        Hyperparameter("calibration_alpha", float, 1.0, "Laplace smoothing α of the calibrator's per-bin counts.",
                       positive),
        Hyperparameter("pruning_min_auc", float, 0.7, "ARROL's gate (docs/arrol.md, 'The gate'): prune only while the "
                       "quality head ranks a group's held-out rollouts with AUC at least this (within groups, "
                       "significantly above 0.5: one-sided p <= 0.001); otherwise rollouts run to the end. 0 turns "
                       "the gate off. Not in the paper: at small scale the head can rank no better than a coin.",
                       within(0, 1)),
        Hyperparameter("pruning_heldout_fraction", float, 0.2, "Share of the groups whose eligible rollouts the gate "
                       "holds out, whole: never pruned, never trained on, scored by the head before it sees them."),
        Hyperparameter("pruning_gate_window", int, 512, "The gate's AUC is measured over this many of the latest "
                       "held-out rollouts.", at_least(1)),
        Hyperparameter("quality_head_init", str | None, None, "Start the quality head from this QualityHead folder "
                       "(e.g. `scripts/arrol_study.py --save_head` on a probe pass of the base model) instead of a "
                       "random head; its hidden size must be the policy's."),
    )

    @classmethod
    def check_config(cls, args: Any) -> None:
        """The rules between the hyperparameters, and with `max_completion_length`."""
        if args.pruning_min_auc > 0 and not 0 < args.pruning_heldout_fraction < 1:
            raise ValueError(f"`pruning_heldout_fraction` must lie in (0, 1) while the gate is on (pruning_min_auc="
                             f"{args.pruning_min_auc}), got {args.pruning_heldout_fraction}: the gate measures the "
                             "head on rollouts it never trained on. Set pruning_min_auc=0 to turn the gate off.")
        if args.quality_head_init is not None and not os.path.isfile(
                os.path.join(args.quality_head_init, "model.safetensors")):
            raise ValueError(f"quality_head_init={args.quality_head_init!r} is not a QualityHead folder (no "
                             "model.safetensors): give the folder `scripts/arrol_study.py --save_head` or a run's "
                             "`quality_head/` wrote.")
        if args.survival_min > args.survival_max:
            raise ValueError(f"`survival_min` ({args.survival_min}) must not exceed `survival_max` "
                             f"({args.survival_max}).")
        if args.keep_ratio < 1 and not args.survival_min <= args.keep_ratio <= args.survival_max:
            raise ValueError(f"`keep_ratio` ({args.keep_ratio}) must lie in [survival_min, survival_max] = "
                             f"[{args.survival_min}, {args.survival_max}]: the mean survival probability is κ and "
                             "each one is clipped to that range; widen the range or change `keep_ratio`.")
        if args.detect_length >= (args.max_completion_length or 0):
            raise ValueError(f"pruning={args.pruning!r} needs `detect_length` ({args.detect_length}) below "
                             f"`max_completion_length` ({args.max_completion_length}): a rollout is scored when it "
                             "reaches detect_length and survivors continue up to max_completion_length. Lower "
                             "`detect_length` (ARROL arXiv 2603.24840: 512 for long reasoning; a few tokens for tiny "
                             "models) or set pruning='none'.")

    @classmethod
    def from_config(cls, args: Any, context: RunContext) -> ARROLPruning:
        """The decision rule the config's hyperparameters give (the quality head itself is the trainer's:
        trl_alloc/rollout/pruning.py), seeded with the allocation seed."""
        own = cls.settings(args)
        return cls(keep_ratio=own["keep_ratio"], target_ratio=own["target_ratio"], slope=own["survival_slope"],
                   p_min=own["survival_min"], p_max=own["survival_max"], cold_start_rounds=own["cold_start_rounds"],
                   calibration_bins=own["calibration_bins"], calibration_buffer=own["calibration_buffer"],
                   calibration_alpha=own["calibration_alpha"], min_auc=own["pruning_min_auc"],
                   heldout_fraction=own["pruning_heldout_fraction"], gate_window=own["pruning_gate_window"],
                   seed=context.seed)

    def __init__(self, keep_ratio: float = 0.5, target_ratio: float = 0.5, slope: float = 0.5, p_min: float = 0.1,
                 p_max: float = 0.9, cold_start_rounds: int = 20, calibration_bins: int = 10,
                 calibration_buffer: int = 2048, calibration_alpha: float = 1.0, min_auc: float = 0.7,
                 heldout_fraction: float = 0.2, gate_window: int = 512, seed: int = 0) -> None:
        self.survival = dict(keep_ratio=keep_ratio, target_ratio=target_ratio, slope=slope, p_min=p_min, p_max=p_max)
        self.cold_start_rounds = check_int("cold_start_rounds", cold_start_rounds, minimum=0)
        self.calibrator = ScoreCalibrator(calibration_bins, calibration_buffer, calibration_alpha)
        self.gate = AUCGate(min_auc if self.uses_head else 0.0, gate_window)
        self.heldout_fraction = float(heldout_fraction) if self.gate.enabled else 0.0
        if not 0 <= self.heldout_fraction < 1 or (self.gate.enabled and self.heldout_fraction == 0):
            raise ValueError(f"`heldout_fraction` must lie in (0, 1) while the gate is on (min_auc={min_auc}): it "
                             f"measures the head on rollouts it never trained on; got {heldout_fraction!r}.")
        self.rng = np.random.default_rng([int(seed), 0xA220])
        self.holdout_rng = np.random.default_rng([int(seed), 0xA221])
        self.rounds = 0

    @property
    def active(self) -> bool:
        """Past the cold start and the gate open: pruning decisions are made (else every rollout survives)."""
        return self.rounds >= self.cold_start_rounds and self.gate.is_open

    def hold_out(self, groups: ArrayLike) -> np.ndarray:
        """Which eligible rollouts go to the gate's held-out slice (never pruned, never trained on): whole groups,
        each with probability `heldout_fraction`. `groups`: each rollout's group in this decision."""
        groups = np.asarray(groups)
        if not self.heldout_fraction or groups.size == 0:
            return np.zeros(groups.size, bool)
        uniq, inverse = np.unique(groups, return_inverse=True)
        return (self.holdout_rng.random(uniq.size) < self.heldout_fraction)[inverse.reshape(-1)]

    def keep_probabilities(self, groups: ArrayLike, logits: ArrayLike) -> np.ndarray:
        """Survival probability of each eligible rollout; `groups`: its prompt id, `logits`: its head logit."""
        groups, logits = np.asarray(groups, np.int64), np.asarray(logits, float)
        q = self.calibrator.calibrate(logits)
        p = np.empty(groups.size)
        for g in np.unique(groups):
            members = groups == g
            p[members] = survival_probabilities(q[members], **self.survival)
        return p

    def prune(self, groups: ArrayLike, logits: ArrayLike | None = None) -> np.ndarray:
        """Boolean mask over the eligible rollouts: True = prune (abort) it."""
        groups = np.asarray(groups, np.int64)
        if not self.active or groups.size == 0:
            return np.zeros(groups.size, bool)
        return ~sample_survivors(self.keep_probabilities(groups, logits), self.rng)

    def observe(self, logits: ArrayLike, labels: ArrayLike, heldout: ArrayLike | None = None,
                groups: Iterable[Hashable] | None = None) -> None:
        """Completed eligible rollouts' (logit, 0/1 label) into the calibrator's buffer; the `heldout` ones also
        into the gate, with their `groups` (their logits were computed before the head could train on them)."""
        self.calibrator.update(logits, labels)
        if heldout is not None and np.any(heldout):
            held = np.asarray(heldout, bool)
            self.gate.observe(np.asarray(logits)[held], np.asarray(labels)[held],
                              [g for g, h in zip(groups, held) if h])

    def end_round(self) -> None:
        self.rounds += 1

    def state_dict(self) -> dict:
        return {"rounds": self.rounds, "rng": self.rng.bit_generator.state,
                "holdout_rng": self.holdout_rng.bit_generator.state, "calibrator": self.calibrator.state_dict(),
                "gate": self.gate.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.rounds = int(state["rounds"])
        self.rng.bit_generator.state = state["rng"]
        self.calibrator.load_state_dict(state["calibrator"])
        if "holdout_rng" in state:  # (checkpoints from before the gate have neither)
            self.holdout_rng.bit_generator.state = state["holdout_rng"]
            self.gate.load_state_dict(state["gate"])


@register("pruning", "random")
class RandomPruning(ARROLPruning):
    """ARROL's control (docs/arrol.md): each eligible rollout survives with probability `keep_ratio`, no head."""

    uses_head = False

    def keep_probabilities(self, groups: ArrayLike, logits: ArrayLike | None = None) -> np.ndarray:
        return np.full(np.asarray(groups).size, float(self.survival["keep_ratio"]))

