"""Bad inputs and faults (docs/reliability.md): each gets a clear error or correct behaviour."""

import errno
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import build, make_args, tiny_setup
from trl_alloc.trainer.checkpointing import read_allocation_state
from trl_alloc.trainer import AllocGRPOTrainer
from trl_alloc.trainer.checkpointing import ALLOCATION_STATE_NAME

from helpers import ROOT  # noqa: E402


def params(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}


def same_params(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- the success signal


def test_success_is_the_unweighted_verifier_not_the_weighted_reward(tmp_path):
    """`reward_weights 0.5` on a 0/1 reward made every weighted reward <= 0.5: no success, nothing trained."""
    trainer = build(tmp_path, pacing="cero", filling="sara", num_rounds=3, rollout_budget=96, reward_weights=[0.5])
    trainer.train()
    assert trainer.allocation_summary["effective_groups"] > 0 and trainer.allocation_summary["trained"]


def test_success_threshold_for_negative_rewards_and_the_no_signal_warning(tmp_path, capsys):
    model, tok, ds, reward = tiny_setup()

    def minus_one_or_zero(completions, answer, **kw):  # 0 = right, -1 = wrong
        return [r - 1.0 for r in reward(completions, answer)]

    def run(out, **kw):
        args = make_args(str(out), pacing="cero", filling="sara", num_rounds=6, rollout_budget=192, **kw)
        t = AllocGRPOTrainer(model=tiny_setup()[0], reward_funcs=minus_one_or_zero, args=args, train_dataset=ds,
                             processing_class=tok)
        before = params(t)
        t.train()
        return t, before

    silent, before = run(tmp_path / "default", no_signal_warning_rounds=3)  # threshold 0.5: nothing ever succeeds
    out = capsys.readouterr().out
    assert "3 rounds in a row without one mixed group" in out and "success_threshold (0.5)" in out
    assert "[-1, -1]" in out or "[-1, 0]" in out  # the rewards seen, so the user sees why
    calls = [h["generation_calls"] for h in silent.allocator.history[:3]]  # SARA: probes, then continuations
    assert min(calls) >= 2 and f"took {sum(calls) / 3:.1f} generation calls a round over the first 3" in out
    assert out.count("generation calls a round") == 1  # once per run
    summary = silent.allocation_summary
    assert not summary["trained"] and summary["rounds_without_signal"] == summary["rounds"] == 6
    assert summary["empty_rounds"] == 6 and same_params(before, params(silent))

    fixed, before = run(tmp_path / "fixed", success_threshold=-0.5)
    assert fixed.allocation_summary["trained"] and not same_params(before, params(fixed))


def test_success_reward_funcs_picks_the_verifier_next_to_a_format_reward(tmp_path):
    model, tok, ds, reward = tiny_setup()

    def always_formatted(completions, **kw):
        return [1.0] * len(completions)

    args = make_args(str(tmp_path), pacing="cero", filling="sara", num_rounds=2, rollout_budget=64,
                     success_reward_funcs=["first_digit_reward"])
    t = AllocGRPOTrainer(model=model, reward_funcs=[always_formatted, reward], args=args, train_dataset=ds,
                         processing_class=tok)
    assert t.success_funcs == [1]
    t.train()
    assert t.allocation_summary["effective_groups"] > 0  # with the format reward as the signal nothing is mixed
    with pytest.raises(ValueError, match="'nope', which is not a reward function"):
        AllocGRPOTrainer(model=model, reward_funcs=reward, train_dataset=ds, processing_class=tok,
                         args=make_args(str(tmp_path), success_reward_funcs=["nope"]))


def test_missing_answer_column_warns_at_start(tmp_path, capsys):
    model, tok, ds, reward = tiny_setup()
    AllocGRPOTrainer(model=model, reward_funcs=reward, args=make_args(str(tmp_path), num_rounds=1),
                     train_dataset=ds.remove_columns("answer"), processing_class=tok)
    assert "takes answer, which the dataset has no column for" in capsys.readouterr().out


def test_a_run_with_too_small_a_budget_says_nothing_was_trained(tmp_path):
    trainer = build(tmp_path, pacing="cero", filling="sara", num_rounds=4, rollout_budget=8)
    before = params(trainer)
    trainer.train()
    assert trainer.allocation_summary["responses_spent"] <= 8
    assert trainer.allocation_summary["trained"] == (not same_params(before, params(trainer)))


# ---------------------------------------------------------------- unscorable rewards


def test_none_rewards_are_unscored_and_reported(tmp_path):
    model, tok, ds, reward = tiny_setup()

    def half_unscorable(completions, answer, **kw):
        return [None if i % 2 else r for i, r in enumerate(reward(completions, answer))]

    args = make_args(str(tmp_path), pacing="uniform", filling="full", num_rounds=2)
    t = AllocGRPOTrainer(model=model, reward_funcs=half_unscorable, args=args, train_dataset=ds, processing_class=tok)
    t.train()
    spent = t.allocation_summary["responses_spent"]
    assert t.allocation_summary["responses_unscored"] == spent // 2
    assert sum(h["unscored"] for h in t.allocator.history) == spent // 2


def test_a_reward_function_returning_none_gets_a_clear_error(tmp_path):
    model, tok, ds, _ = tiny_setup()

    def forgot_to_return(completions, **kw):
        [0.0 for _ in completions]

    t = AllocGRPOTrainer(model=model, reward_funcs=forgot_to_return, args=make_args(str(tmp_path), num_rounds=1),
                         train_dataset=ds, processing_class=tok)
    with pytest.raises(ValueError, match="'forgot_to_return' must return a list of one float per completion"):
        t.train()


# ---------------------------------------------------------------- resume


KW = dict(pacing="cero", filling="sara", num_rounds=4, rollout_budget=64, save_strategy="steps", save_steps=2)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished")
    t = build(out, **KW)
    t.train()
    return out, t


@pytest.mark.parametrize("change,field", [(dict(rollout_budget=80), "rollout_budget"),
                                          (dict(num_rounds=5), "num_rounds"),
                                          (dict(allocation_seed=1), "allocation_seed")])
def test_resume_refuses_another_plan(finished_run, tmp_path, change, field):
    out, _ = finished_run
    other = build(tmp_path, **{**KW, **change})
    with pytest.raises(ValueError, match=f"with {field}=.*but this run has {field}="):
        other.train(resume_from_checkpoint=str(out / "checkpoint-2"))


def test_resume_refuses_another_prompt_pool(finished_run, tmp_path):
    out, _ = finished_run
    model, tok, ds, reward = tiny_setup()
    shuffled = ds.select(list(reversed(range(len(ds)))))
    other = AllocGRPOTrainer(model=model, reward_funcs=reward, args=make_args(str(tmp_path), **KW),
                             train_dataset=shuffled, processing_class=tok)
    with pytest.raises(ValueError, match="dataset_fingerprint"):
        other.train(resume_from_checkpoint=str(out / "checkpoint-2"))


def test_report_after_resume_covers_the_whole_run(finished_run, tmp_path):
    out, full = finished_run
    resumed = build(tmp_path, **KW)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    for key in ("rounds", "responses_spent", "responses_remaining", "effective_groups"):
        assert resumed.allocation_summary[key] == full.allocation_summary[key], key
    assert len(resumed.allocator.history) == 4
    assert resumed.allocator.exposure.tolist() == full.allocator.exposure.tolist()


def test_resuming_a_finished_run_does_not_overwrite_its_report(finished_run, tmp_path):
    out, full = finished_run
    report = out / "allocation" / "summary.json"
    before = report.read_bytes()
    again = build(out, **KW)
    again.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert report.read_bytes() == before and json.loads(before)["rounds"] == 4


def test_resume_true_takes_the_latest_checkpoint(finished_run, tmp_path):
    from trl_alloc.cli.train import resume_argument

    assert resume_argument("True") is True and resume_argument("false") is False
    assert resume_argument("out/checkpoint-2") == "out/checkpoint-2"
    out, _ = finished_run
    t = build(out, **KW)
    t.train(resume_from_checkpoint=True)  # transformers: the newest checkpoint-N of output_dir
    assert t.state.global_step == 4 and t.allocator.counters["rounds"] == 4


@pytest.mark.parametrize("damage,match", [
    (lambda p: p.write_text(""), "is damaged \\(empty or truncated"),
    (lambda p: p.write_text(p.read_text()[:50]), "is damaged \\(empty or truncated"),
    (lambda p: p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items() if k != "pacer"})),
     "has no 'pacer' entry"),
])
def test_damaged_checkpoint_names_the_file_and_the_previous_one(finished_run, tmp_path, damage, match):
    import shutil

    out, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    damage(copy / "checkpoint-4" / ALLOCATION_STATE_NAME)
    with pytest.raises(ValueError, match=match) as err:
        read_allocation_state(str(copy / "checkpoint-4"))
    assert str(copy / "checkpoint-4" / ALLOCATION_STATE_NAME) in str(err.value)
    assert f"--resume_from_checkpoint {copy / 'checkpoint-2'}" in str(err.value)


