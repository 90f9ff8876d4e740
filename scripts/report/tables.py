"""The Markdown tables of results.md (docs/report.md says how to read each). `levels`: the
n-gram reference levels in nats per token, or None."""

import math
from dataclasses import dataclass
from typing import Optional

from model.config import SATURATION_THRESHOLD
from scripts.report import stats as st
from scripts.report.runs import (
    LR_KEY,
    SOLVED_ACCURACY,
    VARIANT_KEY,
    group_runs,
    label,
    varying_keys,
)
from scripts.report.width import WIDTH_KEY, width_section

DIAGNOSTICS = (  # eval-record field, column heading, how layers are combined
    ("attn_entropy", "entropy (nats)", "mean"),
    ("attn_saturated", "saturated rows", "mean"),
    ("attn_max_logit", "max logit, scaled", "max"),
    ("attn_raw_max_logit", "max q.k, raw", "max"),
    ("attn_raw_var", "Var(q.k)/d_head, raw", "mean"),
)
RATIO_LIMIT = 2.0   # losses more than this many times apart are compared by their logs
ONE_LR = "one LR: not defined"


def cell(iv: Optional[st.Interval], digits: Optional[int] = 4, n: bool = False) -> str:
    """"mean ± half" with `digits` decimals (None: 4 significant digits), n: and " (n=...)"."""
    if iv is None:
        return "n/a"
    if digits is None:   # attention statistics span 1e-3 to 1e4
        x = abs(iv.mean)
        digits = 3 if x == 0 or not math.isfinite(x) else max(0, 3 - math.floor(math.log10(x)))
    if iv.half is None:
        return f"{iv.mean:.{digits}f} (n=1)"
    return f"{iv.mean:.{digits}f} ± {iv.half:.{digits}f}" + (f" (n={iv.n})" if n else "")


def loss_cell(ok: list, which: str) -> str:
    """Interval of the final loss over the runs that did not fail, or why there is none."""
    values = [st.final_loss(r, which) for r in ok]
    if missing := sum(v is None for v in values):
        running = sum(r.partial for r in ok)
        return (f"missing: {missing} of {len(ok)} runs lack {st.LOSSES[which][0]}"
                + (f" ({running} still running)" if running else ""))
    iv = st.mean_interval(values)
    return "n/a (all failed)" if iv is None else cell(iv, n=True)


def results_table(groups: dict, which: str, levels: Optional[dict], recall: bool) -> list[str]:
    name, extra = st.LOSSES[which][1], which != "sampled"
    head = f"| group | runs | {name} |" + (" sampled final val loss |" if extra else "")
    lines = [head + " best sampled val loss | failed | still running | tokens/s | steps |",
             "|---|---:|---:|" + ("---:|" if extra else "") + "---:|---:|---:|---:|---:|"]
    for key, runs in groups.items():
        ok = [r for r in runs if st.failure(r, which, levels) is None]
        steps = sorted({int(r.summary_value("steps") if r.summary_value("steps") is not None
                            else r.evals[-1].get("step", 0)) for r in runs})
        lines.append(
            f"| {label(key)} | {len(runs)} | {loss_cell(ok, which)} |"
            + (f" {loss_cell(ok, 'sampled')} |" if extra else "")
            + f" {cell(st.mean_interval([r.best_val_loss for r in ok]))}"
            f" | {len(runs) - len(ok)} | {sum(r.partial for r in runs)}"
            f" | {cell(st.mean_interval([r.tokens_per_sec for r in runs]), 0)}"
            f" | {steps[0]}{f'-{steps[-1]}' if len(steps) > 1 else ''} |")
    field = st.LOSSES[which][0]
    rule = (f"above the unigram reference level ({levels['unigram']:.4f} nats/token) or above"
            " its own step-0 loss" if levels else "above its own step-0 loss" + (
                " (data=recall generates its sequences: there is no corpus and no n-gram"
                " reference level, so the unigram rule does not apply)" if recall else
                " (no reference levels were given, so the unigram rule is not applied)"))
    return lines + ["", f"`failed`: runs whose loss is non-finite (diverged), or whose `{field}`"
                    f" is {rule}. Means and intervals are over the runs that did not fail."]


