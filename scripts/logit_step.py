"""How far does one Adam step move the attention logits? The change of the scaled scores s q.k
over one optimizer step, measured, for each scale at the same learning rate.

    python scripts/logit_step.py [overrides ...] [--scales none sqrt_dk] [--at 1000 3000]
                                 [--seeds 1 2 3] [--out DIR]

The overrides are train.py's, before the -- arguments (when none are given:
`experiment=scaling_ablation optim.lr=4e-3`, the text ablation's model, corpus, schedule and
float32 at `sqrt_dk`'s LR). For each scale and seed it builds the run as train.py does
(trainer.build.build) and trains it with trainer.step.train_step up to each step of --at; there
it records each layer's input on the first fixed validation batch, takes one more optimizer
step, and compares the scaled scores s q.k computed from those same inputs before and after the
step, so that the change is that of W_q and W_k alone. Per layer, over the causal entries of
every head: mean |s q.k| before, mean |change of s q.k|, and the share of query rows with at
least two allowed keys whose largest weight is above 0.99. It prints one line per scale, seed,
step and layer, then the summary (each quantity's mean over layers, then over seeds with its 95%
t interval; each scale's step over `sqrt_dk`'s per seed, the paired t-test of the log steps,
Holm over the table), and writes logit_step.csv into --out; `--from-csv logit_step.csv` prints
the summary of a committed one.

The arithmetic it tests: Adam's step of W_q and W_k has about the same size whatever the
gradient's scale, and the raw q.k moves with it, so the scaled score's step is proportional to
s: sqrt(d_head) = 5.7 times larger for `none` than for `sqrt_dk` at d_head 32, at the same LR
and the same q and k. The runs differ in q and k after training, which is what the measurement adds.
"""

import argparse
import csv
import math
import sys
from pathlib import Path

import torch

from model.config import SATURATION_THRESHOLD
from scripts.common import compose_config, readable_errors
from scripts.report.stats import common_seeds, holm, mean_interval, paired_p
from trainer.build import build
from trainer.step import train_step

DEFAULT_OVERRIDES = ["experiment=scaling_ablation", "optim.lr=4e-3"]
BASELINE = "sqrt_dk"   # every other scale's step is compared with this one's
FIELDS = ["scaling", "seed", "step", "layer", "mean_abs_logit", "mean_abs_change",
          "saturated_rows"]


@torch.no_grad()
def scaled_scores(attn, x: torch.Tensor) -> torch.Tensor:
    """s q.k of one attention module for its input x (B, T, C): (B, H, T, T)."""
    q, k, _ = attn.split_heads(x)   # (B, H, T, D) each
    return (q * attn.scale()) @ k.transpose(-2, -1)


def saturated_share(scores: torch.Tensor) -> float:
    """The share of query rows with at least two allowed (causal) keys whose largest softmax
    weight is above SATURATION_THRESHOLD (0.99, as the run's statistics); the first row, with
    one key, is left out."""
    T = scores.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=scores.device).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)   # (B, H, T, T)
    return (weights[..., 1:, :].amax(dim=-1) > SATURATION_THRESHOLD).float().mean().item()


def layer_inputs(model, idx: torch.Tensor) -> list[torch.Tensor]:
    """Each block's attention input for the batch idx, by forward pre-hooks."""
    inputs: list[torch.Tensor] = []
    hooks = [block.attn.register_forward_pre_hook(lambda m, args: inputs.append(args[0].detach()))
             for block in model.blocks]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return inputs


def one_step(run, idx: torch.Tensor) -> list[dict]:
    """One optimizer step of the run; per layer the scores' size, their change and saturation."""
    model, state = run.state.model, run.state
    was_training = model.training
    model.eval()   # dropout off while the inputs are read
    inputs = layer_inputs(model, idx)
    before = [scaled_scores(block.attn, x) for block, x in zip(model.blocks, inputs)]
    model.train(was_training)
    train_step(state, run.compute, run.config.optim_cfg, run.config.train_cfg)
    rows = []
    T = idx.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    for layer, (block, x, old) in enumerate(zip(model.blocks, inputs, before)):
        new = scaled_scores(block.attn, x)
        rows.append({"layer": layer, "mean_abs_logit": old[..., causal].abs().mean().item(),
                     "mean_abs_change": (new - old)[..., causal].abs().mean().item(),
                     "saturated_rows": saturated_share(old)})
    return rows


def measure(overrides: list[str], scaling: str, seed: int, at: list[int]) -> list[dict]:
    """Train scaling at seed, measuring one step at each step of `at` (ascending)."""
    cfg = compose_config([*overrides, f"scaling={scaling}", f"trainer.seed={seed}"])
    run = build(cfg)   # seeds the model's initialisation with trainer.seed
    torch.manual_seed(seed)   # as train.py seeds dropout after building
    idx = run.eval_batches["val"][0].idx.to(run.compute.device)
    rows, step = [], 0
    for target in at:
        while step < target:
            train_step(run.state, run.compute, run.config.optim_cfg, run.config.train_cfg)
            step += 1
        rows += [{"scaling": scaling, "seed": seed, "step": step, **r}
                 for r in one_step(run, idx)]
        step += 1
    return rows


