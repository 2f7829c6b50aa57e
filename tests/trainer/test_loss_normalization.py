"""`loss_normalization`: 'trained' is TRL's normalisation over the rows a round trains; 'nominal' scales the loss by
trained rows / generation_batch_size, stock GRPO's weighting of a round with fewer mixed groups (docs/benchmarks.md,
the learning regime)."""

import math

import pytest
import torch
from helpers import build


def _losses(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_nominal_scales_each_rounds_loss_by_its_share_of_the_nominal_batch(tmp_path):
    from transformers import TrainerCallback

    runs, scales = {}, {}
    for norm in ("trained", "nominal"):
        trainer = build(tmp_path / norm, pacing="uniform", filling="sara", num_rounds=3,
                        per_device_train_batch_size=16, loss_normalization=norm)
        seen = scales[norm] = []

        class Scale(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                seen.append(trainer.round_state.loss_scale)
        trainer.add_callback(Scale())
        trainer.train()
        runs[norm] = trainer
    trained, nominal = runs["trained"], runs["nominal"]
    # each run's scale is its own rounds' trained rows / 16 (rounds after the first may differ between the two runs:
    # their weights differ once a step has been taken)
    rows = [entry["loss_responses"] for entry in nominal.allocator.history]
    assert scales["trained"] == [1.0] * len(trained.allocator.history)
    assert scales["nominal"] == [r / 16 if r else 1.0 for r in rows]  # (an empty round moves nothing anyway)
    assert rows[0] == trained.allocator.history[0]["loss_responses"]  # round 1: the same weights, the same decisions
    a, b = _losses(trained)[0], _losses(nominal)[0]  # one step from the same weights: the same loss, scaled
    assert math.isclose(b, a * rows[0] / 16, rel_tol=1e-4, abs_tol=1e-9)


def test_nominal_leaves_stock_grpo_unchanged(tmp_path):
    params = {}
    for norm in ("trained", "nominal"):
        trainer = build(tmp_path / norm, num_rounds=2, loss_normalization=norm)
        trainer.train()
        assert trainer.round_state.loss_scale == 1.0  # stock trains its whole batch
        params[norm] = [p.detach().clone() for p in trainer.model.parameters()]
    assert all(torch.equal(x, y) for x, y in zip(params["trained"], params["nominal"]))


def test_an_unknown_normalization_is_refused(tmp_path):
    from helpers import make_args

    with pytest.raises(ValueError, match="unknown `loss_normalization='stock'`; choose one of trained, nominal"):
        make_args(str(tmp_path), loss_normalization="stock")
