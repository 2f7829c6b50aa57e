#!/usr/bin/env bash
# The README's main command: set up ./.venv if needed, then train the embedded tiny model with
# CERO + SARA on the built-in arithmetic task (CPU, a few minutes). Extra arguments override the recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/accelerate launch --config_file configs/accelerate/single.yaml \
    scripts/train.py --config configs/tiny_cpu.yaml "$@"
