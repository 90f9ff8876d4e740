"""The Markdown tables of the report (results.md), built from runs and scripts/report/stats.py.

Each number is a mean over seeds with its 95% Student-t interval ("mean ± half-width") and the
n it rests on. Orderings are stated only from paired (same-seed) differences whose interval
excludes 0; every other comparison is written "not resolved".
"""

from __future__ import annotations

import math
from typing import Optional

from scripts.report import stats as st
from scripts.report.runs import LR_KEY, VARIANT_KEY, Run, group_runs, label, setting_of

DIAGNOSTICS = (  # eval-record field, column heading, how layers are combined
    ("attn_entropy", "entropy (nats)", "mean"),
    ("attn_saturated", "saturated rows", "mean"),
    ("attn_max_logit", "max logit, scaled", "max"),
    ("attn_raw_max_logit", "max q.k, raw", "max"),
    ("attn_raw_var", "Var(q.k)/d_head, raw", "mean"),
)


def cell(iv: Optional[st.Interval], digits: Optional[int] = 4) -> str:
    """"mean ± half" with `digits` decimals; digits None: 4 significant digits of the mean
    (attention statistics span 1e-3 to 1e4)."""
    if iv is None:
        return "n/a"
    if digits is None:
        digits = significant_decimals(iv.mean)
    if iv.half is None:
        return f"{iv.mean:.{digits}f} (n=1)"
    return f"{iv.mean:.{digits}f} ± {iv.half:.{digits}f}"


def significant_decimals(x: float, figures: int = 4) -> int:
    if x == 0 or not math.isfinite(x):
        return figures - 1
    return max(0, figures - 1 - math.floor(math.log10(abs(x))))


def cell_n(iv: Optional[st.Interval], digits: int = 4) -> str:
    """cell() with n appended (a single value already says n=1)."""
    return cell(iv, digits) + (f" (n={iv.n})" if iv is not None and iv.half is not None else "")


def loss_cell(runs: list[Run], which: str) -> str:
    """Interval of the final loss over the runs that did not diverge, or why there is none."""
    ok = [r for r in runs if not r.diverged]
    values = [st.final_loss(r, which) for r in ok]
    missing = sum(v is None for v in values)
    if missing:
        running = sum(r.partial for r in ok)
        return (f"missing: {missing} of {len(ok)} runs lack {st.LOSSES[which][0]}"
                + (f" ({running} still running)" if running else ""))
    iv = st.mean_interval(values)
    return "n/a (all diverged)" if iv is None else cell_n(iv)


def results_table(groups: dict[tuple, list[Run]], which: str) -> list[str]:
    name = st.LOSSES[which][1]
    extra = which != "sampled"
    head = f"| group | runs | {name} |" + (" sampled final val loss |" if extra else "")
    lines = [head + " best sampled val loss | diverged | still running | tokens/s | steps |",
             "|---|---:|---:|" + ("---:|" if extra else "") + "---:|---:|---:|---:|---:|"]
    for key, runs in groups.items():
        ok = [r for r in runs if not r.diverged]
        rates = [r.tokens_per_sec for r in runs]
        lines.append(
            f"| {label(key)} | {len(runs)} | {loss_cell(runs, which)} |"
            + (f" {loss_cell(runs, 'sampled')} |" if extra else "")
            + f" {cell(st.mean_interval([r.best_val_loss for r in ok]))}"
            f" | {sum(r.diverged for r in runs)} | {sum(r.partial for r in runs)}"
            f" | {cell(st.mean_interval(rates), 0)} | {steps_cell(runs)} |")
    return lines


