"""The pieces of ARROL's offline study (`trl_alloc.benchmarks.arrol_study`, `scripts/arrol_study.py`)."""

import numpy as np
import torch
from helpers import DIGITS, char_qwen2

from trl_alloc.allocation.arrol import binary_auc
from trl_alloc.benchmarks import arrol_study as study
from trl_alloc.rollout.quality_head import last_hidden_states


def test_the_trainers_feature_is_what_the_trainer_computes():
    """Last layer, last token at d: the hidden state `last_hidden_states` gives the trainer's head for prompt + the
    first d tokens; rollouts that ended before d are not eligible there."""
    model, _ = char_qwen2(DIGITS, seed=0)
    prompts = [[2, 3, 4], [2, 3, 4], [5, 6]]
    completions = [[7, 8, 9, 10, 1], [7, 1], [9, 9, 9]]
    feats = study.probe_features(model, prompts, completions, [0, 0, 1], points=[1, 3], layers=[2],
                                 eos_ids={1}, batch_size=2, progress=False)
    assert feats.rows[1].tolist() == [0, 1, 2] and feats.rows[3].tolist() == [0, 2]  # row 1 ended at its 2nd token
    want = last_hidden_states(model, [prompts[i] + completions[i][:3] for i in (0, 2)], pad_id=0)
    assert torch.allclose(torch.as_tensor(feats.hidden[(3, 2, "last")]), want, atol=1e-5)
    mean = model(torch.tensor([prompts[0] + completions[0][:3]]), output_hidden_states=True).hidden_states[2]
    assert np.allclose(feats.hidden[(3, 2, "mean")][0], mean[0, 3:6].mean(0).detach().numpy(), atol=1e-5)
    assert feats.signals[1]["group_agreement"].tolist() == [1.0, 1.0, 0.0]  # rows 0 and 1 both start with 7
    assert (feats.signals[3]["mean_logprob"] < 0).all() and (feats.signals[3]["mean_entropy"] > 0).all()


def test_within_group_auc_ignores_what_separates_prompts():
    groups = np.repeat([0, 1], 4)
    labels = np.array([1, 1, 0, 0, 1, 0, 0, 0])
    prompt_difficulty = np.array([5, 5, 5, 5, 0, 0, 0, 0.0])  # ranks prompt 0 above prompt 1, nothing inside
    assert binary_auc(prompt_difficulty, labels) > 0.6
    assert study.within_group_auc(prompt_difficulty, labels, groups) == 0.5
    inside = np.array([2, 1, 0, -1, 3, 0, 1, 2.0])
    assert study.within_group_auc(inside, labels, groups) == 1.0


def test_folds_keep_each_prompt_whole():
    groups = np.repeat(np.arange(23), 8)
    folds = study.prompt_folds(groups, 5, seed=0)
    assert all(len(set(folds[groups == g])) == 1 for g in range(23)) and set(folds) == set(range(5))


def test_fit_head_takes_raw_features_and_ranks_held_out_prompts():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 5.0, size=(600, 6)).astype(np.float32)  # far from standardised
    y = (x[:, 0] + rng.normal(0, 3, 600) > 3).astype(np.int64)
    folds = study.prompt_folds(np.repeat(np.arange(75), 8), 3, seed=0)
    for size in (0, 16):
        scores = study.cross_validated_scores(x, y, folds, size, 0.1, seed=0)
        assert binary_auc(scores, y) > 0.8
    assert binary_auc(study.cross_validated_signal(-x[:, 0], y, folds), y) > 0.8  # direction learnt per fold


def test_online_replay_learns_and_a_pretrained_start_ranks_from_the_first_round():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(960, 8)).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    order = np.arange(480, 960)
    fresh = study.online_replay(x, y, order, per_round=48, head_hidden_size=16, lr=1e-2)
    head = study.fit_head(x[:480], y[:480], 16, 0.0, seed=0)
    warm = study.online_replay(x, y, order, per_round=48, init=head, head_hidden_size=16, lr=1e-2)
    first = slice(0, 48)
    assert binary_auc(warm[first], y[order][first]) > 0.9 > binary_auc(fresh[first], y[order][first])
    assert binary_auc(fresh[-96:], y[order][-96:]) > 0.8  # the online head learns, given a learnable signal