def recall_table(groups: dict, which: str) -> list[str]:
    """Per recall group: steps to SOLVED_ACCURACY, never solved, final accuracy, loss."""
    threshold = f"{SOLVED_ACCURACY:g}"
    lines = [f"| group | runs | steps to {threshold} val accuracy | not solved | final val"
             f" accuracy | {st.LOSSES[which][1]} |", "|---|---:|---:|---:|---:|---:|"]
    for key, runs in groups.items():
        runs = [r for r in runs if r.recall]
        done = [r for r in runs if not r.partial]
        steps = [r.steps_to_90 for r in runs if r.steps_to_90 is not None]
        waiting = sum(r.steps_to_90 is None for r in runs if r.partial)
        lines += [
            f"| {label(key)} | {len(runs)}"
            f" | {cell(st.mean_interval(steps), 0, n=True) if steps else 'none got there'}"
            f" | {sum(r.steps_to_90 is None for r in done)}"
            + (f" (+{waiting} still running below it)" if waiting else "")
            + f" | {recall_cell([r.summary_value('final_val_accuracy') for r in done])}"
            f" | {recall_cell([st.final_loss(r, which) for r in done])} |"] if runs else []
    return lines + ["", f"`steps to {threshold} val accuracy`: the first evaluation at which"
                    f" `val_accuracy` (the sampled validation batches) is at least {threshold}"
                    " (runs.csv's `steps_to_90`), mean over the runs that got there (their n);"
                    " `not solved`: finished runs that never got there. Final accuracy"
                    " (`final_val_accuracy`, the whole validation set) and loss are over every"
                    " finished run, failed runs included: on this task a run that does not"
                    " learn is the outcome measured, not a broken run."]


def recall_cell(values: list[Optional[float]]) -> str:
    iv = st.mean_interval(values)
    lacking = sum(v is None or not math.isfinite(v) for v in values)
    if iv is None:
        return "n/a"
    return cell(iv, n=True) + (f" ({lacking} without a finite value)" if lacking else "")


class Against(tuple):
    """An --against setting ((key, value), ...): the reference at these values."""


def reference(key: tuple, control: tuple) -> Optional[tuple]:
    """The group a group is paired with: the one key it differs in from a control set back
    (None if two), or an Against's named keys at their values."""
    if isinstance(control, Against):
        return tuple((k, dict(control).get(k, v)) for k, v in key)
    differ = [(name, value) for name, value in control
              if dict(key).get(name, value) != value]   # a key the sweep lacks: no differ
    if len(differ) != 1:
        return None
    name, value = differ[0]
    return tuple((k, value if k == name else v) for k, v in key)


def paired_rows(values: dict[tuple, dict], control: tuple, log: bool = False) -> list[tuple]:
    """(setting, variant, comparison) of each group against its reference, one family."""
    rows = [(key, reference(key, control)) for key in values]
    rows = [(key, other) for key, other in rows if other not in (None, key) and other in values]
    tests = st.family([(values[key], values[other]) for key, other in rows], log)
    return [(key[1:], key[0][1], c) for (key, _), c in zip(rows, tests)]


def ref_text(control: tuple) -> str:
    return ", ".join(value if name == VARIANT_KEY else label([(name, value)])
                     for name, value in control)


def against_text(control: tuple, sentence: bool = False) -> str:
    """What a group is paired with, as a column calls it (sentence: as the intro says it)."""
    if isinstance(control, Against):
        return (" and the group's own value of every other key (the reference: every group"
                " whose other keys equal a reference group's is paired with it)") if sentence \
            else "reference"
    if len(control) == 1:
        return "" if sentence else ref_text(control)
    return (" (the control: a group is paired with it where it differs from it in one of these"
            " keys)") if sentence else "control"


