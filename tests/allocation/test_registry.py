"""The registry is the only dispatch (allocation/registry.py): every built-in name builds through its class, an
unknown name lists the registered ones, and a user's own class, named by its import path, trains without any edit of
the package."""

import pytest

from trl_alloc.allocation import method_class, method_names


def test_unknown_names_and_bad_import_paths_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown `filling='saraa'`; choose one of full, dynamic_sampling, sara"):
        method_class("filling", "saraa")
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_module'"):
        method_class("pacing", "no_such_module.MyPacer")
    with pytest.raises(ValueError, match=r"'my_methods' has no 'NotAPacer' that is a subclass of "
                                         r"trl_alloc.allocation.Pacer"):
        method_class("pacing", "my_methods.NotAPacer")
    with pytest.raises(ValueError, match=r"has no 'Missing'"):
        method_class("pacing", "my_methods.Missing")


def test_every_builtin_builds_from_the_config_through_its_class(tmp_path):
    """Each registered pacing and filling builds from an `AllocGRPOConfig` with no name branch in between."""
    from trl_alloc.allocation.factory import build_stages
    from trl_alloc.trainer.config import AllocGRPOConfig

    reference = tmp_path / "state.json"
    reference.write_text('{"pacer": {"allocation_log": [[[0, 1], [2, 2]]]}}')
    builtin = {stage: [n for n in method_names(stage) if "." not in n] for stage in ("pacing", "filling")}
    for pacing in builtin["pacing"]:  # (a class named by its import path is registered once a test has named it)
        for filling in builtin["filling"]:
            try:
                args = AllocGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], pacing=pacing,
                                       filling=filling, per_device_train_batch_size=8, num_generations=4,
                                       random_matched_reference=str(reference))
            except ValueError as err:  # a pairing a method refuses (knapsack sets its own counts)
                assert pacing == "knapsack" and "use filling='full'" in str(err)
                continue
            pacer, filler = build_stages(args, num_prompts=16, num_rounds=4)
            assert type(pacer) is method_class("pacing", pacing) and type(filler) is method_class("filling", filling)
            assert filler.group_size == 4
            if pacing != "random_matched":  # (it spends the reference log's total, not the config's budget)
                assert pacer.remaining_responses == args.budget_for(4)


def test_a_users_own_pacer_trains_by_its_import_path(tmp_path):
    from helpers import build

    from trl_alloc.allocation.allocator import read_round_log
    from trl_alloc.trainer.trl_compat import count_generated

    trainer = build(tmp_path, pacing="my_methods.HalfPacer", filling="full", per_device_train_batch_size=16,
                    num_rounds=3, pacing_kwargs={"fraction": 0.25})
    generated = count_generated(trainer)
    trainer.train()
    assert type(trainer.allocator.pacer).__name__ == "HalfPacer" and trainer.allocator.pacer.admitted == 1
    assert generated["n"] == trainer.allocator.counters["responses"] == 3 * 4  # one prompt of 4 per round, 3 rounds
    assert [len(entry["groups"]) for entry in read_round_log(trainer.round_log_path)] == [1, 1, 1]
    with pytest.raises(ValueError, match=r"`pacing_kwargs` has \['fractoin'\], which pacing='my_methods.HalfPacer' "
                                         r"does not take; it takes fraction"):
        build(tmp_path, pacing="my_methods.HalfPacer", pacing_kwargs={"fractoin": 0.25})


def test_capabilities_are_declared_on_the_class():
    """A pacer says what it can lend (posterior, pacing gap, a start from a probe pass) through the base class's
    declarations; SARA takes its priors from a pacer's posterior whatever the pacer's class, and keeps its own
    history when the pacer has none."""
    import numpy as np

    from trl_alloc.allocation import UniformPacer
    from trl_alloc.allocation.beta import BetaState
    from trl_alloc.allocation.registry import method_class
    from trl_alloc.allocation.sara import SARAFiller

    assert not UniformPacer.seeds_from_probe and method_class("pacing", "cero").seeds_from_probe
    plain = UniformPacer(num_prompts=8, prompts_per_round=2, group_size=4, rounds=4)
    assert plain.posterior is None and plain.pacing_gap() is None
    with pytest.raises(NotImplementedError, match="seeds_from_probe=False"):
        plain.seed_counts(np.zeros(8), np.zeros(8))

    class Informed(UniformPacer):  # a pacer from outside the package that keeps Beta states
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.states = BetaState(self.num_prompts, (1.0, 1.0), 1.0)
            self.states.update(np.arange(8.0), np.zeros(8))

        @property
        def posterior(self):
            return self.states

    sara = SARAFiller(group_size=4, probe=2, posterior_decay=1.0)
    informed = Informed(num_prompts=8, prompts_per_round=2, group_size=4, rounds=4)
    units = informed.propose()
    kwargs = sara.round_arguments(informed, units, 8)
    assert np.array_equal(kwargs["prior_a"], 1.0 + np.arange(8.0)[kwargs["stream"]])
    assert "prior_a" not in sara.round_arguments(plain, plain.propose(), 8)
