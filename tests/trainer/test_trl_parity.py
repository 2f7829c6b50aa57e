"""What a TRL user expects: max_steps, log_extra, stock's step count, several optimizer steps per
round, and chat-format datasets with a real-style tokenizer through scripts/train.py."""

import json
import os
import subprocess
import sys

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from helpers import build, make_args, scripted_generation, tiny_setup
from trl_alloc.allocation.factory import resolve_num_rounds
from trl_alloc.trainer import AllocGRPOTrainer

from helpers import ROOT  # noqa: E402


def test_max_steps_below_num_rounds_stops_early_and_says_so(tmp_path, capsys):
    t = build(tmp_path, pacing="cero", filling="sara", num_rounds=10, rollout_budget=320, max_steps=3)
    assert "max_steps=3 stops the run after 3 of 10 rounds" in capsys.readouterr().out
    t.train()
    assert t.state.global_step == 3 and t.allocator.counters["rounds"] == 3 and t.num_rounds == 10


def test_max_steps_alone_plans_that_many_rounds(tmp_path):
    t = build(tmp_path, pacing="cero", filling="sara", max_steps=2)
    assert t.num_rounds == 2 and t.args.check_budget(2) is None


@pytest.mark.parametrize("n_prompts,batch,k,accum,epochs", [(16, 8, 4, 1, 1), (16, 6, 3, 2, 3), (13, 8, 4, 2, 2)])
def test_default_num_rounds_is_stocks_step_count(tmp_path, n_prompts, batch, k, accum, epochs):
    """Stock's RepeatSampler drops the last incomplete batch; the default horizon takes the same steps."""
    model, tok, ds, reward = tiny_setup(n_prompts=n_prompts)
    kw = dict(output_dir=str(tmp_path / "stock"), per_device_train_batch_size=batch, num_generations=k,
              gradient_accumulation_steps=accum, num_train_epochs=epochs, max_completion_length=2,
              report_to=[], use_cpu=True, bf16=False, save_strategy="no", logging_steps=100)
    stock = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**kw), train_dataset=ds,
                        processing_class=tok)
    stock.train()
    ours = make_args(str(tmp_path / "ours"), pacing="uniform", filling="full", per_device_train_batch_size=batch,
                     num_generations=k, gradient_accumulation_steps=accum, num_train_epochs=epochs)
    assert resolve_num_rounds(ours, n_prompts) == stock.state.global_step


def test_log_extra_columns_reach_the_completions_log(tmp_path):
    model, tok, ds, reward = tiny_setup()

    def reward_with_extra(completions, answer, log_extra=None, **kw):
        log_extra("golden", list(answer))
        return reward(completions, answer)

    args = make_args(str(tmp_path), pacing="uniform", filling="full", num_rounds=1, log_completions=True)
    t = AllocGRPOTrainer(model=model, reward_funcs=reward_with_extra, args=args, train_dataset=ds,
                         processing_class=tok)
    t.train()
    golden = list(t._logs["extra"]["golden"])
    prompts = list(t._logs["prompt"])
    assert golden and len(golden) == len(prompts)
    answers = {p: a for p, a in zip(ds["prompt"], ds["answer"])}
    assert golden == [answers[p] for p in prompts]  # each value next to its own row


@pytest.mark.parametrize("setting", [dict(steps_per_generation=2), dict(num_iterations=2)])
def test_several_optimizer_steps_per_round(tmp_path, setting):
    t = build(tmp_path, pacing="cero", filling="sara", num_rounds=3, rollout_budget=96, **setting)
    scripted_generation(t)
    calls = []
    inner = t._run_round
    t._run_round = lambda: calls.append(1) or inner()
    t.train()
    assert t.state.global_step == 6 and len(calls) == 3 and t.allocator.counters["rounds"] == 3


def test_an_empty_round_moves_no_parameter_over_all_its_steps(tmp_path):
    model, tok, ds, _ = tiny_setup()
    args = make_args(str(tmp_path), pacing="cero", filling="sara", num_rounds=2, rollout_budget=64,
                     steps_per_generation=2, weight_decay=0.1)
    t = AllocGRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                         train_dataset=ds, processing_class=tok)
    before = {k: v.clone() for k, v in t.model.named_parameters()}
    t.train()
    assert t.state.global_step == 4 and t.allocator.counters["empty_rounds"] == 2
    assert all(torch.equal(before[k], v) for k, v in t.model.named_parameters())


