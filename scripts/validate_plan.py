#!/usr/bin/env python
"""The planner against learning runs that happened. See trl_alloc/cli/validate_plan.py."""

from trl_alloc.cli.validate_plan import main

if __name__ == "__main__":
    main()
