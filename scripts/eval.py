#!/usr/bin/env python
"""Evaluate a policy on a held-out set: avg@k, pass@k, maj@k and quality-head-weighted maj@k.
See trl_alloc/cli/eval.py (the same as the `trl-alloc-eval` command)."""

from trl_alloc.cli.eval import main

if __name__ == "__main__":
    main()
