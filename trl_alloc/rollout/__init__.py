"""The rollout layer (torch): how rollouts are generated, ended and pruned, below the trainer.

- `pruning.py`: ARROL's two-phase generation and pruning in the trainer, and the quality head's online training;
- `quality_head.py`: the quality head, its scoring and test-time weighted voting;
- `backends.py`: the rollout backend protocol (`submit` / `next_completed` / `abort`), its exact batched backend and
  the vLLM-server backend;
- `inprocess.py`: the same engine on vLLM's in-process `AsyncLLM`;
- `colocate.py`: the same engine on the `vllm.LLM` of TRL's colocate mode (one process or several);
- `drivers.py`: `RoundDriver` (one event round) and `StreamDriver` (one stream across rounds);
- `engine_model.py`: a continuous-batching engine on a virtual clock (`plan.py`'s engine model, tests)."""
