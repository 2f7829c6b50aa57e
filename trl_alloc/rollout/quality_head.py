"""ARROL's quality head (arXiv 2603.24840): a 2-layer MLP on the policy's last-layer hidden state at the
detection point, one logit out ("will this partial rollout end with reward 1?").

**Why not a PEFT adapter type.** The design asks for a *PEFT side module*: saved, loaded and pushed as
its own adapter next to the policy. peft 0.21 offers three ways to do that, none of which fits:

- a custom PEFT method (``PeftConfig`` + tuner + ``register_peft_method``): registration requires an
  entry in the ``PeftType`` enum (``register_peft_method`` raises "please add an entry to
  peft.utils.peft_types.PeftType"), so it needs patching peft itself; and a tuner *injects* layers
  into the base model, while the head reads the backbone's output and changes nothing in it;
- ``modules_to_save`` / a second named adapter on the policy's ``PeftModel``: only exists for a LoRA
  policy (not full fine-tuning), puts the head inside the policy's module tree, so TRL/accelerate
  would hand it to the policy's optimizer, DeepSpeed would partition it, TRL's vLLM weight sync would
  try to push it to the server, and TRL's adapter switching (reference = adapter disabled) would
  switch it too;
- a LoRA over a randomly initialised MLP base: a real ``adapter_config.json``, but the base weights
  must be rebuilt bit-exactly to load it; contorted for a 2-layer MLP that is trained in full.

So the head is a plain ``nn.Module`` with ``huggingface_hub``'s ``PyTorchModelHubMixin``, which gives
it PEFT's save/load/push semantics -- ``save_pretrained(dir)``, ``QualityHead.from_pretrained(dir or
repo id)``, ``push_to_hub(repo)`` -- as ``config.json`` (sizes, detection length, base model) +
``model.safetensors`` + a small card, in ``output_dir/quality_head/`` next to the policy (or its LoRA
adapter). Its optimizer is its own (``head_learning_rate``), and it only ever sees detached hidden
states: no gradient reaches the backbone. It lives on CPU in float32 (a few hundred thousand
parameters; scoring and one Adam step per round cost milliseconds), on the process that makes the
allocation decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from trl.models.utils import disable_gradient_checkpointing

if TYPE_CHECKING:
    import numpy as np


HEAD_CARD = """---
{{ card_data }}
---

# ARROL quality head

A side module of a policy trained with trl-alloc's ARROL pruning (TRL's GRPOTrainer, subclassed)
(online rollout pruning, arXiv "Prune as You Generate"): a 2-layer MLP that maps the policy's last-layer hidden
state at the last token of prompt + partial rollout to one logit, "this rollout will end with reward 1". It was
trained online with binary cross-entropy on detached hidden states at the detection length recorded in
`config.json`; the policy's weights (or LoRA adapter) sit next to this folder.

```python
from trl_alloc.rollout.quality_head import QualityHead
from trl_alloc.allocation.arrol import rank_weights, weighted_majority_vote

head = QualityHead.from_pretrained("path/to/run/quality_head")
logits = head.score(policy, [prompt_ids + candidate_ids for candidate_ids in candidates], pad_id)
answer = weighted_majority_vote(final_answers, rank_weights(logits))  # test-time weighted voting
```
"""


class QualityHead(nn.Module, PyTorchModelHubMixin, library_name="trl-alloc",
                  tags=["trl-alloc", "arrol", "quality-head"], model_card_template=HEAD_CARD):
    """logit = W2 · GELU(W1 · h + b1) + b2, h the last-layer hidden state at the detection point.

    ``hidden_size`` is the policy's; ``detect_length`` and ``base_model`` are recorded in
    ``config.json`` so a loaded head says what it was trained on (test-time voting reuses it).
    """

    def __init__(self, hidden_size: int, head_hidden_size: int = 256, detect_length: int | None = None,
                 base_model: str | None = None):
        super().__init__()
        self.hidden_size, self.head_hidden_size = int(hidden_size), int(head_hidden_size)
        self.detect_length, self.base_model = detect_length, base_model
        self.net = nn.Sequential(nn.Linear(self.hidden_size, self.head_hidden_size), nn.GELU(),
                                 nn.Linear(self.head_hidden_size, 1))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, hidden_size) hidden states -> (N,) logits."""
        if hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"the quality head expects hidden states of size {self.hidden_size} (the policy it was "
                             f"built for), got {hidden.shape[-1]}.")
        return self.net(hidden.to(self.net[0].weight.dtype)).squeeze(-1)

    @torch.no_grad()
    def score(self, model: nn.Module, sequences: Iterable[Sequence[int]], pad_id: int,
              batch_size: int = 8) -> np.ndarray:
        """Logits for token-id sequences (prompt + candidate) of `model`: test-time candidate weighting
        (docs/arrol.md: rank them with `allocation.arrol.rank_weights`, then `weighted_majority_vote`)."""
        return self(last_hidden_states(model, sequences, pad_id, batch_size)).double().numpy()


def backbone_of(model: nn.Module) -> nn.Module:
    """The decoder stack (no LM head) of a causal LM, a PeftModel around one, or a wrapped module.

    LoRA layers live inside the decoder, so a LoRA policy's adapted hidden states come out of it."""
    inner = model
    while hasattr(inner, "module") and not hasattr(inner, "get_decoder"):  # DDP's or DeepSpeed's model wrapper
        inner = inner.module
    if hasattr(inner, "get_base_model"):  # PeftModel
        inner = inner.get_base_model()
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    if decoder is None or decoder is inner:
        raise ValueError(f"cannot find the decoder of {type(inner).__name__}; the quality head needs a causal LM "
                         "with `get_decoder()`.")
    return decoder


@torch.no_grad()
def last_hidden_states(model: nn.Module, sequences: Iterable[Sequence[int]], pad_id: int, batch_size: int = 8,
                       device: torch.device | str | None = None, num_batches: int | None = None,
                       gradient_checkpointing_kwargs: dict | None = None) -> torch.Tensor:
    """Last-layer hidden state at the last token of each token-id list, as a float32 CPU (N, H) tensor.

    One forward of the decoder stack per batch (left padding, so position -1 is every row's last
    token; position ids follow the attention mask as in generation), without the LM head's
    vocabulary projection. ``num_batches``: run exactly that many forwards, with a one-token dummy
    row where this process has nothing left -- ZeRO-3/FSDP forwards are collective, so every rank
    must run the same number.
    """
    decoder = backbone_of(model)
    device = device or next(decoder.parameters()).device
    seqs = [list(map(int, s)) for s in sequences]
    n_batches = num_batches if num_batches is not None else -(-len(seqs) // batch_size)
    out = []
    with disable_gradient_checkpointing(model, gradient_checkpointing_kwargs):
        for b in range(n_batches):
            chunk = seqs[b * batch_size:(b + 1) * batch_size]
            real = len(chunk)
            chunk = chunk or [[pad_id]]
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, s in enumerate(chunk):
                ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
                mask[i, width - len(s):] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                             use_cache=False).last_hidden_state[:, -1]
            if real:
                out.append(hidden.float().cpu())
    size = getattr(getattr(model, "config", None), "hidden_size", None) or (out[0].shape[-1] if out else 0)
    return torch.cat(out) if out else torch.zeros(0, size)
