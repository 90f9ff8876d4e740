"""Report on sweeps: the results tables (results.md), runs.csv and figures of the runs named.

    python scripts/plot_runs.py SWEEP_DIR [SWEEP_DIR ...] --out DIR [--loss full|sampled]
                                [--baseline sqrt_dk] [--pair KEY=VALUE ...] [--one-control]
                                [--against KEY=VALUE,KEY=VALUE,... ...]
                                [--figures NAME,...] [--heads RUN ...] [--heads-seed SEED]
                                [--select-seeds 1,2 | --report-seeds 3,4,5]
                                [--select-from STAGE1/runs.csv]
    python scripts/plot_runs.py --from-csv DIR/runs.csv --out DIR2 [same options]
    python scripts/plot_runs.py SWEEP_DIR --from-csv STAGE/runs.csv --out DIR [same options]

SWEEP_DIR is one preset run (multirun/<preset>/<time>/, one folder per job) or a single run
folder. Only the folders named are read: name several to pool sweeps on purpose. --from-csv
reads the runs of a report's runs.csv (and the curves.jsonl beside it) instead of their
folders, alone or pooled with sweep folders. The report reads runs, builds tables and draws
figures; what a study varies comes from its runs' keys and the options, never from its name:

- DIR/results.md     the tables of scripts/report/tables.py (also printed), the figures drawn
- DIR/runs.csv       one row per run (scripts/report/runs_csv.py), and DIR/curves.jsonl, the
                     records the step curves draw (scripts/report/runs_csv.py); written when
                     sweep folders were read
- DIR/*.png          the figures of docs/report.md ("The figures and what they promise"),
                     each kept to the contract of scripts/report/style.py; --figures names
                     those to draw (each preset's report command names its own)

docs/report.md says what every table and figure means.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402

from model.errors import UserError  # noqa: E402
from scripts.report import ngram  # noqa: E402
from scripts.report import stats as st  # noqa: E402
from scripts.report.figures import (  # noqa: E402
    Frame,
    plot_accuracy,
    plot_diagnostics,
    plot_heads,
    plot_losses,
    plot_lr,
    plot_qk_grads,
    plot_stability,
    plot_vs_baseline,
)
from scripts.report.length import (  # noqa: E402
    length_arms,
    length_sections,
    plot_lookup,
    plot_text,
)
from scripts.report.normaliser import normaliser_sections, plot_normaliser  # noqa: E402
from scripts.report.runs import (  # noqa: E402
    LR_KEY,
    NORMALISER_KEY,
    canonical,
    group_runs,
    label,
    load_run,
    load_runs,
    value_order,
    varying_keys,
)
from scripts.report.runs_csv import (  # noqa: E402
    CURVES_FILE,
    has_curves,
    read_runs_csv,
    write_curves,
    write_runs_csv,
)
from scripts.report.style import Arms  # noqa: E402
from scripts.report.tables import Reading, appendix, markdown_report, seeds_text  # noqa: E402
from scripts.report.width import WIDTH_KEY, plot_width  # noqa: E402

# The figures a report draws where its runs have what each shows (docs/report.md, "The figures
# and what they promise"), in this order; --figures names some.
FIGURES = ("loss_curves.png", "accuracy_curves.png", "loss_vs_baseline.png", "diagnostics.png",
           "qk_grad_norms.png", "length_lookup.png", "length_text.png", "lr_transfer.png",
           "lr_stability.png", "width_transfer.png", "normaliser.png")


def figure_names(text: str) -> list[str]:
    """--figures NAME,NAME,...: the names, each one of FIGURES."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in FIGURES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'} is not a figure the report draws; name one or"
            f" more of {', '.join(FIGURES)}, comma-separated")
    return names


def label_text(text: str) -> str:
    """--label KEY=VALUE:WORDS, checked for its two parts; the value as runs.csv writes it."""
    pair, _, words = text.partition(":")
    key, _, value = pair.partition("=")
    if not key or not value or not words.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE:WORDS; e.g. --label 'optim.qk_lr_mult=0.25:W_q, W_k LR"
            " x d_head^-1/4'")
    return f"{key}={canonical(value)}:{words.strip()}"


