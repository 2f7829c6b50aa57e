"""The benchmark scripts' shared measurement code: round recording and the selection observer."""

import numpy as np
import pytest

from trl_alloc.benchmarks.measure import RoundRecorder, selection_figures


def _simulate(pick, p, rounds=30, k=8, seed=0):
    """Rounds of `pick(predicted_mean, t) -> prompt ids`, each prompt answered k times at its rate p."""
    rng = np.random.default_rng(seed)
    a, b = np.ones(p.size), np.ones(p.size)
    out = []
    for t in range(rounds):
        groups = {}
        for i in pick(a / (a + b), t, rng):
            r = (rng.random(k) < p[i]).astype(float)
            groups[int(i)] = r.tolist()
            a[i] += r.sum()
            b[i] += k - r.sum()
        out.append(groups)
    return out


def test_selection_lift_is_flat_for_random_choice_and_peaks_where_a_selector_looks():
    p = np.random.default_rng(1).beta(0.5, 0.5, 300)
    uniform = selection_figures(_simulate(lambda m, t, rng: rng.choice(300, 30, replace=False), p), 300)
    rounds = _simulate(
        lambda m, t, rng: rng.choice(300, 30, replace=False) if t < 3 else np.argsort(np.abs(m - 0.5))[:30], p)
    middle = selection_figures(rounds, 300)
    assert np.allclose(uniform["lift"], 1.0, atol=0.25)
    assert middle["lift"][2] > 4 and middle["lift"][0] < 0.2 and middle["lift"][4] < 0.2
    seen, chosen_seen = set(), 0  # only prompts observed before a round count
    for groups in rounds:
        chosen_seen += len(seen & set(groups))
        seen |= set(groups)
    assert sum(middle["chosen_per_bin"]) == chosen_seen > 0


def test_qhat_tracks_the_observed_group_variance():
    p = np.random.default_rng(2).beta(0.5, 0.5, 300)
    fig = selection_figures(_simulate(lambda m, t, rng: rng.choice(300, 40, replace=False), p, rounds=60), 300)
    bins = fig["variance"]
    assert len(bins) >= 4 and sum(b["groups"] for b in bins) > 1500
    assert [b["bin"] for b in bins] == sorted(b["bin"] for b in bins)
    assert all(0.05 * b["bin"] <= b["q_hat"] <= 0.05 * (b["bin"] + 1) for b in bins)  # 5 bins of [0, 1/4]
    observed = [b["observed"] for b in bins]
    assert observed == sorted(observed)  # more predicted variation, more observed variation
    for b in bins[1:]:  # the unbiased sample variance has expectation E[P(1-P)] = q̂ under the posterior
        assert abs(b["observed"] - b["q_hat"]) < 0.05


def test_round_recorder_per_call_and_per_round():
    prompts = ["1+1=", "2+2=", "3+3="]
    reward = lambda prompts, completions, completion_ids=None, **kw: [float(c == "ok") for c in completions]  # noqa: E731

    rec = RoundRecorder(prompts)
    wrapped = rec.wrap(reward, per_call=True)
    assert wrapped(["1+1=", "1+1="], ["ok", "no"], completion_ids=[[1], [2]]) == [1.0, 0.0]
    wrapped(["3+3="], ["ok"], completion_ids=[[1]])
    assert rec.rounds == [{0: [1.0, 0.0]}, {2: [1.0]}]

    class FakeTrainer:  # stands in for a trl-alloc trainer's round loop: two reward calls per round
        round_start_hooks = []

        def _run_round(self):
            for hook in self.round_start_hooks:
                hook()
            scored(["2+2=", "2+2="], ["ok", ""], completion_ids=[[1], []])  # the second one was pruned
            scored(["1+1="], ["no"], completion_ids=[[3]])
            return "batches"

    rec = RoundRecorder(prompts)
    scored = rec.wrap(reward)
    trainer = FakeTrainer()
    rec.record_rounds_of(trainer)
    assert trainer._run_round() == "batches" and trainer._run_round() == "batches"
    assert rec.rounds == [{1: [1.0], 0: [0.0]}] * 2
    with pytest.raises(KeyError):
        scored(["9+9="], ["ok"], completion_ids=[[1]])  # a prompt outside the pool is a bench bug
