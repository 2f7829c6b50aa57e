"""Tasks and models: the built-in verifiable tasks (builtin.py, word_problems.py), their rewards
(rewards.py), user datasets and splits (data.py), the embedded tiny model (tiny.py) and the registered
real models (models.py)."""

from .builtin import TASKS, build_dataset

__all__ = ["TASKS", "build_dataset"]
