#!/usr/bin/env python
"""Allocation-layer speed (not a test): per-round CERO propose+update at M = 17,398 and 100,000,
SARA decisions per 1,000 active prompts, ARROL calibration + survival per 1,000 rollouts.
Medians over repeats. Target: one CERO round at M = 17,398 under 2 ms on a 2-core CPU."""

import argparse
import time

import numpy as np

from trl_alloc.allocation import CEROScheduler, decide
from trl_alloc.allocation.arrol import ScoreCalibrator, survival_probabilities


def median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def cero_round_ms(M, repeats):
    """Median of propose() + update() only; simulated Bernoulli feedback is drawn outside the timer."""
    rng = np.random.default_rng(0)
    p = rng.beta(0.5, 0.5, M)
    sched = CEROScheduler(M, rounds=10 * repeats, budget=132 * 10 * repeats, round_capacity=132)
    times = []
    for i in range(repeats + 5):
        t0 = time.perf_counter()
        units = sched.propose()
        t1 = time.perf_counter()
        n = units * sched.unit_size
        s = rng.binomial(n, p)
        t2 = time.perf_counter()
        sched.update(s, n - s)
        t3 = time.perf_counter()
        if i >= 5:                                   # the first rounds are warm-up
            times.append((t1 - t0) + (t3 - t2))
    return 1e3 * float(np.median(times))


def sara_ms(active, repeats):
    rng = np.random.default_rng(1)
    n = rng.integers(1, 8, active)
    s = np.where(rng.random(active) < 0.5, 0, n)
    a, b = rng.uniform(0.5, 5, active), rng.uniform(0.5, 5, active)
    return median_ms(lambda: decide(n, s, 8, 0.45, 8, (a, b)), repeats)


def arrol_ms(rollouts, repeats, group=16):
    rng = np.random.default_rng(2)
    cal = ScoreCalibrator()
    cal.update(rng.normal(size=2048), rng.random(2048) < 0.4)
    logits = rng.normal(size=rollouts)

    def step():
        q = cal.calibrate(logits)
        for g in range(0, rollouts, group):
            survival_probabilities(q[g:g + group])
    return median_ms(step, repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    rows = [
        ("CERO propose+update, M = 17,398", cero_round_ms(17_398, args.repeats), "ms / round", 2.0),
        ("CERO propose+update, M = 100,000", cero_round_ms(100_000, args.repeats), "ms / round", None),
        ("SARA decisions, 1,000 active prompts", sara_ms(1000, args.repeats), "ms / 1,000 prompts", None),
        ("ARROL calibrate + survival, 1,000 rollouts (groups of 16)", arrol_ms(1000, args.repeats),
         "ms / 1,000 rollouts", None),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'median':>9}  unit")
    for name, ms, unit, target in rows:
        flag = "" if target is None else f"   target < {target} ms: {'met' if ms < target else 'MISSED'}"
        print(f"{name:<{width}}  {ms:9.3f}  {unit}{flag}")


if __name__ == "__main__":
    main()