# ---------------------------------------------------------------- saving


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    """A save that dies half-way leaves no checkpoint folder; the previous one is intact."""
    import transformers.modeling_utils as modeling

    t = build(tmp_path, **KW)
    real = modeling.safe_save_file
    calls = []

    def full_disk_on_second_checkpoint(*args, **kwargs):
        calls.append(1)
        real(*args, **kwargs)  # a (partial) file lands, then the disk is full
        if len(calls) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(modeling, "safe_save_file", full_disk_on_second_checkpoint)
    with pytest.raises(OSError, match="no space left on the device of .* while saving checkpoint-4") as err:
        t.train()
    assert "checkpoint-2; resume from it" in str(err.value)
    assert sorted(n for n in os.listdir(tmp_path) if "checkpoint" in n) == ["checkpoint-2"]
    assert read_allocation_state(str(tmp_path / "checkpoint-2"))["counters"]["rounds"] == 2


def test_full_disk_is_reported_on_a_real_small_filesystem(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        t = build(mount / "run", **{**KW, "save_steps": 1})
        with pytest.raises(OSError, match="no space left on the device of"):
            t.train()
        leftovers = [n for n in os.listdir(mount / "run") if n.startswith(".partial")]
        assert leftovers == []
        for ckpt in (mount / "run").glob("checkpoint-*"):  # whatever is there is whole
            read_allocation_state(str(ckpt))
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# ---------------------------------------------------------------- data


def test_dataset_file_errors_name_the_file_and_the_line(tmp_path):
    from trl_alloc.tasks.data import load_prompt_dataset

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.jsonl' is empty"):
        load_prompt_dataset(str(empty))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", answer: 4}\n')
    with pytest.raises(ValueError, match="bad.jsonl' could not be read: line 3 is not valid JSON"):
        load_prompt_dataset(str(bad))
    with pytest.raises(ValueError, match="no difficulty level 9; its levels are 1, 2, 3, 4, 5"):
        load_prompt_dataset("builtin:arithmetic", levels=(9,))
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"levels \(2, 3; --builtin_levels\) .*good.jsonl' is not one"):
        load_prompt_dataset(str(good), levels=(2, 3))  # was: silently ignored


