"""Synthetic tasks, their verifiers, and the embedded tiny model (built offline, once per session)."""

import builtins
import json
import operator
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from trl_alloc.tasks.rewards import (arithmetic_reward, countdown_reward, math_number_reward, math_reward,  # noqa: E402
                                     stated_answer)
from trl_alloc.tasks.builtin import build_dataset, check_countdown, generate_problems  # noqa: E402

from helpers import ROOT  # noqa: E402


# ---------------------------------------------------------------- tasks
@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
def test_generation_is_deterministic_by_seed(task):
    a = build_dataset(task, n=50, seed=3)
    assert a.to_list() == build_dataset(task, n=50, seed=3).to_list()
    assert a["prompt"] != build_dataset(task, n=50, seed=4)["prompt"]
    assert all(isinstance(p, str) and isinstance(s, str) for p, s in zip(a["prompt"], a["answer"]))


@pytest.mark.parametrize("task", ["arithmetic", "countdown", "arithmetic-chat"])
def test_train_and_test_are_disjoint(task):
    def prompts(**kw):
        return [json.dumps(p) for p in build_dataset(task, **kw)["prompt"]]

    train = set(prompts(n=3000, seed=0, split="train"))
    test, other_seed_test = prompts(n=500, seed=0, split="test"), prompts(n=500, seed=1, split="test")
    assert not train & set(test) and not train & set(other_seed_test)


def test_word_problems_are_chat_prompts_with_checked_answers():
    """builtin:arithmetic-chat: one user message asking for \\boxed{}, five levels, right answers."""
    ds = build_dataset("arithmetic-chat", n=500, seed=0)
    assert set(ds["difficulty"]) == {1, 2, 3, 4, 5}
    for row in ds:
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].endswith("Put the final answer in \\boxed{}.")
        nums = [int(x) for x in re.findall(r"\d+", message["content"])]
        text = message["content"]
        if "gets" in text:
            want = nums[0] + nums[1]
        elif "gives" in text and "buys" not in text:
            want = nums[0] - nums[1]
        elif "in each box" in text:
            want = nums[0] * nums[1]
        elif "buys" in text:
            want = nums[0] + nums[1] - nums[2]
        elif "loose" in text:
            want = nums[0] * nums[1] + nums[2]
        else:
            want = nums[0] * nums[1] - nums[2]
        assert want == int(row["answer"]) >= 0, text
    reward = math_reward([ds[0]["prompt"]] * 2,
                         [[{"role": "assistant", "content": f"so \\boxed{{{ds[0]['answer']}}}"}],
                          [{"role": "assistant", "content": "\\boxed{-1}"}]],
                         answer=[ds[0]["answer"]] * 2)
    assert reward == [1.0, 0.0]


def test_arithmetic_format_and_difficulty_spread():
    ds = build_dataset("arithmetic", n=200, seed=0)
    assert set(ds["difficulty"]) == {1, 2, 3, 4, 5}
    assert ds[0]["prompt"].endswith("=") and len(ds[0]["prompt"]) <= 8
    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul}
    for row in ds:
        a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", row["prompt"]).groups()
        assert ops[op](int(a), int(b)) == int(row["answer"]) >= 0
    assert arithmetic_reward(ds["prompt"], ds["answer"], answer=ds["answer"]) == [1.0] * len(ds)


def test_countdown_reference_answers_verify():
    rows = generate_problems("countdown", n=200, seed=0)
    for r in rows:
        assert check_countdown(r["answer"], r["numbers"], r["target"]), r
    ds = build_dataset("countdown", n=50, seed=0)
    assert countdown_reward(ds["prompt"], ds["answer"], **{c: ds[c] for c in ("numbers", "target")}) == [1.0] * 50


# ---------------------------------------------------------------- rewards
def test_arithmetic_reward():
    completions = ["19", " 19", "19 and more", "20", "", "abc", "1 9", [{"role": "assistant", "content": "19"}]]
    got = arithmetic_reward(["12+7="] * len(completions), completions, answer=["19"] * len(completions))
    assert got == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert all(isinstance(x, float) for x in got)


MALICIOUS = [
    "__import__('os')",
    "__import__('os').system('echo pwned')",
    "(lambda: 22)()",
    "open('/etc/passwd').read()",
    "3*5+7; import os",
    "7**2",
    "[3, 5, 7]",
    "3 if 1 else 5",
    "True+21",
    "(" * 5000 + "22" + ")" * 5000,
    "9" * 10000,
]


