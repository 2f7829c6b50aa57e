"""On-policy by default: the engine samples in the dtype the trainer computes its log-probabilities in.

GRPO's ratio assumes the engine samples from the policy the trainer scores. A float32 trainer beside an engine in
bfloat16 samples from another policy: on SmolLM2-135M the per-token log-probabilities differed by 0.04 on average
(4.1 at most) and TRL's importance-sampling ratio then corrected rounding, not staleness (docs/choosing-settings.md,
"The engine's dtype"; arXiv 2510.26788 measures the same mismatch and its cost).
"""

from __future__ import annotations

import warnings
from typing import Any

ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def trainer_compute_dtype(model: Any, args: Any) -> str:
    """The dtype the trainer's forward passes compute in: mixed precision's (`fp16` / `bf16`, accelerate's autocast)
    where it is on, else the parameters'."""
    if getattr(args, "fp16", False):
        return "float16"
    if getattr(args, "bf16", False):
        return "bfloat16"
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def engine_dtype(model: Any, args: Any) -> str:
    """The colocate engine's dtype: `vllm_dtype` where set, else the trainer's (`trainer_compute_dtype`)."""
    return args.vllm_dtype or trainer_compute_dtype(model, args)


def mismatch_message(engine: str, trainer: str, where: str, fix: str) -> str | None:
    """The warning for an engine that samples in another dtype than the trainer computes in (None when they
    match); `where` names the engine, `fix` says how to match them."""
    if engine == trainer:
        return None
    return (f"{where} generates in {engine} while the trainer computes in {trainer}: the engine samples from another "
            "policy than the one trained, and TRL's importance-sampling correction then corrects rounding, not "
            f"staleness (sampling/* metrics show by how much). {fix} (docs/choosing-settings.md, 'The engine's "
            "dtype').")


def warn_mismatch(engine: str, trainer: str, where: str, fix: str) -> None:
    message = mismatch_message(engine, trainer, where, fix)
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=3)


__all__ = ["ENGINE_DTYPES", "engine_dtype", "mismatch_message", "trainer_compute_dtype", "warn_mismatch"]
