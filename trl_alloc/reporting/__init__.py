"""Reporting a run: its allocation report and plots (plots.py), Hub pushes and model cards (hub.py)."""