def test_countdown_reward_accepts_and_rejects(monkeypatch):
    def no_eval(*a, **k):
        raise AssertionError("eval/exec must never be called")

    monkeypatch.setattr(builtins, "eval", no_eval)
    monkeypatch.setattr(builtins, "exec", no_eval)
    prompt, nums, target = "use 3 5 7 to make 22:", [3, 5, 7], 22
    good = ["3*5+7", " 7+5*3", "(3*5)+7 = 22", "<answer>7+3*5</answer>", "3*5+7\nmore text"]
    bad = ["3*5+7+7", "3*5+8", "22", "15+7", "3*5+7/0", "", "3 5 7"] + MALICIOUS
    completions = good + bad
    n = len(completions)
    got = countdown_reward([prompt] * n, completions, numbers=[nums] * n, target=[target] * n)
    assert got == [1.0] * len(good) + [0.0] * len(bad)
    # numbers/target parsed from the prompt when the columns are absent
    assert countdown_reward([prompt, prompt], ["5*3+7", "__import__('os')"]) == [1.0, 0.0]
    # exact division
    assert check_countdown("(6/4)*4", [6, 4, 4], 6) and not check_countdown("6/4", [6, 4], 1)


def test_math_reward_latex():
    completions = [
        "so the answer is \\boxed{\\frac{1}{2}}",
        "The answer is $\\frac{1}{2}$.",
        "we get \\boxed{3}",
        "hence \\boxed{\\sqrt{2}}",
        "no idea",
        [{"role": "assistant", "content": "thus \\boxed{x^2 + 2x + 1}"}],
    ]
    golds = ["0.5", "\\frac12", "2", "$\\sqrt{2}$", "7", "(x+1)^2"]
    got = math_reward([""] * len(golds), completions, answer=golds)
    assert got == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert math_reward(["", ""], ["\\boxed{1}", "\\boxed{1}"], answer=[None, "\\boxed{}"]) == [0.0, 0.0]


