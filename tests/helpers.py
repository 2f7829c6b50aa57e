"""Builders the tests share: one tiny character-level Qwen2 policy (`char_qwen2`), the trainer tests'
setup on it, and the repository root. Imported as `helpers` (tests/conftest.py puts tests/ on sys.path)."""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DIGITS = "0123456789+="


def char_qwen2(chars, specials=("<pad>", "<eos>"), unk="<pad>", bos=None, hidden_size=64, num_attention_heads=2,
               max_position_embeddings=64, initializer_range=0.02, seed=0, padding_side="left",
               model_max_length=None):
    """(model, tokenizer): a character tokenizer over `specials` + `chars` and a random 2-layer Qwen2 (hidden
    `hidden_size`, one KV head, tied embeddings); pad is the first special, eos the one named <eos>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {t: i for i, t in enumerate(specials)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    names = {"pad_token": specials[0], "eos_token": "<eos>"}
    if padding_side:
        names["padding_side"] = padding_side
    if bos:
        names["bos_token"] = bos
    if unk != specials[0]:
        names["unk_token"] = unk
    if model_max_length:
        names["model_max_length"] = model_max_length
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    cfg = Qwen2Config(vocab_size=len(vocab), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=2, num_attention_heads=num_attention_heads, num_key_value_heads=1,
                      max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
                      initializer_range=initializer_range, pad_token_id=0, eos_token_id=vocab["<eos>"],
                      bos_token_id=vocab[bos] if bos else vocab["<eos>"])
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg), tokenizer


def tiny_setup(seed=0, n_prompts=16):
    """The trainer tests' policy (`char_qwen2` over digits), `n_prompts` "a+b=" prompts and a reward function."""
    from datasets import Dataset

    model, tokenizer = char_qwen2(DIGITS, seed=seed)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)][:n_prompts]
    dataset = Dataset.from_list(rows)

    def first_digit_reward(completions, answer, **kwargs):
        """1 when the completion starts with the answer's first digit (mixed groups for a random model)."""
        return [float(c[:1] == a[:1]) for c, a in zip(completions, answer)]

    return model, tokenizer, dataset, first_digit_reward


def make_args(output_dir, **overrides):
    from trl_alloc.trainer.config import AllocGRPOConfig

    kw = dict(output_dir=output_dir, per_device_train_batch_size=8, num_generations=4, max_completion_length=3,
              learning_rate=1e-3, logging_steps=1, report_to=[], bf16=False, use_cpu=True,
              gradient_checkpointing=False, save_strategy="no", seed=0, temperature=1.0, rollout_mode="deterministic")
    kw.update(overrides)
    return AllocGRPOConfig(**kw)


# Completions by occurrence of a prompt within one generation call (token ids: digits are 2..11, eos 1).
SCRIPTED = [[3, 1], [4, 1], [3, 4, 5], [5, 1]]  # "1", "2", "123" (truncated), "3"


def scripted_generation(trainer):
    """Replace sampling by a fixed completion per (prompt, occurrence), so two trainers see the same data."""

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        seen, out = {}, []
        for p in prompt_ids:
            j = seen.get(tuple(p), 0)
            seen[tuple(p)] = j + 1
            out.append(list(SCRIPTED[j % len(SCRIPTED)]))
        return out, None

    trainer._generate_single_turn = generate
    return trainer


def build(tmp_path, pacing="uniform", filling="full", trainer_cls=None, n_prompts=16, seed=0, **kw):
    """An AllocGRPOTrainer (or `trainer_cls`) on `tiny_setup`."""
    from trl_alloc.trainer import AllocGRPOTrainer

    model, tok, ds, reward = tiny_setup(seed=seed, n_prompts=n_prompts)
    args = make_args(str(tmp_path), pacing=pacing, filling=filling, **kw)
    return (trainer_cls or AllocGRPOTrainer)(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                                             processing_class=tok)


def assert_engine_may_use_its_kernels(cpu):
    """`cpu`: a vLLM worker's `cpu_features` (serving/worker_extension.py). trl-alloc asked for AMX permission in
    the engine's process (serving/cpu_features.py) and Linux granted it wherever the CPU has AMX, so an AMX attention
    kernel cannot die with SIGILL; without AMX on the CPU nothing is asked and none is chosen."""
    import torch

    assert cpu["amx"] == ("granted" if torch.cpu._is_amx_tile_supported() else "absent"), cpu
    assert cpu["xtiledata_permitted"] == (cpu["amx"] == "granted"), cpu
    assert "amx" not in cpu["attention_isa"] or cpu["xtiledata_permitted"], cpu


