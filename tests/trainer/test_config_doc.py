"""The configs' `Parameters:` docstring blocks (Google style for the API reference, grouped as GRPOConfig's) cover
every field trl-alloc adds, each once, with the same words as `--help`."""

import dataclasses

from trl import GRPOConfig

from trl_alloc.trainer.config import PARAMETER_GROUPS, AllocDAPOConfig, AllocGRPOConfig


def test_every_added_field_is_documented_once_in_a_group():
    added = {f.name for f in dataclasses.fields(AllocGRPOConfig)} - {f.name for f in dataclasses.fields(GRPOConfig)}
    grouped = [name for names in PARAMETER_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(added)  # each once, none missing, none unknown
    doc = AllocGRPOConfig.__doc__
    assert "    Parameters:\n        > Stages of the sampling pipeline" in doc
    for f in dataclasses.fields(AllocGRPOConfig):
        if f.name in added:
            assert f"        {f.name} (" in doc and f.metadata["help"].split()[0] in doc
    assert "        overlong_buffer (int | None):" in AllocDAPOConfig.__doc__


def test_the_deprecated_cold_start_steps_still_sets_cold_start_rounds(tmp_path):
    import pytest

    with pytest.warns(FutureWarning, match="`cold_start_steps` is renamed `cold_start_rounds`"):
        args = AllocGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], cold_start_steps=3)
    assert args.cold_start_rounds == 3 and args.cold_start_steps is None
