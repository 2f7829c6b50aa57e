"""AMX tile permission before a vLLM engine runs its kernels (trl_alloc/serving/cpu_features.py). Where the CPU has
AMX these checks ask Linux for real; elsewhere they check the same decisions with AMX reported by a patched CPUID.
Every path that builds an engine is checked on the engine's own process by the live tests
(`assert_engine_may_use_its_kernels` in tests/helpers.py: colocate, in-process AsyncLLM, server)."""

import importlib.util
import subprocess
import sys

import pytest
import torch

from trl_alloc.serving import cpu_features

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(cpu_features, "_state", {})
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", torch.cpu._is_amx_tile_supported)


def test_enable_amx_matches_the_cpu_and_the_kernel(fresh_state):
    """On this CPU, for real: granted (and the kernel says so) where the CPU has AMX, absent where it has none."""
    has_amx = torch.cpu._is_amx_tile_supported()
    assert cpu_features.amx_state() is None
    state = cpu_features.enable_amx()
    assert state == (cpu_features.AMX_GRANTED if has_amx else cpu_features.AMX_ABSENT)
    assert cpu_features.xtiledata_permitted() is has_amx
    assert cpu_features.amx_state() == state and cpu_features.enable_amx() == state  # asked once per process


@needs_vllm
def test_refused_amx_is_hidden_from_vllms_kernel_choice(fresh_state, monkeypatch):
    """A CPU with AMX whose kernel refuses the permission: vLLM picks a kernel that needs none, not AMX's."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert _get_attn_isa(torch.bfloat16, 32, 64) == "amx"  # what an AMX CPU would run
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: False)
    assert cpu_features.enable_amx() == cpu_features.AMX_REFUSED
    assert _get_attn_isa(torch.bfloat16, 32, 64) != "amx"


@needs_vllm
def test_granted_amx_keeps_vllms_amx_kernel(fresh_state, monkeypatch):
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: True)
    monkeypatch.setattr(cpu_features, "xtiledata_permitted", lambda: True)
    assert cpu_features.enable_amx() == cpu_features.AMX_GRANTED
    assert _get_attn_isa(torch.bfloat16, 32, 64) == "amx"


@needs_vllm
def test_vllm_runs_the_plugin_in_a_new_process():
    """vLLM's own plugin loading (what each of its processes does before building an engine) asks for AMX."""
    code = ("from vllm.plugins import load_general_plugins; from trl_alloc.serving import cpu_features as c; "
            "assert c.amx_state() is None; load_general_plugins(); print(c.amx_state())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    has_amx = torch.cpu._is_amx_tile_supported()
    assert out.stdout.split()[-1] == ("granted" if has_amx else "absent")
