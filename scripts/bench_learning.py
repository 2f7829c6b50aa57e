#!/usr/bin/env python
"""Learning-regime benchmark: whole train.py runs per method and seed, held-out accuracy against responses and
seconds, paired against stock GRPO. See trl_alloc/cli/bench_learning.py (the same as `trl-alloc-bench-learning`)."""

from trl_alloc.cli.bench_learning import main

if __name__ == "__main__":
    main()