def parse_pairs(items: list[str], groups: dict) -> tuple[list[tuple], str]:
    """--pair KEY=VALUE items as (key, canonical value) pairs, or why one is unusable."""
    values: dict[str, set] = {}
    for key in groups:
        for k, v in key[1:]:
            values.setdefault(k, set()).add(v)
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in values:
            return [], (f"{item!r}: give KEY=VALUE with a KEY these runs vary"
                        f" ({', '.join(sorted(values)) or 'they vary only the scale'}).")
        if canonical(value) not in values[key]:
            choices = ", ".join("null" if v is None else v
                              for v in sorted(values[key], key=value_order))
            return [], f"{item!r}: {key} takes the values {choices} in these runs."
        pairs.append((key, canonical(value)))
    return pairs, ""


def parse_seeds(text: Optional[str]) -> Optional[frozenset]:
    return None if text is None else frozenset(canonical(s.strip()) for s in text.split(","))


def make_plan(args, lr_runs: list, select_runs: Optional[list]) -> tuple[st.Plan, str]:
    """The LR selection plan of the options, or why the options cannot be used."""
    select, report = parse_seeds(args.select_seeds), parse_seeds(args.report_seeds)
    if (select or report or select_runs is not None) and not lr_runs:
        return st.Plan(), ("--select-seeds, --report-seeds and --select-from choose an LR; these"
                           " runs do not vary optim.lr.")
    have = {r.seed for r in lr_runs}
    source = {r.seed for r in (lr_runs if select_runs is None else select_runs)}
    for seeds, pool, name in ((select, source, "--select-seeds"), (report, have,
                                                                   "--report-seeds")):
        if seeds is not None and not seeds <= pool:
            return st.Plan(), (f"{name} names seed(s) {', '.join(sorted(seeds - pool))} that"
                               f" no run has; the runs have seeds {', '.join(sorted(pool))}.")
    plan = st.Plan(select, report, select_runs, str(args.select_from or ""))
    if select_runs is None and (select or report):
        chosen = {s for s in have if plan.selects(s)}
        read = {s for s in have if plan.reports(s)}
        if chosen & read or not chosen or not read:
            return st.Plan(), ("the seeds that choose the LR and the seeds it is reported on"
                               " must both be non-empty and must not share a seed (here"
                               f" {', '.join(sorted(chosen)) or 'none'} choose,"
                               f" {', '.join(sorted(read)) or 'none'} report).")
    return plan, ""


def read_runs(args) -> tuple[list, list, str, Optional[dict], str]:
    """(runs, skipped, what was read, reference levels of the runs.csv files, why nothing was
    read): the runs of the sweep folders and of each --from-csv runs.csv, pooled."""
    missing = [str(p) for p in args.sweeps if not p.is_dir()]
    if missing or not (args.sweeps or args.from_csv):
        return [], [], "", None, (f"not a directory: {', '.join(missing) or 'none given'}. Pass"
                                  " the multirun/<preset>/<time> folder of a sweep, a run"
                                  " folder, or --from-csv runs.csv.")
    runs, skipped = load_runs(args.sweeps)
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    read = ["Sweeps read: " + ", ".join(f"`{r}`" for r in args.sweeps)] if args.sweeps else []
    levels = {}
    for path in args.from_csv:
        csv_runs, csv_levels = read_runs_csv(path)
        if csv_levels and levels and csv_levels != levels:
            return [], [], "", None, (f"{path} was judged against other reference levels than"
                                      f" {args.from_csv[0]}: pool runs.csv files of one corpus.")
        runs += csv_runs
        levels = csv_levels or levels
        read.append(f"Runs read from `{path}` (one row per run).")
    seen = set()
    for run in runs:
        if str(run.path) in seen:
            return [], [], "", None, (f"the run {run.path} is read twice: name each sweep folder"
                                      " and runs.csv once, and pool only runs.csv files of other"
                                      " runs than the folders hold.")
        seen.add(str(run.path))
    return runs, skipped, " ".join(read), levels or None, ""


def parse_against(items: list[str], runs: list) -> tuple[list[tuple], str]:
    """--against KEY=VALUE,KEY=VALUE,... items as reference settings ((key, canonical value),
    ...), or why one is unusable: every KEY must be a key of the runs, every VALUE one that a
    run has (null: the default)."""
    found = []
    for item in items:
        setting = []
        for part in item.split(","):
            key, sep, value = part.partition("=")
            have = {run_value(r, key) for r in runs}
            if not sep or canonical(value) not in have:
                choices = ", ".join("null" if v is None else v
                                    for v in sorted(have, key=value_order))
                return [], f"--against {item!r}: {key} takes the values {choices} in these runs."
            setting.append((key, canonical(value)))
        found.append(tuple(setting))
    return found, ""


