#!/usr/bin/env python
"""The stream's yield guard: CERO + SARA as a stream against stock, on the engine model and the live CPU server,
compared with docs/data/stream_yield/reference.json. See trl_alloc/cli/bench_stream_yield.py."""

from trl_alloc.cli.bench_stream_yield import main

if __name__ == "__main__":
    main()
