"""Reporting: a run's allocation report and plots (plots.py), Hub pushes and model cards (hub.py), and
the benchmark scripts' shared measurements (benchmarking.py)."""