# ---------------------------------------------------------------- chat format through scripts/train.py


def chat_model_dir(folder):
    """A small Llama-style model whose tokenizer adds BOS and has a chat template (like SmolLM2's)."""
    from tokenizers import processors
    from transformers import LlamaConfig, LlamaForCausalLM

    from trl_alloc.tasks.tiny import build_tokenizer

    tok = build_tokenizer("0123456789+-*=abcdefghijklmnopqrstuvwxyz|<>/ \n")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", tok.bos_token_id)])
    tok.chat_template = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return tok


def test_chat_prompts_are_evaluated_with_the_trainers_token_ids(tmp_path):
    from trl_alloc.evaluation import tokenize_prompts

    tok = chat_model_dir(tmp_path / "model")
    model, _, _, reward = tiny_setup()
    prompts = [[{"role": "user", "content": f"{i}+1="}] for i in range(4)]
    from datasets import Dataset
    ds = Dataset.from_list([{"prompt": p, "answer": "1"} for p in prompts])
    from transformers import AutoModelForCausalLM
    t = AllocGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tmp_path / "model"), reward_funcs=reward,
                         args=make_args(str(tmp_path / "out"), num_rounds=1), train_dataset=ds, processing_class=tok)
    ids = tokenize_prompts(tok, prompts)
    assert ids == [list(map(int, x)) for x in t._tokenize_prompts(prompts)[0]]
    assert ids[0][0] == tok.bos_token_id and ids[0].count(tok.bos_token_id) == 1  # BOS once, from the template
    plain = ["1+1=", "2+2="]
    ids = tokenize_prompts(tok, plain)
    assert ids == [list(map(int, x)) for x in t._tokenize_prompts(plain)[0]]
    assert ids[0][0] == tok.bos_token_id  # the tokenizer's own special tokens


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_train_script_on_a_chat_jsonl_with_a_disjoint_held_out_split(tmp_path):
    chat_model_dir(tmp_path / "model")
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}
            for a in range(8) for b in range(5)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--model_name_or_path", str(tmp_path / "model"),
         "--dataset_name", str(data), "--reward", "arithmetic", "--output_dir", str(out), "--num_rounds", "2",
         "--per_device_train_batch_size", "16", "--num_generations", "4", "--max_completion_length", "4",
         "--pacing", "uniform", "--filling", "full", "--use_cpu", "--bf16", "false", "--report_to", "none",
         "--eval_samples", "2", "--test_fraction", "0.25", "--save_strategy", "no", "--tau_low", "auto"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 2), proc.stderr[-3000:]  # 2: nothing trained (a random policy may get no signal)
    assert "10 prompts, 10 rows held out of" in proc.stdout and "the pool is the other 30" in proc.stdout
    summary = json.loads((out / "allocation" / "summary.json").read_text())
    assert summary["held_out_prompts"] == 10 and "held out of" in summary["held_out_split"]
    after = json.loads((out / "eval" / "after" / "eval_results.json").read_text())["info"]
    assert summary["held_out_reward"] == after["reward"] == "arithmetic_reward"  # --reward's (what a regrade uses)
    held_out = [json.loads(line)["prompt"] for line in (out / "eval" / "after" / "samples.jsonl").open()]
    assert len(held_out) == 10
    trained_on = {json.dumps(r["prompt"]) for r in rows} - {json.dumps(p) for p in held_out}
    assert len(trained_on) == 30


def test_a_trl_without_the_private_steps_gets_a_clear_error(monkeypatch, tmp_path):
    """trl_compat checks TRL's private surface once: a missing method or buffer is named, with the install fix."""
    from trl import GRPOTrainer

    from trl_alloc.trainer import trl_compat

    monkeypatch.delattr(GRPOTrainer, "_calculate_rewards")
    with pytest.raises(trl_compat.TRLCompatibilityError,
                       match=r"has no _calculate_rewards.*pip install 'trl>=1.16,<1.17'"):
        build(tmp_path)
    monkeypatch.undo()
    monkeypatch.setattr(trl_compat.trl, "__version__", "1.99.0")
    with pytest.warns(UserWarning, match="tested with trl 1.16.x; you have 1.99.0"):
        trl_compat.check_trl()

    class Bare:
        pass

    with pytest.raises(trl_compat.TRLCompatibilityError, match="does not set _metrics, _pending_metrics"):
        trl_compat.check_trainer(Bare())
