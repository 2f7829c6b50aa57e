"""One config: the planner runs the trainer's defaults. `AllocationConfig` (allocation/config.py, torch-free) and
`AllocGRPOConfig` are built from one list of fields, and `scripts/plan.py` with no flags builds, for every method it
plans, the config a training run with no flags would have, field by field."""

import dataclasses
import subprocess
import sys

import pytest

from trl_alloc.allocation.config import AllocationConfig, allocation_field_names
from trl_alloc.allocation.simulate import PLAN_SHAPE, plan_config
from trl_alloc.cli.plan import PLAN_OWN, make_parser, paper_shape
from trl_alloc.trainer.config import AllocGRPOConfig


def trainer_config(tmp_path, **kw):
    return AllocGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], **kw)


def test_the_allocation_config_has_the_trainers_defaults_field_by_field(tmp_path):
    ours, trainers = AllocationConfig(), trainer_config(tmp_path).allocation_config()
    names = [f.name for f in dataclasses.fields(AllocationConfig)]
    assert set(allocation_field_names()) <= set(names) and len(names) > 50
    for name in names:
        assert getattr(ours, name) == getattr(trainers, name), name
    # the trainer's config has every allocation field, with the same help text
    fields = {f.name: f for f in dataclasses.fields(AllocGRPOConfig)}
    for f in dataclasses.fields(AllocationConfig):
        if f.name in allocation_field_names():
            assert fields[f.name].metadata["help"] == f.metadata["help"] and fields[f.name].default == f.default


@pytest.mark.parametrize("method", ["uniform", "cero", "cero+sara", "uniform+sara", "uniform+dynamic_sampling",
                                    "knapsack", "greso+dynamic_sampling"])
def test_a_plan_with_no_flags_runs_what_a_training_run_with_no_flags_would(tmp_path, method):
    """Every allocation field the planner sets is the plan's own (its methods, budget, rounds, group shape) or the
    trainer's default for that method."""
    plan = paper_shape(make_parser().parse_args([]))
    config = plan_config(method, plan)
    pacing, _, filling = method.partition("+")
    k = plan.unit_size * plan.units_per_group
    trainer = trainer_config(tmp_path, pacing=pacing, filling=filling or "full", num_generations=k,
                             per_device_train_batch_size=plan.budget // plan.rounds, seed=plan.seed,
                             rollout_budget=plan.budget, num_rounds=plan.rounds, round_capacity=plan.capacity)
    own = PLAN_OWN | set(PLAN_SHAPE.values())
    compared = 0
    for name in allocation_field_names():
        if name not in own:
            assert getattr(config, name) == getattr(trainer, name), name
            compared += 1
    assert compared >= 45  # (every registered hyperparameter but CERO's shape, and the run's own fields)
    assert config.history_decay == trainer.history_decay == 0.5 and config.max_staleness == trainer.max_staleness
    assert (config.num_generations, config.generation_batch_size) == (trainer.num_generations,
                                                                      trainer.generation_batch_size)


def test_a_flag_reaches_the_config_and_a_bad_value_is_refused_as_the_trainer_refuses_it(capsys):
    plan = paper_shape(make_parser().parse_args(["--history_decay", "1.0", "--tau_low", "auto", "--filling_kwargs",
                                     '{"replace_probes": false}', "--sara_overcommit", "3"]))
    config = plan_config("cero+sara", plan)
    assert (config.history_decay, config.tau_low, config.replace_probes, config.sara_overcommit) == (1.0, "auto",
                                                                                                     False, 3.0)
    from trl_alloc.cli.plan import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--sara_overcommit", "0.5", "--engine_methods", ""])
    assert exit_info.value.code == 2 and "`sara_overcommit` must be >= 1, got 0.5." in capsys.readouterr().err


@pytest.mark.parametrize("first", ["trl_alloc.allocation.simulate", "trl_alloc.allocation.registry",
                                   "trl_alloc.allocation.sara"])
def test_the_fields_are_complete_whichever_module_is_imported_first(first):
    """The config asks the registry for every method while it is imported; the registry imports them all first."""
    code = (f"import {first}, importlib; from trl_alloc.allocation.registry import method_names; "
            "method_names('pacing'); c = importlib.import_module('trl_alloc.allocation.config').AllocationConfig(); "
            "print(c.tau_low, c.history_decay, c.round_capacity, c.keep_ratio)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0.45", "0.5", "None", str(AllocationConfig().keep_ratio)]


def test_pruning_is_built_from_the_config_as_the_other_stages_are():
    """ARROL's decision rule comes from its declared hyperparameters through `from_config`, as every method's does;
    whether a run prunes is asked of the config, never by the method's name."""
    from trl_alloc.allocation.base import RunContext
    from trl_alloc.allocation.registry import method_class

    config = AllocationConfig(pruning="arrol", survival_slope=0.3, survival_min=0.2, keep_ratio=0.4,
                              pruning_min_auc=0.0, cold_start_rounds=3, calibration_bins=7)
    policy = method_class("pruning", "arrol").from_config(config, RunContext(num_prompts=0, num_rounds=0, budget=0,
                                                                             seed=5))
    assert policy.survival == dict(keep_ratio=0.4, target_ratio=0.5, slope=0.3, p_min=0.2, p_max=0.9)
    assert policy.cold_start_rounds == 3 and not policy.gate.enabled and policy.calibrator.num_bins == 7
    assert config.prunes and not AllocationConfig().prunes


def test_a_plan_is_the_same_whatever_its_workers(tmp_path):
    """plan.py runs its pool and engine-model runs over `--workers` processes; each run is seeded on its own, so the
    plan (the scheduler's milliseconds aside) is the same with one process or two, random_matched's replay of CERO
    included."""
    import json

    from trl_alloc.cli.plan import main

    small = ["--prompts", "300", "--rounds", "20", "--budget", "2400", "--capacity", "40", "--methods",
             "uniform,cero,random_matched,uniform+sara", "--engine_methods", "uniform,cero+sara", "--engine_prune",
             "cero+sara", "--engine_rounds", "3", "--engine_seqs", "64", "--length_median", "200", "--max_tokens",
             "512", "--detect_length", "64"]
    plans = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        main(small + ["--workers", str(workers), "--output_dir", str(out)])
        plan = json.loads((out / "plan.json").read_text())
        for v in plan["results"].values():  # (the only timed figures)
            v["summary"].pop("scheduler_ms_per_round")
            v["per_round"].pop("alloc_ms")
        plans.append({k: v for k, v in plan.items() if k != "settings"})
    assert set(plans[0]["results"]) == {"uniform", "cero", "random_matched", "uniform+sara"}
    assert len(plans[0]["engine"]) == 9 and plans[0] == plans[1]