def test_local_file_gets_a_disjoint_held_out_split(tmp_path):
    from trl_alloc.tasks.data import load_train_and_test

    rows = [{"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)} for i in range(50)]
    rows += rows[:5]  # duplicated prompts must never land on both sides
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    splits = load_train_and_test(str(path), test_fraction=0.2, seed=0)
    train = {json.dumps(p) for p in splits.train["prompt"]}
    test = [json.dumps(p) for p in splits.test["prompt"]]
    assert test and not train & set(test) and len(splits.train) + len(splits.test) <= 55
    assert "held out of" in splits.test_source and "20%" in splits.test_source
    given = tmp_path / "test.jsonl"
    fresh = [{"prompt": [{"role": "user", "content": f"{i}+2="}], "answer": str(i + 2)} for i in range(5)]
    given.write_text("".join(json.dumps(r) + "\n" for r in rows[:5] + fresh))  # half of it is in the pool
    splits = load_train_and_test(str(path), test_name=str(given), test_fraction=0.2)
    assert len(splits.train) == 55 and splits.test["prompt"] == [r["prompt"] for r in fresh]
    given.write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    with pytest.raises(ValueError, match="every held-out prompt .* is also a training prompt"):
        load_train_and_test(str(path), test_name=str(given))


def test_all_rewards_unscorable_warns_and_trains_nothing(tmp_path, capsys):
    model, tok, ds, _ = tiny_setup()
    args = make_args(str(tmp_path), pacing="cero", filling="sara", num_rounds=4, rollout_budget=128,
                     no_signal_warning_rounds=2)
    t = AllocGRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [None] * len(completions), args=args,
                         train_dataset=ds, processing_class=tok)
    before = params(t)
    t.train()
    assert "Likely cause: every reward was None/NaN" in capsys.readouterr().out
    assert not t.allocation_summary["trained"] and same_params(before, params(t))
    assert t.allocation_summary["responses_unscored"] == t.allocation_summary["responses_spent"] > 0


def test_budget_error_in_responses_before_the_model_loads(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--model_name_or_path", "no-such-org/no-such-model",
         "--dataset_name", "builtin:arithmetic", "--num_builtin_prompts", "64", "--output_dir", str(tmp_path / "o"),
         "--per_device_train_batch_size", "16", "--num_generations", "8", "--num_train_epochs", "1",
         "--round_capacity", "8", "--rollout_budget", "4096", "--use_cpu", "--report_to", "none"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3  # refused (2: nothing was trained)
    assert "`rollout_budget` (4096 responses) exceeds what 32 rounds can spend (32 × 32 responses per round)" \
        in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("[trl-alloc] the run was refused: ValueError: `rollout_")
    assert "no-such-model" not in proc.stderr  # the model was never loaded


def test_a_refused_run_under_accelerate_quiet_ends_with_our_message(tmp_path):
    """`accelerate launch --quiet` (one process): accelerate's own traceback is gone, our message is the last line;
    the status is accelerate's 1 (the script's own 3 is what `python scripts/train.py` returns)."""
    proc = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--config_file",
         str(ROOT / "configs" / "accelerate" / "single.yaml"), str(ROOT / "scripts" / "train.py"),
         "--model_name_or_path", "tiny", "--dataset_name", "builtin:arithmetic", "--num_builtin_prompts", "64",
         "--output_dir", str(tmp_path / "o"), "--per_device_train_batch_size", "16", "--num_generations", "8",
         "--round_capacity", "8", "--rollout_budget", "4096", "--use_cpu", "--report_to", "none"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("[trl-alloc] the run was refused: ValueError: `rollout_budget` (4096 responses)"), last
    assert "CalledProcessError" not in proc.stderr


def accelerate_launch(*args, timeout=300):
    """A plain `accelerate launch` (one process: its simple launcher, which quotes the script's stderr tail)."""
    return subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                           str(ROOT / "configs" / "accelerate" / "single.yaml"), *map(str, args)],
                          cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=timeout)