def pick_runs(item: str, runs: list) -> tuple[list, str]:
    """--heads: the run folder named, or every run whose settings are KEY=VALUE,...
    (`trainer.seed=2`, `scaling=none,optim.lr=7.5e-4,trainer.seed=1`)."""
    if Path(item).is_dir():
        run, why = load_run(Path(item))
        return ([run], "") if run is not None else ([], f"--heads {item}: not drawn ({why})")
    wanted = [part.partition("=") for part in item.split(",")]
    if not all(sep for _, sep, _ in wanted):
        return [], f"--heads {item}: give a run folder or KEY=VALUE,... of one run"
    chosen = [r for r in runs if all(run_value(r, k) == canonical(v) for k, _, v in wanted)]
    return chosen, "" if chosen else f"--heads {item}: no run has these settings"


def run_value(run, key: str):
    """A run's value of a key as --heads and --against name it (its scale, its seed)."""
    return {"scaling": run.variant, "trainer.seed": run.seed}.get(key, run.setting(key))


def run_name(run, arms: Arms, groups: dict) -> str:
    """A run as a figure names it: its arm, LR, other settings and seed."""
    key = next(k for k, g in groups.items() if run in g)
    parts = [arms.name(key), *(f"lr {run.lr:g}" for _ in [0] if math.isfinite(run.lr)),
             label(arms.setting(key), short=True), f"seed {run.seed}"]
    return ", ".join(p for p in parts if p)


def file_name(run) -> str:
    return "heads_" + re.sub(r"[^A-Za-z0-9._=-]+", "_", run.path.resolve().name) + ".png"


def draw_heads(args, runs: list, curves: dict, arms: Arms, out: Path) -> tuple[list, list]:
    """The per-head figures of --heads and --heads-seed (the run of that seed in every group
    the curves draw): (a note on each, the files)."""
    groups = group_runs(runs, drop=(LR_KEY,))
    chosen, notes, files = [], [], []
    for item in args.heads:
        found, why = pick_runs(str(item), runs)
        chosen += found
        notes += [why] if why else []
    for key, group in curves.items() if args.heads_seed is not None else ():
        found = [r for r in group if r.seed == canonical(args.heads_seed)]
        chosen += found
        notes += [] if found else [f"--heads-seed {args.heads_seed}: {label(key)} has no run"
                                   " of that seed"]
    for run in {id(r): r for r in chosen}.values():
        name = run_name(run, arms, groups) if run in runs else run.path.name
        if save(plot_heads(run, name), out / file_name(run)):
            notes.append(f"per-head attention statistics of {run.path}: {file_name(run)}")
            files.append(file_name(run))
        else:
            notes.append(f"--heads {run.path}: not drawn (its eval records have no attn_heads)")
    return notes, files


def save(fig, path: Path) -> bool:
    """Writes a figure (None: nothing drawn); whether it wrote one."""
    if fig is None:
        return False
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None, levels: Optional[dict] = None) -> int:
    """levels: the n-gram reference levels in nats per token ({"unigram": ..., "bigram": ...,
    "trigram": ...}) that judge failed runs; None: a runs.csv's own, else the cached levels of
    the runs' corpus (scripts/report/ngram.py); without any, only the non-finite and step-0
    rules apply."""
    args = command_line().parse_args(argv)
    try:
        return report(args, levels)
    except UserError as e:
        print(f"plot_runs: {e}", file=sys.stderr)
        return 2