def family_line(rows: list, test: str) -> str:
    tested = sum(c.p is not None for _, _, c in rows)
    same = sum(c.identical for _, _, c in rows)
    untested = len(rows) - tested - same
    return (f"Family: {tested} paired t-tests{test}, Holm-adjusted together"
            + (f"; {untested} more without two pairs, untested" if untested else "")
            + (f"; {same} of identical runs (every pair equal), not tests and not"
               " counted" if same else "") + f". Resolved: Holm p < {st.ALPHA:g}.")


def paired_table(values: dict[tuple, dict], control: tuple, what: str,
                 loss: bool = False) -> list[str]:
    """The paired differences against `control`, one Holm family (loss: on log loss too)."""
    rows = paired_rows(values, control)
    if not rows:
        return [f"No paired comparison: no `{ref_text(control)}` runs at the settings of the"
                " others."]
    against = against_text(control)
    logs = paired_rows(values, control, log=True) if loss else [(0, 0, None)] * len(rows)
    lines = [f"| setting | variant | pairs | {what}: group − {against} | p (paired t) | Holm p"
             " | reading |", "|---|---|---:|---:|---:|---:|---|"]
    for (setting, variant, c), (_, _, lc) in zip(rows, logs):
        reading = st.verdict(c, f"lower than {against}", f"higher than {against}")
        if lc is not None and lc.diff is not None and abs(lc.diff.mean) > math.log(RATIO_LIMIT):
            reading = (st.verdict(lc, f"lower than {against}", f"higher than {against}")
                       + f" (log loss test: more than {RATIO_LIMIT:g}x apart)")
        lines.append(f"| {label(setting, 'all')} | {variant} | {c.diff.n if c.diff else 0}"
                     f" | {cell(c.diff)} | {st.p_text(c.p)} | {st.p_text(c.p_holm)} | {reading} |")
    lines += ["", family_line(rows, "")]
    return lines + (log_table(logs, against) if loss else [])


def log_table(rows: list, against: str) -> list[str]:
    lines = ["", f"The same pairs on log loss: the ratio group / {against} (exp of the mean"
             " per-seed log ratio, 95% t interval) and the paired t-test of the log losses."
             f" A row whose ratio is above {RATIO_LIMIT:g} or below 1/{RATIO_LIMIT:g} reads this"
             " test's verdict in the table above; the others read the difference.", "",
             f"| setting | variant | pairs | ratio group / {against} | p (paired t, log) |"
             " Holm p | reading |", "|---|---|---:|---:|---:|---:|---|"]
    for setting, variant, c in rows:
        lines.append(f"| {label(setting, 'all')} | {variant} | {c.diff.n if c.diff else 0}"
                     f" | {ratio_text(c)} | {st.p_text(c.p)} | {st.p_text(c.p_holm)}"
                     f" | {st.verdict(c, f'lower than {against}', f'higher than {against}')} |")
    return lines + ["", family_line(rows, " of log loss")]


def ratio_text(c: st.Comparison) -> str:
    """exp of a mean log ratio with its 95% interval."""
    if c.diff is None:
        return "n/a"
    lo, hi = (f"{math.exp(x):.4g}" for x in (c.diff.lo, c.diff.hi))
    return f"{math.exp(c.diff.mean):.4g}" + ("" if c.diff.half is None else f" ({lo} to {hi})")


def layer_value(record: dict, name: str, how: str) -> Optional[float]:
    values = [float(v) for v in record.get(name) or [] if v is not None and math.isfinite(v)]
    return (max(values) if how == "max" else sum(values) / len(values)) if values else None


