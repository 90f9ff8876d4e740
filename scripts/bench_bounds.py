"""The step cost of the score bounds: the training step of `python train.py <overrides>` plain,
with QK-Clip (optim.qk_clip, whose per-head max is one more q k^T product per layer) and with
the z-loss (trainer.z_loss), the cases interleaved in one process (scripts/bench.py's method).

    python scripts/bench_bounds.py                       # the default config, 1 thread
    python scripts/bench_bounds.py --rounds 12 --per-round 20 --threads 1 model=small

Prints one row per case: the median step over every timed step, and its ratio to the plain
step's median from the same run. The threshold is set low (optim.qk_clip=1, below every
logit of a trained head), so that heads are clipped and the clip's weight update is timed too.
"""

from __future__ import annotations

import argparse
import platform
from typing import Optional

import torch

from scripts.common import compose_config, interleave, median_ms
from trainer.build import build
from trainer.step import train_step

CASES = {"plain": [], "qk_clip": ["optim.qk_clip=1"], "z_loss": ["trainer.z_loss=1e-4"]}


def stepper(overrides: list[str]):
    """A function that runs one training step of the run those overrides build."""
    run = build(compose_config(overrides + ["trainer.threads=null", "trainer.max_steps=100000",
                                            "trainer.sample_prompts=[]"]))
    config = run.config
    return lambda: train_step(run.state, run.compute, config.optim_cfg, config.train_cfg)


def main(argv: Optional[list[str]] = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="train.py overrides shared by every case")
    p.add_argument("--rounds", type=int, default=12, help="rounds; each times every case")
    p.add_argument("--per-round", type=int, default=20, help="steps per case per round")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per case first")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cases = {name: stepper(args.overrides + extra) for name, extra in CASES.items()}
    for step in cases.values():
        for _ in range(args.warmup):
            step()
    times = interleave(cases, args.rounds, args.per_round, torch.device("cpu"))
    plain = median_ms(times["plain"])
    rows = [{"case": name, "overrides": " ".join(CASES[name]) or "-",
             "median_ms": median_ms(t), "ratio": median_ms(t) / plain}
            for name, t in times.items()]
    print(f"{platform.processor() or platform.machine()}, {args.threads} thread(s), "
          f"{args.rounds} rounds x {args.per_round} steps, overrides: "
          f"{' '.join(args.overrides) or '(the default config)'}")
    print("| case | overrides | median step | ratio to plain |\n|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | `{r['overrides']}` | {r['median_ms']:.1f} ms | "
              f"{r['ratio']:.3f} |")
    return rows


if __name__ == "__main__":
    main()
