"""Composition of pacers and fillers (docs/architecture.md) on a drifting synthetic pool, as scripts/plan.py
runs it."""

import argparse

import numpy as np
import pytest

from trl_alloc.allocation import simulate as plan


@pytest.fixture(scope="module")
def results():
    args = argparse.Namespace(prompts=1200, rounds=120, budget=120 * 96, unit_size=4, units_per_group=2,
                              capacity=26, tau_low=0.45, history_decay=1.0, drift=1.5, seed=0)
    out, ref = {}, None
    for method in ["uniform", "cero", "random_matched", "cero+sara", "uniform+dynamic_sampling"]:
        summary, rec, log = plan.simulate(method, args, ref)
        ref = log if method == "cero" else ref
        out[method] = (summary, rec)
    return args, out


def test_cero_spends_the_budget_exactly_by_the_last_round(results):
    args, out = results
    s, rec = out["cero"]
    assert s["responses_spent"] == args.budget and s["budget_left"] == 0 and s["rounds"] == args.rounds
    spend = np.asarray(rec["spend"])
    assert spend.max() <= args.capacity * args.unit_size
    gap = np.cumsum(spend) - args.budget / args.rounds * np.arange(1, spend.size + 1)
    assert np.abs(gap).max() > 0.5 * args.capacity * args.unit_size    # departs from uniform spending ...
    assert gap[-1] == pytest.approx(0)                                 # ... and returns


def test_cero_over_selects_intermediate_predicted_success(results):
    lift = results[1]["cero"][0]["selection_lift_by_predicted_success"]
    assert lift[2] > 1.2 and lift[0] < 1 and lift[4] < 1


def test_cero_beats_random_matched_and_uniform_on_effective_groups(results):
    out = results[1]
    assert out["cero"][0]["egr"] > out["uniform"][0]["egr"]
    assert out["cero"][0]["egr"] > out["random_matched"][0]["egr"]
    assert out["random_matched"][0]["responses_spent"] == out["cero"][0]["responses_spent"]


def test_cero_sara_is_cheapest_per_effective_group_and_never_overspends(results):
    args, out = results
    s = out["cero+sara"][0]
    assert s["responses_spent"] <= args.budget and s["egr"] == 1.0
    ds = out["uniform+dynamic_sampling"][0]["responses_per_effective_group"]
    assert s["responses_per_effective_group"] < 0.85 * ds
    assert s["responses_per_effective_group"] < out["cero"][0]["responses_per_effective_group"]
