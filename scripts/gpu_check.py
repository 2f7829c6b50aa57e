#!/usr/bin/env python
"""What a lent GPU machine can check without vLLM or a download: AllocGRPOTrainer in bf16 on CUDA, stock vs CERO+SARA.
See trl_alloc/benchmarks/gpu_check.py."""

from trl_alloc.benchmarks.gpu_check import main

if __name__ == "__main__":
    main()
