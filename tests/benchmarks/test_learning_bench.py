"""The learning-regime benchmark (trl_alloc/benchmarks/learning.py, scripts/bench_learning.py): its figures on
constructed curves, exactly, and the whole bench on local jsonl files with the embedded model."""

import json
import math
import os
import subprocess
import sys

import pytest
from scipy.stats import chi2, f, t

from helpers import ROOT
from trl_alloc.benchmarks.learning import (accuracy_at, code_commit, compare, cost_to_reach, endpoint,
                                          held_out_details, markdown_table, mean_curve, method_flags, paired,
                                          power_lines, sd_comparison_lines, sd_interval, seeds_for_half_width,
                                          truncation_lines)

CURVE = [{"responses": 0, "seconds": 0.0, "accuracy": 0.10}, {"responses": 100, "seconds": 20.0, "accuracy": 0.20},
         {"responses": 200, "seconds": 50.0, "accuracy": 0.30}, {"responses": 300, "seconds": 60.0, "accuracy": 0.25}]


def test_cost_to_reach_interpolates_the_first_crossing():
    assert cost_to_reach(CURVE, 0.25, "responses") == pytest.approx(150.0)
    assert cost_to_reach(CURVE, 0.25, "seconds") == pytest.approx(35.0)
    assert cost_to_reach(CURVE, 0.30, "responses") == 200.0  # reached at an evaluation; the later dip is ignored
    assert cost_to_reach(CURVE, 0.05, "responses") == 0.0
    assert cost_to_reach(CURVE, 0.31, "responses") == math.inf


def test_paired_is_the_student_t_interval():
    p = paired([1.0, 2.0, 4.0, math.inf])
    half = t.ppf(0.975, 2) * math.sqrt(7 / 3) / math.sqrt(3)
    assert (p["n"], p["n_inf"]) == (3, 1) and p["mean"] == pytest.approx(7 / 3)
    assert (p["low"], p["high"]) == pytest.approx((7 / 3 - half, 7 / 3 + half))
    assert paired([math.inf])["mean"] is None


def test_the_endpoint_is_the_mean_accuracy_at_half_three_quarters_and_all_of_the_budget():
    """Accuracy at 150 / 225 / 300 of a 300-response budget, linear between evaluations; a run that spent less
    than its budget is read at its own spend (its last point)."""
    assert accuracy_at(CURVE, 150) == pytest.approx(0.25) and accuracy_at(CURVE, 225) == pytest.approx(0.2875)
    assert accuracy_at(CURVE, 0) == 0.10 and accuracy_at(CURVE, 300) == 0.25 and accuracy_at(CURVE, 999) == 0.25
    assert endpoint({"held_out_curve": CURVE, "budget_responses": 300}) == pytest.approx((0.25 + 0.2875 + 0.25) / 3)
    short = {"held_out_curve": CURVE[:3], "budget_responses": 300}  # stopped at 200 of 300 responses
    assert endpoint(short) == pytest.approx((0.25 + 0.30 + 0.30) / 3)


def test_the_mean_curve_averages_runs_at_the_same_shares_of_their_budget():
    """Evaluations at other spends (CURVE at 100 / 200 / 300, a shorter run stopped at 200) are read at the same
    shares of the budget, linear between evaluations; a run that spent less at its own last point."""
    short = {"held_out_curve": CURVE[:3], "budget_responses": 300}
    runs = [{"held_out_curve": CURVE, "budget_responses": 300}, short]
    assert mean_curve(runs, (0.0, 0.5, 1.0)) == pytest.approx([0.10, (0.25 + 0.25) / 2, (0.25 + 0.30) / 2])


def test_seeds_for_a_half_width_invert_the_student_t_interval():
    n = seeds_for_half_width(0.09, 0.04)
    assert t.ppf(0.975, n - 1) * 0.09 / math.sqrt(n) <= 0.04 < t.ppf(0.975, n - 2) * 0.09 / math.sqrt(n - 1)
    assert 20 <= n <= 25  # about (1.96 * 9 / 4)^2 = 19.4, plus the t distribution's wider tails
    assert seeds_for_half_width(0.01, 0.04) == 3  # two seeds: t(0.975, 1) = 12.7 widens the interval to ±9 pp


