"""trl-alloc: where the rollout budget goes (CERO, SARA, ARROL) for TRL."""
__version__ = "0.1.0"
