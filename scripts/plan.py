#!/usr/bin/env python
"""Plan a run before renting GPUs: the real schedulers, no model, on a pool whose difficulty drifts.
See trl_alloc/cli/plan.py (the same as the `trl-alloc-plan` command)."""

from trl_alloc.cli.plan import main

if __name__ == "__main__":
    main()
