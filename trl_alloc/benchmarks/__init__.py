"""The benchmarks (above the trainer): shared measurements of rollouts and selection (measure.py), the
method benchmark's runs (methods.py) and its table and plots (report.py)."""
