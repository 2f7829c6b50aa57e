"""docs/metrics.md documents every metric the trainer logs: the names written in the code, the stream's
(`STREAM_ENTRY_KEYS`) and each filler's own stats, as their rounds report them."""

import argparse
import pathlib
import re

from trl_alloc.allocation.registry import method_names
from trl_alloc.allocation.simulate import plan_allocator
from trl_alloc.trainer.metrics import BASE_STATS, STREAM_ENTRY_KEYS

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "metrics.md").read_text()
NAME = re.compile(r"""["'](alloc|arrol|pruning|sampling)/([a-z0-9_/]+)["']""")


def documented(name):
    """Named on the page, whole or as `family/<filling>/key` or `prefix/a`, `/b` shorthand."""
    if f"`{name}`" in PAGE:
        return True
    head, _, tail = name.rpartition("/")
    return f"`{head}/" in PAGE and f"`/{tail}`" in PAGE


def metric_names_in_code():
    names = set()
    for path in (ROOT / "trl_alloc").rglob("*.py"):
        names |= {f"{a}/{b}" for a, b in NAME.findall(path.read_text())}
    return names


def filler_stats():
    plan = argparse.Namespace(prompts=32, rounds=4, budget=256, unit_size=4, units_per_group=2, capacity=32, seed=0)
    names = set()
    for filling in method_names("filling"):
        for events in (False, True):
            allocator, _ = plan_allocator(f"uniform+{filling}", plan)
            _, _, summary = allocator.one_round(lambda: None, events)  # an empty round: its stats' keys
            names |= {(filling, key) for key in set(summary["stats"]) - set(BASE_STATS)}
    return names


def test_every_metric_named_in_the_code_is_documented():
    names = metric_names_in_code()
    assert len(names) > 50 and "sampling/importance_sampling_capped_share" in names
    missing = sorted(n for n in names if not documented(n))
    assert not missing, f"add these to docs/metrics.md: {missing}"


def test_the_stream_and_filler_metrics_are_documented():
    missing = [f"alloc/{key}" for key in STREAM_ENTRY_KEYS if f"`alloc/{key}`" not in PAGE
               and not documented(f"alloc/{key}")]
    stats = filler_stats()
    assert {("sara", "unfinished"), ("full", "carried_in")} <= stats
    for filling, key in stats:
        if f"`alloc/{filling}/{key}`" not in PAGE and f"`alloc/<filling>/{key}`" not in PAGE:
            missing.append(f"alloc/{filling}/{key}")
    assert not missing, f"add these to docs/metrics.md: {missing}"


def test_the_check_fails_for_an_undocumented_name():
    assert not documented("alloc/no_such_metric") and documented("alloc/egr")
    assert documented("sampling/raw_importance_sampling_ratio/p95") and documented("arrol/heldout_mixed_groups")
