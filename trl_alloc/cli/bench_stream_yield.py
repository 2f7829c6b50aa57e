"""The stream's yield guard (a benchmark, not a test): CERO + SARA as a stream against stock GRPO, effective groups
a round, on the engine model at fixed seeds (seconds) and, with --live_seeds, on the live vLLM CPU server
(`scripts/bench_rollout.py`, about 8 minutes a seed on 2 cores), each compared with the reference figures in
docs/data/stream_yield/reference.json within the tolerance `benchmarks.stream_yield` states. Exit status 1 when
a figure dropped below it. Run it before a change to the rollout or allocation code lands (docs/benchmarks.md).

    python scripts/bench_stream_yield.py                          # engine model, 40 seeds (10 s)
    python scripts/bench_stream_yield.py --live_seeds 0 1 2       # and the live CPU server, 3 seeds
    python scripts/bench_stream_yield.py --live_seeds 0 1 2 --write_reference   # after a change meant to move it
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

REFERENCE = os.path.join("docs", "data", "stream_yield", "reference.json")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engine_seeds", type=int, nargs="+", default=list(range(40)))
    p.add_argument("--live_seeds", type=int, nargs="*", default=[], help="seeds of the live comparison (none: skip)")
    p.add_argument("--reference", default=REFERENCE)
    p.add_argument("--write_reference", action="store_true", help="record this run as the reference instead")
    p.add_argument("--output_dir", default=None, help="keep this run's figures (and the live runs' folders) here")
    args = p.parse_args(argv)
    if len(args.engine_seeds) < 2 or len(args.live_seeds) == 1:
        p.error("a mean needs at least two seeds (--engine_seeds, --live_seeds) to have a spread.")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    from ..benchmarks.stream_yield import main_run

    raise SystemExit(main_run(parse_args(argv)))


if __name__ == "__main__":
    main()
