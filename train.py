"""Train a decoder-only GPT whose attention score scale is a config switch.

    python train.py                                        # tiny model, Shakespeare's works, CPU
    python train.py scaling=none model=small               # any file of any config group
    python train.py -m scaling=sqrt_dk,none trainer.seed=1,2      # a sweep under multirun/
    python train.py trainer.resume=auto hydra.run.dir=outputs/DAY/TIME   # continue that run
    torchrun --standalone --nproc_per_node=2 train.py      # data parallel, same global batch

`train` is the loop: one `train_step` (trainer/step.py) per iteration, and at check steps one
collective and host sync, then logging, evaluation and checkpoints as `if step % k == 0` lines.
docs/training.md describes the configuration, the run directory, resuming and the exit codes.
"""

import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

# Read once, when torch loads OpenMP: a thread that waits for work sleeps instead of spinning, so
# runs that share the cores do not spin each other down (docs/benchmarks.md, "Threads and other
# processes"). A caller's own OMP_WAIT_POLICY is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from model.errors import UserError
from trainer import checkpoint
from trainer.build import Run, all_reduce_sum, build, lr_at, process_rank
from trainer.evaluate import describe, evaluate, evaluate_full
from trainer.files import display_path
from trainer.job import Diverged, Interrupted, Job, StopSignal, exit_if_sweep_stopped
from trainer.run_dir import RunDir, summarize
from trainer.schema import LoggerConfig, TrainerConfig, register_configs
from trainer.step import train_step

SCRIPT = display_path(Path(__file__))   # train.py as the printed resume commands run it


def train(cfg: DictConfig, run_dir: Path, job: Optional[Job] = None) -> Optional[dict]:
    """Train as `cfg` says into run_dir (rank 0); the summary, or None when a resumed run is
    already finished. Raises UserError (before writing anything), Interrupted, Diverged."""
    job = job or Job()
    run = build(cfg, job.jobs_at_once())
    train_cfg, optim_cfg, compute, state = (run.config.train_cfg, run.config.optim_cfg,
                                            run.compute, run.state)
    if train_cfg.eval_lengths:   # evaluation past block_size: refused before training
        from trainer.long_eval import check_lengths, target_cap
        check_lengths(run.config.model_cfg, run.config.data_cfg, train_cfg.eval_lengths,
                      target_cap(train_cfg.full_eval_tokens),
                      None if run.data.val is None else len(run.data.val))
    resumed_from = None
    if train_cfg.resume is not None:   # the resume rules load only when trainer.resume is set
        from trainer import resume
        resumed_from = resume.resume_path(train_cfg.resume, run_dir)
        if resumed_from is not None:
            resume.restore(run, resumed_from)
            if resume.finished(state.progress.step, train_cfg.max_steps, run_dir, compute.rank):
                return None
    if resumed_from is None:
        torch.manual_seed(train_cfg.seed + compute.rank)   # dropout masks differ across processes
    out = RunDir(run, run_dir, resumed_from, job.overrides,   # no new run where one is
                 job.config_files)
    step = state.progress.step
    clock = Clock(step, run.config.tokens_per_step, state.progress.wall_s)
    if step == 0:
        evaluate_and_log(run, out, 0, lr_at(1, optim_cfg, train_cfg.max_steps), None)
    diverged = False
    nonfinite = torch.zeros((), device=compute.device)   # non-finite losses, summed on device
    bar = tqdm(total=train_cfg.max_steps, initial=step, dynamic_ncols=True,
               disable=not (out.writes and sys.stderr.isatty()))   # rank 0's terminal only
    with out, StopSignal(job.stop_signals(), job.stopped_before_loop()) as stop, bar:
        while step < train_cfg.max_steps:
            step += 1
            check = is_check_step(step, train_cfg) or (compute.world == 1 and stop.signum > 0)
            lr = state.scheduler.get_last_lr()[0]
            loss, grad_norm, records = train_step(state, compute, optim_cfg, train_cfg, check)
            nonfinite += (~torch.isfinite(loss)).float()
            bar.update(1)
            if not check:   # host-device syncs only at check steps
                continue
            loss, diverged, stop_asked = check_all(loss, nonfinite, stop.signum, compute.device)
            tokens_per_sec = clock.lap(step)
            if diverged:
                out.say(f"step {step}: non-finite training loss; stopping "
                        f"(trainer.on_nan={train_cfg.on_nan}).")
                break
            out.log({"kind": "train", "step": step, "loss": loss, "lr": lr,
                     "tokens_per_sec": tokens_per_sec, "grad_norm": grad_norm.item(),
                     **records})
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_sec:,.0f}")
            if step % train_cfg.eval_every == 0 or step == train_cfg.max_steps:
                evaluate_and_log(run, out, step, lr, tokens_per_sec)
            state.progress.step, state.progress.wall_s = step, clock.wall_s()
            if step % train_cfg.ckpt_every == 0 or step == train_cfg.max_steps or stop_asked:
                checkpoint.save(run, out.last)
            if stop_asked and step < train_cfg.max_steps:
                out.end_segment(step, "interrupted")
                raise Interrupted(stop.signum or signal.SIGTERM, step, out.last)
            clock.restart()
        lengths = {}
        if train_cfg.eval_lengths and not diverged:   # past block_size: trainer/long_eval.py
            from trainer.long_eval import report_lengths
            lengths = report_lengths(run, out, step)   # a record and a line per length
    return finish(run, out, step, diverged, clock, lengths)


