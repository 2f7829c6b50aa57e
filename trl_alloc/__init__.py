"""trl-alloc: where the rollout budget goes (CERO, SARA, ARROL) for TRL's GRPOTrainer.

The trainer classes import torch and TRL lazily, so `import trl_alloc.allocation` stays framework-free.
"""

import warnings

__version__ = "0.1.0"

# TRL 1.16 warns that vLLM 0.32 is outside its range, once per import site (five per process, in every process);
# trl-alloc runs and tests that pair and says so once itself (trainer/trl_compat.py: vllm_version_notice).
warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)

_LAZY = {"AllocGRPOConfig": "trainer.config", "AllocDAPOConfig": "trainer.config",
         "AllocGRPOTrainer": "trainer.grpo", "AllocDAPOTrainer": "trainer.grpo"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'trl_alloc' has no attribute {name!r}")


__all__ = list(_LAZY)
