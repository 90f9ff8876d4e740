"""muP's coordinate check (Yang et al. 2022, Tensor Programs V; mup's get_coord_data): does the
size of each layer's output stay put as the model widens, after a few Adam steps at one LR?

    python scripts/coord_check.py [--widths 64 128 256 512 1024] [--steps 5] [--lr 1e-2]
                                  [--seeds 4] [--out docs/figures/coord_check]
    python scripts/coord_check.py --from-csv docs/figures/coord_check/coord_check.csv
                                  [--lr 1e-2] [--out DIR]

For each arm of {sp, mup} x {sqrt_dk, dk} (param x scaling) and each width d_model, with
n_head fixed at 4 so that d_head grows with the width (1/d against 1/sqrt(d) differ only
then), it trains the model `--steps` AdamW steps at `--lr` and records, by forward hooks (the
model is not changed), the mean |coordinate| at steps 0 (initialisation) to `--steps` of:

- embedding: wte(idx) + wpe(pos), the blocks' input;
- attn_logits.<l>: block l's scaled scores s q.k over the causal entries (the hook recomputes
  them from the attention's input: forward's SDPA keeps none);
- attn_out.<l>, mlp_out.<l>: the outputs of block l's attention and MLP branches;
- logits: the read-out, param's multiplier included.

The optimizer is train.py's (trainer.build.make_optimizer: param's groups, AdamW (0.9, 0.99),
eps 1e-8, weight decay 0.1), at a constant LR with no warm-up and no gradient clipping. The
data is a fixed batch (mup's fix_data) of 4 x 16 uniformly random tokens from a vocabulary of
65, the default corpus's characters: it needs no data cache, and the check asks how the
updates scale with width, not what they learn. Each seed draws its own model and batch; the
figure and the growth table show the mean over seeds, the CSV every seed. It writes
coord_check.csv (arm, width, seed, step, quantity, value) and coord_check.png (a row of panels
per arm, one per quantity, width on a log axis, a line per step) into --out, and prints each
quantity's growth: its value at the widest width over that at the narrowest, at the last step.
--from-csv redraws the figure and the growth from a coord_check.csv without training (its
steps and seeds from the CSV; give the --lr it was made with, which the title names).
Under muP the lines flatten as the width grows; under SP with Adam the updates, and with them
the attention logits and the output logits, grow with width. docs/scaling.md, section 9, has
the figure, the measured time and what the check can and cannot tell.
"""

import argparse
import csv
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from model.config import GPTConfig, ParamConfig, ScalingConfig
from model.gpt import GPT
from trainer.build import make_optimizer
from trainer.schema import OptimConfig

ARMS = (("sp", "sqrt_dk"), ("sp", "dk"), ("mup", "sqrt_dk"), ("mup", "dk"))  # (param, scaling)
WIDTHS = (64, 128, 256, 512, 1024)
VOCAB = 65   # the default corpus's characters; the tokens are random


@dataclass(frozen=True)
class Setup:
    """Everything but the arm and the width: the model's other dimensions, the data, the run."""

    n_layer: int = 2
    n_head: int = 4                # fixed: d_head = d_model / 4 grows with the width
    # 64 tokens a step: muP's limit is the width growing at a fixed batch, and the updates are
    # coherent only once the width is well above the tokens that make a gradient
    block_size: int = 16
    batch_size: int = 4
    steps: int = 5
    lr: float = 1e-2
    seeds: int = 4                 # seeds 0..seeds-1, each its own model and batch: averaged
    base_width: int = ParamConfig().base_width   # where mup is sp


def arm_name(arm: tuple[str, str]) -> str:
    return f"{arm[0]}, {arm[1]}"


def quantities(n_layer: int) -> list[str]:
    """The recorded quantities in the order of the forward pass."""
    per_block = [f"{q}.{layer}" for q in ("attn_logits", "attn_out", "mlp_out")
                 for layer in range(n_layer)]
    return ["embedding", *per_block, "logits"]


def build_model(arm: tuple[str, str], width: int, setup: Setup, seed: int) -> GPT:
    """The arm's model at d_model = width, seeded: every arm draws the same random numbers."""
    torch.manual_seed(seed)
    param, scaling = arm
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=setup.block_size, n_layer=setup.n_layer,
                         n_head=setup.n_head, d_model=width, bias=False,
                         scaling=ScalingConfig(name=scaling),
                         param=ParamConfig(name=param, base_width=setup.base_width)))


