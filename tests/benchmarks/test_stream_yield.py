"""The stream's yield guard (scripts/bench_stream_yield.py): its tolerance, exact on constructed figures; a drop of a
third fails and a reshuffle within the spread passes; the engine half is deterministic for a seed and matches the
reference kept in docs/data/stream_yield/reference.json for the seeds it shares."""

import json
import math
import os

import numpy as np
import pytest

from trl_alloc.benchmarks.stream_yield import compare, engine_yield, main_run, tolerance
from trl_alloc.cli.bench_stream_yield import REFERENCE, parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tolerance_is_three_standard_errors_of_a_difference():
    ref = [3.0, 4.0, 5.0]  # SD 1
    assert tolerance(ref, 3) == pytest.approx(3.0 * math.sqrt(2 / 3))
    assert tolerance(ref, 12) == pytest.approx(3.0 * math.sqrt(1 / 3 + 1 / 12))
    with pytest.raises(ValueError, match="two seeds"):
        tolerance([3.0], 3)


def test_a_drop_of_a_third_fails_and_a_reshuffle_passes():
    rng = np.random.default_rng(0)
    ref = {"cero+sara stream": {"effective_groups_per_round": list(3.4 + 0.5 * rng.standard_normal(40))}}
    same = {"cero+sara stream": {"effective_groups_per_round": list(3.4 + 0.5 * rng.standard_normal(40))}}
    third = {"cero+sara stream": {"effective_groups_per_round": list(2.27 + 0.5 * rng.standard_normal(40))}}
    rise = {"cero+sara stream": {"effective_groups_per_round": list(4.5 + 0.5 * rng.standard_normal(40))}}
    assert compare(ref, same)[0]["ok"]
    assert not compare(ref, third)[0]["ok"]
    assert compare(ref, rise)[0]["ok"]  # only a drop fails
    assert compare(ref, {}) == []


def test_the_engine_half_is_deterministic_and_matches_the_reference():
    first, again = engine_yield([0, 1]), engine_yield([0, 1])
    assert first == again
    with open(os.path.join(ROOT, REFERENCE), encoding="utf-8") as f:
        reference = json.load(f)["engine"]
    for name, row in first.items():
        kept = reference["rows"][name]["effective_groups_per_round"]
        assert row["effective_groups_per_round"] == pytest.approx(kept[:2])  # seeds 0 and 1 of the reference


def test_a_dropped_figure_exits_1(tmp_path):
    fake = {"commit": "x", "engine": {"seeds": [0, 1], "rows": {
        name: {"effective_groups_per_round": [v + 10.0 for v in row["effective_groups_per_round"]]}
        for name, row in engine_yield([0, 1]).items()}}}
    path = tmp_path / "reference.json"
    path.write_text(json.dumps(fake))
    assert main_run(parse_args(["--engine_seeds", "0", "1", "--reference", str(path)])) == 1
    fake["engine"]["rows"] = {n: {"effective_groups_per_round": [v - 10.0 for v in r["effective_groups_per_round"]]}
                              for n, r in fake["engine"]["rows"].items()}
    path.write_text(json.dumps(fake))
    assert main_run(parse_args(["--engine_seeds", "0", "1", "--reference", str(path)])) == 0
