"""rollout_mode="auto" (trainer/rollout_mode.py): the measured-faster mode for each kind of run, recorded with its
reason in the config (the log and the model card read it); explicit modes are kept as given."""

import pytest
from helpers import make_args

from trl_alloc.reporting.hub import render_model_card
from trl_alloc.trainer.rollout_mode import choose_rollout_mode


@pytest.mark.parametrize("cuda,kw,mode", [
    (True, dict(use_vllm=False), "deterministic"),
    (False, dict(use_vllm=True, vllm_mode="server"), "deterministic"),
    (True, dict(use_vllm=True, vllm_mode="server", max_completion_length=16), "deterministic"),
    (True, dict(use_vllm=True, vllm_mode="server"), "stream"),
    (True, dict(use_vllm=True, vllm_mode="server", filling="full"), "stream"),
    (True, dict(use_vllm=True, vllm_mode="server", pruning="arrol", detect_length=32), "stream"),
    (True, dict(use_vllm=True, vllm_mode="colocate"), "stream"),
    (True, dict(use_vllm=True, vllm_mode="colocate", filling="full"), "deterministic"),
    (True, dict(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True), "events"),
    (True, dict(use_vllm=True, vllm_mode="colocate", pruning="random", detect_length=32), "stream"),
    (True, dict(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True, pruning="random", detect_length=32),
     "events"),
])
def test_auto_picks_the_measured_faster_mode(tmp_path, cuda, kw, mode):
    args = make_args(str(tmp_path), pacing="cero", filling=kw.pop("filling", "sara"), rollout_budget=64,
                     num_rounds=4, **{"max_completion_length": 256, "rollout_mode": "deterministic", **kw})
    chosen, reason = choose_rollout_mode(args, cuda)
    assert chosen == mode and reason


def test_auto_is_resolved_in_the_config_and_reported(tmp_path):
    args = make_args(str(tmp_path), pacing="cero", filling="sara", rollout_budget=64, num_rounds=4,
                     rollout_mode="auto")
    assert args.rollout_mode == "deterministic" and "transformers generation" in args.rollout_mode_reason
    card = str(render_model_card(args, {}, "m"))
    assert "rollout_mode_reason" in card and "transformers generation" in card
    explicit = make_args(str(tmp_path), pacing="cero", filling="sara", rollout_budget=64, num_rounds=4,
                         rollout_mode="events")
    assert explicit.rollout_mode == "events" and explicit.rollout_mode_reason is None


def test_colocate_stream_with_sleep_mode_is_refused(tmp_path):
    """Sleep mode discards the KV cache a colocate stream's carried rollouts live in: refused at config time."""
    with pytest.raises(ValueError, match="vllm_enable_sleep_mode discards their KV cache"):
        make_args(str(tmp_path), pacing="cero", filling="sara", rollout_budget=64, num_rounds=4, use_vllm=True,
                  vllm_mode="colocate", vllm_enable_sleep_mode=True, rollout_mode="stream")
    args = make_args(str(tmp_path), pacing="cero", filling="sara", rollout_budget=64, num_rounds=4, use_vllm=True,
                     vllm_mode="colocate", vllm_enable_sleep_mode=True, rollout_mode="events")
    assert args.rollout_mode == "events"
