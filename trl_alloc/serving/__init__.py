"""vLLM server mode for trl-alloc: start a server, talk to it, push weights into it.

- :func:`start_server` / :class:`VLLMServer` (``server.py``; imports neither torch nor vLLM);
- :class:`AllocVLLMClient` (``client.py``; TRL's ``VLLMClient`` + CPU weight push; importing it
  imports TRL and vLLM, ~10 s, so it is loaded on first access);
- the worker side lives in ``trl_alloc.serving.worker_extension``.
"""

from .server import (
    EXTENSION_CLS,
    VLLMServer,
    VLLMServerStartError,
    build_server_command,
    find_free_port,
    server_env,
    start_server,
)

_CLIENT_NAMES = ("AllocVLLMClient", "CompletionGroup", "VLLMServerUnreachableError", "VLLMRequestError",
                 "pushed_checksum")

# the client names are left out of __all__ so that `import *` stays light
__all__ = ["EXTENSION_CLS", "VLLMServer", "VLLMServerStartError", "build_server_command", "find_free_port",
           "server_env", "start_server"]


def __getattr__(name):
    if name in _CLIENT_NAMES:
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