def test_the_record_names_the_commit_of_the_code_that_ran():
    """In a git clone (CI's, a developer's): the 40-hex HEAD, with `-dirty` where tracked files differ."""
    commit = code_commit()
    if not (ROOT / ".git").exists():
        assert commit is None
        return
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert commit is not None and commit.removesuffix("-dirty") == head and len(head) == 40


def test_the_record_names_the_machine_that_ran():
    """The CPU, its cores and the instruction set torch dispatches to: floats, and RL trajectories, differ by them."""
    import torch

    from trl_alloc.benchmarks.learning import machine

    got = machine()
    assert got["isa"] == torch.backends.cpu.get_cpu_capability() and got["cores"] == os.cpu_count()
    assert isinstance(got["cpu"], str) and got["cpu"] and got["amx"] == torch.cpu._is_amx_tile_supported()
    assert got["gpu"] is None or got["gpu"] == torch.cuda.get_device_name(0)
    assert json.loads(json.dumps(got)) == got  # as a record keeps it


def record(method, seed, curve, effective_groups=10):
    return {"method": method, "seed": seed, "held_out_accuracy_after": curve[-1]["accuracy"],
            "held_out_curve": curve, "effective_groups": effective_groups, "responses_spent": curve[-1]["responses"],
            "budget_responses": 300}


def test_compare_pairs_each_seed_against_stocks_final_accuracy():
    fast = [dict(p, accuracy=a) for p, a in zip(CURVE, (0.10, 0.30, 0.30, 0.35))]
    runs = [record("stock", 0, CURVE), record("cero_sara", 0, fast, 14),
            record("stock", 1, CURVE, 12), record("cero_sara", 1, CURVE[:2], 11)]  # seed 1: never reaches 0.25
    rows = compare(runs)
    assert rows["stock"]["responses_to_target_ratio"]["mean"] == 1.0
    ratio = rows["cero_sara"]["responses_to_target_ratio"]
    # seed 0: stock first reaches its final 0.25 at 150 responses, CERO+SARA at 75 (0.10 -> 0.30 over 0..100)
    assert (ratio["n"], ratio["n_inf"], ratio["mean"]) == (1, 1, pytest.approx(0.5))
    assert rows["cero_sara"]["seconds_to_target_ratio"]["mean"] == pytest.approx(15.0 / 35.0)
    assert rows["cero_sara"]["d_final"]["mean"] == pytest.approx(((0.35 - 0.25) + (0.20 - 0.25)) / 2)
    assert rows["cero_sara"]["d_effective_groups"]["mean"] == pytest.approx(((14 - 10) + (11 - 12)) / 2)
    assert rows["stock"]["effective_groups"]["mean"] == pytest.approx(11)
    table = markdown_table(rows)
    assert "| +1.5 [" in table.splitlines()[-1]  # CERO+SARA's effective-group difference, with its interval
    # the endpoint, paired: seed 0 (0.30 + 0.3125 + 0.35) / 3 against stock's 0.2625; seed 1 stops at 100 responses
    d = rows["cero_sara"]["d_endpoint"]
    assert d["mean"] == pytest.approx(((0.9625 / 3 - 0.7875 / 3) + (0.20 - 0.7875 / 3)) / 2)
    assert rows["cero_sara"]["spend_share"]["mean"] == pytest.approx((1.0 + 100 / 300) / 2)
    [line] = power_lines(rows)
    assert line.startswith("cero_sara: Δ endpoint paired SD")
    slow = compare([r for r in runs if r["seed"] == 1])  # the seeds that never reach stock's final are counted
    assert "| never (1 of 1) |" in markdown_table(slow).splitlines()[-1]
    assert f"needs {seeds_for_half_width(d['sd'], 0.04)} seeds" in line


def test_sd_interval_is_the_chi_square_interval():
    low, high = sd_interval(0.10, 6)
    assert low ** 2 == pytest.approx(5 * 0.01 / chi2.ppf(0.975, 5))
    assert high ** 2 == pytest.approx(5 * 0.01 / chi2.ppf(0.025, 5))
    assert 0.06 < low < 0.10 < 0.24 < high < 0.25  # six seeds: the SD itself is known to within about 0.6x-2.5x


