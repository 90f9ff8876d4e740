"""Train a decoder-only GPT whose attention score scale is a config switch.

    python train.py                                        # tiny model, Tiny Shakespeare, CPU
    python train.py scaling=none model=small               # pick any option of any group
    python train.py -m scaling=sqrt_dk,none trainer.seed=1,2      # a sweep under multirun/
    python train.py trainer.resume=auto hydra.run.dir=outputs/DAY/TIME   # continue that run
    torchrun --standalone --nproc_per_node=2 train.py      # data parallel, same global batch

This file is the Hydra entry and the training loop; the pieces it calls are in trainer/
(build: the run; step: one optimizer step; evaluate: losses, diagnostics, samples;
checkpoint: save and restore; run_dir: the files a run writes; resume: continuing a run).
docs/training.md describes the configuration, the run directory and the resume rules.
Exit codes: 0 done (a diverged run with trainer.on_nan=stop included), 2 bad config, data or
checkpoint, 3 diverged with trainer.on_nan=raise, 128+signal when stopped by SIGINT/SIGTERM
(a checkpoint to resume from is written first).
"""

import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig
from tqdm import tqdm

from model.errors import UserError
from trainer import checkpoint
from trainer.build import build, lr_at
from trainer.evaluate import describe, describe_full, evaluate, evaluate_full, write_samples
from trainer.resume import finished, overrides, resume_commands, resume_path, shown
from trainer.run_dir import (
    end_segment,
    now,
    open_run_dir,
    remove_if_unstarted,
    summarize,
    write_json,
)
from trainer.schema import register_configs
from trainer.signals import Diverged, Interrupted, StopSignal
from trainer.step import all_reduce_sum, train_step


