"""CPU threads when runs share the cores: `python train.py` started alone and `--at-once` copies
started together, under each way of choosing the threads; each run's training tokens/s comes
from its summary.json (the laps between check steps: start-up and evaluation left out).

    python scripts/bench_threads.py                            # 3 rounds, 2 at once, 100 steps
    python scripts/bench_threads.py --rounds 5 --steps 300 --cases auto spin one

The cases (what the environment and trainer.threads are; `cores`: the CPUs this process may use):
- auto: trainer.threads=auto, as this checkout chooses (trainer/build.py, choose_threads) and
  waits (train.py sets OMP_WAIT_POLICY=PASSIVE before torch loads OpenMP: idle threads sleep)
- spin: trainer.threads=<cores> with GOMP_SPINCOUNT=300000, what OpenMP (libgomp) does when
  OMP_WAIT_POLICY is unset: an idle thread spins that long before it sleeps (auto before it
  set the policy)
- one: trainer.threads=1
- load: trainer.threads=<cores> minus the 1-minute load average at launch, rounded, at least 1,
  spinning as `spin` does

Each round runs every case alone, then `--at-once` at once, the cases' order rotating from
round to round so that a burst of other load reaches them all alike. Before each launch the
1-minute load average is recorded; other people's work on a shared machine shows there. Prints
a Markdown table (median over rounds of each run's tokens/s) and writes every number (--json,
default outputs/bench/threads-<time>.json) with the CPU and the loads.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from scripts.common import ROOT
from trainer.run_dir import cpu_name

CASES = ("auto", "spin", "one", "load")
OPENMP = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")   # left to each case


def launch(case: str, cores: int) -> tuple[dict, str]:
    """The environment and trainer.threads of one run of `case`."""
    env = {k: v for k, v in os.environ.items() if k not in OPENMP}
    if case in ("spin", "load"):
        env["GOMP_SPINCOUNT"] = "300000"   # overrides the spin count that a policy sets
    threads = {"auto": "auto", "one": "1", "spin": str(cores),
               "load": str(max(1, min(cores, round(cores - os.getloadavg()[0]))))}
    return env, threads[case]


def run_together(case: str, n: int, steps: int, folder: Path, overrides: list[str],
                 cores: int) -> list[dict]:
    """Start n runs of `case` at once; each one's tokens/s, threads and the load at launch."""
    procs = []
    for i in range(n):
        env, threads = launch(case, cores)
        load = os.getloadavg()[0]
        run_dir = folder / f"{case}-{n}-{i}-{time.monotonic_ns()}"
        command = [sys.executable, "train.py", "trainer.full_eval_tokens=1000", *overrides,
                   f"trainer.max_steps={steps}", f"trainer.eval_every={steps}",
                   f"trainer.ckpt_every={steps}", f"trainer.threads={threads}",
                   f"hydra.run.dir={run_dir}"]
        procs.append((subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True),
                      run_dir, load))
    out = []
    for proc, run_dir, load in procs:
        printed = proc.communicate()[0]
        if proc.returncode != 0:
            raise SystemExit(f"error: a {case} run exited {proc.returncode}:\n{printed[-2000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        start = next(line for line in printed.splitlines() if " thread(s)" in line)
        out.append({"tokens_per_sec": summary["tokens_per_sec"], "load_at_start": load,
                    "threads": re.search(r"(\d+) thread\(s\)", start)[1],   # what auto chose
                    "start_line": start})
    return out


def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="train.py overrides shared by every run (the "
                   "steps, threads and run folder are the bench's)")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=100, help="trainer.max_steps of each run")
    p.add_argument("--at-once", type=int, default=2, help="runs started together")
    p.add_argument("--json", type=Path, default=ROOT / "outputs" / "bench" /
                   f"threads-{time.strftime('%Y%m%d-%H%M%S')}.json")
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    results = {case: {"alone": [], "at_once": []} for case in args.cases}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            k = r % len(args.cases)
            for case in args.cases[k:] + args.cases[:k]:
                for n, key in ((1, "alone"), (args.at_once, "at_once")):
                    runs = run_together(case, n, args.steps, Path(tmp), args.overrides, cores)
                    results[case][key].append(runs)
                    print(f"round {r + 1}, {case}, {key}: " + ", ".join(
                        f"{run['tokens_per_sec']:,.0f} tokens/s (load {run['load_at_start']:.2f})"
                        for run in runs), file=sys.stderr)
    report = {"cpu": cpu_name(), "cores": cores, "steps": args.steps, "at_once": args.at_once,
              "overrides": args.overrides, "results": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(table(report))
    return report


def table(report: dict) -> str:
    """Per case: the median tokens/s of a run alone and of one of the runs at once, their ratio,
    and the range of the loads at launch."""
    n = report["at_once"]
    rows = [f"{report['cpu']}, {report['cores']} cores, {report['steps']} steps a run",
            "", f"| case | alone, tokens/s | {n} at once, tokens/s a run | at once / alone | "
                "threads | load at launch |", "|---|---:|---:|---:|---|---|"]
    for case, got in report["results"].items():
        runs = [run for key in ("alone", "at_once") for group in got[key] for run in group]
        alone = statistics.median(g[0]["tokens_per_sec"] for g in got["alone"])
        together = statistics.median(run["tokens_per_sec"] for g in got["at_once"] for run in g)
        loads = [run["load_at_start"] for run in runs]
        threads = sorted({run["threads"] for run in runs})
        rows.append(f"| {case} | {alone:,.0f} | {together:,.0f} | {together / alone:.2f} | "
                    f"{', '.join(threads)} | {min(loads):.2f}-{max(loads):.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
