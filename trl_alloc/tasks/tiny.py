"""A tiny, locally built Qwen2 policy for the synthetic tasks: the project's embedded default.

``get_tiny_model_dir()`` builds a character-level tokenizer and a ~0.4M-parameter Qwen2 model,
gives it a short deterministic supervised warm-up on ``prompt + answer + <eos>`` so that sampled
accuracy is *partial* (per-prompt success rates spread over (0, 1): informative GRPO groups),
and saves both with ``save_pretrained`` (safetensors, standard Qwen2 config, generation config)
in a cache directory keyed by a hash of the build settings. Nothing is downloaded.

The warm-up corpus is deliberately noisy, like a pre-training corpus: 40% of its answers are
rough estimates (``"27+15="`` -> ``"~40"``), which the verifier rejects unless they are exact. The
model learns both styles; RL learns to answer exactly, a behaviour that carries over to prompts
it never trained on. Without the estimates the 0.4M-parameter model memorises the small easy
levels and RL gains do not reach held-out prompts (docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BUILD_VERSION = 1
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
DEFAULT_CHARS = string.digits + string.ascii_lowercase + "+-*/()=:<>.,?!~ \n"


@dataclass(frozen=True)
class TinyBuildConfig:
    """Everything that determines the built model (its hash names the cache directory)."""

    task: str = "arithmetic"
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2  # head_dim 64: supported by every vLLM attention backend
    num_key_value_heads: int = 1
    intermediate_size: int = 384
    max_position_embeddings: int = 128
    n_train: int = 20000
    data_seed: int = 1000  # warm-up problems differ from the usual RL draw (train split, seed 0)
    warmup_steps: int = 800
    estimate_fraction: float = 0.4  # share of arithmetic warm-up answers written as a rough estimate "~40"
    batch_size: int = 128
    lr: float = 3e-3
    seed: int = 0
    chars: str = DEFAULT_CHARS

    def key(self) -> str:
        blob = json.dumps({"v": BUILD_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------- tokenizer and model
def build_tokenizer(chars: str = DEFAULT_CHARS):
    """A character-level ``PreTrainedTokenizerFast`` (WordLevel vocab: specials, then ``chars``).

    ``<pad>``/``<bos>``/``<eos>``/``<unk>`` are set, padding is on the left (for generation),
    and no special token is added automatically: prompts are plain strings.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = "".join(dict.fromkeys(chars))  # unique, order kept
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
        unk_token="<unk>", padding_side="left", model_max_length=128,
    )