def fixed_batch(setup: Setup, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of random tokens, the same at every step, arm and width: idx and targets."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(VOCAB, (setup.batch_size, setup.block_size + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]  # (B, T) each, targets the next token


def mean_abs(into: dict, name: str):
    """A forward hook that stores the mean |coordinate| of the module's output in into[name]."""
    def hook(module, inputs, output):
        into[name] = output.detach().abs().mean().item()
    return hook


def logits_hook(into: dict, name: str):
    """A forward hook on a MultiHeadAttention: the mean |s q.k| over the causal entries of its
    input's scores, recomputed from the input by the module's own split_heads and scale."""
    @torch.no_grad()
    def hook(attn, inputs, output):
        q, k, _ = attn.split_heads(inputs[0])  # (B, H, T, D) each
        scores = (q * attn.scale()) @ k.transpose(-2, -1)  # (B, H, T, T)
        T = scores.shape[-1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T): key <= query
        into[name] = scores.abs()[..., causal].mean().item()
    return hook


def watch(model: GPT, into: dict) -> list:
    """Forward hooks on every recorded quantity; the handles, to remove them."""
    hooks = [(model.drop, mean_abs(into, "embedding")), (model.lm_head, mean_abs(into, "logits"))]
    for layer, block in enumerate(model.blocks):
        hooks += [(block.attn, logits_hook(into, f"attn_logits.{layer}")),
                  (block.attn, mean_abs(into, f"attn_out.{layer}")),
                  (block.mlp, mean_abs(into, f"mlp_out.{layer}"))]
    return [module.register_forward_hook(hook) for module, hook in hooks]


def coordinates(arm: tuple[str, str], width: int, setup: Setup, seed: int) -> list[dict]:
    """One row per step 0..setup.steps and quantity: the arm's model at `width`, trained on the
    seed's fixed batch, its coordinates read before each update (step t: after t updates)."""
    model = build_model(arm, width, setup, seed).train()
    optimizer = make_optimizer(model, OptimConfig(lr=setup.lr, min_lr=0.0, warmup_steps=0),
                               torch.device("cpu"))
    idx, targets = fixed_batch(setup, seed)
    rows = []
    for step in range(setup.steps + 1):
        into: dict[str, float] = {}
        handles = watch(model, into)
        _, loss = model(idx, targets)
        for handle in handles:
            handle.remove()
        rows += [{"arm": arm_name(arm), "width": width, "seed": seed, "step": step,
                  "quantity": name, "value": value} for name, value in into.items()]
        if step < setup.steps:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return rows


def coord_check(widths: tuple[int, ...], setup: Setup,
                arms: tuple[tuple[str, str], ...] = ARMS) -> list[dict]:
    """coordinates() of every arm at every width, for each seed."""
    return [row for arm in arms for width in widths for seed in range(setup.seeds)
            for row in coordinates(arm, width, setup, seed)]


def value(rows: list[dict], arm: str, quantity: str, step: int) -> dict[int, float]:
    """width -> the quantity's value for the arm (arm_name) at the step, the mean over seeds."""
    picked: dict[int, list[float]] = {}
    for r in rows:
        if r["arm"] == arm and r["quantity"] == quantity and r["step"] == step:
            picked.setdefault(r["width"], []).append(r["value"])
    return {width: sum(values) / len(values) for width, values in picked.items()}


def growth(rows: list[dict], arm: tuple[str, str], quantity: str, step: int) -> float:
    """The quantity at the widest width over the narrowest, at the step: 1 is flat."""
    by_width = value(rows, arm_name(arm), quantity, step)
    return by_width[max(by_width)] / by_width[min(by_width)]


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["arm", "width", "seed", "step", "quantity",
                                               "value"])
        writer.writeheader()
        writer.writerows({**r, "value": f"{r['value']:.6g}"} for r in rows)


def read_csv(path: Path) -> list[dict]:
    """The rows write_csv wrote (values to 6 significant digits)."""
    with path.open(newline="") as f:
        return [{**r, "width": int(r["width"]), "seed": int(r["seed"]), "step": int(r["step"]),
                 "value": float(r["value"])} for r in csv.DictReader(f)]


