"""`scripts/gpu_check.py` (the prepared GPU check) as a CPU smoke run on the tiny shape: both methods train, spend
their budget exactly, and the ratios are written."""

import json


def test_gpu_check_smoke_on_cpu(tmp_path, tiny_dir):  # (its tokenizer: the session's tiny model, $TRL_ALLOC_CACHE)
    from trl_alloc.benchmarks.gpu_check import main

    got = main(["--shape", "tiny", "--cpu", "--rounds", "2", "--prompts_per_round", "4", "--max_completion_length",
                "8", "--output_dir", str(tmp_path)])
    for method in ("stock", "cero_sara"):
        r = got[method]
        assert r["steps"] == 2 and 0 < r["responses"] <= 2 * 4 * 8 and r["s_per_step"] > 0
    assert got["stock"]["responses"] == 64  # stock: every admitted group whole
    saved = json.load(open(tmp_path / "gpu_check.json"))
    assert saved["ratios"]["s_per_step"] > 0 and set(saved["results"]) == {"stock", "cero_sara"}
    from importlib.util import find_spec

    from trl_alloc.trainer.trl_compat import TESTED_VLLM
    vllm = saved["versions"]["vllm"]  # the vLLM found is recorded: the tested one (setup.py pins it), or none
    assert (vllm is None) if find_spec("vllm") is None else vllm.startswith(TESTED_VLLM + ".")
