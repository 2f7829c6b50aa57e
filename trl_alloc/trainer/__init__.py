"""The TRL adapter layer: `AllocGRPOTrainer` / `AllocDAPOTrainer` (grpo.py) and their configs (config.py).

The trainer drives the allocator (`trl_alloc.allocation.allocator`) from TRL's sampling step;
everything TRL-private it touches goes through `trl_compat.py`.
"""

from .config import AllocDAPOConfig, AllocGRPOConfig
from .grpo import AllocDAPOTrainer, AllocGRPOTrainer

__all__ = ["AllocGRPOConfig", "AllocDAPOConfig", "AllocGRPOTrainer", "AllocDAPOTrainer"]
