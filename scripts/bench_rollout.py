#!/usr/bin/env python
"""Rollout benchmark: synchronous calls vs event-driven rounds on a live vLLM server. See
trl_alloc/cli/bench_rollout.py for the methods, figures and commands."""

from trl_alloc.cli.bench_rollout import main

if __name__ == "__main__":
    main()
