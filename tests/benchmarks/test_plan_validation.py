"""The planner against learning runs that happened (trl_alloc/benchmarks/plan_validation.py, scripts/validate_plan.py):
a run's settings come from its record's command, a probe's counts become the pool's rates exactly, the drift fitted
to a stock run reproduces its effective groups, and the table pairs every record with its predictions."""

import json

import numpy as np
import pytest

from trl_alloc.benchmarks.plan_validation import (by_method, fit_drift_to_stock, markdown, order_matches, plan_args,
                                                  predict, probed_rates, run_settings, validate)

CONFIG = "configs/learning_smollm2_pool64.yaml"


def record(method, seed, effective, responses=1280):
    return {"method": method, "seed": seed, "effective_groups": effective, "responses_spent": responses,
            "command": ["scripts/train.py", "--config", CONFIG, "--pacing", "uniform", "--seed", str(seed),
                        "--num_builtin_prompts", "64", "--temperature", "0.3", "--use_vllm", "--rollout_mode",
                        "deterministic"]}


def test_a_runs_settings_are_its_config_then_its_flags():
    settings = run_settings(record("stock", 2, 50))
    assert settings["num_builtin_prompts"] == 64 and settings["num_rounds"] == 40 and settings["seed"] == 2
    assert settings["pacing"] == "uniform" and settings["use_vllm"] is True  # a flag with no value
    assert settings["rollout_mode"] == "deterministic" and settings["temperature"] == 0.3
    args = plan_args(settings, 64, seed=1)
    assert (args.prompts, args.rounds, args.budget, args.unit_size * args.units_per_group) == (64, 40, 1280, 8)
    assert args.probe == 2 and args.seed == 1  # an allocation field the run set (SARA's probe size) goes through


def test_probed_rates_are_the_probes_and_a_larger_pool_draws_from_them():
    probe = {"successes": [0, 2, 8, 4], "failures": [8, 6, 0, 4]}
    assert probed_rates(probe, seed=0).tolist() == [0.0, 0.25, 1.0, 0.5]
    wider = probed_rates({**probe, "pool_prompts": 10}, seed=0)
    assert wider.size == 10 and wider[:4].tolist() == [0.0, 0.25, 1.0, 0.5]
    assert set(wider[4:].tolist()) <= {0.0, 0.25, 1.0, 0.5}
    assert probed_rates({**probe, "pool_prompts": 10}, seed=0).tolist() == wider.tolist()  # seeded


def test_the_fitted_drift_reproduces_the_stock_runs_effective_groups():
    settings = run_settings(record("stock", 0, 0))
    rates = np.random.default_rng(3).beta(0.5, 3.0, 64)
    truth = predict("uniform", rates, settings, 1.5, seeds=range(3))["effective_groups"]
    fitted = fit_drift_to_stock(rates, settings, truth, seeds=range(3))
    assert predict("uniform", rates, settings, fitted, seeds=range(3))["effective_groups"] == truth
    assert abs(fitted - 1.5) <= 0.5
    static = predict("uniform", rates, settings, 0.0, seeds=range(3))["effective_groups"]
    assert static != truth  # the drift moves the prediction, so the fit has something to find


