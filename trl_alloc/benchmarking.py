"""Shared pieces of the benchmark scripts (`scripts/bench*.py`) and the trainer tests."""


def cpu_run_kwargs(output_dir, batch, num_generations, max_completion_length, seed, learning_rate=1e-4, **extra):
    """GRPOConfig keyword arguments every CPU benchmark run shares (stock TRL and trl-alloc alike)."""
    return dict(output_dir=output_dir, per_device_train_batch_size=batch, num_generations=num_generations,
                max_completion_length=max_completion_length, temperature=1.0, learning_rate=learning_rate,
                lr_scheduler_type="constant", beta=0.0, loss_type="dapo", logging_steps=1, report_to=[],
                save_strategy="no", bf16=False, use_cpu=True, gradient_checkpointing=False, seed=seed,
                disable_tqdm=True, **extra)


def count_generated(trainer):
    """Count every response a trainer really generates (stock TRL and trl-alloc both go through
    `_generate_single_turn`); returns a dict whose "n" grows as training runs."""
    inner, box = trainer._generate_single_turn, {"n": 0}

    def generate(prompt_ids, *args, **kwargs):
        out = inner(prompt_ids, *args, **kwargs)
        box["n"] += len(out[0])
        return out

    trainer._generate_single_turn = generate
    return box


def parse_choices(parser, text, choices, what):
    """A comma-separated subset of `choices`, or a parser error naming the unknown ones."""
    picked = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in picked if c not in choices]
    if unknown:
        parser.error(f"unknown {what}(s) {unknown}; choose from {list(choices)}")
    return picked


def check_batch(parser, args):
    if args.batch % args.num_generations:
        parser.error(f"--batch ({args.batch}) must be a multiple of --num_generations ({args.num_generations})")


def quiet():
    """Silence library warnings and info logs so benchmark output is the figures only."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("transformers", "trl", "accelerate", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def step_timer():
    """A TrainerCallback recording each optimizer step's wall-clock (`steps`) and CPU time (`cpu`)."""
    import time

    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps, self.cpu, self._t, self._c, self.last_end = [], [], None, None, None

        def on_step_begin(self, args, state, control, **kwargs):
            self._t, self._c = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            if self._t is not None:
                self.last_end = time.perf_counter()
                self.steps.append(self.last_end - self._t)
                self.cpu.append(time.process_time() - self._c)
                self._t = None

    return StepTimer()