def test_sd_comparison_tests_two_designs_spreads_with_an_f_test():
    def runs(diffs):
        out = []
        for seed, d in enumerate(diffs):
            base = [dict(p, accuracy=0.2) for p in CURVE]
            out += [record("stock", seed, base), record("sara", seed, [dict(p, accuracy=0.2 + d) for p in CURVE])]
        return out

    narrow, wide = compare(runs([0.00, 0.02, 0.04, 0.02])), compare(runs([-0.10, 0.10, 0.20]))
    [endpoint_line, final_line] = sd_comparison_lines(narrow, wide, "on-policy", "bf16")
    sd_a, sd_b = narrow["sara"]["d_endpoint"]["sd"], wide["sara"]["d_endpoint"]["sd"]
    assert sd_a == pytest.approx(math.sqrt(0.0008 / 3)) and sd_b == pytest.approx(0.152753, rel=1e-5)
    ratio = (sd_a / sd_b) ** 2
    p = 2 * f.cdf(ratio, 3, 2)
    (alo, ahi), (blo, bhi) = sd_interval(sd_a, 4), sd_interval(sd_b, 3)
    assert endpoint_line == (f"sara: Δ endpoint paired SD {100 * sd_a:.1f} pp [{100 * alo:.1f}, {100 * ahi:.1f}] "
                             f"over 4 seeds (on-policy) against 15.3 pp [{100 * blo:.1f}, {100 * bhi:.1f}] over 3 "
                             f"(bf16); variance ratio {ratio:.2f}, F-test p = {p:.2g}")
    assert final_line.startswith("sara: Δ final paired SD 1.6 pp")
    assert sd_comparison_lines(narrow, compare(runs([0.1])), "a", "b") == []  # one seed has no SD to compare


def test_cpu_seconds_are_compared_only_where_both_runs_measured_them():
    """CPU seconds are paired like seconds, on the seeds whose stock and method runs both recorded them (older run
    files have none)."""
    cpu = [dict(p, cpu_seconds=3 * p["seconds"]) for p in CURVE]
    fast = [dict(p, accuracy=a) for p, a in zip(cpu, (0.10, 0.30, 0.30, 0.35))]
    runs = [record("stock", 0, cpu), record("cero_sara", 0, fast),  # both measured: 45 / 105 CPU seconds
            record("stock", 1, CURVE), record("cero_sara", 1, fast)]  # stock's run has none: not paired
    rows = compare(runs)
    ratio = rows["cero_sara"]["cpu_seconds_to_target_ratio"]
    assert (ratio["n"], ratio["n_inf"], ratio["mean"]) == (1, 0, pytest.approx(45.0 / 105.0))
    assert rows["cero_sara"]["seconds_to_target_ratio"]["n"] == 2  # seconds: both seeds
    assert compare(runs[2:])["cero_sara"]["cpu_seconds_to_target_ratio"]["mean"] is None


def _eval_results(out, when, truncated, tokens):
    os.makedirs(out / "eval" / when)
    (out / "eval" / when / "eval_results.json").write_text(json.dumps(
        {"metrics": {"1": {"avg": 0.5}}, "info": {"truncated_rate": truncated, "mean_completion_tokens": tokens}}))


def test_held_out_details_read_each_evaluations_cut_share_from_its_outputs(tmp_path):
    curve = [dict(p, when=w) for p, w in zip(CURVE, ("before", "round-4", "round-8", "after"))]
    _eval_results(tmp_path, "before", 0.75, 60.5)
    _eval_results(tmp_path, "after", 0.125, 30.0)
    points = held_out_details(str(tmp_path), curve)
    assert [p.get("truncated_share") for p in points] == [0.75, None, None, 0.125]
    assert points[-1]["mean_completion_tokens"] == 30.0 and points[-1]["accuracy"] == CURVE[-1]["accuracy"]
    assert "truncated_share" not in curve[0]  # the record's curve is not changed in place


def test_truncation_lines_rank_each_seed_and_test_the_correlation_by_permutation():
    def run(method, seed, acc, cut):
        curve = [dict(p, accuracy=acc) for p in CURVE]
        curve[-1]["truncated_share"] = cut
        return record(method, seed, curve)

    runs = [run("stock", 0, 0.30, 0.05), run("sara", 0, 0.25, 0.10), run("cero_sara", 0, 0.20, 0.90)]
    lines = truncation_lines(runs)
    assert lines[0] == "seed 0: stock 30.0% (cut 5%) > sara 25.0% (cut 10%) > cero_sara 20.0% (cut 90%)"
    # three runs in the opposite order: rho = -1, and 2 of the 3! = 6 orderings are as extreme, so p = 1/3
    assert lines[1].endswith("Spearman -1.00 (permutation p = 0.33)")
    assert truncation_lines(runs[:1]) == ["seed 0: stock 30.0% (cut 5%)"]  # too few runs for a correlation
    assert truncation_lines([record("stock", 0, CURVE)]) == []  # records without the cut shares


