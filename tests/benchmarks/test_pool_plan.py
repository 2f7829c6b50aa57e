"""Planning on the user's own pool (`scripts/plan.py --model M --dataset D`, trl_alloc/benchmarks/probe.py and
pool_plan.py): a probe's counts become the pool's rates exactly, and a short plan on the embedded tiny model writes
its table, recommendation, JSON, plot and the probe_counts.json train.py reads."""

import json

import numpy as np
import pytest

from trl_alloc.allocation.simulate import DriftingPool
from trl_alloc.benchmarks.probe import pool_rates, pool_summary


def test_a_probes_counts_are_the_pools_rates_exactly():
    successes, failures = [0, 1, 4, 8, 3, 0], [8, 7, 4, 0, 5, 0]  # the last prompt: no response could be scored
    rates = pool_rates(successes, failures)
    assert rates[:5].tolist() == [0.0, 0.125, 0.5, 1.0, 0.375] and np.isnan(rates[5])
    pool = DriftingPool.from_rates(rates[:5], rounds=10, drift=0.0, gain=0.0)
    assert np.allclose(pool.success_rate(), [1e-4, 0.125, 0.5, 1 - 1e-4, 0.375], rtol=0, atol=1e-12)
    pool.t = 7  # a static pool: no drift with the rounds
    assert np.allclose(pool.success_rate()[1:4], [0.125, 0.5, 1 - 1e-4], rtol=0, atol=1e-12)
    summary = pool_summary(successes, failures)
    assert (summary["prompts"], summary["scored_prompts"]) == (6, 5)
    assert summary["all_fail"] == pytest.approx(1 / 6) and summary["all_pass"] == pytest.approx(1 / 6)
    assert summary["mixed"] == pytest.approx(3 / 6) and summary["mean_rate"] == pytest.approx(2.0 / 5)
    assert sum(summary["histogram"]) == 5 and summary["histogram"][0] == 1 and summary["histogram"][-1] == 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_short_plan_on_the_tiny_model_writes_its_table_and_the_counts_train_reads(tmp_path, capsys):
    from trl_alloc.benchmarks.probe import sample_pool
    from trl_alloc.cli.plan import main
    from trl_alloc.tasks.data import load_prompt_counts

    out = tmp_path / "plan"
    plan = main(["--model", "tiny", "--dataset", "builtin:arithmetic", "--probe_prompts", "24", "--probe_k", "4",
                 "--probe_max_tokens", "8", "--probe_backend", "transformers", "--plan_seeds", "2",
                 "--methods", "uniform,cero+sara", "--engine_methods", "uniform,cero+sara", "--output_dir", str(out)])
    printed = capsys.readouterr().out
    assert "probe: 96 responses (24 prompts x 4) of tiny through transformers" in printed
    assert "| uniform | " in printed and "| cero+sara stream |" in printed and "recommended: " in printed
    assert "a static pool" in printed
    saved = json.loads((out / "plan.json").read_text())
    assert saved["recommendation"] == plan["recommendation"]
    assert plan["recommendation"]["setting"] in plan["engine"]
    assert saved["pool"]["prompts"] == 24 and saved["probe"]["responses"] == 96
    # 40 rounds of max(1, 24 // 16) prompt x 8 responses (the plan's groups: g x N_max), all spent by stock
    assert plan["rows"]["uniform"]["responses"] == {"mean": 320, "sd": 0.0, "min": 320, "max": 320}
    assert (out / "plan.png").stat().st_size > 0 and (out / "plan.md").read_text().startswith("probe: ")
    # the counts are the file train.py --probe_counts reads, matched by prompt text to the same seeded pool
    pool = sample_pool("builtin:arithmetic", 24, seed=0)
    successes, failures, matched = load_prompt_counts(str(out / "probe_counts.json"), pool["prompt"])
    assert matched == 24 and (np.asarray(successes) + np.asarray(failures) <= 4).all()
    assert (np.asarray(successes) == np.asarray(saved["probe"]["successes"])).all()


def test_the_drift_is_recovered_from_a_run_whose_drift_is_known(tmp_path):
    """A synthetic stock run on a pool of known rates that drifts by +1.2 in logit over 40 rounds (binomial noise,
    32 scored responses a round): the fit finds it within 0.3, and `--drift_from` reads it from a run folder,
    rescaled to the plan's rounds."""
    from scipy.special import expit, logit

    from trl_alloc.allocation.simulate import fit_drift
    from trl_alloc.benchmarks.pool_plan import drift_from_run

    rng = np.random.default_rng(0)
    rates = rng.uniform(0.02, 0.6, 64)
    t = np.arange(40)
    truth = expit(logit(rates)[None, :] + 1.2 * t[:, None] / 40).mean(axis=1)
    scored = np.full(40, 32)
    successes = rng.binomial(scored, truth)
    assert abs(fit_drift(rates, successes, scored) - 1.2) < 0.3
    assert abs(fit_drift(rates, np.rint(truth * 32), scored) - 1.2) < 0.05  # (no noise but the rounding)
    many = np.full(40, 10_000)  # a static pool (rounded to whole successes of 10,000 a round)
    assert abs(fit_drift(rates, np.rint(expit(logit(rates)).mean() * many), many)) < 0.01
    run = tmp_path / "run" / "allocation"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"methods": {"pacing": "uniform", "filling": "full"}, "per_round": [
        {"successes": int(s), "scored": int(n)} for s, n in zip(successes, scored)]}))
    fitted = drift_from_run(str(tmp_path / "run"), rates, rounds=80)
    assert fitted["run_rounds"] == 40 and fitted["uniform"]
    assert fitted["drift"] == pytest.approx(2 * fitted["run_drift"])
    (run / "summary.json").write_text(json.dumps({"per_round": [{"responses": 32}]}))
    with pytest.raises(ValueError, match="its rounds record no successes"):
        drift_from_run(str(tmp_path / "run"), rates, rounds=80)


def test_an_engine_profile_sets_the_decode_step(tmp_path, capsys):
    """--engine_profile: the decode step `bench_rollout.py --calibrate` fitted (a + b × running) becomes --step_ms
    and --step_ms_per_seq; a file without a fit is a clear usage error naming the command that writes one."""
    import argparse

    from trl_alloc.cli.plan import apply_engine_profile, make_parser

    profile = tmp_path / "bench_rollout.json"
    profile.write_text(json.dumps({"summary": {}, "calibration": {"a_s": 0.069, "b_s": 0.0059, "points": []}}))
    parser = make_parser()
    args = parser.parse_args(["--engine_profile", str(profile)])
    apply_engine_profile(parser, args)
    assert (args.step_ms, args.step_ms_per_seq) == pytest.approx((69.0, 5.9))
    profile.write_text(json.dumps({"summary": {}}))
    with pytest.raises(SystemExit) as stop:
        apply_engine_profile(parser, argparse.Namespace(engine_profile=str(profile)))
    assert stop.value.code == 2 and "bench_rollout.py --calibrate" in capsys.readouterr().err
