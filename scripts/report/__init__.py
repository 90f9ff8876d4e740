"""The report of scripts/plot_runs.py, as a library: one module per step of the report.

    runs.py       which folders are runs, what a run's settings and seed are, how runs group
    stats.py      95% Student-t intervals, paired (same-seed) t-tests as Holm families, failed
                  runs, the LR analyses (the LR chosen on held-out seeds)
    tables.py     the Markdown tables of results.md
    runs_csv.py   runs.csv: one row per run, and the runs read back from it (--from-csv)
    curves.py     curves.jsonl: the records the step-curve figures draw, beside runs.csv
    style.py      the figure contract: each arm's colour and marker, bands, titles, legends
    figures.py    the step-curve figures (losses, attention diagnostics, q/k gradient norms)
                  and the per-head figure of one run
    lr_figure.py  the learning-rate figures of an LR sweep: loss against LR, and logits and
                  entropy at each arm's highest stable and first failing LR
    width.py      LR transfer across width: each width's optimal LR, its drift per doubling,
                  whether wider is better (results.md's "## Width")
    width_figure.py  its figure, width_transfer.png
    ngram.py      the n-gram reference levels of a run's corpus (cached next to its token cache)
"""
