"""What ARROL's quality head can learn on a real model (arXiv 2603.24840; docs/arrol.md, "What the head can
learn"): features of partial rollouts from a probe pass, heads trained offline, held-out AUC by detection point,
feature, head size and regularisation, and head-free signals beside them.

The probe pass itself (vLLM sampling, rewards) is `scripts/arrol_study.py`; this module takes its token ids and
labels. Every AUC is measured on prompts the head never trained on (k-fold, split by prompt), two ways:

* pooled: all held-out eligible rollouts ranked together (what `arrol/head_auc` logs in training);
* within-group: only pairs of rollouts of the same prompt -- ARROL normalises survival inside each group
  (arXiv 2603.24840, eq. 3), so this is the ranking pruning actually uses; a head that only knows which
  prompts are hard scores well pooled and 0.5 here.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..allocation.arrol import binary_auc


@dataclass
class ProbeFeatures:
    """Per detection point d: the rollouts still running at d (`rows[d]`, indices into the probe pass), their
    hidden-state features `hidden[(d, layer, pooling)]` (len(rows[d]), H), and head-free signals `signals[d][name]`."""

    points: list[int]
    layers: list[int]
    rows: dict[int, np.ndarray]
    hidden: dict[tuple[int, int, str], np.ndarray]
    signals: dict[int, dict[str, np.ndarray]]


def eligible_at(completion: Sequence[int], d: int, eos_ids: set[int]) -> bool:
    """A rollout is scored at d if it generated d tokens and had not ended (the trainer's eligibility rule)."""
    return len(completion) > d or (len(completion) == d and d > 0 and completion[-1] not in eos_ids)


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


@torch.no_grad()
def probe_features(model: torch.nn.Module, prompt_ids: Sequence[Sequence[int]],
                   completion_ids: Sequence[Sequence[int]], groups: Sequence[int], points: Sequence[int],
                   layers: Sequence[int], eos_ids: set[int], batch_size: int = 8,
                   progress: bool = True) -> ProbeFeatures:
    """One teacher-forced forward of prompt + the first max(points) completion tokens per rollout gives, at every
    point d: the hidden state of `layers` (HF `hidden_states` index; the last one is the decoder's output after its
    final norm, what the trainer's head reads) at the last token (`last`) and mean-pooled over the d completion
    tokens (`mean`); the mean log-probability and entropy of the d sampled tokens under the model; and the
    rollout's agreement with its group (mean Jaccard overlap of its first d tokens with the others')."""
    from tqdm.auto import tqdm

    points, layers = sorted(int(d) for d in points), [int(x) for x in layers]
    top = points[-1]
    n = len(completion_ids)
    rows = {d: np.array([i for i in range(n) if eligible_at(completion_ids[i], d, eos_ids)], np.int64)
            for d in points}
    where = {d: {int(i): j for j, i in enumerate(rows[d])} for d in points}
    hidden = {(d, layer, pool): np.zeros((len(rows[d]), model.config.hidden_size), np.float32)
              for d in points for layer in layers for pool in ("last", "mean")}
    signals = {d: {"mean_logprob": np.zeros(len(rows[d])), "mean_entropy": np.zeros(len(rows[d])),
                   "group_agreement": np.zeros(len(rows[d]))} for d in points}
    todo = [i for i in range(n) if any(i in where[d] for d in points)]
    model.eval()
    for start in tqdm(range(0, len(todo), batch_size), desc="hidden states", disable=not progress):
        batch = todo[start:start + batch_size]
        seqs = [list(prompt_ids[i]) + list(completion_ids[i][:top]) for i in batch]
        width = max(map(len, seqs))
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, s in enumerate(seqs):  # right padding: positions 0.. as in the rollout itself
            ids[r, :len(s)], mask[r, :len(s)] = torch.tensor(s), 1
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        logp = torch.log_softmax(out.logits.float(), -1)
        for r, i in enumerate(batch):
            P = len(prompt_ids[i])
            comp = torch.tensor(list(completion_ids[i][:top]), dtype=torch.long)
            tok_logp = logp[r, P - 1:P - 1 + len(comp)].gather(-1, comp[:, None]).squeeze(-1)
            ent = -(logp[r, P - 1:P - 1 + len(comp)].exp() * logp[r, P - 1:P - 1 + len(comp)]).sum(-1)
            for d in points:
                j = where[d].get(i)
                if j is None:
                    continue
                for layer in layers:
                    h = out.hidden_states[layer][r]
                    hidden[(d, layer, "last")][j] = h[P + d - 1].float().numpy()
                    hidden[(d, layer, "mean")][j] = h[P:P + d].float().mean(0).numpy()
                signals[d]["mean_logprob"][j] = float(tok_logp[:d].mean())
                signals[d]["mean_entropy"][j] = float(ent[:d].mean())
    groups = np.asarray(groups)
    for d in points:
        prefix = [set(completion_ids[i][:d]) for i in range(n)]
        for j, i in enumerate(rows[d]):
            mates = [m for m in np.flatnonzero(groups == groups[i]) if m != i]
            agreement = [_jaccard(prefix[i], prefix[m]) for m in mates]
            signals[d]["group_agreement"][j] = np.mean(agreement) if agreement else 0.0
    return ProbeFeatures(points, layers, rows, hidden, signals)


def within_group_auc(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> float:
    """AUC over pairs (positive, negative) of the same group: Σ_g n1_g n0_g AUC_g / Σ_g n1_g n0_g; NaN if no group
    is mixed."""
    total = weight = 0.0
    for g in np.unique(groups):
        m = groups == g
        n1 = int(labels[m].sum())
        n0 = int(m.sum()) - n1
        if n1 and n0:
            total += n1 * n0 * binary_auc(scores[m], labels[m])
            weight += n1 * n0
    return total / weight if weight else float("nan")


def prompt_folds(groups: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold index per row, whole prompts to a fold (a held-out prompt is never trained on)."""
    uniq = np.unique(groups)
    order = np.random.default_rng(seed).permutation(len(uniq))
    fold_of = {int(g): int(f % k) for f, g in zip(range(len(uniq)), uniq[order])}
    return np.array([fold_of[int(g)] for g in groups], np.int64)


def fit_head(x: np.ndarray, y: np.ndarray, head_hidden_size: int, weight_decay: float, seed: int,
             max_epochs: int = 400, lr: float = 1e-3, patience: int = 40) -> torch.nn.Module:
    """A head on standardised features (`head_hidden_size` 0: a linear probe; else the trainer's 2-layer MLP),
    AdamW full-batch on binary cross-entropy, early-stopped on a 20% validation slice; the standardisation is
    folded into its first layer, so it takes raw hidden states."""
    from ..rollout.quality_head import QualityHead

    g = torch.Generator().manual_seed(seed)
    X, Y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    mu, sd = X.mean(0), X.std(0).clamp_min(1e-6)
    perm = torch.randperm(len(X), generator=g)
    val, fit = perm[:max(1, len(X) // 5)], perm[max(1, len(X) // 5):]
    torch.manual_seed(seed)
    head = (QualityHead(X.shape[1], head_hidden_size) if head_hidden_size else torch.nn.Linear(X.shape[1], 1))
    first = head.net[0] if head_hidden_size else head
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    Z = (X - mu) / sd

    def logits(rows):
        out = head(Z[rows])
        return out if head_hidden_size else out.squeeze(-1)

    best, best_state, waited = float("inf"), None, 0
    for _ in range(max_epochs):
        head.train()
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(logits(fit), Y[fit]).backward()
        opt.step()
        head.eval()
        with torch.no_grad():
            v = float(torch.nn.functional.binary_cross_entropy_with_logits(logits(val), Y[val]))
        if v < best - 1e-5:
            best, best_state, waited = v, {k: t.clone() for k, t in head.state_dict().items()}, 0
        elif (waited := waited + 1) >= patience:
            break
    head.load_state_dict(best_state)
    with torch.no_grad():  # raw features: W (x - mu)/sd + b = (W/sd) x + (b - W mu/sd)
        first.bias -= (first.weight / sd) @ mu
        first.weight /= sd
    return head.eval()


def head_logits(head: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = head(torch.as_tensor(x, dtype=torch.float32))
    return out.reshape(-1).double().numpy()


def cross_validated_scores(x: np.ndarray, y: np.ndarray, folds: np.ndarray, head_hidden_size: int,
                           weight_decay: float, seed: int) -> np.ndarray:
    """Out-of-fold logits: each fold scored by a head trained on the other folds' prompts."""
    scores = np.full(len(y), np.nan)
    for f in np.unique(folds):
        test = folds == f
        if len(np.unique(y[~test])) < 2:
            continue
        head = fit_head(x[~test], y[~test], head_hidden_size, weight_decay, seed + int(f))
        scores[test] = head_logits(head, x[test])
    return scores


def cross_validated_signal(values: np.ndarray, y: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """A head-free signal as a score, its direction (higher = more likely correct, or lower) chosen on the other
    folds' prompts, as a gate would have to choose it before seeing the held-out ones."""
    scores = np.full(len(y), np.nan)
    for f in np.unique(folds):
        test = folds == f
        auc = binary_auc(values[~test], y[~test])
        scores[test] = values[test] if not auc < 0.5 else -values[test]
    return scores


def auc_row(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> dict:
    ok = np.isfinite(scores)
    return {"auc": binary_auc(scores[ok], labels[ok]), "auc_within_group": within_group_auc(scores[ok], labels[ok],
                                                                                         groups[ok]),
            "n": int(ok.sum()), "positives": int(labels[ok].sum())}


def cero_seeding_effect(rates: np.ndarray, probe_k: int, rounds: int, budget: int, group_size: int,
                        early_rounds: int = 3, seeds: int = 200, method: str = "cero") -> dict:
    """Does starting CERO's Beta states from a probe pass (`CEROScheduler.seed_counts`, arXiv 2610.09679 eq. 5
    with the probe's counts) raise the effective-group rate? The real pacer and filler (`allocation.simulate`) on a
    fixed pool with the probe's success `rates`, unseeded against seeded with a fresh Binomial(probe_k, rate) probe,
    paired per seed. Returns the mean EGR of the first `early_rounds` rounds and of the run, each arm, and the paired
    difference with a 95% interval; the probe's responses (probe_k per prompt) are reported beside the budget."""
    from ..allocation.simulate import DriftingPool, plan_settings_for, simulate

    args = plan_settings_for(len(rates), rounds, budget, group_size)  # every allocation field: the trainer's default
    arms = {"unseeded": {"early": [], "run": [], "effective": []}, "seeded": {"early": [], "run": [], "effective": []}}
    for seed in range(seeds):
        args.seed = seed
        probe = np.random.default_rng([seed, 7]).binomial(probe_k, rates)
        for arm, counts in (("unseeded", None), ("seeded", (probe.astype(float), (probe_k - probe).astype(float)))):
            pool = DriftingPool.from_rates(rates, rounds, group_size=group_size, seed=seed)
            with warnings.catch_warnings():  # (the selection-lift figure of a short run has empty bins)
                warnings.simplefilter("ignore", RuntimeWarning)
                _, rec, _ = simulate(method, args, pool=pool, seed_counts=counts)
            g, e = np.array(rec["groups"], float), np.array(rec["effective"], float)
            arms[arm]["early"].append(e[:early_rounds].sum() / max(g[:early_rounds].sum(), 1))
            arms[arm]["run"].append(e.sum() / max(g.sum(), 1))
            arms[arm]["effective"].append(e.sum())
    out = {"method": method, "rounds": rounds, "budget": budget, "group_size": group_size, "seeds": seeds,
           "probe_responses": int(probe_k * len(rates)), "early_rounds": early_rounds}
    for part in ("early", "run"):
        a, b = np.array(arms["unseeded"][part]), np.array(arms["seeded"][part])
        d = b - a
        out[part] = {"unseeded": float(a.mean()), "seeded": float(b.mean()), "difference": float(d.mean()),
                     "ci95": float(1.96 * d.std(ddof=1) / np.sqrt(len(d)))}
    eff = {arm: float(np.mean(v["effective"])) for arm, v in arms.items()}
    out["responses_per_effective_group"] = {"unseeded": budget / eff["unseeded"],
                                            "seeded, probe counted": (budget + out["probe_responses"]) / eff["seeded"]}
    return out


def pruning_at_auc(auc: float, rate: float, group_size: int = 8, keep_ratio: float = 0.5, slope: float = 0.5,
                   groups: int = 20000, seed: int = 0) -> dict:
    """What ARROL's survival rule (arXiv 2603.24840, eq. 3 with calibrated q) does with a head of a given AUC:
    binormal scores (logit = d·label + N(0, 1), AUC = Φ(d/√2)) for groups of `group_size` rollouts that succeed
    with probability `rate`, the real `ScoreCalibrator` and `survival_probabilities`. Returns the survivors'
    positive ratio over `rate` (the lift) and the share of groups still mixed among survivors, against pruning at
    random with the same keep ratio."""
    from scipy.stats import norm

    from ..allocation.arrol import ScoreCalibrator, sample_survivors, survival_probabilities

    rng = np.random.default_rng(seed)
    d = np.sqrt(2) * norm.ppf(auc)
    labels = rng.random((groups, group_size)) < rate
    logits = d * labels + rng.normal(size=labels.shape)
    calibrator = ScoreCalibrator(buffer_size=labels.size)
    calibrator.update(logits.ravel(), labels.ravel())
    q = calibrator.calibrate(logits.ravel()).reshape(labels.shape)
    keep = np.stack([sample_survivors(survival_probabilities(qg, keep_ratio, 0.5, slope), rng) for qg in q])
    coin = rng.random(labels.shape) < keep_ratio

    def figures(kept):
        pos = (labels & kept).sum(1)
        return float(pos.sum() / kept.sum() / rate), float(np.mean((pos > 0) & (pos < kept.sum(1))))

    (lift, mixed), (coin_lift, coin_mixed) = figures(keep), figures(coin)
    before = float(np.mean((labels.sum(1) > 0) & (labels.sum(1) < group_size)))
    return {"auc": auc, "rate": rate, "lift": lift, "mixed_after": mixed, "mixed_before": before,
            "random_lift": coin_lift, "random_mixed_after": coin_mixed}


def online_replay(x: np.ndarray, y: np.ndarray, order: np.ndarray, per_round: int, init: torch.nn.Module | None = None,
                  head_hidden_size: int = 256, lr: float = 1e-3, seed: int = 0) -> np.ndarray:
    """The trainer's online head on the probe's rollouts: rounds of `per_round` rollouts in `order`, each scored
    before the head trains on it, then one Adam step of BCE on the round (`RolloutPruner.end_round`). `init`: a
    pretrained head to start from (`quality_head_init`), else a fresh one seeded as the trainer seeds it. Returns
    the per-rollout prequential logits in `order`."""
    from ..rollout.quality_head import QualityHead

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = QualityHead(x.shape[1], head_hidden_size)
    if init is not None:
        head.load_state_dict(init.state_dict())
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    out = np.zeros(len(order))
    for start in range(0, len(order), per_round):
        rows = order[start:start + per_round]
        feats = torch.as_tensor(x[rows], dtype=torch.float32)
        head.eval()
        with torch.no_grad():
            out[start:start + len(rows)] = head(feats).double().numpy()
        head.train()
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(
            head(feats), torch.as_tensor(y[rows], dtype=torch.float32)).backward()
        opt.step()
    return out
