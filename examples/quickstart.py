"""The README's quick start (tests/test_readme.py checks that the two stay the same and that it runs)."""

from trl_alloc import AllocGRPOConfig, AllocGRPOTrainer
from trl_alloc.tasks.data import load_prompt_dataset, reward_for_dataset
from trl_alloc.tasks.tiny import get_tiny_model_dir

model = get_tiny_model_dir(task="arithmetic")          # or a Hub model id, e.g. "Qwen/Qwen2.5-1.5B-Instruct"
dataset = load_prompt_dataset("builtin:arithmetic")    # or a Hub dataset / local .jsonl with prompt + answer
args = AllocGRPOConfig(
    output_dir="outputs/quickstart",
    pacing="cero", filling="sara",            # the method; pacing="uniform", filling="full" is plain GRPO
    num_rounds=10,                            # K scheduler rounds = optimizer steps
    rollout_budget=4096,                      # one budget, in responses, for the whole run
    num_generations=8, per_device_train_batch_size=64, max_completion_length=8,
    probe=2, tau_low=0.45,                    # SARA
    learning_rate=1e-4, use_cpu=True, bf16=False, report_to="none",
)
trainer = AllocGRPOTrainer(model=model, reward_funcs=reward_for_dataset("builtin:arithmetic"),
                           args=args, train_dataset=dataset)
trainer.train()
print(trainer.allocation_summary)
