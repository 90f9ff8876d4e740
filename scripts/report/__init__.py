"""The report of scripts/plot_runs.py, as a library: one module per step of the report.

    runs.py       which folders are runs, what a run's settings and seed are, how runs group
    stats.py      95% Student-t intervals, paired (same-seed) differences, the LR analyses
    tables.py     the Markdown tables of results.md
    figures.py    the step-curve figures (losses, attention diagnostics, q/k gradient norms)
    lr_figure.py  the learning-rate figure of an LR sweep
"""