def build_tiny_model(tokenizer, hidden_size: int = 128, num_hidden_layers: int = 2,
                     num_attention_heads: int = 2, num_key_value_heads: int = 1,
                     intermediate_size: int = 384, max_position_embeddings: int = 128, seed: int = 0):
    """A freshly initialised ``Qwen2ForCausalLM`` (tied embeddings) sized for ``tokenizer``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # token ids only: sampling settings come from the trainer / vLLM request
    return model


# ---------------------------------------------------------------- warm-up
def warm_up(model, tokenizer, dataset, steps: int = 800, seed: int = 0, batch_size: int = 128,
            lr: float = 3e-3, micro_batch: int = 32, num_threads: int | None = 1,
            progress: bool = True) -> list[float]:
    """Deterministic supervised pass on ``prompt + answer + <eos>`` (loss on answer tokens only).

    Plain torch loop: fixed seed and batch order, AdamW with 5% linear warm-up then linear decay,
    deterministic algorithms and ``num_threads`` torch threads for the duration (the result does
    not depend on the thread count; one thread is immune to CPU oversubscription, which slowed
    two threads by up to 10x on a busy 2-core box). Returns the per-step losses.
    """
    import torch
    from tqdm.auto import tqdm

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    seqs, labels = [], []
    for prompt, answer in zip(dataset["prompt"], dataset["answer"]):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(str(answer), add_special_tokens=False)["input_ids"] + [eos]
        seqs.append(p + a)
        labels.append([-100] * len(p) + a)

    was_deterministic = torch.are_deterministic_algorithms_enabled()
    old_threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True, warn_only=True)
    if num_threads:
        torch.set_num_threads(num_threads)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    warm = max(1, steps // 20)  # linear warm-up over 5% of the steps, then linear decay to 0
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (1.0 - s / max(steps, 1)))
    model.train()
    losses = []
    try:
        for _ in tqdm(range(steps), desc="warm-up tiny model", disable=not progress, mininterval=1.0):
            idx = torch.randint(len(seqs), (batch_size,), generator=gen).tolist()
            n_tok = sum(len(seqs[i]) - labels[i].count(-100) for i in idx)
            # one optimiser step per batch; the batch is run as length-sorted micro-batches so
            # short sequences are not padded to the longest (same gradient, ~30% less compute)
            idx.sort(key=lambda i: len(seqs[i]))
            total = 0.0
            for chunk in (idx[j:j + micro_batch] for j in range(0, len(idx), micro_batch)):
                width = max(len(seqs[i]) for i in chunk)
                ids = torch.tensor([seqs[i] + [pad] * (width - len(seqs[i])) for i in chunk])
                lab = torch.tensor([labels[i] + [-100] * (width - len(labels[i])) for i in chunk])
                logits = model(input_ids=ids, attention_mask=(ids != pad).long()).logits
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1), lab[:, 1:].flatten(), ignore_index=-100,
                    reduction="sum") / n_tok
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(total)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(old_threads)
        model.eval()
    return losses


def estimate_answer(answer: str) -> str:
    """A rough estimate of an integer answer: ``~`` and the value rounded at its leading digit
    (to tens at least): ``"42"`` -> ``"~40"``, ``"7"`` -> ``"~10"``, ``"155"`` -> ``"~200"``."""
    value = int(answer)
    scale = 10 ** max(len(str(abs(value))) - 1, 1)
    return "~" + str(round(value / scale) * scale)


def with_estimates(dataset, fraction: float, seed: int = 0):
    """``dataset`` with a fixed random ``fraction`` of its answers replaced by ``estimate_answer``."""
    import random

    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"`estimate_fraction` must lie in [0, 1] (a share of the warm-up answers), got {fraction}.")
    rng = random.Random(f"estimates:{seed}")
    return dataset.map(lambda row: {"answer": estimate_answer(row["answer"]) if rng.random() < fraction
                                    else row["answer"]})


# ---------------------------------------------------------------- cached build
def default_cache_dir() -> Path:
    return Path(os.environ.get("TRL_ALLOC_CACHE") or Path.home() / ".cache" / "trl_alloc")


def build_tiny_model_dir(out_dir: str | os.PathLike, cfg: TinyBuildConfig = TinyBuildConfig(),
                         num_threads: int | None = 1, progress: bool = True) -> dict:
    """Build tokenizer + model + warm-up and save both to ``out_dir``; returns build info."""
    from .builtin import build_dataset

    t0 = time.time()
    tokenizer = build_tokenizer(cfg.chars)
    model = build_tiny_model(
        tokenizer, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position_embeddings,
        seed=cfg.seed)
    data = build_dataset(cfg.task, n=cfg.n_train, seed=cfg.data_seed, split="train")
    if cfg.estimate_fraction and cfg.task == "arithmetic":  # Countdown answers are expressions
        data = with_estimates(data, cfg.estimate_fraction, seed=cfg.data_seed)
    losses = warm_up(model, tokenizer, data, steps=cfg.warmup_steps, seed=cfg.seed,
                     batch_size=cfg.batch_size, lr=cfg.lr, num_threads=num_threads,
                     progress=progress)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    info = {"config": asdict(cfg), "key": cfg.key(), "build_seconds": round(time.time() - t0, 2),
            "final_loss": losses[-1] if losses else None,
            "num_parameters": sum(p.numel() for p in model.parameters())}
    (out_dir / "trl_alloc_build.json").write_text(json.dumps(info, indent=1))
    return info


def get_tiny_model_dir(cache_dir: str | os.PathLike | None = None, task: str = "arithmetic",
                       num_threads: int | None = 1, progress: bool = True, **overrides) -> str:
    """Path of the cached tiny model for ``task``, building it once if needed.

    Cached under ``cache_dir`` (default ``$TRL_ALLOC_CACHE`` or ``~/.cache/trl_alloc``) by a hash
    of the build settings (``overrides`` change ``TinyBuildConfig`` fields). Concurrent callers
    (e.g. two ``accelerate launch`` ranks) serialise on a file lock; the build is written to a
    temporary directory and renamed into place, so a reader never sees a partial model.
    """
    cfg = TinyBuildConfig(task=task, **overrides)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_once(root / f"tiny-{task}-{cfg.key()}", "trl_alloc_build.json",
                      lambda tmp: build_tiny_model_dir(tmp, cfg, num_threads=num_threads, progress=progress))


def build_once(final: Path, marker: str, build) -> str:
    """`final`, made by `build(folder)` (which writes `marker` last) unless it is already there.

    Concurrent callers serialise on a file lock; the build goes to a temporary folder renamed into
    place, so a reader never sees a partial one."""
    from filelock import FileLock

    final.parent.mkdir(parents=True, exist_ok=True)
    done = final / marker
    if done.exists():
        return str(final)
    with FileLock(str(final) + ".lock"):
        if done.exists():
            return str(final)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            build(tmp)
            if final.exists():  # a stale, incomplete folder from a crashed build
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(final)
