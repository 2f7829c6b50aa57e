"""What the trainer side and the server side of weight sync share: the worker extension's class path,
the pushed file's name, the checksum both sides compute, and the architecture fields a push must match.
Imports no vLLM (torch only inside `state_checksum`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

EXTENSION_CLS = "trl_alloc.serving.worker_extension.AllocWorkerExtension"
WEIGHTS_FILE = "model.safetensors"


def state_checksum(named_tensors: Iterable[tuple[str, "object"]]) -> str:
    """sha256 over ``(name, shape, float32 bytes)`` of the tensors, sorted by name.

    The same function runs trainer-side (on what is sent) and server-side (on what was received),
    so a test can check that a push arrived intact. vLLM's own parameters cannot serve for this on
    CPU: fused (``qkv_proj``), and linear weights are replaced by packed copies after loading.
    """
    import torch

    h = hashlib.sha256()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        t = t.detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


MODEL_SIGNATURE_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "intermediate_size")


def model_signature(config) -> dict:
    """The architecture fields of a transformers config that a weight push must match."""
    text = getattr(config, "text_config", None) or config
    return {k: getattr(text, k, None) for k in MODEL_SIGNATURE_FIELDS}