def read_csv(path: Path) -> list[dict]:
    """The rows of a logit_step.csv, numbers as numbers."""
    with path.open(newline="") as f:
        return [{**r, **{k: int(r[k]) for k in FIELDS[1:4]},
                 **{k: float(r[k]) for k in FIELDS[4:]}} for r in csv.DictReader(f)]


def interval_text(interval) -> str:
    """An Interval as mean ± half-width (n), to 3 significant digits."""
    if interval.half is None:
        return f"{interval.mean:.3g} (n={interval.n})"
    return f"{interval.mean:.3g} ± {interval.half:.2g} (n={interval.n})"


def layer_means(rows: list[dict], key: str) -> dict[tuple, dict[int, float]]:
    """(scaling, step) -> {seed: the mean of rows[key] over layers}."""
    values: dict[tuple, dict[int, list[float]]] = {}
    for r in rows:
        values.setdefault((r["scaling"], r["step"]), {}).setdefault(r["seed"], []).append(r[key])
    return {k: {seed: sum(v) / len(v) for seed, v in by_seed.items()}
            for k, by_seed in values.items()}


def summary(rows: list[dict], baseline: str) -> list[str]:
    """Per step and scale, the mean over layers then over seeds (95% t interval, n seeds) of the
    scores' size, one step's change and the saturated share; per step and scale, the per-seed
    ratio of its change to the baseline's, with the paired t-test of the log changes, Holm over
    every ratio of the table."""
    means = {key: layer_means(rows, key) for key in FIELDS[4:]}
    scales = list(dict.fromkeys(r["scaling"] for r in rows))
    steps = sorted({r["step"] for r in rows})
    labels = ("|s q.k|", "one step moves it", "saturated rows")
    lines, tests = [], []
    for step in steps:
        for scaling in scales:
            parts = []
            for key, label in zip(FIELDS[4:], labels):
                by_seed = means[key][scaling, step]
                parts.append(f"{label} {interval_text(mean_interval(list(by_seed.values())))}")
            lines.append(f"step {step}, {scaling}: " + ", ".join(parts))
            if scaling != baseline and (baseline, step) in means["mean_abs_change"]:
                ours, theirs = (means["mean_abs_change"][s, step] for s in (scaling, baseline))
                ratio = interval_text(mean_interval([ours[seed] / theirs[seed]
                                                     for seed in common_seeds(ours, theirs)]))
                p = paired_p({seed: math.log(v) for seed, v in ours.items()},
                             {seed: math.log(v) for seed, v in theirs.items()})
                tests.append((step, scaling, ratio, p))
    for (step, scaling, ratio, p), adjusted in zip(tests, holm([t[3] for t in tests])):
        lines.append(f"step {step}: {scaling}'s step over {baseline}'s, per seed: {ratio} "
                     f"(paired t of the log changes p {p:.3g}, Holm p {adjusted:.3g} over "
                     f"{len(tests)})" if p is not None else
                     f"step {step}: {scaling}'s step over {baseline}'s: {ratio} (untested)")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", nargs="+", default=["none", "sqrt_dk"])
    parser.add_argument("--at", nargs="+", type=int, default=[1000, 3000],
                        help="measure the step after this many steps (ascending)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--from-csv", type=Path, metavar="CSV",
                        help="print the summary of an earlier logit_step.csv; train nothing")
    parser.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES,
                        help="train.py's overrides (default: %(default)s)")
    args = parser.parse_args(argv)
    if sorted(args.at) != args.at or args.at[0] < 0:
        parser.error(f"--at must be ascending step counts from 0, got {args.at}")
    if args.from_csv:
        print("\n".join(summary(read_csv(args.from_csv), BASELINE)))
        return 0
    rows: list[dict] = []
    status = readable_errors(lambda: rows.extend(run_all(args)))   # a bad override: exit 2
    if status:
        return status
    print("\n".join(summary(rows, BASELINE)))
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "logit_step.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({**r, **{k: f"{r[k]:.6g}" for k in FIELDS[4:]}} for r in rows)
    return 0


def run_all(args) -> list[dict]:
    """measure() of every scale and seed, each row printed as it comes."""
    rows = []
    for scaling in args.scales:
        for seed in args.seeds:
            for r in measure(args.overrides, scaling, seed, args.at):
                print(f"{r['scaling']:8} seed {r['seed']} step {r['step']} layer {r['layer']}: "
                      f"mean |s q.k| {r['mean_abs_logit']:.4g}, one step moves it "
                      f"{r['mean_abs_change']:.4g}, saturated rows {r['saturated_rows']:.3f}")
                rows.append(r)
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
