"""One kind of method: every method declares its hyperparameters on its class (`allocation.hyperparameters`); the
config's fields, `--help` and the checks are built from those declarations, for the built-in methods as for one from
outside the package (`my_methods.HalfPacer`)."""

import dataclasses

import pytest

from trl_alloc.allocation.hyperparameters import Hyperparameter, at_least, within
from trl_alloc.allocation.registry import method_class, registered_hyperparameters


def config(tmp_path, **kwargs):
    from trl_alloc.trainer.config import AllocGRPOConfig

    return AllocGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_train_batch_size=8,
                           num_generations=4, **kwargs)


def test_the_config_fields_of_the_methods_are_their_declarations():
    from trl import GRPOConfig

    from trl_alloc.allocation.config import ALLOCATION_FIELDS
    from trl_alloc.trainer.config import AllocGRPOConfig, _RunFields

    fields = {f.name: f for f in dataclasses.fields(AllocGRPOConfig)}
    declared = {h.name: h for group in registered_hyperparameters().values() for h in group}
    run_own = {f.name for f in dataclasses.fields(_RunFields)} - {f.name for f in dataclasses.fields(GRPOConfig)}
    allocation_own = {name for name, _, _ in ALLOCATION_FIELDS}
    assert set(fields) - {f.name for f in dataclasses.fields(GRPOConfig)} == run_own | allocation_own | set(declared)
    for name, h in declared.items():
        assert fields[name].default == h.default and fields[name].metadata["help"] == h.help, name
    # shared declarations are one object: CERO's Beta prior is SARA's
    cero = {h.name: h for h in method_class("pacing", "cero").hyperparameters}
    sara = {h.name: h for h in method_class("filling", "sara").hyperparameters}
    assert cero["prior_alpha"] is sara["prior_alpha"] and "probe" in sara and "probe" not in cero
    assert {h.name for h in method_class("pacing", "greso").hyperparameters} == {
        "p_easy", "p_hard", "p_min", "p_max", "delta_p", "target_zero_variance"}


def test_help_lists_every_method_hyperparameter_with_its_words():
    from trl import TrlParser

    from trl_alloc.trainer.config import AllocGRPOConfig

    text = " ".join(TrlParser((AllocGRPOConfig,)).format_help().split())
    for group in registered_hyperparameters().values():
        for h in group:
            assert f"--{h.name} " in text and " ".join(h.help.split()[:4]) in text, h.name
    (args,) = TrlParser((AllocGRPOConfig,)).parse_args_and_config(
        ["--output_dir", "o", "--use_cpu", "--bf16", "false", "--pacing", "greso", "--replace_probes", "false",
         "--p_hard", "0.3"])
    assert args.replace_probes is False and args.p_hard == 0.3


def test_a_method_from_outside_the_package_gets_its_defaults_and_its_checks(tmp_path):
    args = config(tmp_path, pacing="my_methods.HalfPacer", filling="full")
    assert args.pacing_kwargs == {"fraction": 0.5}  # the declared default, filled in
    assert config(tmp_path, pacing="my_methods.HalfPacer", filling="full",
                  pacing_kwargs='{"fraction": 0.25}').pacing_kwargs == {"fraction": 0.25}
    with pytest.raises(ValueError, match=r"`fraction` must lie in \(0, 1\], got 2"):
        config(tmp_path, pacing="my_methods.HalfPacer", filling="full", pacing_kwargs={"fraction": 2})
    with pytest.raises(TypeError, match="`fraction` must be a number, got 'half'"):
        config(tmp_path, pacing="my_methods.HalfPacer", filling="full", pacing_kwargs={"fraction": "half"})
    with pytest.raises(ValueError, match=r"pacing='my_methods.SeedPacer' declares the hyperparameter\(s\) \['seed'\], "
                                         "which are the config's own fields"):
        config(tmp_path, pacing="my_methods.SeedPacer", filling="full")


def test_only_the_chosen_methods_are_checked_and_an_unread_setting_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"`tau_low` must be a number in \(0, 1\) or 'auto', got 1.5"):
        config(tmp_path, pacing="uniform", filling="sara", tau_low=1.5)
    with pytest.warns(UserWarning, match=r"tau_low=1.5 \(filling='sara'\), keep_ratio=0.3 \(pruning='arrol'\) set, "
                                         r"but the chosen methods .* do not read them"):
        args = config(tmp_path, pacing="uniform", filling="full", tau_low=1.5, keep_ratio=0.3)
    assert args.tau_low == 1.5
    with pytest.raises(ValueError, match=r"`keep_ratio` must lie in \(0, 1\], got 0"):
        config(tmp_path, pruning="random", keep_ratio=0, max_completion_length=16, detect_length=4)
    # the rules between a method's hyperparameters live on its class (`check_config`)
    with pytest.raises(ValueError, match=r"`round_capacity` \(1 units\) is below one group"):
        config(tmp_path, pacing="cero", round_capacity=1)
    with pytest.warns(UserWarning, match=r"round_capacity=1 \(pacing='cero'\) set"):  # CERO's rule, CERO not chosen
        config(tmp_path, pacing="uniform", filling="full", round_capacity=1)


def test_a_declaration_checks_types_and_rules():
    count = Hyperparameter("count", int, 2, "A count.", at_least(1))
    share = Hyperparameter("share", float | None, 0.5, "A share.", within(0, 1))
    flag = Hyperparameter("flag", bool, True, "A flag.")
    assert count.check(3.0) == 3 and isinstance(count.check(3.0), int)
    assert share.check("0.25") == 0.25 and share.check(None) is None and flag.check(False) is False
    for h, value, error, words in ((count, True, TypeError, "`count` must be an integer, got True"),
                                   (count, 2.5, TypeError, "`count` must be an integer, got 2.5"),
                                   (count, 0, ValueError, "`count` must be >= 1, got 0"),
                                   (count, None, TypeError, "`count` must not be None"),
                                   (share, 1.5, ValueError, r"`share` must lie in \[0, 1\], got 1.5"),
                                   (share, float("nan"), ValueError, "`share` must lie in"),
                                   (flag, "yes", TypeError, "`flag` must be true or false, got 'yes'")):
        with pytest.raises(error, match=words):
            h.check(value)