def test_validate_pairs_every_record_with_its_predictions():
    rng = np.random.default_rng(0)
    probes = {s: {"successes": (k := rng.integers(0, 9, 64)).tolist(), "failures": (8 - k).tolist(), "k": 8}
              for s in (0, 1)}
    records = [record("stock", 0, 60), record("stock", 1, 45), record("sara", 0, 66, 1274),
               record("sara", 1, 58, 1278), record("grpo_old", 0, 1)]  # not a known method: left out
    result = validate(records, probes, plan_seeds=2)
    assert sorted((r["method"], r["seed"]) for r in result["rows"]) == [("sara", 0), ("sara", 1), ("stock", 0),
                                                                        ("stock", 1)]
    assert result["donor_seed"] == 0 and set(result["drift"]) == {0, 1}
    for row in result["rows"]:
        assert ("fit_other" in row) == (row["seed"] == 1)  # seed 0's drift predicts seed 1, not itself
        assert row["static"]["drift"] == 0.0 and row["fit_own"]["drift"] == result["drift"][row["seed"]]
    table = by_method(result)
    sara = table["sara"]
    assert sara["measured"]["effective_groups"] == 62.0 and sara["measured"]["n"] == 2
    assert sara["static"]["error"] == pytest.approx(sara["static"]["effective_groups"] / 62.0 - 1)
    assert sara["fit_other"]["n"] == 1
    text = markdown(result, "constructed")
    assert (sara["measured"]["min"], sara["measured"]["max"]) == (58, 66)
    assert "| sara | 2 | 62.0 (58–66) |" in text and "fitted on seed 0's stock" in text
    json.dumps(result, default=float)  # what validate_plan.py writes


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_probe_samples_the_runs_own_pool_at_its_settings():
    from trl_alloc.benchmarks.plan_validation import probe_run, run_pool

    settings = {"dataset_name": "builtin:arithmetic", "num_builtin_prompts": 12, "num_generations": 3,
                "max_completion_length": 8, "temperature": 1.0}
    probe = probe_run(settings, seed=4, model="tiny", backend="transformers")
    assert probe["prompts"] == list(run_pool(settings, 4)["prompt"])  # the pool train.py builds for seed 4
    assert probe["k"] == 3 and probe["max_tokens"] == 8 and probe["responses"] == 36 == 12 * 3
    assert [s + f for s, f in zip(probe["successes"], probe["failures"])] == [3] * 12  # the verifier scores all
    sampled = probe_run(settings, seed=4, model="tiny", probe_prompts=5, backend="transformers")
    assert len(sampled["prompts"]) == 5 and set(sampled["prompts"]) <= set(probe["prompts"])
    assert sampled["pool_prompts"] == 12 and probed_rates(sampled, 4).size == 12


def test_the_order_check_compares_responses_per_effective_group():
    def entry(measured, predicted):
        return {"measured": {"responses_per_effective_group": measured},
                "static": {"responses_per_effective_group": predicted}}
    same = {"stock": entry(22.9, 23.7), "sara": entry(19.6, 18.7), "cero_sara": entry(16.4, 15.9)}
    assert order_matches(same, "static") is True
    swapped = {**same, "stock": entry(20.1, 25.6), "cero_sara": entry(20.4, 20.6)}  # the 500-prompt pool's tie
    assert order_matches(swapped, "static") is False
    assert order_matches({"stock": entry(1, 1)}, "static") is None  # one method: no order
    assert order_matches(same, "fit_other") is None  # a prediction no method has


def test_the_script_reuses_kept_probes_and_writes_the_table(tmp_path, capsys):
    from trl_alloc.cli.validate_plan import main

    runs, probes = tmp_path / "runs", tmp_path / "probes"
    runs.mkdir()
    probes.mkdir()
    for r in (record("stock", 0, 60), record("cero_sara", 0, 70, 1190)):
        (runs / f"{r['method']}-s0.json").write_text(json.dumps(r))
    k = np.random.default_rng(1).integers(0, 9, 64)
    (probes / "probe-s0.json").write_text(json.dumps({"successes": k.tolist(), "failures": (8 - k).tolist()}))
    result = main(["--runs_dir", str(runs), "--probe_dir", str(probes), "--plan_seeds", "2", "--label", "kept"])
    printed = capsys.readouterr().out
    assert "probing" not in printed and "**kept**" in printed and "| cero_sara | 1 | 70.0 (70–70) |" in printed
    saved = json.loads((probes / "validation.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"])) and "cero_sara" in saved["by_method"]
    assert (probes / "validation.md").read_text().strip() == saved["table"]