def test_math_reward_grades_an_equation_on_its_stated_result():
    """math-verify's plain-text extraction stops at "=": "The final answer is 10 + 23 = 22." parsed as 10 + 23 and
    earned the reward (26.8% of held-out samples of one learning run stated such a wrong result). The stated
    result is graded now, as math-verify grades the same equation in LaTeX."""
    completions = [
        "Hana has 10 cards.\nShe gets 23 more.\nThe final answer is 10 + 23 = 22.",  # from a learning run
        "Hana has 10 cards.\nShe gets 23 more.\nThe final answer is 10 + 23 = 33.",
        "The final answer is 10 + 23 = 33 cards.",
        "The final answer is 10 + 23 = 22 = 33.",  # a chain: its last right-hand side
        "The final answer is 10 + 23 =",  # cut at the token cap: no answer stated
        "The final answer is 10 + 23\n= 22",
        "The final answer is $10 + 23 = 22$.",  # LaTeX: math-verify's own right-hand side
        "The final answer is \\boxed{33}.",
        "So 10 + 23 = 33 cards.",
        "The final answer is 33, since 10 + 20 = 30.",  # the answer, then other arithmetic: the answer
    ]
    got = math_reward([""] * len(completions), completions, answer=["33"] * len(completions))
    assert got == [0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    # math-verify stops at "x" too: "70 x 8 = 560" read as 70 refused a right answer
    assert math_reward(["", ""], ["The final answer is 70 x 8 = 560 apples.", "The final answer is 1 x 14 = 14."],
                       answer=["560", "14"]) == [1.0, 1.0]
    assert stated_answer("The final answer is 10 + 23 = 22.")[1] == "22"
    assert stated_answer("Ben has 33 cards.")[1] == "33"  # no equation: math-verify's parse as it is


def test_math_number_reward_refuses_an_expression_left_for_the_verifier():
    """A learning run (SARA, seed 4) learned to stop at "90 - 4": math-verify evaluates it to the gold, so
    `math_reward` pays it (as TRL's accuracy_reward would); `math_number_reward` pays numbers only."""
    completions = [
        "Dara gives 4 stickers away, so Dara has 90 - 4 stickers left.",  # from the run
        "Jo has 90 stickers, so Jo has 90 - 4 stickers left.\n\nThe final answer is 90 - 4 stickers.",
        "Dara has 90 - 4 = 86 stickers left.",
        "The final answer is \\boxed{86}.",
        "The final answer is 86.",
        "The final answer is 90 - 4 = 85.",
    ]
    golds = ["86"] * len(completions)
    assert math_reward([""] * 6, completions, answer=golds) == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert math_number_reward([""] * 6, completions, answer=golds) == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    # fractions, decimals, negatives and thousands separators are numbers
    assert math_number_reward([""] * 4, ["The answer is $\\frac{1}{2}$.", "The final answer is 0.5.",
                                         "The final answer is -3.", "So the total is 1,234 apples."],
                              answer=["1/2", "0.5", "-3", "1234"]) == [1.0, 1.0, 1.0, 1.0]


def test_reward_names():
    assert [f.__name__ for f in (arithmetic_reward, countdown_reward, math_reward)] == [
        "arithmetic_reward", "countdown_reward", "math_reward"]


# ---------------------------------------------------------------- tokenizer
def test_tokenizer_round_trip():
    from trl_alloc.tasks.tiny import build_tokenizer

    tok = build_tokenizer()
    for text in ["12+7=19", "use 3 5 7 to make 22:", "(3*5)-7/2", "a b\nc  d"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.padding_side == "left" and tok.pad_token == "<pad>" and tok.eos_token == "<eos>"
    assert len({tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}) == 3
    batch = tok(["1+1=", "12+13="], padding=True)
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2 and batch["attention_mask"][0][:2] == [0, 0]
    assert tok.decode(tok("19", add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                      skip_special_tokens=True) == "19"


def test_warm_up_estimates():
    """The warm-up corpus's rough-estimate style: "~" + the value rounded at its leading digit."""
    from trl_alloc.tasks.tiny import estimate_answer, with_estimates

    assert [estimate_answer(a) for a in ["42", "7", "0", "155", "96", "1234", "45"]] == \
        ["~40", "~10", "~0", "~200", "~100", "~1000", "~40"]
    assert arithmetic_reward(["40+2="], ["~40"], answer=["42"]) == [0.0]  # an estimate is not the answer
    assert arithmetic_reward(["30+10="], ["~40"], answer=["40"]) == [1.0]  # unless it is exact
    data = build_dataset("arithmetic", n=2000, seed=0)
    noisy = with_estimates(data, 0.4, seed=3)
    changed = [a != b for a, b in zip(data["answer"], noisy["answer"])]
    assert all(b.startswith("~") for b, c in zip(noisy["answer"], changed) if c)
    assert 0.35 < sum(a.startswith("~") for a in noisy["answer"]) / 2000 < 0.45
    assert noisy["answer"] == with_estimates(data, 0.4, seed=3)["answer"]  # deterministic
    assert noisy["prompt"] == data["prompt"]
    with pytest.raises(ValueError, match="estimate_fraction"):
        with_estimates(data, 1.5)


# ---------------------------------------------------------------- tiny model
def test_tiny_model_reloads_offline(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.tasks.tiny import get_tiny_model_dir

    files = set(os.listdir(tiny_dir))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= files
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.tie_word_embeddings and cfg.vocab_size == len(tok)
    assert cfg.hidden_size // cfg.num_attention_heads == 64 and cfg.max_position_embeddings == 128
    gen = json.loads((Path(tiny_dir) / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id and gen["pad_token_id"] == tok.pad_token_id
    assert tok.padding_side == "left" and tok.decode(tok("12+7=")["input_ids"]) == "12+7="
    # cached: a second call returns the same directory without rebuilding
    mtime = os.path.getmtime(Path(tiny_dir) / "model.safetensors")
    assert get_tiny_model_dir(cache_dir=Path(tiny_dir).parent) == tiny_dir
    assert os.path.getmtime(Path(tiny_dir) / "model.safetensors") == mtime


def test_tiny_model_success_rates_are_spread(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.evaluation import TransformersBackend, answer_spec, evaluate

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
    test = build_dataset("arithmetic", n=32, seed=0, split="test")

    def rates(ds, n):
        res = evaluate(TransformersBackend(model, tok), tok, ds, arithmetic_reward, answer_spec("arithmetic"),
                       num_samples=n, max_new_tokens=8, progress=False)
        return [p["num_correct"] / n for p in res.per_prompt]

    per_prompt = rates(test, 8)
    mean = sum(per_prompt) / len(per_prompt)
    print(f"\nmean accuracy {mean:.3f}, mixed prompts {sum(0 < r < 1 for r in per_prompt)}")
    assert len(per_prompt) == 32
    assert 0.15 <= mean <= 0.75
    assert sum(0 < r < 1 for r in per_prompt) >= 5
    assert sum(0.1 <= r <= 0.9 for r in per_prompt) >= 4
    assert rates(test.select(range(8)), 4) == rates(test.select(range(8)), 4)  # deterministic given the seed


def test_default_cache_dir_env(monkeypatch, tmp_path):
    from trl_alloc.tasks.tiny import default_cache_dir

    monkeypatch.setenv("TRL_ALLOC_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TRL_ALLOC_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "trl_alloc"


def test_concurrent_builds_share_one_directory(tmp_path):
    """Two processes asking for the same (very small) model at once: one builds, both get it."""
    code = ("import sys; from trl_alloc.tasks.tiny import get_tiny_model_dir; "
            "print(get_tiny_model_dir(sys.argv[1], progress=False, n_train=64, warmup_steps=3, batch_size=8))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    paths = {o[0].strip().splitlines()[-1] for o in outs}
    assert len(paths) == 1
    built = [d for d in os.listdir(tmp_path) if not d.endswith(".lock")]
    assert built == [Path(paths.pop()).name]  # no leftover temporary directory


def estimate_share(samples_jsonl):
    """Share of sampled held-out answers written as a rough estimate ("~40")."""
    comps = [c for line in Path(samples_jsonl).open() for c in json.loads(line)["completions"]]
    return sum(c.lstrip().startswith("~") for c in comps) / len(comps)


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_readme_main_command_improves_held_out_accuracy(tiny_dir, tmp_path):
    """The README's main command (CERO + SARA on the tiny model, the shipped recipe) teaches the model
    to answer exactly instead of with a rough estimate, on held-out prompts too.

    Margins from 10 seeds (docs/benchmarks.md): the estimate share falls from 0.36-0.38 to
    0.068-0.087 (ratio <= 0.23; asserted <= 0.5) and accuracy rises +0.033 ... +0.074 (mean +0.058,
    sd 0.012; asserted >= +0.015). lr 0, zeroed advantages and shuffled rewards fail both."""
    out = tmp_path / "demo"
    env = {**os.environ, "TRL_ALLOC_CACHE": str(Path(tiny_dir).parent), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "run_demo.sh"), "--output_dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "allocation" / "summary.json").read_text())
    before, after = summary["held_out_accuracy_before"], summary["held_out_accuracy_after"]
    est_before, est_after = (estimate_share(out / "eval" / phase / "samples.jsonl") for phase in ("before", "after"))
    print(f"\nheld-out accuracy {before:.4f} -> {after:.4f}; estimates {est_before:.3f} -> {est_after:.3f}; "
          f"spent {summary['responses_spent']} responses")
    assert re.search(r"held-out accuracy after training: +[0-9.]+ \(before [0-9.]+, [+-]0\.\d+\)", proc.stdout)
    assert est_after <= 0.5 * est_before
    assert after - before >= 0.015
    assert summary["held_out_prompts"] == 200 and summary["held_out_samples"] == 16
    assert 0.98 * 40 * 256 <= summary["responses_spent"] <= 40 * 256 and summary["rounds"] == 40
    assert (out / "model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_bench_quick_writes_table_json_and_plots(tiny_dir, tmp_path):
    """scripts/bench.py at a few rounds: every method spends the same budget, random-matched
    replays CERO's per-round sizes, and the table, JSON and plots are written."""
    out = tmp_path / "bench"
    env = {**os.environ, "TRL_ALLOC_CACHE": str(Path(tiny_dir).parent), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--rounds", "3",
                           "--eval_prompts", "16", "--methods", "stock,dapo,random_matched,cero_sara",
                           "--output_dir", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads((out / "bench.json").read_text())
    runs = {r["method"]: r for r in payload["runs"]}
    assert set(runs) == {"stock", "dapo", "cero", "random_matched", "cero_sara"}  # cero added for the replay
    budget = 3 * 256
    assert runs["stock"]["responses"] == runs["cero"]["responses"] == budget
    assert all(r["responses"] <= budget for r in runs.values())
    per_round = lambda m: [h["responses"] for h in runs[m]["history"]]  # noqa: E731
    assert per_round("random_matched") == per_round("cero")
    assert payload["summary"]["dapo"]["rpe_ratio_vs_dapo"][0] == 1.0
    assert 0.0 <= payload["start_checkpoint"]["avg"][0] <= 1.0
    table = (out / "bench.md").read_text()
    assert "| CERO+SARA | 1 |" in table and "Start checkpoint: avg@4" in table
    lift = runs["cero_sara"]["selection"]["lift"]
    assert len(lift) == 5 and sum(runs["cero_sara"]["selection"]["chosen_per_bin"]) > 0
    for name in ("egr_vs_budget", "pacing_gap", "responses_per_effective_group", "heldout_avg_at_k",
                 "selection_lift", "qhat_vs_variance"):
        assert (out / f"{name}.png").stat().st_size > 1000
    # --from_json re-draws the same table and plots without training; a file that is not a bench.json is named
    redo = tmp_path / "redo"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--from_json", str(out / "bench.json"),
                           "--output_dir", str(redo)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (redo / "bench.md").read_text() == table and (redo / "selection_lift.png").exists()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--from_json",
                           str(out / "egr_vs_budget.png"), "--output_dir", str(redo)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "cannot read it as a bench.json" in proc.stderr


def test_countdown_tiny_model_builds_without_estimates(tmp_path):
    """The estimate style is arithmetic's; a Countdown build keeps its reference expressions."""
    from transformers import AutoModelForCausalLM

    from trl_alloc.tasks.tiny import get_tiny_model_dir

    path = get_tiny_model_dir(tmp_path, task="countdown", progress=False, n_train=64, warmup_steps=3, batch_size=8)
    info = json.loads((Path(path) / "trl_alloc_build.json").read_text())
    assert info["config"]["task"] == "countdown" and info["num_parameters"] > 0
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "qwen2"
