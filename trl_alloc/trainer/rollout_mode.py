"""`rollout_mode="auto"`: the rollout mode that is faster for this run, from what the config already says (backend,
device, filler, pruning, completion cap), chosen by the figures in docs/benchmarks.md. Deterministic wherever
events or stream were not measured to pay, since it is also the bit-exact one.

| run | auto picks | why (GPU-s per effective group, docs/benchmarks.md) |
|---|---|---|
| no vLLM (transformers generation) | deterministic | nothing overlaps; stream learned less on the demo |
| vLLM on a CPU | deterministic | live CPU server: events and stream not faster than stock's synchronous calls |
| completions capped at <= 32 tokens | deterministic | one request per rollout costs more than it saves (2.48x) |
| vLLM server on GPUs | stream | engine model: CERO+SARA 13.55 vs 35.63 events, stock 13.86 vs 24.61 |
| ... with pruning | stream | engine model, CERO+SARA with pruning: 12.75 (0.52x stock) |
| vLLM colocate on one GPU, filling full | deterministic | full groups: one call either way |
| vLLM colocate, adaptive filling | stream | engine model, 1 GPU: CERO+SARA 5.65, events 7.18, sync 15.79, stock 7.92 |
| ... with pruning | stream | engine model, one GPU: CERO+SARA with pruning 4.51 vs 5.76 events |
| ... with sleep mode | events | sleep mode drops a stream's carried KV cache |
| ... with pruning on several processes | deterministic | in-engine pruning runs on one colocate process for now |
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..allocation.registry import method_class

if TYPE_CHECKING:
    from .config import AllocGRPOConfig

SHORT_COMPLETIONS = 32  # tokens: at or below this cap, one streamed request per rollout does not pay


def choose_rollout_mode(args: AllocGRPOConfig, cuda: bool) -> tuple[str, str]:
    """(mode, reason) for `args` (an `AllocGRPOConfig` whose rollout_mode is "auto"); `cuda`: GPUs are in use."""
    if not args.use_vllm:
        return "deterministic", "transformers generation: nothing overlaps, and the run stays bit-exact"
    if not cuda:
        return "deterministic", "vLLM on a CPU: events and stream were not faster than synchronous calls there"
    if args.max_completion_length <= SHORT_COMPLETIONS:
        return "deterministic", (f"completions of at most {args.max_completion_length} tokens: one request per "
                                 "rollout costs more than event-driven filling saves")
    if args.vllm_mode == "colocate" and not method_class("filling", args.filling).adaptive:
        return "deterministic", "colocate with full groups: one generation call either way, nothing to overlap"
    if args.vllm_mode == "colocate" and args.prunes and args.world_size > 1:
        return "deterministic", "pruning inside a colocate engine runs on one process for now (two-phase pruning here)"
    if args.vllm_mode == "colocate" and args.vllm_enable_sleep_mode:
        return "events", "colocate with sleep mode: a stream's carried rollouts would lose their KV cache"
    if args.vllm_mode == "colocate":
        return "stream", ("one GPU: carried rollouts replace the wait for a round's stragglers "
                          "(engine model 0.71x stock)")
    return "stream", "vLLM server: the engine generates while the trainer trains (engine model 0.54x stock)"


__all__ = ["choose_rollout_mode"]
