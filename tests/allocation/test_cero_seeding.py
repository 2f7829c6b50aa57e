"""CERO started from a probe pass (arXiv 2610.09679 eq. 5 with the probe's counts): the pacer, the file the study
writes, the trainer's `probe_counts`, and the effect measured by simulation."""

import json

import numpy as np
import pytest
from helpers import make_args, tiny_setup

from trl_alloc.allocation.beta import variance_proxy
from trl_alloc.allocation.cero import CEROScheduler
from trl_alloc.benchmarks.arrol_study import cero_seeding_effect
from trl_alloc.tasks.data import load_prompt_counts


def test_seed_counts_is_eq5_once_and_vartheta_from_the_posterior():
    pacer = CEROScheduler(4, rounds=5, budget=10, round_capacity=4, prior=(1.0, 1.0))
    pacer.seed_counts([4, 0, 2, 0], [0, 4, 2, 0])
    assert pacer.beta.a.tolist() == [5, 1, 3, 1] and pacer.beta.b.tolist() == [1, 5, 3, 1]
    assert np.allclose(pacer.vartheta, 4 * variance_proxy(pacer.beta.a, pacer.beta.b))
    first = set(pacer.propose().nonzero()[0].tolist())
    assert 2 in first and not {0, 1} & first  # the mixed prompt first; the decided ones priced out (ϑ < ν)
    pacer.update(np.zeros(4), np.zeros(4))
    with pytest.raises(ValueError, match="before the first round"):
        pacer.seed_counts([1, 1, 1, 1], [1, 1, 1, 1])


def test_prompt_counts_match_by_text_and_refuse_a_foreign_file(tmp_path):
    path = tmp_path / "probe_counts.json"
    path.write_text(json.dumps({"prompts": ["b", [{"role": "user", "content": "c"}]], "successes": [3, 1],
                                "failures": [1, 3]}))
    s, f, matched = load_prompt_counts(path, ["a", "b", [{"content": "c", "role": "user"}]])
    assert s.tolist() == [0, 3, 1] and f.tolist() == [0, 1, 3] and matched == 2
    with pytest.raises(ValueError, match="none of the 2 prompts"):
        load_prompt_counts(path, ["x"])
    path.write_text(json.dumps({"prompts": ["b"], "successes": [1]}))
    with pytest.raises(ValueError, match="not a probe-counts file"):
        load_prompt_counts(path, ["b"])


def test_the_trainer_starts_cero_from_probe_counts(tmp_path, capsys):
    from trl_alloc.trainer import AllocGRPOTrainer

    model, tok, ds, reward = tiny_setup()
    path = tmp_path / "probe_counts.json"
    path.write_text(json.dumps({"prompts": ds["prompt"][:3], "successes": [4, 0, 2], "failures": [0, 4, 2]}))
    args = make_args(str(tmp_path / "out"), pacing="cero", probe_counts=str(path), num_rounds=2)
    trainer = AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    beta = trainer.allocator.pacer.beta
    assert beta.a[:4].tolist() == [5, 1, 3, 1] and beta.b[:4].tolist() == [1, 5, 3, 1]
    assert "3 of 16 prompts seeded with 12 probe responses" in capsys.readouterr().out
    with pytest.raises(ValueError, match="keeps none"):
        make_args(str(tmp_path / "out"), pacing="uniform", probe_counts=str(path))
    with pytest.raises(ValueError, match="is not a file"):
        make_args(str(tmp_path / "out"), pacing="cero", probe_counts=str(tmp_path / "missing.json"))


def test_seeding_raises_the_early_effective_group_rate_in_simulation():
    """A pool whose prompts are mostly decided (as a base model's are): seeded CERO skips them from round one.
    Measured (200 seeds): early EGR 0.49 -> 0.76; asserted with a wide margin on 30 seeds, paired."""
    rates = np.random.default_rng(0).beta(0.5, 1.5, 300)
    out = cero_seeding_effect(rates, probe_k=4, rounds=12, budget=192, group_size=4, seeds=30)
    assert out["early"]["difference"] - out["early"]["ci95"] > 0.1
    assert out["run"]["seeded"] > out["run"]["unseeded"] and out["probe_responses"] == 1200