def steps_cell(runs: list[Run]) -> str:
    """The horizon: the steps the runs ran (summary.json), or reached so far (last eval)."""
    steps = sorted({int(r.summary_value("steps") if r.summary_value("steps") is not None
                        else r.evals[-1].get("step", 0)) for r in runs})
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def paired_rows(values: dict[tuple, dict], ref: tuple) -> list[tuple]:
    """(setting, variant, difference interval) of each group minus its reference group, paired
    by seed: the reference is the same key with ref = (config key, value) put in, e.g.
    ("scaling", "sqrt_dk"). values maps a group key to {seed: number}."""
    name, value = ref
    rows = []
    for key, seeds in values.items():
        if dict(key).get(name, value) == value:
            continue  # the reference itself, or a sweep that does not vary `name`
        other = tuple((k, value if k == name else v) for k, v in key)
        if other in values:
            rows.append((setting_of(key), key[0][1],
                         st.paired_difference(seeds, values[other])))
    return rows


def ref_text(ref: tuple) -> str:
    return ref[1] if ref[0] == VARIANT_KEY else label([ref])


def paired_table(values: dict[tuple, dict], ref: tuple, what: str) -> list[str]:
    rows = paired_rows(values, ref)
    name = ref_text(ref)
    if not rows:
        return [f"No paired comparison: no `{name}` runs at the settings of the others."]
    lines = [f"| setting | variant | pairs | {what}: group − {name} | reading |",
             "|---|---|---:|---:|---|"]
    for setting, variant, diff in rows:
        reading = st.verdict(diff, f"lower than {name}", f"higher than {name}")
        lines.append(f"| {label(setting, 'all')} | {variant} | {diff.n if diff else 0}"
                     f" | {cell(diff)} | {reading} |")
    return lines


def layer_value(record: dict, name: str, how: str) -> Optional[float]:
    values = [float(v) for v in record.get(name) or [] if v is not None]
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return None
    return max(values) if how == "max" else sum(values) / len(values)


def diagnostics_table(groups: dict[tuple, list[Run]], pick: int, title: str) -> list[str]:
    """Attention statistics at one evaluation of each run (0: first, -1: last)."""
    names = [heading for _, heading, _ in DIAGNOSTICS]
    lines = [f"### {title}", "",
             "| group | runs | step | " + " | ".join(names) + " |",
             "|---|---:|---:|" + "---:|" * len(names)]
    for key, runs in groups.items():
        records = [r.evals[pick] for r in runs]
        steps = sorted({str(e.get("step")) for e in records})
        cells = []
        for name, _, how in DIAGNOSTICS:
            values = [layer_value(e, name, how) for e in records]
            cells.append(cell(st.mean_interval([v for v in values if v is not None]), None)
                         if any(v is not None for v in values) else "not recorded")
        lines.append(f"| {label(key)} | {len(runs)} | {'/'.join(steps)} | "
                     + " | ".join(cells) + " |")
    return lines