def test_held_out_details_are_added_to_older_records_once(tmp_path, capsys):
    from trl_alloc.cli.bench_learning import main

    runs, work = tmp_path / "runs", tmp_path / "out" / "train"
    runs.mkdir()
    curve = [dict(p, when=w) for p, w in zip(CURVE, ("before", "round-4", "round-8", "after"))]
    (runs / "stock-s0.json").write_text(json.dumps(record("stock", 0, curve)))
    for when, cut in (("before", 0.5), ("round-4", 0.25), ("round-8", 0.125), ("after", 0.0)):
        _eval_results(work / "stock-s0", when, cut, 40.0)
    main(["--add_held_out_details", "--runs_dir", str(runs), "--output_dir", str(tmp_path / "out")])
    saved = json.loads((runs / "stock-s0.json").read_text())
    assert [p["truncated_share"] for p in saved["held_out_curve"]] == [0.5, 0.25, 0.125, 0.0]
    assert "held-out cut shares added" in capsys.readouterr().out
    main(["--add_held_out_details", "--runs_dir", str(runs), "--output_dir", str(tmp_path / "out")])
    assert "held-out cut shares added" not in capsys.readouterr().out  # already there: left as it is
    assert "| 0.0 |" in (tmp_path / "out" / "bench_learning.md").read_text()  # the table's last column


