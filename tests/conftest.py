"""Shared fixtures. tests/ is put on sys.path so that every test folder imports `helpers` (the builders).
One vLLM CPU server serves the session (`vllm_server`): the tests that use it run first, the one that stops it
last of them, and it is stopped after them (a vLLM CPU server left running, even idle, slowed the colocate tests
that came later by half: 163 s instead of 111)."""

import importlib.util
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """The default embedded model (trl_alloc.tasks.tiny), built offline once per session in a temporary cache."""
    from trl_alloc.tasks.tiny import get_tiny_model_dir

    cache = tmp_path_factory.mktemp("trl_alloc_cache")
    t = time.time()
    path = get_tiny_model_dir(cache_dir=cache, task="arithmetic")
    print(f"\ntiny model built in {time.time() - t:.1f} s: {path}")
    return path


@pytest.fixture(scope="session")
def tiny_random_dir(tmp_path_factory):
    """An untrained 1-layer Qwen2 with trl_alloc.tasks.tiny's character tokenizer, saved to disk."""
    from trl_alloc.tasks.tiny import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=64, max_position_embeddings=64, seed=0)
    out = tmp_path_factory.mktemp("tiny_random")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


_SERVERS = []  # the session's server, once started


@pytest.fixture(scope="session")
def _session_server(tmp_path_factory):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from helpers import SharedServer, build_served_model

    from trl_alloc.serving import start_server

    model_dir = str(tmp_path_factory.mktemp("served") / "model")
    model = build_served_model(model_dir)
    server = start_server(model_dir, timeout=600, env={"HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"})
    print(f"\nvLLM server up in {server.startup_seconds:.1f} s at {server.url} (log {server.log_path})")
    _SERVERS.append(server)
    try:
        yield SharedServer(server, model_dir, model)
    finally:
        server.stop()


@pytest.fixture
def vllm_server(_session_server):
    """The session's vLLM CPU server of `helpers.build_served_model` (worker extension, dev routes), reset to
    the model's own weights, unpaused, with an empty prefix cache (`helpers.SharedServer`)."""
    return _session_server.reset()


@pytest.fixture(scope="session")
def two_process_runs(tmp_path_factory):
    """run(zero, name) -> (rank records, the run's folder) of `helpers.TWO_PROCESS_RUNS[zero][name]`: all runs of
    one accelerate config share one launch, started by the first test that asks for one of them."""
    from helpers import TWO_PROCESS_RUNS, launch_two_processes

    launched = {}

    def run(zero, name):
        if zero not in launched:
            out = tmp_path_factory.mktemp(f"two_process_{zero}")
            try:
                launched[zero] = out, launch_two_processes(zero, out, TWO_PROCESS_RUNS[zero])
            except BaseException as exc:  # noqa: BLE001 -- every test of this launch reports its failure
                launched[zero] = out, exc
        out, got = launched[zero]
        if isinstance(got, BaseException):
            raise got
        return got[name], out / name

    return run


def pytest_collection_modifyitems(config, items):
    """The tests that use the session's vLLM server first, the one marked `stops_shared_server` last of them."""
    def order(item):
        if "_session_server" not in item.fixturenames:
            return 2
        return 1 if item.get_closest_marker("stops_shared_server") else 0

    items.sort(key=order)


def pytest_runtest_teardown(item, nextitem):
    """Stop the session's vLLM server after the last test that uses it."""
    if _SERVERS and "_session_server" in item.fixturenames and (
            nextitem is None or "_session_server" not in nextitem.fixturenames):
        _SERVERS[0].stop()