def command_line() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="*", type=Path, help="sweep or run folders to read")
    parser.add_argument("--out", type=Path, required=True, help="folder for figures and tables")
    parser.add_argument("--from-csv", type=Path, action="append", default=[],
                        metavar="RUNS_CSV",
                        help="also read the runs of this runs.csv (and of the curves.jsonl"
                        " beside it), e.g. an earlier stage of the sweep (repeatable)")
    parser.add_argument("--loss", choices=tuple(st.LOSSES), default="full",
                        help="final loss of the tables: full = final_val_loss_full (the whole"
                        " validation split, default), sampled = final_val_loss")
    parser.add_argument("--baseline", default="sqrt_dk", help="scale the others are paired with")
    parser.add_argument("--pair", action="append", default=[], metavar="KEY=VALUE",
                        help="also pair every group with the same setting at KEY=VALUE, e.g."
                        " model.qk_init_std=null (repeatable)")
    parser.add_argument("--against", action="append", default=[], metavar="KEY=VALUE,...",
                        help="also pair every group with the reference group of this whole"
                        " setting at the same other keys, e.g. scaling=sqrt_dk,"
                        "model.qk_init_std=null (repeatable; one Holm family each)")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE:WORDS",
                        type=label_text, help="the words a figure names an arm's KEY=VALUE by"
                        " (repeatable): --label 'model.qk_init_std=0.0084:W_q, W_k init moved'")
    parser.add_argument("--one-control", action="store_true",
                        help="the baseline scale and every --pair value are one control: each"
                        " group that differs from it in one of these keys is paired with it,"
                        " one Holm family a table (an arm per bound against the scale alone)")
    parser.add_argument("--select-seeds", metavar="S,S,...",
                        help="LR sweep: choose each scale's best LR on these seeds only")
    parser.add_argument("--report-seeds", metavar="S,S,...",
                        help="LR sweep: report the loss at the chosen LR on these seeds only")
    parser.add_argument("--select-from", type=Path, metavar="RUNS_CSV",
                        help="choose each scale's LR on the runs of an earlier stage's runs.csv")
    parser.add_argument("--figures", type=figure_names, metavar="NAME,...",
                        help="draw only these figures, e.g. lr_transfer.png,loss_curves.png"
                        f" (default: each of {', '.join(FIGURES)} the runs can show)")
    parser.add_argument("--heads", action="append", default=[], metavar="RUN",
                        help="also draw DIR/heads_<run>.png, the per-head attention statistics"
                        " of a run: its folder, or KEY=VALUE,... of its settings, e.g."
                        " scaling=none,optim.lr=7.5e-4,trainer.seed=1 (repeatable)")
    parser.add_argument("--heads-seed", metavar="SEED",
                        help="also draw the per-head statistics of the run of this seed in"
                        " every group (one run per cell; in an LR sweep, at the chosen LR)")
    return parser


def report(args, levels: Optional[dict]) -> int:
    runs, skipped, read, csv_levels, bad = read_runs(args)
    if not bad and not runs:
        bad = ("no run with eval records found in"
               f" {', '.join(map(str, args.sweeps + args.from_csv))}; point it at a sweep's"
               " folder of jobs.")
    groups = group_runs(runs) if runs else {}
    pairs, bad = (parse_pairs(args.pair, groups) if not bad else ([], bad))
    against, bad = (parse_against(args.against, runs) if not bad else ([], bad))
    select_runs = read_runs_csv(args.select_from)[0] if args.select_from and not bad else None
    lr_swept = bool(runs) and (LR_KEY in varying_keys(runs) or select_runs is not None)
    lr_runs = [r for r in runs if math.isfinite(r.lr)] if lr_swept else []
    plan, bad = make_plan(args, lr_runs, select_runs) if not bad else (st.Plan(), bad)
    if bad:
        print(f"plot_runs: {bad}", file=sys.stderr)
        return 2
    levels = levels if levels is not None else csv_levels
    notes = []
    if levels is None and args.sweeps:   # a runs.csv's levels, else those of the folders read
        levels, why = ngram.levels_of_runs([r.path for r in runs])
        notes += [why] if why else []
    elif levels is None and all(r.recall for r in runs):   # a recall runs.csv alone
        notes.append(ngram.NO_LEVELS_RECALL)
    args.out.mkdir(parents=True, exist_ok=True)
    reading = Reading(args.loss, args.baseline, tuple(pairs), levels, plan, args.one_control,
                      tuple(against))
    more, figures = draw_figures(args, runs, lr_runs, reading)
    write_report(args, runs, (groups, lr_runs, reading), (read, skipped, notes + more, figures))
    return 0


def chosen_curves(lr_runs: list, reading) -> tuple[dict, str, list[str]]:
    """The runs the step curves draw in an LR sweep, what the titles say of them, and notes.
    Where the LR is chosen on these runs (leave one seed out, or one seed), each arm at its best
    LR over every seed: the LR results.md names, on the seeds that chose it. Where it is chosen
    on other seeds (a split, or an earlier stage), the runs read on the held-out seeds."""
    held = st.held_out(lr_runs, reading.which, reading.plan)
    if not reading.plan.leave_one_out:
        curves = {key: h["runs"] for key, h in held.items() if h["runs"]}
        return curves, (f"; each arm at the LR chosen on other seeds, {seeds_of(lr_runs)} held"
                        " out"), []
    by_key = group_runs(lr_runs, drop=(LR_KEY,))
    curves = {key: [r for r in by_key[key] if r.lr == h["best"]["lr"]]
              for key, h in held.items() if h["best"]}
    why = [] if curves else [f"no best LR (no run has {st.LOSSES[reading.which][0]}): curves"
                             " not drawn"]
    return curves, (f"; each arm at its best LR on {seeds_of(lr_runs)}, the seeds that chose"
                    " it (not held out)"), why