def quoted(proc):
    """The text accelerate's `CalledProcessError` is raised from: `RuntimeError(<the script's stderr tail>)`."""
    assert "subprocess.CalledProcessError" in proc.stderr, proc.stderr[-3000:]
    block = proc.stderr.split("RuntimeError: ", 1)[1]
    return block.split("\n\nThe above exception was the direct cause", 1)[0].strip()


@pytest.mark.parametrize("flag, value, message", [
    ("--max_staleness", "abc", "argument --max_staleness/--max-staleness: invalid int value: 'abc'"),
    ("--replace_probes", "maybe", "argument --replace_probes/--replace-probes: Truthy value expected: got maybe"),
])
def test_a_mistyped_flag_value_under_plain_accelerate_launch_ends_with_one_line_naming_it(tmp_path, flag, value,
                                                                                          message):
    """argparse would print the usage of every flag (about 230 lines) and exit, leaving accelerate nothing to quote:
    now the usage of that flag alone, then the refusal naming the flag and the value, quoted by accelerate."""
    proc = accelerate_launch(ROOT / "scripts" / "train.py", "--config", ROOT / "configs" / "tiny_cpu.yaml",
                             "--output_dir", tmp_path / "o", flag, value)
    assert proc.returncode == 1  # accelerate's (train.py's own: 3, refused)
    said = quoted(proc)
    assert said.startswith(f"[trl-alloc] the run was refused: {message}") and "\n" not in said, said[:3000]
    assert said.endswith("(`python scripts/train.py --help` lists every flag)")
    assert proc.stdout.strip().splitlines()[-1] == said
    assert proc.stdout.count("usage:") == 1 and f"usage: train.py ... {flag} " in proc.stdout
    assert "--per_device_train_batch_size" not in proc.stdout  # not the whole usage
    direct = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), flag, value], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert direct.returncode == 3 and direct.stdout.strip().splitlines()[-1] == said


