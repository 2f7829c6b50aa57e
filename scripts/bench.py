#!/usr/bin/env python
"""Method benchmark: every sampling method at the same total response budget, from the same start
checkpoint. See trl_alloc/cli/bench.py for the methods, figures and commands (the same as `trl-alloc-bench`)."""

from trl_alloc.cli.bench import main

if __name__ == "__main__":
    main()