def is_check_step(step: int, train_cfg: TrainerConfig) -> bool:
    """A step that logs, evaluates or checkpoints, or the last one."""
    return step == train_cfg.max_steps or any(
        step % every == 0
        for every in (train_cfg.log_every, train_cfg.eval_every, train_cfg.ckpt_every))


def check_all(loss: torch.Tensor, nonfinite: torch.Tensor, signum: int,
              device: torch.device) -> tuple[float, bool, bool]:
    """One collective and one host sync: the step's loss (the sum of the processes' shares),
    whether any process saw a non-finite loss or was signalled to stop (all stop together)."""
    asked = torch.tensor(float(signum > 0), device=device)
    loss, bad, stop = all_reduce_sum(torch.stack([loss, nonfinite, asked])).tolist()
    return loss, bad > 0, stop > 0


def evaluate_and_log(run: Run, out: RunDir, step: int, lr: float,
                     tokens_per_sec: Optional[float]) -> None:
    """Evaluate, log and print the record, update the progress; best.pt when val improved."""
    record = evaluate(run, step, lr, tokens_per_sec)
    out.log(record)
    out.say(describe(record))
    if run.state.progress.add_eval(step, record["val_loss"]):
        checkpoint.save(run, out.best, full=False)


def finish(run: Run, out: RunDir, step: int, diverged: bool, clock: "Clock",
           lengths: dict) -> dict:
    """After the loop: whole-split score, summary.json, the end of the segment, then samples
    (a sample that fails loses none of the run's record)."""
    full = {} if diverged else evaluate_full(run)
    if full:
        out.say(describe(full))
    run.state.progress.wall_s = clock.wall_s()
    summary = {**summarize(run, step, clock.tokens_per_sec(), diverged=diverged, full=full),
               **lengths}
    out.write_summary(summary)
    out.end_segment(step, "diverged" if diverged else "finished")
    if run.compute.rank == 0 and not diverged and run.config.train_cfg.sample_prompts:
        from trainer.samples import write_samples
        write_samples(run, out.path, out.best)
    if diverged and run.config.train_cfg.on_nan == "raise":
        raise Diverged(f"non-finite training loss at step {step}; the last good checkpoint is "
                       f"{out.last} (trainer.on_nan=raise)")
    return summary