@pytest.mark.parametrize("case", ["refused", "nothing_trained"])
@pytest.mark.timeout(660)
def test_plain_accelerate_launch_quotes_our_message(tmp_path, case):
    """Under plain `accelerate launch`, the `RuntimeError:` accelerate quotes is our message alone (library warnings,
    progress bars and our traceback went to stdout), and it is also the last line on stdout."""
    common = ["--model_name_or_path", "tiny", "--dataset_name", "builtin:arithmetic", "--num_builtin_prompts", "64",
              "--output_dir", tmp_path / "o", "--per_device_train_batch_size", "16", "--num_generations", "8",
              "--use_cpu", "--report_to", "none"]
    if case == "refused":
        proc = accelerate_launch(ROOT / "scripts" / "train.py", *common, "--round_capacity", "8", "--rollout_budget",
                                 "4096")
        message = "[trl-alloc] the run was refused: ValueError: `rollout_budget` (4096 responses) exceeds"
    else:  # no response can reach a success threshold of 2: no mixed group, nothing trained (exit 2)
        proc = accelerate_launch(ROOT / "scripts" / "train.py", *common, "--num_rounds", "1", "--rollout_budget", "16",
                                 "--max_completion_length", "8", "--success_threshold", "2", "--eval_samples", "0",
                                 timeout=600)
        message = "[trl-alloc] nothing was trained: no round had a group with a non-zero advantage"
    assert proc.returncode == 1  # accelerate's, for any failure (trl-alloc-launch keeps train.py's)
    said = quoted(proc)
    assert said.startswith(message) and "\n" not in said, said[:3000]
    assert proc.stdout.strip().splitlines()[-1] == said
    if case == "refused":
        assert "Traceback" in proc.stdout and "check_budget" in proc.stdout  # the traceback is still shown


def test_a_native_crash_under_accelerate_quotes_pythons_stack(tmp_path):
    """A process that dies of a signal (here SIGILL, what an AMX kernel without permission raised) used to leave
    nothing Python could say; accelerate now quotes the faulthandler's stack, which names the signal."""
    script = tmp_path / "crash.py"
    script.write_text("import os, signal\nfrom trl_alloc.cli.launch import keep_stderr_for_the_last_message\n"
                      "keep_stderr_for_the_last_message()\nprint('noise', file=__import__('sys').stderr)\n"
                      "os.kill(os.getpid(), signal.SIGILL)\n")
    proc = accelerate_launch(script)
    said = quoted(proc)
    assert said.startswith("Fatal Python error: Illegal instruction") and "crash.py" in said, said
    assert "noise" in proc.stdout and "noise" not in said


