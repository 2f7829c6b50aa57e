"""Public entry point for vLLM server mode (re-exports :mod:`trl_alloc.serving`).

    from trl_alloc.vllm_server import start_server, AllocVLLMClient

    with start_server(model_dir) as server:               # picks a free port, waits for /health
        client = AllocVLLMClient(base_url=server.url, connection_timeout=10)
        groups = client.generate_groups([[5, 6, 7]], n=8, max_tokens=32, temperature=1.0, seed=0)
        client.update_weights(model)                       # CPU: safetensors via the worker extension

The client names (``AllocVLLMClient``, ``CompletionGroup``, ``VLLMServerUnreachableError``,
``VLLMRequestError``, ``patch_trl_vllm_client``, ``pushed_checksum``) are imported on first
access: they import TRL and vLLM (~10 s).
"""

from .serving import (  # noqa: F401
    EXTENSION_CLS,
    VLLMServer,
    VLLMServerStartError,
    __all__,
    build_server_command,
    find_free_port,
    server_env,
    start_server,
)
from .serving import __getattr__  # noqa: F401