def assert_on_policy(model, prompts, completions, logprobs, tol=1e-3):
    """Each sampled sequence's importance-sampling ratio between the engine (its log-probabilities of the tokens it
    sampled, at temperature 1) and `model` (float32, what the trainer scores) is within `tol` of 1."""
    import torch

    assert len(prompts) == len(completions) == len(logprobs) and completions
    for prompt, completion, engine in zip(prompts, completions, logprobs):
        assert len(engine) == len(completion) > 0
        with torch.no_grad():
            logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0].double()
        mine = torch.log_softmax(logits[len(prompt) - 1:-1], -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
        ratio = torch.exp((mine - torch.tensor(engine, dtype=torch.float64)).sum()).item()
        assert abs(ratio - 1) < tol, (ratio, (mine - torch.tensor(engine, dtype=torch.float64)).abs().max())


def build_served_model(out_dir):
    """The vLLM tests' model, saved to `out_dir`: `char_qwen2` over digits, letters and punctuation with
    <bos>/<unk>, one attention head and initializer_range 0.2 (peaked logits, so greedy decoding has no
    near-ties between backends)."""
    import string

    model, tokenizer = char_qwen2(string.digits + string.ascii_lowercase + "+-*/()=:<>.,?! \n",
                                  specials=("<pad>", "<bos>", "<eos>", "<unk>"), unk="<unk>", bos="<bos>",
                                  num_attention_heads=1, max_position_embeddings=512, initializer_range=0.2,
                                  padding_side=None, model_max_length=512)
    model = model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model


class SharedServer:
    """The session's vLLM CPU server of `build_served_model` (fixture `vllm_server`, tests/conftest.py): one server
    start instead of one per test (each takes 25-40 s here). `reset()` undoes what a test may leave behind: a pause,
    pushed weights, cached prefixes; `pushes_before` is the worker's push count after it."""

    def __init__(self, server, model_dir, model):
        self.server, self.url, self.model_dir, self.model = server, server.url, model_dir, model
        self.pushes_before = 0

    def client(self, **kwargs):
        from trl_alloc.serving import AllocVLLMClient

        return AllocVLLMClient(base_url=self.url, **{"connection_timeout": 10, "request_timeout": 300, **kwargs})

    def reset(self):
        client = self.client()
        try:
            client._post(f"{self.url}/resume")
            client.collective_rpc("load_weights_from_dir", [self.model_dir])
            client.reset_prefix_cache()
            report = client.weights_checksum()
            assert report["head_follows_embedding"] is True
            self.pushes_before = report["num_pushes"]
        finally:
            client.close()
        return self


def sums_task(model_dir):
    """The served trainer tests' parts: (tokenizer, the "a+b=" prompt pool, the first-digit reward)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]

    def first_digit_reward(completions, answer, **kwargs):
        return [float(c[:1] == a[:1]) for c, a in zip(completions, answer)]

    return AutoTokenizer.from_pretrained(model_dir), Dataset.from_list(rows), first_digit_reward


SMOKE = dict(pacing="cero", filling="sara", probe=1, commit_min=3, rollout_max_inflight=4)  # one-row requests
TWO_PROCESS_RUNS = {  # accelerate config -> {run: settings} (tests/trainer/dist_smoke.py), one launch per config
    "zero2": {"deterministic": {**SMOKE, "rollout_mode": "deterministic"},
              "deterministic-resumed": {**SMOKE, "rollout_mode": "deterministic",
                                        "resume_from_checkpoint": "deterministic/run/checkpoint-2"}},
    "zero3": {"deterministic": {**SMOKE, "rollout_mode": "deterministic"},
              "events": {**SMOKE, "rollout_mode": "events"},
              "stream": {**SMOKE, "rollout_mode": "stream"},
              "arrol": {**SMOKE, "pruning": "arrol", "detect_length": 2, "max_completion_length": 5,
                        "cold_start_rounds": 1, "head_hidden_size": 16, "pruning_min_auc": 0.0}},
}


def launch_two_processes(zero, out, runs, timeout=900):
    """`accelerate launch` of tests/trainer/dist_smoke.py on 2 CPU processes under configs/accelerate/<zero>.yaml:
    `runs` ({name: settings}) one after another in the same two processes (each launch starts torch, DeepSpeed and
    TRL twice: ~20 s here). Returns {name: [rank 0's record, rank 1's]}; each run's files are in out/<name>."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / f"{zero}.yaml"), "--main_process_port", "0",
           str(ROOT / "tests" / "trainer" / "dist_smoke.py"), str(out), json.dumps(runs)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {name: [json.loads((Path(out) / name / f"rank{r}.json").read_text()) for r in range(2)] for name in runs}
