"""Held-out evaluation (trl_alloc/evaluation/, scripts/eval.py): metric math by hand and by brute
force, then one small end-to-end run of a randomly initialised tiny Qwen2 through transformers."""

import itertools
import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from trl_alloc import evaluation as ev  # noqa: E402
from trl_alloc.evaluation import (  # noqa: E402
    answer_spec, compute_metrics, group_answers, maj_at_k, pass_at_k, vote)



# ---------------------------------------------------------------- pass@k


def brute_pass_at_k(n, c, k):
    """Fraction of the C(n, k) size-k subsets of n samples (c correct) holding a correct sample."""
    flags = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(flags[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    # large n stays finite and matches the closed form
    assert pass_at_k(200, 7, 16) == pytest.approx(1 - math.comb(193, 16) / math.comb(200, 16), rel=1e-10)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="correct samples"):
        pass_at_k(3, 4, 1)


# ---------------------------------------------------------------- maj@k


def test_vote_ties_go_to_first_appearance_and_none_abstains():
    assert vote([0, 1, 1, 0]) == 0  # 2-2 tie: the answer seen first
    assert vote([1, 0, 0, 1]) == 0  # index of group 1's first member is 0 as well
    assert vote([None, 1, 0, 0, 1]) == 1  # tie 2-2, group 1 appears first (index 1)
    assert vote([None, None]) is None
    assert vote([None, 3, 2, 2]) == 2  # plain majority


def test_maj_at_k_with_ties_by_hand():
    # answers A B B B, only B correct
    groups, correct = [0, 1, 1, 1], [False, True, True, True]
    assert maj_at_k(correct, groups, 4) == 1.0
    assert maj_at_k(correct, groups, 2) == 0.5  # blocks [A, B] (tie -> A, wrong) and [B, B] (right)
    assert maj_at_k(correct, groups, 1) == 0.75  # maj@1 = mean correctness
    assert maj_at_k(correct, groups, 3) == 1.0  # one block [A, B, B]; the 4th sample is unused
    # a block where nobody gives an answer scores 0
    assert maj_at_k([False, False, True, True], [None, None, 0, 0], 2) == 0.5
    # tie between a right and a wrong answer: the first seen wins
    assert maj_at_k([True, False, False, True], [0, 1, 1, 0], 4) == 1.0
    assert maj_at_k([False, True, True, False], [0, 1, 1, 0], 4) == 0.0
    with pytest.raises(ValueError, match="k <= n"):
        maj_at_k([True], [0], 2)


def test_head_weighted_vote_changes_the_answer():
    # answers A A B; A (wrong) has the plain majority, the head ranks B first
    groups, correct = [0, 0, 1], [False, False, True]
    scores = [0.1, 0.2, 0.9]  # rank weights: 0, 0.5, 1 -> A 0.5 vs B 1.0
    assert maj_at_k(correct, groups, 3) == 0.0
    assert maj_at_k(correct, groups, 3, scores) == 1.0
    # equal scores: every weight is 0.5, so the weighted vote is the plain vote
    assert maj_at_k(correct, groups, 3, [0.3, 0.3, 0.3]) == 0.0
    # weights are ranked within each block: blocks [A, B] and [A, B] with B scored higher in each
    g2, c2, s2 = [0, 1, 0, 1], [False, True, False, True], [5.0, 6.0, -3.0, -2.0]
    assert maj_at_k(c2, g2, 2) == 0.0  # ties -> A, first seen
    assert maj_at_k(c2, g2, 2, s2) == 1.0


def test_compute_metrics_by_hand():
    # prompt 0: n=4, answers 5 5 7 None (5 right) ; prompt 1: answers 3 4 4 3 (3 right)
    rewards = [[1, 1, 0, 0], [1, 0, 0, 1]]
    groups = [[0, 0, 1, None], [0, 1, 1, 0]]
    scores = [[0.0, 0.1, 0.2, 0.3], [0.0, 0.9, 0.8, 0.1]]
    m = compute_metrics(rewards, groups, [1, 2, 4], scores)
    assert m[1]["avg"] == pytest.approx(0.5) and m[4]["avg"] == pytest.approx(0.5)
    assert m[1]["pass"] == pytest.approx(0.5)
    assert m[2]["pass"] == pytest.approx(1 - 1 / 6)  # each prompt: c=2 of 4 -> 1 - C(2,2)/C(4,2)
    assert m[4]["pass"] == 1.0
    assert m[1]["maj"] == pytest.approx(0.5)
    # prompt 0: blocks [5,5] right, [7,None] wrong -> 0.5; prompt 1: [3,4] tie -> 3 right, [4,3] tie -> 4 wrong
    assert m[2]["maj"] == pytest.approx(0.5)
    # k=4: prompt 0 -> 5 (right); prompt 1 -> 2-2 tie -> 3 (right)
    assert m[4]["maj"] == 1.0
    # head, k=4, prompt 1: weights 0, 1, 2/3, 1/3 -> 3: 1/3, 4: 5/3 -> 4 (wrong); prompt 0: 5: 0+1/3, 7: 2/3 -> 7
    assert m[4]["head_maj"] == 0.0
    assert set(compute_metrics(rewards, groups, [2])[2]) == {"avg", "pass", "maj"}
    with pytest.raises(ValueError, match="num_samples"):
        compute_metrics(rewards, groups, [8])


# ---------------------------------------------------------------- answers


def test_answer_extraction_and_grouping():
    arith = answer_spec("arithmetic")
    assert [arith.extract(t) for t in ["12", " -3 apples", "x", ""]] == [12, -3, None, None]
    assert group_answers([12, 7, None, 12, 7, 9]) == [0, 1, None, 0, 1, 2]
    cd = answer_spec("countdown")
    assert cd.extract("3 * 5 + 7 = 22") == "3*5+7"
    assert cd.extract("") is None
    # a custom equality joins the first group whose first member matches
    close = group_answers([1.0, 1.05, 2.0, 0.98], equal=lambda a, b: abs(a - b) < 0.1)
    assert close == [0, 0, 1, 0]
    with pytest.raises(ValueError, match="no answer extraction"):
        answer_spec("poetry")
    # a reward's answer type, by --reward name or function name (a user's reward: math)
    assert [ev.answer_type(r) for r in ("arithmetic", "countdown_reward", "math", "math_number_reward", "judge")] == [
        "arithmetic", "countdown", "math", "math", "math"]


def test_math_answers_group_by_equivalence():
    pytest.importorskip("math_verify")
    spec = answer_spec("math")
    answers = [spec.extract(t) for t in ["$\\frac{1}{2}$", "0.5", "$3$", "no idea"]]
    assert answers[3] is None
    assert group_answers(answers, spec.equal) == [0, 0, 1, None]
    stated = [spec.extract(t) for t in ["The final answer is 10 + 23 = 22.", "22", "The final answer is 33."]]
    assert group_answers(stated, spec.equal) == [0, 0, 1]  # an equation votes for its stated result


def test_score_fn_gets_token_ids_only_when_it_accepts_them():
    seen = {}

    def plain(prompts, completions):
        return [len(c) for c in completions]

    def with_ids(prompts, completions, completion_ids=None, **kwargs):
        seen.update(kwargs, completion_ids=completion_ids)
        return [float(len(c)) for c in completion_ids]

    assert ev.core._call_score_fn(plain, ["p"], ["abc"], [[1]], [[2, 3]]).tolist() == [3.0]
    assert ev.core._call_score_fn(with_ids, ["p"], ["abc"], [[1]], [[2, 3]]).tolist() == [2.0]
    assert seen == {"completion_ids": [[2, 3]], "prompt_ids": [[1]]}
    with pytest.raises(ValueError, match="one score per completion"):
        ev.core._call_score_fn(lambda p, c: [1.0, 2.0], ["p"], ["a"], [[1]], [[2]])
    with pytest.raises(ValueError, match="non-finite"):
        ev.core._call_score_fn(lambda p, c: [float("nan")], ["p"], ["a"], [[1]], [[2]])


# ---------------------------------------------------------------- end to end (tiny random Qwen2)


def _load_eval_script():
    from trl_alloc.cli import eval as script

    return script


def test_evaluate_end_to_end_transformers(tiny_random_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.tasks.rewards import arithmetic_reward
    from trl_alloc.tasks.builtin import build_dataset

    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir)
    tok = AutoTokenizer.from_pretrained(tiny_random_dir)
    data = build_dataset("arithmetic", n=5, seed=0, split="test")
    backend = ev.TransformersBackend(model, tok, batch_size=8)
    res = ev.evaluate(backend, tok, data, arithmetic_reward, answer_spec("arithmetic"), ks=[1, 2, 4],
                      max_new_tokens=4, seed=0, progress=False,
                      score_fn=lambda prompts, completions: [float(len(c)) for c in completions],
                      info={"model": "random", "dataset": "builtin:arithmetic", "split": "test"})
    assert set(res.metrics) == {1, 2, 4}
    for k, row in res.metrics.items():
        assert set(row) == {"avg", "pass", "maj", "head_maj"}
        assert all(0.0 <= v <= 1.0 for v in row.values())
    assert res.metrics[1]["pass"] <= res.metrics[4]["pass"]
    assert len(res.per_prompt) == 5 and all(len(r["completions"]) == 4 for r in res.per_prompt)
    assert all(reason in ("stop", "length") for r in res.per_prompt for reason in r["finish_reasons"])
    # same seed, same samples
    again = ev.evaluate(backend, tok, data, arithmetic_reward, answer_spec("arithmetic"), ks=[4],
                        max_new_tokens=4, seed=0, progress=False)
    assert [r["completions"] for r in again.per_prompt] == [r["completions"] for r in res.per_prompt]

    # greedy: one decode per prompt, replicated n times (generate refuses num_return_sequences > 1)
    greedy = ev.evaluate(backend, tok, data, arithmetic_reward, answer_spec("arithmetic"), ks=[1, 2],
                         temperature=0.0, max_new_tokens=4, progress=False)
    assert all(len(set(r["completions"])) == 1 for r in greedy.per_prompt)
    assert greedy.metrics[2]["pass"] == greedy.metrics[1]["avg"]

    paths = ev.write_outputs(res, str(tmp_path / "out"))
    table = Path(paths["table"]).read_text()
    assert "| pass@k |" in table and "| head-weighted maj@k |" in table and "k=4" in table
    saved = json.loads(Path(paths["json"]).read_text())
    assert saved["metrics"]["4"]["pass"] == pytest.approx(res.metrics[4]["pass"])
    assert saved["info"]["num_samples"] == 4 and saved["info"]["backend"] == "transformers"
    assert len(Path(paths["samples"]).read_text().splitlines()) == 5


def test_regrade_scores_written_samples_again(tiny_random_dir, tmp_path):
    """The same verifier reproduces an evaluation's avg@k exactly; a corrected one re-scores its samples."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.tasks.builtin import build_dataset
    from trl_alloc.tasks.rewards import arithmetic_reward, math_reward

    tok = AutoTokenizer.from_pretrained(tiny_random_dir)
    data = build_dataset("arithmetic", n=6, seed=1, split="test")
    res = ev.evaluate(ev.TransformersBackend(AutoModelForCausalLM.from_pretrained(tiny_random_dir), tok), tok, data,
                      arithmetic_reward, answer_spec("arithmetic"), ks=[2], max_new_tokens=4, seed=0, progress=False)
    samples = ev.write_outputs(res, str(tmp_path / "out"))["samples"]
    assert ev.regrade(samples, arithmetic_reward) == res.metrics[2]["avg"]

    rows = [{"prompt": [{"role": "user", "content": "Hana has 10 cards. She gets 23 more. How many?"}], "answer": "33",
             "completions": ["The final answer is 10 + 23 = 22.", "The final answer is 10 + 23 = 33."]},
            {"prompt": [{"role": "user", "content": "Ben has 5 books. He gives 2 away. How many?"}], "answer": "3",
             "completions": ["The final answer is 5 - 2 = 3 books.", "no idea"]}]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ev.regrade(str(path), math_reward) == 0.5  # the stated "= 22" is wrong, whatever 10 + 23 is
    with pytest.raises(ValueError, match="no samples"):
        (tmp_path / "empty.jsonl").write_text("")
        ev.regrade(str(tmp_path / "empty.jsonl"), math_reward)


def test_eval_script_writes_table_and_json(tiny_random_dir, tmp_path, capsys):
    script = _load_eval_script()
    out = tmp_path / "eval"
    res = script.main(["--model", tiny_random_dir, "--dataset", "builtin:arithmetic", "--split", "test",
                       "--num_prompts", "4", "--k", "1", "2", "--max_new_tokens", "3", "--output_dir", str(out),
                       "--no_progress"])
    printed = capsys.readouterr().out
    assert "| maj@k |" in printed and "head-weighted" not in printed
    saved = json.loads((out / "eval_results.json").read_text())
    assert set(saved["metrics"]) == {"1", "2"} and saved["info"]["num_prompts"] == 4
    assert (out / "eval_table.md").read_text().strip() == saved["table"].strip()
    assert res.metrics[2]["pass"] >= res.metrics[1]["pass"]
    assert (saved["info"]["reward"], saved["info"]["answer_type"]) == ("arithmetic_reward", "arithmetic")


def test_eval_script_scores_numbers_only_with_reward_math_number(tiny_random_dir, tmp_path):
    """--reward math_number: math answers extracted as math, a stated expression ("90 - 4") scores 0."""
    from trl_alloc.tasks.data import reward_for_dataset

    data = tmp_path / "stickers.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Dara has 90 stickers and gives {k} away. How many are left?",
                                        "answer": str(90 - k)}) + "\n" for k in (4, 5)))
    res = _load_eval_script().main(["--model", tiny_random_dir, "--dataset", str(data), "--reward", "math_number",
                                    "--k", "1", "--max_new_tokens", "2", "--no_progress",
                                    "--output_dir", str(tmp_path / "eval")])
    assert (res.info["reward"], res.info["answer_type"]) == ("math_number_reward", "math")
    reward = reward_for_dataset(str(data), "math_number")  # what train.py --reward math_number trains with
    assert reward.__name__ == "math_number_reward"
    assert reward(["", ""], ["so Dara has 90 - 4 stickers left.", "Dara has 86 stickers left."],
                  answer=["86", "86"]) == [0.0, 1.0]
    with pytest.raises(ValueError, match="no reward for task 'numbers'.*'math_number'"):
        reward_for_dataset(str(data), "numbers")


def test_eval_script_head_column(tiny_random_dir, tmp_path, capsys):
    script = _load_eval_script()
    args = ["--model", tiny_random_dir, "--dataset", "builtin:arithmetic", "--num_prompts", "3", "--k", "2",
            "--max_new_tokens", "3", "--no_progress"]
    head_dir = tmp_path / "head"
    from trl_alloc.rollout.quality_head import QualityHead

    QualityHead(hidden_size=32, head_hidden_size=8, detect_length=1).save_pretrained(head_dir)
    res = script.main(args + ["--head", str(head_dir), "--output_dir", str(tmp_path / "with_head")])
    assert "head_maj" in res.metrics[2]
    assert "| head-weighted maj@k |" in capsys.readouterr().out
    assert all(len(r["head_scores"]) == 2 for r in res.per_prompt)


def test_eval_script_evaluates_the_held_out_set_a_training_run_used(tiny_random_dir, tmp_path):
    """--builtin_levels with the run's --seed and num_eval_prompts: the prompts train.py held out, in its order."""
    from trl_alloc.tasks.data import load_train_and_test

    script = _load_eval_script()
    res = script.main(["--model", tiny_random_dir, "--dataset", "builtin:arithmetic", "--builtin_levels", "2", "3",
                       "--seed", "3", "--num_prompts", "6", "--k", "1", "--max_new_tokens", "2",
                       "--output_dir", str(tmp_path / "eval"), "--no_progress"])
    held_out = load_train_and_test("builtin:arithmetic", num_test=6, num_builtin=64, seed=3, levels=(2, 3)).test
    assert [r["prompt"] for r in res.per_prompt] == held_out["prompt"]
    assert sorted(set(held_out["difficulty"])) == [2, 3]
    other = load_train_and_test("builtin:arithmetic", num_test=6, num_builtin=64, seed=3).test
    assert other["prompt"] != held_out["prompt"]  # without the levels, another set: the flag matters