def test_regrade_into_scores_each_evaluation_again_and_keeps_the_runs_accuracy(tmp_path, capsys):
    """A run that learned to state wrong results ("10 + 23 = 22") scored by the verifier it trained with, then by
    this commit's: each evaluation re-scored from its samples, the run's own figure kept beside it."""
    from trl_alloc.cli.bench_learning import main

    runs, work = tmp_path / "runs", tmp_path / "out" / "train"
    runs.mkdir()
    curve = [dict(p, when=w) for p, w in zip(CURVE, ("before", "round-4", "round-8", "after"))]
    stock = dict(record("stock", 0, curve), held_out_accuracy_before=0.10)
    (runs / "stock-s0.json").write_text(json.dumps(stock))
    prompt = [{"role": "user", "content": "Hana has 10 cards. She gets 23 more. How many cards does she have?"}]
    for when, right in (("before", 1), ("round-4", 2), ("round-8", 3), ("after", 0)):
        _eval_results(work / "stock-s0", when, 0.0, 20.0)
        info = json.loads((work / "stock-s0" / "eval" / when / "eval_results.json").read_text())
        (work / "stock-s0" / "eval" / when / "eval_results.json").write_text(
            json.dumps({**info, "info": {**info["info"], "answer_type": "math"}}))
        completions = [f"The final answer is 10 + 23 = {33 if i < right else 22}." for i in range(4)]
        (work / "stock-s0" / "eval" / when / "samples.jsonl").write_text(
            json.dumps({"prompt": prompt, "answer": "33", "completions": completions}) + "\n")
    main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "new")])
    saved = json.loads((tmp_path / "new" / "stock-s0.json").read_text())
    assert [p["accuracy"] for p in saved["held_out_curve"]] == [0.25, 0.5, 0.75, 0.0]
    assert [p["accuracy_as_run"] for p in saved["held_out_curve"]] == [p["accuracy"] for p in CURVE]
    assert (saved["held_out_accuracy_before"], saved["held_out_accuracy_after"]) == (0.25, 0.0)
    assert saved["regraded"]["verifier"] == "math_reward" and saved["regraded"]["accuracy_as_run_after"] == 0.25
    assert saved["regraded"]["commit"] == code_commit()
    assert json.loads((runs / "stock-s0.json").read_text()) == stock  # the run's own record is left as it is
    assert "held-out after 0.250 as run, 0.000 regraded (math_reward)" in capsys.readouterr().out
    # regraded again at a later commit, to the same figures: the record stays as first written, with its commit
    (tmp_path / "new" / "stock-s0.json").write_text(json.dumps(dict(saved, regraded=dict(saved["regraded"],
                                                                                           commit="0" * 40))))
    main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "new")])
    assert json.loads((tmp_path / "new" / "stock-s0.json").read_text())["regraded"]["commit"] == "0" * 40
    assert "regraded as before; the record in" in capsys.readouterr().out
    (tmp_path / "new" / "stock-s0.json").write_text(json.dumps(saved))
    (work / "stock-s0" / "eval" / "round-8" / "samples.jsonl").unlink()
    with pytest.raises(SystemExit, match="no samples in .*round-8 to regrade"):
        main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "x")])
    # samples gone (another machine's run): the record already regraded from them is kept, as it was
    main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "new")])
    assert json.loads((tmp_path / "new" / "stock-s0.json").read_text()) == saved
    assert "no samples here; the record in" in capsys.readouterr().out
    # numbers only: "10 + 23" (the before point's wrong ones are "= 22") states no number and scores 0 there
    (work / "stock-s0" / "eval" / "round-8" / "samples.jsonl").write_text(json.dumps(
        {"prompt": prompt, "answer": "33", "completions": ["Hana has 10 + 23 cards."] * 3 + ["She has 33."]}) + "\n")
    main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "num"),
          "--regrade_verifier", "math_number_reward"])
    strict = json.loads((tmp_path / "num" / "stock-s0.json").read_text())
    assert [p["accuracy"] for p in strict["held_out_curve"]] == [0.25, 0.5, 0.25, 0.0]
    assert strict["regraded"]["verifier"] == "math_number_reward"
    with pytest.raises(SystemExit):  # the verifier of --regrade_into only
        main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_verifier",
              "math_number_reward"])
    assert "give --regrade_into RUNS_DIR too" in capsys.readouterr().err
    (work / "stock-s0" / "eval" / "round-8" / "samples.jsonl").unlink()
    # samples gone: a record regraded with another verifier than asked for is not taken as this regrade
    with pytest.raises(SystemExit, match="round-8 to regrade.*regraded with math_number_reward, not the run's own"):
        main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "num")])
    with pytest.raises(SystemExit, match="regraded with math_reward, not math_number_reward"):
        main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "new"),
              "--regrade_verifier", "math_number_reward"])
    main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "num"),
          "--regrade_verifier", "math_number_reward"])
    assert json.loads((tmp_path / "num" / "stock-s0.json").read_text()) == strict
    (runs / "stock-s0.json").write_text(json.dumps(dict(stock, held_out_accuracy_after=0.30)))  # a run done again
    with pytest.raises(SystemExit, match="round-8 to regrade.*regraded another run of it"):
        main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "new")])
    # a run that evaluated with math_number_reward (its evaluations and record name it) is regraded with it
    (work / "stock-s0" / "eval" / "round-8" / "samples.jsonl").write_text(json.dumps(
        {"prompt": prompt, "answer": "33", "completions": ["Hana has 10 + 23 cards."] * 3 + ["She has 33."]}) + "\n")
    for results in (work / "stock-s0" / "eval").glob("*/eval_results.json"):
        info = json.loads(results.read_text())
        results.write_text(json.dumps({**info, "info": {**info["info"], "reward": "math_number_reward"}}))
    (runs / "stock-s0.json").write_text(json.dumps(dict(stock, held_out_reward="math_number_reward")))
    main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "own")])
    own = json.loads((tmp_path / "own" / "stock-s0.json").read_text())
    assert [p["accuracy"] for p in own["held_out_curve"]] == [0.25, 0.5, 0.25, 0.0]
    assert own["regraded"]["verifier"] == "math_number_reward"
    (work / "stock-s0" / "eval" / "round-8" / "samples.jsonl").unlink()
    main(["--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--regrade_into", str(tmp_path / "num")])
    assert "no samples here; the record in" in capsys.readouterr().out  # its own verifier: kept


