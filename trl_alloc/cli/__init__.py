"""Command lines (the scripts in `scripts/` and the `trl-alloc-*` console commands call these `main`s):
train.py (`trl-alloc-train`, TRL's `trl grpo`), eval.py (`trl-alloc-eval`), plan.py (`trl-alloc-plan`) and
bench.py (`trl-alloc-bench`); the vLLM server's is `trl_alloc.serving.cli` (`trl-alloc-serve`, TRL's
`trl vllm-serve`)."""
