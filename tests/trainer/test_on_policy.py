"""The engine's default dtype is the trainer's (trainer/on_policy.py): the rule, and the warning where they differ.
The engines themselves are checked on-policy in tests/trainer/test_colocate.py, tests/rollout/test_backends.py
(in-process) and tests/serving/test_vllm_server.py (server)."""

from types import SimpleNamespace

import pytest
import torch

from trl_alloc.trainer.on_policy import engine_dtype, mismatch_message, trainer_compute_dtype, warn_mismatch


@pytest.mark.parametrize("params, fp16, bf16, want", [
    (torch.float32, False, False, "float32"),    # a float32 trainer (the CPU recipes): the engine in float32
    (torch.float32, False, True, "bfloat16"),    # mixed precision: forward passes compute in bfloat16
    (torch.float32, True, False, "float16"),     # FP16 in both (arXiv 2510.26788)
    (torch.bfloat16, False, False, "bfloat16"),  # a model loaded in bfloat16
])
def test_the_engine_takes_the_dtype_the_trainer_computes_in(params, fp16, bf16, want):
    model = torch.nn.Linear(2, 2).to(params)
    args = SimpleNamespace(fp16=fp16, bf16=bf16, vllm_dtype=None)
    assert trainer_compute_dtype(model, args) == want == engine_dtype(model, args)
    assert engine_dtype(model, SimpleNamespace(fp16=fp16, bf16=bf16, vllm_dtype="auto")) == "auto"  # TRL's


def test_a_mismatch_warns_with_how_to_match_and_a_match_does_not():
    assert mismatch_message("float32", "float32", "The engine", "fix") is None
    with pytest.warns(UserWarning, match=r"The vLLM server at http://x generates in bfloat16 while the trainer "
                      r"computes in float32: .* Start it with --dtype float32 \(docs/choosing-settings.md"):
        warn_mismatch("bfloat16", "float32", "The vLLM server at http://x", "Start it with --dtype float32")