def plot(rows: list[dict], setup: Setup, path: Path) -> None:
    """A row of panels per arm, a panel per quantity: the mean over seeds against width, a line
    per step from dark (initialisation) to light (the last step), both axes log (the quantities
    grow by orders of magnitude); each point on its width, a hollow marker of its own shape per
    step, so that equal values show both."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    names = quantities(setup.n_layer)
    fig, axes = plt.subplots(len(arms), len(names), figsize=(2.3 * len(names), 2.0 * len(arms)),
                             squeeze=False)
    colors = plt.cm.viridis([t / max(1, setup.steps) for t in range(setup.steps + 1)])
    zeros = {}   # quantity -> the (arm, step)s at 0 (muP's zero W_q: logits 0 at step 0)
    for (i, arm), (j, name) in itertools.product(enumerate(arms), enumerate(names)):
        ax = axes[i][j]
        for step in range(setup.steps + 1):
            by_width = value(rows, arm, name, step)
            widths = sorted(by_width)
            if any(by_width[w] <= 0 for w in widths):
                zeros.setdefault(name, set()).add(f"{arm} at step {step}")
            ax.plot(widths, [by_width[w] if by_width[w] > 0 else math.nan for w in widths],
                    marker="os^Dv<>p"[step % 8], mfc="none", ms=3.5, mew=0.8, lw=1,
                    color=colors[step], label=f"step {step}")   # hollow: equal values show
        log_axes(ax)
        ax.set_title(name if i == 0 else "", fontsize=9)
        ax.set_xlabel("d_model" if i == len(arms) - 1 else "", fontsize=8)
        ax.set_ylabel(f"{arm}\nmean |x|" if j == 0 else "", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
    left = "; ".join(f"{name} of {', '.join(sorted(at))}" for name, at in zeros.items())
    fig.suptitle(f"Coordinate check: AdamW at lr {setup.lr:g}, n_head {setup.n_head}, "
                 f"{setup.n_layer} layers, a fixed batch of {setup.batch_size} x "
                 f"{setup.block_size} random tokens; mean of {setup.seeds} seeds; log axes"
                 + (f"\nleft out, values of 0 (a log axis holds none): {left}" if left else ""),
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def log_axes(ax) -> None:
    """Both axes log, x base 2; y labelled at the decades, or at 1, 2, 3 and 5 times them where
    the panel spans less than one."""
    ys = [y for line in ax.lines for y in line.get_ydata() if y > 0]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 3, 5) if max(ys) < 10 * min(ys) else (1,)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.margins(x=0.08)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS),
                        help="d_model values, each divisible by the 4 heads")
    parser.add_argument("--steps", type=int, default=Setup.steps, help="AdamW steps")
    parser.add_argument("--lr", type=float, default=Setup.lr, help="the one learning rate")
    parser.add_argument("--seeds", type=int, default=Setup.seeds,
                        help="seeds 0..SEEDS-1, each its own model and batch; means are plotted")
    parser.add_argument("--out", type=Path, default=Path("docs/figures/coord_check"),
                        help="folder for coord_check.csv and coord_check.png (created)")
    parser.add_argument("--from-csv", type=Path, metavar="CSV",
                        help="draw coord_check.png from this coord_check.csv, without training")
    args = parser.parse_args(argv)
    if any(w % Setup.n_head for w in args.widths):
        parser.error(f"every width must be divisible by n_head={Setup.n_head}")
    if args.from_csv and not args.from_csv.is_file():
        parser.error(f"--from-csv {args.from_csv}: no such file; give a coord_check.csv that"
                     " this script wrote")
    if args.from_csv:
        rows = read_csv(args.from_csv)
        setup = Setup(steps=max(r["step"] for r in rows), lr=args.lr,
                      seeds=len({r["seed"] for r in rows}))
        args.widths = sorted({r["width"] for r in rows})
    else:
        setup = Setup(steps=args.steps, lr=args.lr, seeds=args.seeds)
        rows = coord_check(tuple(sorted(args.widths)), setup)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.from_csv:
        write_csv(rows, args.out / "coord_check.csv")
    plot(rows, setup, args.out / "coord_check.png")
    lo, hi = min(args.widths), max(args.widths)
    print(f"growth from d_model {lo} to {hi} at step {setup.steps} (1 = flat):")
    print("| quantity | " + " | ".join(arm_name(a) for a in ARMS) + " |")
    print("|---|" + "---:|" * len(ARMS))
    for name in quantities(setup.n_layer):
        print(f"| {name} | " + " | ".join(f"{growth(rows, a, name, setup.steps):.2f}"
                                          for a in ARMS) + " |")
    print(f"Wrote {args.out}/{'' if args.from_csv else 'coord_check.csv and '}coord_check.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
