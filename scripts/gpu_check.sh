#!/usr/bin/env bash
# The prepared GPU check (docs/benchmarks.md, "On a lent GPU"): run from the repository root on a GPU machine that
# installs nothing from outside. It uses the machine's own torch; what else it lacks (trl, transformers, accelerate,
# datasets, peft, math-verify; no vLLM) must travel with the working tree as wheels in $WHEELS (default ./wheels,
# made here with `pip download --no-deps -d wheels trl transformers accelerate datasets peft math-verify ...`).
# Prints s/step, responses, effective groups and peak memory for stock GRPO's allocation and CERO+SARA, each on a
# random-weight model of SmolLM2-135M's and Qwen2.5-0.5B's shape, in bf16 with transformers generation (~8 min).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-wheels}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if ! $PY -c "import trl, transformers, accelerate, datasets, math_verify" 2>/dev/null; then
    [ -d "$WHEELS" ] || { echo "missing python packages and no $WHEELS/ folder of wheels to install them from"; exit 2; }
    $PY -m pip install -q --no-index --find-links "$WHEELS" --no-deps "$WHEELS"/*.whl
fi
$PY -c "import torch, trl, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| trl', trl.__version__, '| transformers', transformers.__version__)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# the vLLM found (trl-alloc is tested with 0.32; none is needed by this check, which generates with transformers)
$PY -c "from trl_alloc.trainer.trl_compat import installed_vllm_version as v; print('vllm', v())"
OUT=${OUT:-outputs}/gpu_check
for shape in smollm2-135m qwen2.5-0.5b; do
    timeout 300 $PY scripts/gpu_check.py --shape "$shape" --rounds "${ROUNDS:-6}" --output_dir "$OUT/$shape" \
        || echo "[gpu_check] $shape: failed or timed out (rc $?)"
done
