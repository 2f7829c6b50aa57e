"""Shared fixtures. tests/ is put on sys.path so that every test folder imports `helpers` (the builders)."""

import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


PREBUILT = {  # fixture -> what builds its model into the cache folder sys.argv[1] (one thread, a minute or less)
    "tiny_dir": "from trl_alloc.tasks.tiny import get_tiny_model_dir as get; "
                "get(cache_dir=sys.argv[1], task='arithmetic', progress=False)",
    "smollm2_dir": "from trl_alloc.tasks.models import get_model_dir as get; "
                   "get('smollm2-135m-instruct', cache_dir=sys.argv[1], progress=False)",
}


@pytest.fixture(scope="session", autouse=True)
def model_caches(request, tmp_path_factory):
    """{fixture: the temporary cache it builds its model into}. The build of each model a selected test needs starts
    at once in a process of its own (single-threaded), so it runs beside the tests before the first that needs it;
    the fixture then waits on the build's file lock (or builds it itself, had that process failed)."""
    wanted = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    caches, builds = {}, []
    for fixture, code in PREBUILT.items():
        caches[fixture] = tmp_path_factory.mktemp(f"{fixture}_cache")
        if fixture in wanted:
            builds.append(subprocess.Popen([sys.executable, "-c", f"import sys; {code}", str(caches[fixture])],
                                           env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
    yield caches
    for build in builds:  # (still running only if the tests stopped before needing it)
        if build.poll() is None:
            build.kill()
            build.wait()


@pytest.fixture(scope="session")
def tiny_dir(model_caches):
    """The default embedded model (trl_alloc.tasks.tiny), built offline once per session in a temporary cache."""
    from trl_alloc.tasks.tiny import get_tiny_model_dir

    t = time.time()
    path = get_tiny_model_dir(cache_dir=model_caches["tiny_dir"], task="arithmetic")
    print(f"\ntiny model ready in {time.time() - t:.1f} s: {path}")
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