@pytest.mark.timeout(660)
def test_trl_alloc_launch_on_two_processes_ends_with_our_message_and_status(tmp_path):
    """`trl-alloc-launch` (accelerate launch of train.py): on two processes torchrun's failure report comes first, the
    main process's refusal is the last line, and the status is train.py's 3, not accelerate's 1."""
    proc = subprocess.run(
        [sys.executable, "-m", "trl_alloc.cli.launch", "--config_file",
         str(ROOT / "configs" / "accelerate" / "zero2.yaml"), "--",
         "--model_name_or_path", "tiny", "--dataset_name", "builtin:arithmetic", "--num_builtin_prompts", "64",
         "--output_dir", str(tmp_path / "o"), "--per_device_train_batch_size", "16", "--num_generations", "8",
         "--round_capacity", "8", "--rollout_budget", "4096", "--use_cpu", "--report_to", "none"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 3, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("[trl-alloc] the run was refused: ValueError: `rollout_budget` (4096 responses)"), last
    assert proc.stderr.count("[trl-alloc] the run was refused") == 2  # the main process's, then repeated last
    from trl_alloc.cli.launch import main

    with pytest.raises(SystemExit, match="put train.py's arguments after `--`"):
        main(["configs/demo.yaml", "--", "--output_dir", "o"])


def test_api_type_errors_and_tau_low_auto_everywhere(tmp_path):
    from trl import TrlParser

    from trl_alloc.trainer.config import AllocGRPOConfig

    with pytest.raises(TypeError, match="`rollout_budget` must be an integer, got '256' \\(str\\)"):
        make_args(str(tmp_path), rollout_budget="256")
    with pytest.raises(TypeError, match="`num_rounds` must be an integer, got 2.5"):
        make_args(str(tmp_path), num_rounds=2.5)
    with pytest.raises(ValueError, match="`tau_low` must be a number in \\(0, 1\\) or 'auto', got 'often'"):
        make_args(str(tmp_path), tau_low="often")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path}\ntau_low: auto\nuse_cpu: true\nbf16: false\nreport_to: none\n")
    cli = ["--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false", "--tau_low"]
    for argv in (["--config", str(recipe)], cli + ["auto"]):
        (args,) = TrlParser((AllocGRPOConfig,)).parse_args_and_config(argv)
        assert args.tau_low == "auto"
    (args,) = TrlParser((AllocGRPOConfig,)).parse_args_and_config(cli + ["0.3"])
    assert args.tau_low == 0.3
    t = build(tmp_path / "run", pacing="cero", filling="sara", num_rounds=2, rollout_budget=64, tau_low="auto")
    t.train()
    assert t.allocator.filler.state_dict() is not None and t.allocator.counters["rounds"] == 2


def test_the_verifier_is_the_default_success_signal_wherever_it_stands(tmp_path):
    from trl_alloc.tasks.data import reward_for_dataset

    model, tok, ds, _ = tiny_setup()
    t = AllocGRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [1.0] * len(completions),
                                                    reward_for_dataset("builtin:arithmetic")],
                         args=make_args(str(tmp_path), num_rounds=1), train_dataset=ds, processing_class=tok)
    assert t.success_funcs == [1]


@pytest.mark.parametrize("argv,expected", [
    (["--algorithm", "dapo"], "AllocDAPOConfig"), (["--algorithm=dapo"], "AllocDAPOConfig"),
    (["--algorithm=grpo"], "AllocGRPOConfig"), ([], "AllocGRPOConfig"),
    (["--config", "{recipe}"], "AllocDAPOConfig"), (["--config={recipe}", "--algorithm=grpo"], "AllocGRPOConfig"),
])
def test_algorithm_flag_parses_in_both_forms(tmp_path, argv, expected):
    """`--algorithm=dapo` used to train GRPO silently: both flag forms (and the recipe's field) pick the config."""
    from trl_alloc.cli.train import pick_config_class

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("algorithm: dapo\n")
    assert pick_config_class([a.format(recipe=recipe) for a in argv]).__name__ == expected
    with pytest.raises(ValueError, match="must be grpo or dapo"):
        pick_config_class(["--algorithm=ppo"])


def test_resume_without_optimizer_state_is_refused(finished_run, tmp_path):
    """A checkpoint with no optimizer.pt would restart Adam silently: refused, naming the file and the fallback."""
    import shutil

    out, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    (copy / "checkpoint-4" / "optimizer.pt").unlink()
    t = build(copy, **KW)
    with pytest.raises(FileNotFoundError,
                       match="checkpoint-4 has no optimizer.pt.*--resume_from_checkpoint .*checkpoint-2"):
        t.train(resume_from_checkpoint=str(copy / "checkpoint-4"))


def test_disk_full_is_found_in_a_chained_exception(tmp_path):
    """torch reports a full disk as `unexpected pos ...`, the "iostream error" only in the exception it chains."""
    from trl_alloc.trainer.checkpointing import is_disk_full

    try:
        try:
            raise RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
                               "data/0: file write failed")
        except RuntimeError as inner:
            raise RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 2304 vs 2198") from inner
    except RuntimeError as exc:
        chained = exc
    shutil_free = __import__("shutil").disk_usage(tmp_path).free
    assert is_disk_full(chained, str(tmp_path)) == (shutil_free < 2**26)  # torch's words need a disk that is full
    full = RuntimeError("unexpected pos 2304 vs 2198")
    full.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert is_disk_full(full, str(tmp_path)) and not is_disk_full(RuntimeError("unexpected pos"), str(tmp_path))


