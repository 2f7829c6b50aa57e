#!/usr/bin/env bash
# The README's test command: set up ./.venv if needed, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# lint first (seconds): undefined names, unused imports, syntax, lines over 119 characters (ruff.toml)
.venv/bin/python -m ruff check trl_alloc tests scripts
exec .venv/bin/python -m pytest -q "$@"