class Clock:
    """Training tokens per second between check steps; the run's wall time over its segments."""

    def __init__(self, step: int, tokens_per_step: int, wall_s: float):
        self.tokens_per_step, self.first_step, self.last_step = tokens_per_step, step, step
        self.train_s, self.wall_before = 0.0, wall_s
        self.start = self.lap_start = time.perf_counter()

    def lap(self, step: int) -> float:
        """Tokens per second of the steps since the last lap; `restart` starts the next."""
        elapsed = time.perf_counter() - self.lap_start
        tokens = self.tokens_per_step * (step - self.last_step)
        self.train_s, self.last_step = self.train_s + elapsed, step
        return tokens / elapsed

    def restart(self) -> None:
        self.lap_start = time.perf_counter()

    def wall_s(self) -> float:
        return self.wall_before + time.perf_counter() - self.start

    def tokens_per_sec(self) -> Optional[float]:
        """Over every lap of this segment."""
        steps = self.last_step - self.first_step
        return self.tokens_per_step * steps / self.train_s if self.train_s else None


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    overrides, files = (list(hc.overrides.task), list(hc.overrides.hydra)), hydra_files(cfg)
    if hc.mode == RunMode.MULTIRUN:   # a sweep's job: trainer/launch.py, only here
        from trainer.launch import SweepJob
        job = SweepJob(*overrides, files)
    else:
        job = Job(*overrides, files)
    run_dir = job.join_processes(Path(hc.runtime.output_dir), cfg.trainer.device)
    rank, together = process_rank(), False   # together: every process leaves at one barrier
    try:
        if cfg.logger.name != "none":   # a missing package fails here, before any data work
            from trainer.loggers import require
            require(LoggerConfig(**OmegaConf.to_container(cfg.logger, resolve=True)))
        job.skip_if_stopped(run_dir)
        summary = train(cfg, run_dir, job)
        together = True
    except (UserError, Interrupted, Diverged) as err:
        # a stop is all-reduced: every process stopped after the same step
        together = isinstance(err, Interrupted)
        from trainer.exits import end_on  # loaded only when a run does not finish
        end_on(job, err, run_dir, SCRIPT, cfg.trainer.resume)
    finally:
        job.leave_processes(together)
    if rank == 0 and summary is not None:   # None: a finished run, resumed, did nothing
        print_outcome(summary, run_dir)


def hydra_files(cfg: DictConfig) -> dict[str, str]:
    """.hydra/'s files as Hydra writes them, for the run to write once its checks pass:
    configs/config.yaml sets hydra.output_subdir=null, so a refused run writes nothing and a
    refused resume leaves its folder as it was."""
    hydra_cfg = HydraConfig.instance().cfg
    return {"config.yaml": OmegaConf.to_yaml(cfg), "hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
            "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task)}


def print_outcome(summary: dict, run_dir: Path) -> None:
    print(f"best val loss {summary['best_val_loss']:.4f} at step {summary['best_step']} "
          f"(final {summary['final_val_loss']:.4f}; {summary['steps']} steps, "
          f"{summary['wall_s']:.0f} s)" if not summary["diverged"] else
          f"diverged at step {summary['steps']} (non-finite loss)")
    print(f"run dir: {display_path(run_dir)}")


def main() -> None:
    register_configs()
    overrides = [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")]
    if overrides:   # a bad config group or key is named with what to write (exit code 2)
        from trainer.overrides import exit_on_bad_overrides
        exit_on_bad_overrides(overrides)
    if int(os.environ.get("RANK", "0")) > 0:   # a torchrun rank above 0 makes no run directory
        from trainer.distributed import rank_argv
        sys.argv = rank_argv(sys.argv)
    try:
        hydra_main()
    finally:
        exit_if_sweep_stopped(SCRIPT)   # a parallel sweep stopped on a signal: its exit code


if __name__ == "__main__":
    main()