def test_bad_rows_are_refused_at_load_with_their_numbers(tmp_path, capsys):
    from trl_alloc.tasks.data import load_prompt_dataset

    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(8)]
    rows[2]["answer"], rows[5]["answer"] = None, None
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="2 row\\(s\\) whose 'answer' is null \\(rows 2, 5\\)"):
        load_prompt_dataset(str(path))
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(8)]
    rows[3]["prompt"] = "  "
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="1 empty prompt\\(s\\) \\(rows 3\\)"):
        load_prompt_dataset(str(path))
    chat = [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"},
            {"prompt": [{"role": "human", "content": "2+2="}], "answer": "4"},
            {"prompt": [{"role": "system", "content": "Be brief."}], "answer": "0"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in chat))
    load_prompt_dataset(str(path))
    out = capsys.readouterr().out
    assert ("1 chat prompt(s) with role 'human' (rows 1)" in out
            and "2 chat prompt(s) with no 'user' turn (rows 1, 2)" in out)
    from trl_alloc.tasks.data import check_prompts

    check_prompts(load_prompt_dataset(str(path))["prompt"], "`train_dataset`")  # the trainer checks the same rows
    assert "WARNING" not in capsys.readouterr().out  # each warning once, not once per check


def test_api_inputs_refused_at_construction(tmp_path):
    """What TRL's own GRPOTrainer refuses (or a user gets wrong) is refused here too, naming the fix."""
    from datasets import Dataset

    model, tok, ds, reward = tiny_setup()
    args = make_args(str(tmp_path), num_rounds=1)
    with pytest.raises(ValueError, match="No reward source provided: `reward_funcs` is required"):  # TRL's words
        AllocGRPOTrainer(model=model, reward_funcs=None, args=args, train_dataset=ds, processing_class=tok)
    with pytest.raises(ValueError, match="`train_dataset` is required: it is the prompt pool"):  # (TRL's words)
        AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=None, processing_class=tok)
    with pytest.raises(TypeError, match="Dataset.from_list"):
        AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=list(ds), processing_class=tok)
    with pytest.raises(ValueError, match="`environment_factory` is not supported"):  # before the dataset is checked
        AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=None, processing_class=tok,
                         environment_factory=lambda: None)
    empty = Dataset.from_list([{"prompt": "1+1=", "answer": "2"}, {"prompt": "", "answer": "0"}])
    with pytest.raises(ValueError, match="empty prompt\\(s\\) \\(rows 1\\)"):
        AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=empty, processing_class=tok)
    with pytest.raises(ValueError, match="smaller than one group \\(4 responses"):
        make_args(str(tmp_path), pacing="uniform", filling="full", num_rounds=1, rollout_budget=3)


def test_a_short_run_without_signal_still_says_why(tmp_path, capsys):
    """Fewer rounds than no_signal_warning_rounds, none with a mixed group: the warning comes at the end."""
    model, tok, ds, _ = tiny_setup()
    args = make_args(str(tmp_path), pacing="uniform", filling="full", num_rounds=2, no_signal_warning_rounds=5)
    t = AllocGRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                         train_dataset=ds, processing_class=tok)
    t.train()
    assert "2 rounds in a row without one mixed group" in capsys.readouterr().out


@pytest.mark.parametrize("flags,match", [
    (["--rounds", "0"], "--rounds must be >= 1"), (["--unit_size", "0"], "--unit_size must be >= 1"),
    (["--step_ms", "-1"], "--step_ms must be >= 0"), (["--budget", "-5"], "--budget must be >= 1"),
    (["--sara_overcommit", "0.5"], "`sara_overcommit` must be >= 1, got 0.5."),  # (SARA's rule, whatever is planned)
    (["--budget", "3201", "--rounds", "20"], "`rollout_budget` (3201 responses) exceeds what 20 rounds can spend "
     "(20 × 160 responses per round)"),  # the trainer refuses that config too
])
def test_plan_refuses_impossible_settings(flags, match, capsys):
    from trl_alloc.cli.plan import main

    with pytest.raises(SystemExit) as exit_:
        main(["--methods", "uniform", "--engine_methods", "", *flags])
    assert exit_.value.code == 2 and match in capsys.readouterr().err


