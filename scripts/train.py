#!/usr/bin/env python
"""`accelerate launch scripts/train.py --config configs/tiny_cpu.yaml [--key value ...]`: see trl_alloc/cli/train.py
(the same as the `trl-alloc-train` command)."""

from trl_alloc.cli.train import main

if __name__ == "__main__":
    main()
