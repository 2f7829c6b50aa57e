"""How a pacer and a filler join in one round (SPEC §1 composition), and a prompt-level simulator.

CERO's ranked positive-margin list is the filler's stream and its executed units × g the round's
response budget; plain pacers (uniform, knapsack) fix prompts, not spend, so an adaptive filler may
oversample up to its own cap. SARA's prior for a prompt is the pacer's Beta state, discounted.
"""

import numpy as np


def round_arguments(pacer, units, filling, group_size, target_groups=None, oversample=6, history_decay=None):
    """Keyword arguments of `filler.start_round` for the pacer's proposal `units`."""
    stream = np.asarray(pacer.ranked_prompts, np.int64)
    spend = int(units.sum()) * pacer.unit_size
    admitted = int((units > 0).sum())
    if filling == "full":
        return {"stream": stream, "budget": spend, "target_groups": None, "counts": units[stream] * pacer.unit_size}
    target = admitted if target_groups is None or admitted == 0 else int(target_groups)
    if not getattr(pacer, "paces_budget", False):
        spend = min(oversample * target * group_size, pacer.remaining_responses)
    kwargs = {"stream": stream, "budget": spend, "target_groups": target}
    if filling == "sara" and history_decay is not None and hasattr(pacer, "beta"):
        kwargs["prior_a"], kwargs["prior_b"] = pacer.beta.discounted(history_decay, stream)
    return kwargs


def run_round(pacer, filler, sample_rewards, round_kwargs):
    """Drive one round to completion; `sample_rewards(ids, counts)` returns one reward array per prompt."""
    rnd = filler.start_round(**round_kwargs)
    while not rnd.done:
        ids, counts = rnd.requests()
        rnd.observe(sample_rewards(ids, counts))
    pacer.update(*rnd.outcomes(pacer.num_prompts))
    return rnd


class DriftingPool:
    """A synthetic prompt pool whose success rates drift as a policy would learn: logit_i(t) =
    logit_i(0) + drift · t/K + gain · (responses trained on prompt i)/k (SPEC issue 5's planning prior)."""

    def __init__(self, num_prompts, rounds, mean_logit=-1.0, spread=2.5, drift=1.5, gain=0.05,
                 group_size=8, seed=0):
        self.rng = np.random.default_rng(seed)
        self.logit0 = self.rng.normal(mean_logit, spread, num_prompts)
        self.rounds, self.drift, self.gain, self.k = rounds, drift, gain, group_size
        self.trained = np.zeros(num_prompts)
        self.t = 0

    def success_rate(self):
        z = self.logit0 + self.drift * self.t / self.rounds + self.gain * self.trained / self.k
        return 1.0 / (1.0 + np.exp(-z))

    def sample(self, ids, counts):
        p = self.success_rate()
        return [(self.rng.random(n) < p[i]).astype(float) for i, n in zip(ids, counts)]

    def step(self, rnd):
        """Advance one round: the groups that reached the loss are 'trained on'."""
        for pid in rnd.groups:
            self.trained[pid] += rnd.successes.get(pid, 0) + rnd.failures.get(pid, 0)
        self.t += 1


def predicted_success_bins(predicted, admitted, bins=5):
    """Selection lift by predicted-success bin: the admitted prompts' share in each bin of the
    pre-decision predicted success rate, over the pool's share in that bin (1 = no preference)."""
    edges = np.linspace(0, 1, bins + 1)
    pool = np.histogram(predicted, edges)[0] / max(predicted.size, 1)
    chosen = np.histogram(predicted[admitted], edges)[0] / max(len(admitted), 1)
    return np.divide(chosen, pool, out=np.full(bins, np.nan), where=pool > 0)


__all__ = ["round_arguments", "run_round", "DriftingPool", "predicted_success_bins"]
