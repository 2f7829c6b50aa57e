"""The rollout layer (torch): ARROL's two-phase generation and pruning in the trainer (pruning.py) and
the quality head, its scoring and test-time weighted voting (quality_head.py)."""