def seeds_of(runs: list) -> str:
    seeds = {str(r.seed) for r in runs}
    return f"seed{'s' if len(seeds) > 1 else ''} {seeds_text(seeds)}"


def draw_figures(args, runs: list, lr_runs: list, reading) -> tuple[list[str], list[str]]:
    """Draws the figures of the runs that --figures names (default: all) into args.out:
    (notes on what was not drawn, the files)."""
    curves, seeds, notes = (chosen_curves(lr_runs, reading) if lr_runs
                            else (group_runs(runs), f"; {seeds_of(runs)}", []))
    keys = group_runs(runs, drop=(LR_KEY,))
    # one palette for the arms of every figure; --against's keys and the length factor name arms
    arms = length_arms(Arms.of(keys, {k for setting in reading.against for k, _ in setting},
                               dict(label.split(":", 1) for label in args.label)))
    frame = Frame(arms, arms.looks(keys), seeds, reading.levels, args.baseline, reading.which)
    records = all(map(has_curves, runs))
    if not records:
        notes.append(f"step-curve figures need every run's records (its folder, or the"
                     f" {CURVES_FILE} beside its runs.csv): not drawn")
    step, which = bool(curves) and records, reading.which
    plans = {"loss_curves.png": step and (lambda: plot_losses(frame, curves)),
             "accuracy_curves.png": step and (lambda: plot_accuracy(frame, curves)),
             "loss_vs_baseline.png": step and (lambda: plot_vs_baseline(frame, curves)),
             "diagnostics.png": step and (lambda: plot_diagnostics(frame, curves)),
             "qk_grad_norms.png": step and (lambda: plot_qk_grads(frame, curves)),
             "length_lookup.png": lambda: plot_lookup(frame, runs),
             "length_text.png": lambda: plot_text(frame, runs),
             "lr_transfer.png": bool(lr_runs) and (lambda: plot_lr(frame, lr_runs, which,
                                                                    reading.plan)),
             "lr_stability.png": (bool(lr_runs) and reading.plan.select_runs is None and records
                                  and (lambda: plot_stability(frame, lr_runs, which))),
             "width_transfer.png": (bool(lr_runs) and WIDTH_KEY in varying_keys(lr_runs)
                                    and (lambda: plot_width(lr_runs, which))),
             "normaliser.png": (bool(curves) and NORMALISER_KEY in varying_keys(runs)
                                and (lambda: plot_normaliser(frame, curves, which)))}
    drawn = [name for name in FIGURES if name in (args.figures or FIGURES) and plans[name]
             and save(plans[name](), args.out / name)]
    notes += [f"--figures {name}: not drawn, these runs lack what it shows (docs/report.md,"
              " \"The figures and what they promise\")" for name in args.figures or ()
              if name not in drawn]
    heads, files = draw_heads(args, runs, curves, frame.arms, args.out) if records else ([], [])
    return notes + heads, drawn + files


def write_report(args, runs: list, analysed: tuple, inputs: tuple) -> None:
    """results.md (also printed), and runs.csv and curves.jsonl where sweep folders were read."""
    (groups, lr_runs, reading), (read, skipped, notes, figures) = analysed, inputs
    text = (markdown_report(read, runs, groups, lr_runs, reading)
            + length_sections(runs, reading.baseline)
            + normaliser_sections(runs, lr_runs, reading)
            + appendix(runs, reading, skipped, notes, figures))
    if reading.levels:
        text = ngram.above_every_table(text, ngram.levels_line(reading.levels))
    if args.sweeps:   # a runs.csv read alone is not written again
        write_runs_csv(runs, args.out / "runs.csv", args.loss, reading.levels)
        if all(map(has_curves, runs)):
            write_curves(runs, args.out / CURVES_FILE)
        else:   # one that no longer matches runs.csv
            (args.out / CURVES_FILE).unlink(missing_ok=True)
    (args.out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    raise SystemExit(main())