def train(cfg: DictConfig, run_dir: Path) -> Optional[dict]:
    """Train as `cfg` says, writing into run_dir (rank 0); return the summary.

    Raises UserError before writing anything if the config, data or checkpoint is bad,
    Interrupted after a signal, Diverged on a non-finite loss with trainer.on_nan=raise.
    Returns None, writing nothing, when a resumed run is already finished.
    """
    # 1. Build everything, resume if asked; only then write the run directory.
    r = build(cfg)
    tc = r.tc
    ckpt_path = resume_path(tc.resume, run_dir)
    if ckpt_path is not None:
        checkpoint.restore(r, ckpt_path)
        reason = finished(r, run_dir)
        if reason:
            if r.rank == 0:
                print(f"Nothing to do: the run in {run_dir} is finished ({reason}). Its files "
                      "are left as they are.")
            return None
    else:
        torch.manual_seed(tc.seed + r.rank)   # dropout masks differ across processes
    ckpt_dir = run_dir / "checkpoints"
    log = open_run_dir(r, run_dir, ckpt_path, overrides()) if r.rank == 0 else None

    def evaluate_and_log(step: int, lr: float, tokens_per_sec: Optional[float]) -> None:
        record, improved = evaluate(r, step, lr, tokens_per_sec)
        if r.rank == 0:
            log.write(record)
            tqdm.write(describe(record))
        if improved:
            checkpoint.save(r, ckpt_dir / "best.pt", full=False)

    # 2. The loop. Host-device syncs (.item()) happen only at check steps (logging, evaluation,
    # checkpointing); the non-finite check and, with several processes, the stop signal wait
    # for them.
    step = first_step = last_check = r.state["step"]
    start = t0 = time.perf_counter()
    tokens_per_step = tc.batch_size * tc.grad_accum * r.model_cfg.block_size
    bar = tqdm(total=tc.max_steps, initial=step, dynamic_ncols=True,
               disable=r.rank != 0 or not sys.stderr.isatty())
    if step == 0:
        evaluate_and_log(0, lr_at(1, r.optim, tc.max_steps), None)
    nonfinite = torch.zeros((), device=r.device)
    tokens_per_sec, train_time, diverged, interrupted = None, 0.0, False, None
    with StopSignal() as stop:
        while step < tc.max_steps:
            step += 1
            done = step == tc.max_steps
            check = (done or step % tc.log_every == 0 or step % tc.eval_every == 0
                     or step % tc.ckpt_every == 0 or (r.world == 1 and stop.signum))
            lr = r.scheduler.get_last_lr()[0]
            loss, grad_norm, qk = train_step(r, want_qk=bool(check))
            nonfinite += (~torch.isfinite(loss)).float()
            bar.update(1)
            if not check:
                continue
            # one collective: the loss (the sum of its per-process shares), the non-finite count
            # and the stop requests of all processes
            loss, bad, stop_asked = all_reduce_sum(torch.stack([loss, nonfinite, torch.tensor(
                float(stop.signum > 0), device=r.device)])).tolist()
            elapsed = time.perf_counter() - t0
            train_time += elapsed
            tokens_per_sec = tokens_per_step * (step - last_check) / elapsed
            last_check = step
            if bad > 0:
                diverged = True
                if r.rank == 0:
                    tqdm.write(f"step {step}: non-finite training loss; stopping "
                               f"(trainer.on_nan={tc.on_nan}).")
                break
            if r.rank == 0:
                log.write({"kind": "train", "step": step, "loss": loss, "lr": lr,
                           "tokens_per_sec": tokens_per_sec, "grad_norm": grad_norm.item(), **qk})
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}",
                                tok_s=f"{tokens_per_sec:,.0f}")
            if done or step % tc.eval_every == 0:
                evaluate_and_log(step, lr, tokens_per_sec)
            r.state.update(step=step, wall_s=r.state["wall_s"] + time.perf_counter() - start)
            start = time.perf_counter()
            if done or step % tc.ckpt_every == 0 or stop_asked > 0:
                checkpoint.save(r, ckpt_dir / "last.pt")
            if stop_asked > 0 and not done:
                interrupted = stop.signum or signal.SIGTERM
                break
            t0 = time.perf_counter()
    bar.close()
    if log is not None:
        log.close()
    if interrupted:
        if r.rank == 0:
            end_segment(run_dir / "run.json", ended_at=now(), end_step=step, ended="interrupted")
        raise Interrupted(interrupted, step, ckpt_dir / "last.pt")

    # 3. The final weights on the whole validation split, samples from the best weights, then
    # the summary.
    full = {} if diverged else evaluate_full(r)
    if full and r.rank == 0:
        tqdm.write(describe_full(full))
    if r.rank == 0 and not diverged and tc.sample_prompts:
        write_samples(r, run_dir, ckpt_dir / "best.pt")
    r.state["wall_s"] += time.perf_counter() - start
    summary = summarize(r, step, diverged=diverged, full=full, tokens_per_sec=(
        tokens_per_step * (last_check - first_step) / train_time if train_time else None))
    if r.rank == 0:
        write_json(run_dir / "summary.json", summary)
        end_segment(run_dir / "run.json", ended_at=now(), end_step=step,
                    ended="diverged" if diverged else "finished")
    if diverged and tc.on_nan == "raise":
        raise Diverged(f"non-finite training loss at step {step}; the last good checkpoint is "
                       f"{ckpt_dir / 'last.pt'} (trainer.on_nan=raise)")
    return summary


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() and
                                cfg.trainer.device != "cpu" else "gloo")
        shared = [str(run_dir)]
        dist.broadcast_object_list(shared, src=0)   # only rank 0's Hydra made a directory
        run_dir = Path(shared[0])
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    try:
        summary = train(cfg, run_dir)
    except UserError as err:
        if rank == 0:
            remove_if_unstarted(run_dir)
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as err:
        if rank == 0:
            how = "".join(f"\nResume {what} with:\n  {command}"
                          for what, command in resume_commands(run_dir, world))
            print(f"{err}; checkpoint {err.checkpoint}.{how}", file=sys.stderr)
        sys.exit(128 + err.signum)
    except Diverged as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(3)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank != 0:
        return
    if summary is None:   # a finished run, resumed: nothing was written
        remove_if_unstarted(run_dir)
        return
    print(f"best val loss {summary['best_val_loss']:.4f} at step {summary['best_step']} "
          f"(final {summary['final_val_loss']:.4f}; {summary['steps']} steps, "
          f"{summary['wall_s']:.0f} s)" if not summary["diverged"] else
          f"diverged at step {summary['steps']} (non-finite loss)")
    print(f"run dir: {shown(run_dir)}")


def main() -> None:
    register_configs()
    if int(os.environ.get("RANK", "0")) > 0:
        # Only rank 0 owns a run directory: the other processes' Hydra must not make one.
        sys.argv = [a for a in sys.argv if not a.startswith(("hydra.run.dir=",
                                                             "hydra.output_subdir="))]
        sys.argv += ["hydra.run.dir=.", "hydra.output_subdir=null"]
    hydra_main()


if __name__ == "__main__":
    main()