def test_a_before_evaluation_is_taken_only_where_everything_its_samples_depend_on_is_the_same(tmp_path):
    """`train.py --eval_before_from`: another run's "before" folder and accuracy are taken where the key (model,
    held-out rows, sampling settings, verifier, code, machine) is equal; any difference, a missing key or code with
    uncommitted changes makes the run evaluate, and says why."""
    from datasets import Dataset

    from trl_alloc.benchmarks.learning import machine
    from trl_alloc.cli.held_out_before import before_key, take_before, taken_from, write_key

    rows = [{"prompt": "2 + 3 =", "answer": "5"}, {"prompt": "4 + 4 =", "answer": "8"}]
    settings = {"samples": 1, "temperature": 0.3, "top_p": 1.0, "top_k": 0, "max_new_tokens": 64, "seed": 5}
    key = before_key("smollm2-135m-instruct", None, "vllm_engine", "float32", Dataset.from_list(rows), settings,
                     "math_reward")
    assert key["code"] == code_commit() and key["machine"] == machine() and key["seed"] == 5
    assert key == before_key("smollm2-135m-instruct", None, "vllm_engine", "float32", Dataset.from_list(rows),
                             dict(settings), "math_reward")
    other_rows = before_key("smollm2-135m-instruct", None, "vllm_engine", "float32",
                            Dataset.from_list([rows[0], {"prompt": "4 + 4 =", "answer": "9"}]), settings,
                            "math_reward")
    assert other_rows["held_out_sha256"] != key["held_out_sha256"]
    source = tmp_path / "stock-s5" / "eval" / "before"
    source.mkdir(parents=True)
    (source / "eval_results.json").write_text(json.dumps({"metrics": {"1": {"avg": 0.125}}}))
    (source / "samples.jsonl").write_text('{"completions": ["5"]}\n')
    mine = tmp_path / "sara-s5" / "eval" / "before"
    accuracy, why = take_before(str(tmp_path / "stock-s5"), str(mine), key)
    assert accuracy is None and "no key.json" in why and not mine.exists()
    key = dict(key, code="abc123")  # (a clean commit, whatever this checkout's state)
    write_key(str(source), key)
    for change in ({"seed": 6}, {"dtype": "bfloat16"}, {"held_out_sha256": other_rows["held_out_sha256"]},
                   {"machine": dict(key["machine"], cpu="another CPU")}):
        accuracy, why = take_before(str(tmp_path / "stock-s5"), str(mine), dict(key, **change))
        assert accuracy is None and why.startswith("it differs in " + next(iter(change))) and not mine.exists()
    accuracy, why = take_before(str(tmp_path / "stock-s5"), str(mine), dict(key, code="abc123-dirty"))
    assert accuracy is None and "uncommitted changes" in why
    accuracy, why = take_before(str(tmp_path / "stock-s5"), str(mine), key)
    assert accuracy == 0.125 and why == f"taken from {source}"
    assert (mine / "samples.jsonl").read_text() == (source / "samples.jsonl").read_text()
    assert taken_from(str(mine)) == str(tmp_path / "stock-s5") and taken_from(str(source)) is None
    write_key(str(mine), key)  # the run evaluated this folder itself later: no longer taken
    assert taken_from(str(mine)) is None