def lr_section(runs: list[Run], which: str, baseline: str) -> list[str]:
    """Best LR, loss at it, LR sensitivity per variant and setting, and the paired
    differences of the last two against the baseline at each setting."""
    variants = group_runs(runs, drop=(LR_KEY,))
    summaries = {key: st.lr_table(vruns, which) for key, vruns in variants.items()}
    # sensitivity = mean over the grid - minimum over the grid, so both are shown: a low best
    # loss alone raises the sensitivity
    lines = ["| group | LRs | best LR | LRs not resolved from it | loss at best LR"
             " | mean loss over the grid | LR sensitivity | diverged |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    for key, table in summaries.items():
        best = st.best_lr(table)
        if best is None:
            lines.append(f"| {label(key)} | {len(table)} | n/a: no run has a"
                         f" {st.LOSSES[which][0]} and a loss at init | | | | | |")
            continue
        grid = st.mean_interval(list(st.grid_mean_by_seed(table).values()))
        sens = st.mean_interval(list(st.sensitivity_by_seed(table).values()))
        tied = ", ".join(f"{lr:g}" for lr in best["tied"]) or "none"
        lines.append(f"| {label(key)} | {len(table)} | {best['lr']:g} | {tied}"
                     f" | {cell_n(best['loss'])} | {cell_n(grid)} | {cell_n(sens)}"
                     f" | {sum(r.diverged for r in variants[key])} |")
    best_loss = {key: st.loss_at_best_lr(table) for key, table in summaries.items()}
    sens_seed = {key: st.sensitivity_by_seed(table) for key, table in summaries.items()}
    lines += ["", "Loss at each variant's own best LR, paired by seed against "
              f"`{baseline}` at the same setting:", ""]
    lines += paired_table(best_loss, (VARIANT_KEY, baseline), "loss at best LR")
    lines += ["", f"LR sensitivity, paired by seed against `{baseline}`:", ""]
    lines += paired_table(sens_seed, (VARIANT_KEY, baseline), "LR sensitivity")
    lines += ["", "Mean clipped final loss per learning rate (a diverged run counts as its loss"
              " at init; `div` = runs diverged):", ""] + lr_grid(variants, summaries)
    return lines


def lr_grid(variants, summaries) -> list[str]:
    lrs = sorted({lr for table in summaries.values() for lr in table})
    lines = ["| group | " + " | ".join(f"lr={lr:g}" for lr in lrs) + " |",
             "|---|" + "---:|" * len(lrs)]
    for key, table in summaries.items():
        cells = []
        for lr in lrs:
            iv = st.mean_interval(list(table.get(lr, {}).values()))
            div = sum(r.diverged for r in variants[key] if r.lr == lr)
            cells.append(cell(iv) + (f" ({div} div)" if div else "") if iv else "")
        lines.append(f"| {label(key)} | " + " | ".join(cells) + " |")
    return lines


def markdown_report(roots, runs, groups, skipped, notes, which: str, baseline: str,
                    lr_runs: Optional[list[Run]], pairs: tuple = ()) -> str:
    """results.md: results, paired differences against the baseline scale and against each
    (key, value) of pairs, attention statistics, LR analysis if the runs vary optim.lr
    (lr_runs), then what was still running, skipped or odd."""
    field, name = st.LOSSES[which]
    lines = ["# Sweep results", "", "Sweeps read: " + ", ".join(f"`{r}`" for r in roots), "",
             f"Loss: {name} (`{field}` in summary.json), over the runs of a group that did not"
             " diverge. Every number is the mean over seeds ± the half-width of its 95%"
             " Student-t interval, with n the number of seeds; `(n=1)` has no interval."
             " Sampled losses come from the fixed evaluation batches.", ""]
    lines += results_table(groups, which)
    values = {key: st.by_seed(g, lambda r: st.final_loss(r, which)) for key, g in groups.items()}
    for ref in ((VARIANT_KEY, baseline), *pairs):
        lines += ["", f"## Paired differences against `{ref_text(ref)}`", "",
                  f"Per seed, a group's {name} minus that of the same setting and seed with"
                  f" `{label([ref])}`; an ordering is read only where the 95% interval of the"
                  " difference excludes 0.", ""] + paired_table(values, ref, name)
    lines += ["", "## Attention statistics", "",
              "Entropy, saturated-row fraction and raw variance: mean over layers; max logits:"
              " max over layers. Scaled = the logit softmax sees; raw = q.k before the scale.",
              ""]
    lines += diagnostics_table(groups, 0, "First evaluation") + [""]
    lines += diagnostics_table(groups, -1, "Last evaluation")
    if lr_runs:
        lines += ["", "## Learning rate", "",
                  "Per variant and setting, over the LR grid: the best LR (lowest mean clipped"
                  f" {name}), the LRs whose paired difference to it is not resolved, and the"
                  " LR sensitivity of Wortsman et al. 2023 (per seed: mean over the grid of"
                  " min(loss, loss at init) minus its minimum over the grid).", ""]
        lines += lr_section(lr_runs, which, baseline)
    partial = [r for r in runs if r.partial]
    if partial:
        lines += ["", "## Still running (no summary.json)", ""]
        lines += [f"- {r.path} (last eval at step {r.evals[-1].get('step')})" for r in partial]
    lines += ["", "## Skipped", ""] + ([f"- {s}" for s in skipped] or ["- none"])
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