def diagnostics_table(groups: dict, pick: int, title: str) -> list[str]:
    names = [heading for _, heading, _ in DIAGNOSTICS]
    lines = [f"### {title}", "", "| group | runs | step | " + " | ".join(names) + " |",
             "|---|---:|---:|" + "---:|" * len(names)]
    for key, runs in groups.items():
        records = [r.evals[pick] for r in runs]
        steps = sorted({str(e.get("step")) for e in records})
        cells = []
        for name, _, how in DIAGNOSTICS:
            values = [v for e in records if (v := layer_value(e, name, how)) is not None]
            cells.append(cell(st.mean_interval(values), None) if values else "not recorded")
        lines.append(f"| {label(key)} | {len(runs)} | {'/'.join(steps)} | "
                     + " | ".join(cells) + " |")
    return lines


def lr_section(runs: list, reading: "Reading") -> list[str]:
    """Per group: best LR, its held-out loss, LR sensitivity; paired per control."""
    which, levels, plan = reading.which, reading.levels, reading.plan or st.Plan()
    variants = group_runs(runs, drop=(LR_KEY,))
    summaries = {key: st.lr_table(vruns, which) for key, vruns in variants.items()}
    chosen = st.held_out(runs, which, plan)
    lines = [selection_caption(plan, runs), "",
             "| group | LRs | best LR | LRs not resolved from it | loss at the chosen LR,"
             " held-out seeds | LR it was read at | mean loss over the grid | LR sensitivity"
             " | failed |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    lines += [lr_row(key, table, chosen[key], variants[key], (which, levels))
              for key, table in summaries.items()]
    sens_seed = {key: st.sensitivity_by_seed(table) for key, table in summaries.items()
                 if len(table) > 1}
    for control in reading.controls:
        lines += lr_comparisons({key: held["loss"] for key, held in chosen.items()}, sens_seed,
                                control)
    lines += ["", "Mean clipped final loss per learning rate (a diverged run counts as its loss"
              " at init; `failed` = runs that failed), and the largest LR each group survives:",
              ""]
    return lines + lr_grid(variants, summaries, which, levels)


def lr_row(key: tuple, table: dict, held: dict, runs: list, reading: tuple) -> str:
    (which, levels), best = reading, held["best"]
    failed = sum(st.failure(r, which, levels) is not None for r in runs)
    grid = cell(st.mean_interval(list(st.grid_mean_by_seed(table).values())), n=True)
    sens = cell(st.mean_interval(list(st.sensitivity_by_seed(table).values())), n=True) \
        if len(table) > 1 else ONE_LR
    if best is None:
        return (f"| {label(key)} | {len(table)} | n/a: no selection run has a"
                f" {st.LOSSES[which][0]} and a loss at init | | | |"
                f" {grid} | {sens} | {failed} |")
    chosen = ", ".join(lr_text(lr, held["grid"]) for lr in sorted(set(held["chosen"].values())))
    return (f"| {label(key)} | {len(table)} | {lr_text(best['lr'], held['grid'])}"
            f" | {', '.join(f'{lr:g}' for lr in best['tied']) or 'none'}"
            f" | {cell(st.mean_interval(list(held['loss'].values())), n=True)}"
            f" | {chosen or 'n/a'} | {grid} | {sens} | {failed} |")


def lr_comparisons(best_loss: dict, sens_seed: dict, control: tuple) -> list[str]:
    name = ref_text(control)
    lines = ["", f"Loss at each variant's own chosen LR on the held-out seeds, paired by seed"
             f" against `{name}` at the same setting:", ""]
    lines += paired_table(best_loss, control, "loss at chosen LR", loss=True)
    if any(all(dict(key).get(k, v) == v for k, v in control) for key in sens_seed):
        return lines + ["", f"LR sensitivity, paired by seed against `{name}` (the groups with"
                        " more than one LR):", ""] + paired_table(sens_seed, control,
                                                                    "LR sensitivity")
    return lines + ["", (f"LR sensitivity: not compared. `{name}` ran one LR in this sweep,"
                         " where the sensitivity is 0 by construction (`one LR` above); the"
                         " groups with more than one LR have theirs in the table above."
                         if sens_seed else "LR sensitivity: not compared. Every group ran one"
                         " LR in this sweep, where the sensitivity is 0 by construction (`one"
                         " LR` above).")]