def test_plan_budget_remainder_does_not_stretch_the_run(tmp_path):
    """A CERO budget that leaves a remainder below one group (3,204 responses: 400 groups of 8, and 4) used to
    stretch a plan for 80 rounds; the remainder ends it."""
    from trl_alloc.cli.plan import main

    main(["--prompts", "200", "--rounds", "20", "--budget", "3204", "--capacity", "60",
          "--methods", "cero,cero+sara", "--engine_methods", "", "--output_dir", str(tmp_path)])
    results = json.loads((tmp_path / "plan.json").read_text())["results"]
    assert all(r["summary"]["rounds"] <= 21 for r in results.values()), {
        k: r["summary"]["rounds"] for k, r in results.items()}


def test_groups_mixed_by_success_but_flat_in_the_loss_are_reported(tmp_path, capsys):
    """A verifier at reward weight 0 next to a constant format reward: the allocator's groups are mixed, the loss's
    rewards are not. Warned, naming the weights, and the summary says nothing was trained (no parameter moved)."""
    model, tok, ds, _ = tiny_setup()

    def alternating_verifier(completions, **kwargs):  # 0, 1, 0, 1 within each group of k = 4: every group is mixed
        return [float(i % 2) for i in range(len(completions))]

    def format_reward(completions, **kwargs):
        return [1.0] * len(completions)

    verifier = alternating_verifier
    args = make_args(str(tmp_path), pacing="uniform", filling="full", num_rounds=3, reward_weights=[0.0, 1.0],
                     success_reward_funcs=["alternating_verifier"])
    t = AllocGRPOTrainer(model=model, reward_funcs=[verifier, format_reward], args=args, train_dataset=ds,
                         processing_class=tok)
    before = params(t)
    t.train()
    out = capsys.readouterr().out
    assert sum(h["effective_groups"] for h in t.allocator.history) > 0  # mixed by the verifier...
    assert "have a constant training reward (reward weights: alternating_verifier=0, format_reward=1)" in out
    assert "generation calls a round" not in out  # full groups: one generate call a round, no note
    assert not t.allocation_summary["trained"] and same_params(before, params(t))  # ...but nothing moved


def test_unclear_messages_now_name_the_problem(finished_run, tmp_path, capsys):
    import shutil

    from trl_alloc.serving.server import VLLMServerStartError, start_server
    from trl_alloc.tasks.data import load_prompt_dataset

    model, tok, ds, reward = tiny_setup()
    args = make_args(str(tmp_path / "o"), num_rounds=1)
    with pytest.raises(FileNotFoundError, match="'./no-such-model' is not a folder here"):
        AllocGRPOTrainer(model="./no-such-model", reward_funcs=reward, args=args, train_dataset=ds)
    with pytest.raises(ValueError, match="get_tiny_model_dir"):
        AllocGRPOTrainer(model="tiny", reward_funcs=reward, args=args, train_dataset=ds)
    with pytest.raises(VLLMServerStartError, match="embedded model of scripts/train.py"):
        start_server("tiny")
    text = tmp_path / "prompts.txt"
    text.write_text("1+1=\n")
    with pytest.raises(ValueError, match="extension trl-alloc does not read; give a .*jsonl"):
        load_prompt_dataset(str(text))
    # YAML's bare `no` is False; a zero completion length is named as ours, not as transformers' max_new_tokens
    assert make_args(str(tmp_path / "o"), num_rounds=1, save_strategy=False).save_strategy == "no"
    with pytest.raises(ValueError, match="`max_completion_length` must be >= 1"):
        make_args(str(tmp_path / "o"), num_rounds=1, max_completion_length=0)
    from trl_alloc.cli.eval import parse_args as eval_args
    with pytest.raises(SystemExit):  # argparse names the choices
        eval_args(["--model", "x", "--dtype", "float64x"])
    assert "invalid choice: 'float64x'" in capsys.readouterr().err
    # a checkpoint without its weights, and one whose pacer state is null
    out, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    (copy / "checkpoint-4" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="checkpoint-4 has no model weights .*checkpoint-2"):
        build(copy, **KW).train(resume_from_checkpoint=str(copy / "checkpoint-4"))
    state = copy / "checkpoint-2" / ALLOCATION_STATE_NAME
    state.write_text(json.dumps({**json.loads(state.read_text()), "pacer": None}))
    with pytest.raises(ValueError, match="has no 'pacer' entry \\(or it is not an object\\)"):
        read_allocation_state(str(copy / "checkpoint-2"))