def test_method_flags_are_train_script_stages():
    assert method_flags("stock") == ["--pacing", "uniform", "--filling", "full"]
    assert method_flags("dapo") == ["--pacing", "uniform", "--filling", "dynamic_sampling"]
    assert method_flags("greso+dynamic_sampling") == ["--pacing", "greso", "--filling", "dynamic_sampling"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_bench_runs_train_script_on_local_jsonl_files_and_keeps_finished_runs(tmp_path):
    """Two methods on a local train.jsonl + test.jsonl (any dataset train.py takes): a curve per run, in the order
    of the rounds, at exact budgets; a second call runs nothing again."""
    from trl_alloc.tasks.builtin import generate_problems
    from trl_alloc.tasks.tiny import get_tiny_model_dir

    for split, n in (("train", 64), ("test", 12)):
        rows = [{"prompt": r["prompt"], "answer": r["answer"]}
                for r in generate_problems("arithmetic", n=n, seed=0, split=split)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = tmp_path / "runs"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_learning.py"), "--methods", "stock,cero_sara", "--seeds", "0",
           "--eval_every_responses", "64", "--runs_dir", str(runs), "--output_dir", str(tmp_path / "out"), "--",
           "--config", str(ROOT / "configs" / "tiny_cpu.yaml"),
           "--model_name_or_path", get_tiny_model_dir(task="arithmetic"),
           "--dataset_name", str(tmp_path / "train.jsonl"),
           "--test_dataset_name", str(tmp_path / "test.jsonl"), "--num_rounds", "5",
           "--per_device_train_batch_size", "32", "--eval_samples", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = {name: json.loads((runs / name).read_text()) for name in os.listdir(runs)}
    assert sorted(got) == ["cero_sara-s0.json", "stock-s0.json"]
    for r in got.values():
        curve = r["held_out_curve"]
        assert curve[0]["when"] == "before" and curve[-1]["when"] == "after"
        # an evaluation after each round in which the responses spent passed another multiple of 64 (the last
        # round's is the "after" point)
        marks = [p["responses"] // 64 for p in curve[1:-1]]
        assert marks and marks == sorted(set(marks)) and marks[0] >= 1
        assert curve[-1]["responses"] == r["responses_spent"] <= r["budget_responses"] == 5 * 32
        assert all(a["responses"] < b["responses"] and a["seconds"] < b["seconds"]
                   and a["cpu_seconds"] < b["cpu_seconds"] for a, b in zip(curve, curve[1:]))
        assert curve[0]["cpu_seconds"] == 0.0 < curve[-1]["cpu_seconds"]
        assert curve[-1]["accuracy"] == r["held_out_accuracy_after"] and r["held_out_prompts"] == 12
        assert r["held_out_split"].endswith("test.jsonl") or "test.jsonl" in r["held_out_split"]
        assert r["pool_prompts"] == 64 and 0 < r["prompts_seen"] <= 64 and 0 <= r["rounds_without_signal"] <= 5
        assert r["prompts_with_signal"] <= r["prompts_trained"] <= r["prompts_seen"]
        assert 0.0 <= r["truncated_share"] <= 1.0 and r["commit"] == code_commit()
        assert r["engine"] == {"backend": "transformers", "trainer_dtype": "float32", "dtype": "float32"}
        for p in curve:  # each evaluation's cut share: the share of its samples that ended at the token cap
            with open(tmp_path / "out" / "train" / f"{r['method']}-s0" / "eval" / p["when"] / "samples.jsonl") as f:
                reasons = [x for line in f for x in json.loads(line)["finish_reasons"]]
            assert p["truncated_share"] == pytest.approx(reasons.count("length") / len(reasons))
            assert len(reasons) == 12 * 2 and p["mean_completion_tokens"] > 0
    # one "before" evaluation a seed: CERO+SARA takes stock's (the same model, held-out rows and settings), unless
    # the code has uncommitted changes, when it samples its own, and the same samples
    out = tmp_path / "out" / "train"
    assert got["stock-s0.json"]["held_out_before_from"] is None
    assert got["cero_sara-s0.json"]["held_out_accuracy_before"] == got["stock-s0.json"]["held_out_accuracy_before"]
    assert ((out / "cero_sara-s0" / "eval" / "before" / "samples.jsonl").read_text()
            == (out / "stock-s0" / "eval" / "before" / "samples.jsonl").read_text())
    log = (out / "cero_sara-s0.log").read_text()
    if code_commit().endswith("-dirty"):
        assert got["cero_sara-s0.json"]["held_out_before_from"] is None and "uncommitted changes" in log
    else:
        assert got["cero_sara-s0.json"]["held_out_before_from"] == str(out / "stock-s0")
        assert "held-out evaluation before training taken from" in log
    assert got["stock-s0.json"]["responses_spent"] == 5 * 32  # stock spends its budget exactly
    assert [p["responses"] for p in got["stock-s0.json"]["held_out_curve"]] == [0, 64, 128, 160]
    assert "| stock GRPO | 1 |" in proc.stdout and "| CERO+SARA | 1 |" in proc.stdout
    assert "\nseed 0: " in proc.stdout and "(cut " in proc.stdout
    assert (tmp_path / "out" / "learning_curves.png").stat().st_size > 0
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.count("already in") == 2 and "running" not in again.stdout
    assert json.loads((runs / "stock-s0.json").read_text()) == got["stock-s0.json"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_interrupted_run_resumes_from_its_checkpoint_with_its_curve(tmp_path):
    """A learning run that a stopped session left at a checkpoint goes on from it: the curve it kept (points and
    seconds) continues, no new "before" is evaluated, and the record says where it resumed."""
    import shutil

    from trl_alloc.benchmarks.learning import machine, run_one
    from trl_alloc.tasks.tiny import get_tiny_model_dir

    train_args = ["--config", str(ROOT / "configs" / "tiny_cpu.yaml"),
                  "--model_name_or_path", get_tiny_model_dir(task="arithmetic"), "--num_rounds", "4",
                  "--num_builtin_prompts", "64", "--num_eval_prompts", "12", "--eval_samples", "2",
                  "--per_device_train_batch_size", "32", "--save_total_limit", "4"]
    whole = run_one("stock", 0, train_args, str(tmp_path / "runs_a"), str(tmp_path / "a"), eval_every=1,
                    save_steps=2)
    kept = json.loads((tmp_path / "a" / "stock-s0" / "checkpoint-2" / "held_out_curve.json").read_text())
    assert [p["when"] for p in kept["points"]] == ["before", "round-1", "round-2"] and kept["elapsed"][0] > 0
    # a stopped session: only the step-2 checkpoint is there
    shutil.copytree(tmp_path / "a" / "stock-s0" / "checkpoint-2", tmp_path / "b" / "stock-s0" / "checkpoint-2")
    resumed = run_one("stock", 0, train_args, str(tmp_path / "runs_b"), str(tmp_path / "b"), eval_every=1,
                      save_steps=2)
    assert resumed["resumed_at_steps"] == [2] and whole["resumed_at_steps"] == []
    assert resumed["machines"] == whole["machines"] == [machine()]  # one machine, named once for both parts
    curve = resumed["held_out_curve"]
    assert curve[:3] == kept["points"]  # the kept points, as they were
    assert [p["when"] for p in curve] == [p["when"] for p in whole["held_out_curve"]]
    assert [p["responses"] for p in curve] == [p["responses"] for p in whole["held_out_curve"]] == [0, 32, 64, 96,
                                                                                                    128]
    assert all(a["seconds"] < b["seconds"] for a, b in zip(curve, curve[1:]))  # seconds carried, not restarted
    assert resumed["held_out_accuracy_before"] == whole["held_out_accuracy_before"]
    assert "held-out accuracy before training" not in (tmp_path / "b" / "stock-s0.log").read_text()


def test_a_killed_parts_seconds_are_kept_to_within_the_heartbeat(tmp_path):
    """The bench killed with SIGKILL while its train.py runs (a stopped session): the seconds the part ran are in
    its progress file, added to the earlier parts', to within the heartbeat; a timeout still stops the run."""
    import time

    import psutil

    from trl_alloc.benchmarks.learning import _run_counting_seconds

    progress_path = tmp_path / "run.progress.json"
    script = (f"import sys\nfrom trl_alloc.benchmarks.learning import _run_counting_seconds\n"
              f"with open({str(tmp_path / 'run.log')!r}, 'w') as log:\n"
              f"    _run_counting_seconds([sys.executable, '-c', 'import time; time.sleep(30)'], log, "
              f"{{'wall_s': 100.0}}, {str(progress_path)!r}, None, 0.1)\n")
    bench = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    t0, seen = time.perf_counter(), 0.0
    try:
        while seen < 101.0 and time.perf_counter() - t0 < 60:  # one second of the part, counted
            time.sleep(0.1)
            if progress_path.exists():
                seen = json.loads(progress_path.read_text())["wall_s"]  # (written whole: os.replace)
    finally:
        children = psutil.Process(bench.pid).children(recursive=True)
        bench.kill()  # (SIGKILL: no handler, no finally runs in the bench)
        bench.wait()
        elapsed = time.perf_counter() - t0
        for child in children:  # its train.py, orphaned
            child.kill()
    kept = json.loads(progress_path.read_text())["wall_s"]
    assert 101.0 <= kept <= 100.0 + elapsed  # the earlier parts' 100 s, and this part's up to its last heartbeat
    log = open(tmp_path / "timeout.log", "w")
    progress = {"wall_s": 0.0}
    with pytest.raises(subprocess.TimeoutExpired):
        _run_counting_seconds([sys.executable, "-c", "import time; time.sleep(30)"], log, progress,
                              str(tmp_path / "timeout.json"), 0.5, 0.1)
    log.close()
    assert 0.5 <= json.loads((tmp_path / "timeout.json").read_text())["wall_s"] < 10


def test_train_script_refuses_a_curve_in_stream_mode(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--config",
                           str(ROOT / "configs" / "tiny_cpu.yaml"), "--rollout_mode", "stream", "--eval_every", "2",
                           "--output_dir", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 3
    assert "--eval_every evaluates between rounds" in proc.stdout.strip().splitlines()[-1]