def seeds_text(seeds) -> str:
    return ", ".join(sorted(seeds, key=lambda s: (len(str(s)), str(s))))


def selection_caption(plan: st.Plan, runs: list) -> str:
    report = {r.seed for r in runs if plan.reports(r.seed)}
    if plan.leave_one_out:
        return ("Best LR: chosen on all seeds. Loss at the chosen LR: each seed's loss at the LR"
                " that is best on the other seeds (leave one seed out), so that no seed's"
                " loss chose its own LR; `LR it was read at` lists those LRs.")
    if plan.select_runs is None:
        select = {r.seed for r in runs if plan.selects(r.seed)}
        return (f"Best LR: chosen on seeds {seeds_text(select)}; loss at it: seeds"
                f" {seeds_text(report)}.")
    select = {r.seed for r in plan.select_runs if plan.selects(r.seed)}
    return (f"Best LR: chosen on the runs of `{plan.select_name}` (seeds {seeds_text(select)});"
            f" loss at it: this sweep's seeds {seeds_text(report)}."
            + (f" Seeds {seeds_text(select & report)} are on both sides: their runs share data"
               " order and initialisation with the runs that chose the LR."
               if select & report else ""))


def lr_text(lr: float, grid: list[float]) -> str:
    """An LR, flagged at its grid's edge: the optimum may lie beyond it."""
    return f"{lr:g}" + (" (grid edge)" if len(grid) > 1 and lr in (grid[0], grid[-1]) else "")


def lr_grid(variants, summaries, which: str, levels: Optional[dict]) -> list[str]:
    lrs = sorted({lr for table in summaries.values() for lr in table})
    lines = ["| group | " + " | ".join(f"lr={lr:g}" for lr in lrs) + " | survives up to |",
             "|---|" + "---:|" * (len(lrs) + 1)]
    for key, table in summaries.items():
        cells = []
        for lr in lrs:
            iv = st.mean_interval(list(table.get(lr, {}).values()))
            failed = sum(st.failure(r, which, levels) is not None
                         for r in variants[key] if r.lr == lr)
            cells.append(cell(iv) + (f" ({failed} failed)" if failed else "") if iv else "")
        safe = st.survives_up_to(variants[key], which, levels)
        cells.append("none" if safe is None else f"{safe:g}"
                     + (" (all)" if safe == max(table) else ""))
        lines.append(f"| {label(key)} | " + " | ".join(cells) + " |")
    return lines + ["", "`survives up to`: the largest LR at and below which no run of the group"
                    " failed; `(all)`: no run failed up to the largest LR it ran."]


@dataclass(frozen=True)
class Reading:
    """How a report reads its runs: loss, paired-table controls, levels, LR plan."""

    which: str
    baseline: str
    pairs: tuple = ()
    levels: Optional[dict] = None
    plan: Optional[st.Plan] = None
    one_control: bool = False
    against: tuple = ()   # --against settings, an Against each

    @property
    def controls(self) -> tuple:
        """The baseline scale and each --pair (or all as one control), each --against."""
        refs = ((VARIANT_KEY, self.baseline), *self.pairs)
        controls = (refs,) if self.one_control else tuple((ref,) for ref in refs)
        return controls + tuple(Against(a) for a in self.against)


