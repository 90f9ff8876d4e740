"""The report of scripts/plot_runs.py as a library, one module per step (docs/report.md)."""
