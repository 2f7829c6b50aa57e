"""The rollout layer (torch): how rollouts are generated, ended and pruned, below the trainer.

- `pruning.py`: ARROL's two-phase generation and pruning in the trainer, and the quality head's online training;
- `quality_head.py`: the quality head, its scoring and test-time weighted voting;
- `backends.py`: the rollout backend protocol (`submit` / `next_completed` / `abort`), its exact batched backend and
  the vLLM-server backend;
- `inprocess.py`: the same rollout backend on vLLM's in-process `AsyncLLM`;
- `colocate.py`: the same rollout backend on the `vllm.LLM` of TRL's colocate mode (one process or several);
- `drivers.py`: `RoundDriver` (one event round) and `StreamDriver` (one stream across rounds);
- `engine_model.py`: the engine model, a simulation of a continuous-batching vLLM engine on a virtual clock behind
  the rollout backend's interface (`plan.py`'s engine table, tests)."""