def markdown_report(read: str, runs, groups, lr_runs: Optional[list], reading: Reading) -> str:
    """results.md's tables; `read` says what was read; `appendix` adds the rest."""
    which, levels = reading.which, reading.levels
    field, name = st.LOSSES[which]
    subset = "; ".join(f"{n:,} of the split's {m:,} targets" for n, m in st.subset_counts(runs))
    lines = ["# Sweep results", "", read, "",
             f"Loss: {name} (`{field}` in summary.json), over the runs of a group that did not"
             " fail. Every number is the mean over seeds ± the half-width of its 95%"
             " Student-t interval, with n the number of seeds; `(n=1)` has no interval."
             " Sampled losses come from the fixed evaluation batches."
             + (" The whole-split loss covers an even fixed subset of the validation split"
                f" (trainer.full_eval_tokens): {subset}." if which == "full" and subset else ""),
             ""]
    recall = any(r.recall for r in runs)
    lines += results_table(groups, which, levels, recall)
    if recall:
        lines += ["", "## Recall accuracy", ""] + recall_table(groups, which)
    lines += paired_sections(groups, reading) + attention_section(groups)
    if lr_runs:
        lines += ["", "## Learning rate", "", LR_INTRO.format(name=name), ""]
        lines += lr_section(lr_runs, reading)
        if WIDTH_KEY in varying_keys(lr_runs):
            lines += [""] + width_section(lr_runs, which)
    return "\n".join(lines) + "\n"


LR_INTRO = ("Per variant and setting, over the LR grid: the best LR (lowest mean clipped {name}),"
            " the LRs whose paired difference to it is not resolved (Holm over the comparisons"
            " with it), the loss at the chosen LR on seeds that did not choose it, and the LR"
            " sensitivity of Wortsman et al. 2023 (per seed: mean over the grid of min(loss,"
            " loss at init) minus its minimum over the grid). A failed run keeps its clipped"
            " loss here: dropping it would favour the LRs that fail. `(grid edge)`: the best LR"
            " is the smallest or largest tried, so the optimum may lie outside the grid.")


def paired_sections(groups: dict, reading: Reading) -> list[str]:
    which, name = reading.which, st.LOSSES[reading.which][1]
    values = {key: st.by_seed([r for r in g if st.failure(r, which, reading.levels) is None],
                              lambda r: st.final_loss(r, which)) for key, g in groups.items()}
    lines = []
    for control in reading.controls:
        lines += ["", f"## Paired differences against `{ref_text(control)}`", "",
                  f"Per seed, a group's {name} minus that of the same setting and seed with"
                  f" `{label(list(control))}`" + against_text(control, sentence=True)
                  + ", over the seeds where neither run failed; an ordering is read only where"
                  f" the Holm-adjusted p of the paired t-test is below {st.ALPHA:g}.", ""]
        lines += paired_table(values, control, name, loss=True)
    return lines


def attention_section(groups: dict) -> list[str]:
    return ["", "## Attention statistics", "",
            "Entropy, saturated-row fraction and raw variance: mean over layers; max logits:"
            " max over layers. Scaled = the logit softmax sees; raw = q.k before the scale."
            f" Saturated rows (largest weight above {SATURATION_THRESHOLD}) include each"
            " sequence's first query row, which sees one key and puts all its weight on it:"
            " the share has a floor of 1/T for T = model.block_size (0.0104 at the recall"
            " task's 96, 0.0156 at the default 64); read it against that floor.", "",
            *diagnostics_table(groups, 0, "First evaluation"), "",
            *diagnostics_table(groups, -1, "Last evaluation")]


def appendix(runs, reading: Reading, skipped: list[str], notes: list[str],
             figures: tuple = ()) -> str:
    """The end of results.md: failed and running runs, what was skipped, figures, notes."""
    failed = [(r, st.failure(r, reading.which, reading.levels)) for r in runs]
    lines = ["", "## Failed runs", ""] + (
        [f"- {r.path}: {why}" for r, why in failed if why] or ["- none"])
    partial = [r for r in runs if r.partial]
    if partial:
        lines += ["", "## Still running (no summary.json)", ""]
        lines += [f"- {r.path} (last eval at step {r.evals[-1].get('step')})" for r in partial]
    lines += ["", "## Skipped", ""] + ([f"- {s}" for s in skipped] or ["- none"])
    lines += ["", "## Figures", "", "What each shows: docs/report.md, \"The figures and what"
              " they promise\".", ""] + [f"- `{name}`" for name in figures] if figures else []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
