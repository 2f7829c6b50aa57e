"""`scripts/bench_rollout.py` end to end on the tiny served model (one round per method): the table's figures add
up, with ARROL in the stream the engine's scores equal the trainer-side forward's, and a stream method runs."""

import importlib.util
import json

import pytest
from helpers import build_served_model


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_bench_rollout_runs_and_compares_the_two_scoring_paths(tmp_path, capsys, vllm_server):
    """On the session's server (`--server_url`, as for a server a user already runs)."""
    from trl_alloc.cli.bench_rollout import main

    main(["--server_url", vllm_server.url, "--model", vllm_server.model_dir, "--dataset", "builtin:arithmetic",
          "--levels", "1", "--rounds", "1", "--groups", "2", "--num_generations", "4", "--max_completion_length", "8",
          "--detect_length", "3", "--cold_start", "0",
          "--methods", "stock,stock_arrol_events,stock_stream", "--train_s", "0.2", "--calibrate",
          "--output_dir", str(tmp_path / "out")])
    out = json.load(open(tmp_path / "out" / "bench_rollout.json"))["summary"]
    assert out["stock"]["responses"] == 8 and out["stock"]["pruned"] == out["stock"]["aborted"] == 0
    arrol = out["stock_arrol_events"]
    assert arrol["responses"] == 8 and arrol["pruned"] <= 8
    scoring = arrol["scoring"]
    assert scoring["scored"] >= 1 and scoring["max_abs_score_diff"] < 1e-3
    assert scoring["engine_s_per_scored"] > 0 and scoring["trainer_s_per_scored"] > 0
    assert "| stock_arrol_events |" in (tmp_path / "out" / "bench_rollout.md").read_text()
    stream = out["stock_stream"]  # one round of a stream: its groups all started, then it closes
    assert stream["rounds"] == 1 and stream["responses"] == 8 and stream["effective_groups"] <= 2
    assert out["stock"]["s_per_round"] >= 0.2  # the trainer's step counts in every method's round
    # the calibrated engine model predicts each method's round from the same configuration (its error is a figure)
    saved = json.load(open(tmp_path / "out" / "bench_rollout.json"))
    assert saved["calibration"]["a_s"] + saved["calibration"]["b_s"] > 0 and len(saved["calibration"]["points"]) >= 3
    assert all(s["model_s_per_round"] >= 0.2 for s in out.values())
    assert "| stock_stream |" in (tmp_path / "out" / "bench_rollout.md").read_text().split("Engine model")[1]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
@pytest.mark.timeout(960)
def test_bench_rollout_on_the_colocate_engine(tmp_path):
    """`--backend colocate`: the same methods on the vllm.LLM TRL's colocate mode builds, in the bench's process
    (run as a script: the engine holds process-wide state); ARROL scores in that engine too."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    build_served_model(str(tmp_path / "model"))
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_rollout.py"), "--backend", "colocate",
           "--model", str(tmp_path / "model"), "--dataset", "builtin:arithmetic", "--levels", "1", "--rounds", "2",
           "--groups", "2", "--num_generations", "4", "--max_completion_length", "8", "--detect_length", "3",
           "--cold_start", "0", "--gpu_memory_utilization", "0.1", "--max_model_len", "128",
           "--methods", "stock,stock_arrol_events,cero_sara_events,cero_sara_stream,cero_sara_arrol_stream",
           "--train_s", "0.2",
           "--output_dir", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    saved = json.load(open(tmp_path / "out" / "bench_rollout.json"))
    out, raw = saved["summary"], saved["raw"]
    assert out["stock"]["responses"] == 16 and out["stock"]["aborted"] == 0 and out["stock"]["rounds"] == 2
    assert out["stock_arrol_events"]["responses"] == 16
    scoring = out["stock_arrol_events"]["scoring"]  # the colocate engine's scores vs the trainer-side forward
    assert scoring["scored"] >= 1 and scoring["max_abs_score_diff"] < 0.05
    for name in ("cero_sara_events", "cero_sara_stream", "cero_sara_arrol_stream"):
        # each round that trained waited the trainer's 0.2 s (a stream round that trained nothing does not: no step)
        trained = sum(r["effective_groups"] > 0 for r in raw[name]["rounds"])
        assert 0 < out[name]["responses"] <= 16 and out[name]["s_per_round"] * out[name]["rounds"] >= 0.2 * trained
    assert 0 <= out["cero_sara_arrol_stream"]["pruned"] <= out["cero_sara_arrol_stream"]["responses"]
