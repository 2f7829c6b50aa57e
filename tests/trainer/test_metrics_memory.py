"""The memory watch (trainer/metrics.py): a peak past 80% of the total warns once, naming the micro-batch and the
fix; below it, nothing. And a real round logs the process's peak memory (`alloc/peak_memory_gb`)."""

import resource
from types import SimpleNamespace

import psutil

from helpers import make_args, tiny_setup
from trl_alloc.trainer import AllocGRPOTrainer
from trl_alloc.trainer.metrics import MEMORY_WARN_SHARE, memory_warning

GIB = 2**30


def test_the_warning_names_the_peak_the_batch_and_the_fix():
    args = SimpleNamespace(per_device_train_batch_size=64, max_completion_length=64)
    assert memory_warning(int(18.0 * GIB), int(23.4 * GIB), args, 1) is None  # 77%
    text = memory_warning(int(19.2 * GIB), int(23.4 * GIB), args, 1)
    assert text.startswith("[trl-alloc] WARNING: this process's memory peaked at 19.2 of 23.4 GiB (82%) by round 1")
    assert "per_device_train_batch_size=64" in text and "gradient_accumulation_steps" in text
    assert memory_warning(int(MEMORY_WARN_SHARE * 100 * GIB), 100 * GIB, args, 3) is None  # at the share: not past


def test_a_round_logs_the_peak_memory(tmp_path):
    model, tok, ds, reward = tiny_setup()
    args = make_args(str(tmp_path), pacing="uniform", filling="full", num_rounds=2, max_steps=2)
    trainer = AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    trainer.train()
    peaks = [e["alloc/peak_memory_gb"] for e in trainer.state.log_history if "alloc/peak_memory_gb" in e]
    assert len(peaks) == 2 and 0.05 < peaks[0] <= peaks[1]  # a peak never falls
    peak_now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (Linux: kilobytes)
    assert peaks[-1] * GIB <= peak_now < psutil.virtual_memory().total  # this process's peak, not the machine's use
