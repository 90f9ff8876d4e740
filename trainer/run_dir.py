"""What a training run writes into its run directory (docs/training.md, "Run directory"):
run.json, metrics.jsonl, summary.json, tokenizer.json; checkpoints are trainer/checkpoint.py's.
Files are replaced atomically (a temporary file, fsync, rename): never half of one."""

import json
import math
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from tqdm import tqdm

from model.errors import UserError
from trainer.build import Run, all_reduce_sum
from trainer.files import atomic_write, read_metrics, write_json
from trainer.schema import LoggerConfig

RUN_FILES = ("metrics.jsonl", "summary.json", "run.json", "checkpoints/last.pt")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


class RunDir:
    """The run directory as the loop writes it, on rank 0 only. Opening it refuses a new run
    where another run's files are (every rank), prints what is about to run, writes .hydra/'s
    `config_files` (a resume keeps the ones there), adds this segment to run.json, copies
    tokenizer.json, opens metrics.jsonl (flushed per line) and the logger."""

    def __init__(self, run: Run, path: Path, resumed_from: Optional[Path], overrides: list[str],
                 config_files: dict[str, str]):
        found = [name for name in RUN_FILES if (path / name).exists()]
        clash = torch.tensor(float(run.config.train_cfg.resume is None and bool(found)))
        if all_reduce_sum(clash.to(run.compute.device)).item() > 0:   # all look before 0 writes
            raise UserError(f"The run folder {path} already holds a run ({', '.join(found)}). "
                            "Continue it with trainer.resume=auto, or give the new run its own "
                            "folder (hydra.run.dir, or for a sweep hydra.sweep.dir).")
        self.path, self.writes = path, run.compute.rank == 0
        self.last, self.best = path / "checkpoints" / "last.pt", path / "checkpoints" / "best.pt"
        self.metrics, self.logger = None, None
        if not self.writes:
            return
        print(start_line(run, resumed_from))
        path.mkdir(parents=True, exist_ok=True)
        if config_files and (resumed_from is None or not (path / ".hydra").exists()):
            (path / ".hydra").mkdir(exist_ok=True)
            for name, text in config_files.items():
                atomic_write(path / ".hydra" / name, lambda f, text=text: f.write(text.encode()))
        logger_cfg = LoggerConfig(**run.config.resolved.get("logger", {}))
        if logger_cfg.name != "none":
            from trainer.loggers import ExperimentLogger  # loaded only when named
            self.logger = ExperimentLogger(logger_cfg, path, run.config.resolved,
                                           run.state.progress.step)
        metrics = path / "metrics.jsonl"
        if resumed_from and metrics.exists():   # drop the records of steps past the checkpoint
            kept = [json.dumps(r) + "\n" for r in read_metrics(metrics)
                    if r["step"] <= run.state.progress.step]
            atomic_write(metrics, lambda f: f.write("".join(kept).encode()))
        # a resumed run appends; a fresh start replaces what a run that never checkpointed left
        self.metrics = open(metrics, "a" if resumed_from else "w", buffering=1)
        begin_segment(path / "run.json", run, resumed_from, overrides)
        if run.data.tokenizer_path:   # a generated recall task has no tokenizer
            shutil.copyfile(run.data.tokenizer_path, path / "tokenizer.json")

    def log(self, record: dict) -> None:   # one line of metrics.jsonl
        if self.metrics:
            self.metrics.write(json.dumps(record) + "\n")
            if self.logger:
                self.logger.record(record)

    def say(self, line: str) -> None:   # one line on the terminal, above the progress bar
        if self.writes:
            tqdm.write(line)

    def end_segment(self, step: int, ended: str) -> None:   # run.json: how the segment ended
        if self.writes:
            record = json.loads((self.path / "run.json").read_text())
            record["segments"][-1].update(ended_at=now(), end_step=step, ended=ended)
            write_json(self.path / "run.json", record)
            if self.logger:
                self.logger.close()

    def write_summary(self, summary: dict) -> None:
        if self.writes:
            write_json(self.path / "summary.json", summary)
            if self.logger:
                self.logger.summary(summary)

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.metrics:
            self.metrics.close()
        if self.logger and exc_type is not None:   # else the summary still follows
            self.logger.close()


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def start_line(run: Run, resumed_from: Optional[Path]) -> str:
    """What is about to run: data, model size, device, precision, threads, processes (and
    optim=muon's optimizer)."""
    data, compute, train_cfg = run.data, run.compute, run.config.train_cfg
    return (f"data {run.config.data_cfg.name}: {data.describe()}; "
            f"model {run.state.model.num_params() / 1e6:.2f}M parameters, "
            f"attention {run.state.model.attention_name}; "
            + (f"optimizer {run.state.optimizer.name}; " if run.config.optim_cfg.name == "muon"
               else "")   # trainer/muon.py's MuonAdamW: which Muon (its Newton-Schulz dtype)
            + f"{compute.device} {compute.precision}, {torch.get_num_threads()} thread(s)"
            + (f" ({compute.threads_chosen})" if compute.threads_chosen else "")
            + f" x {compute.world} process(es)"
            + (f"; resuming from {resumed_from} at step {run.state.progress.step}"
               if resumed_from else "")
            + ("; trainer.resume=auto found no checkpoint: starting fresh"
               if train_cfg.resume == "auto" and not resumed_from else ""))


def begin_segment(path: Path, run: Run, resumed_from: Optional[Path],
                  overrides: list[str]) -> None:
    """run.json: what the run is (config, git commit, library versions, device), as its first
    segment wrote it, and one record per segment (start or resume)."""
    import hydra
    import omegaconf
    import tokenizers

    def git(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                                 cwd=Path(__file__).resolve().parent)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    compute, train_cfg, device = run.compute, run.config.train_cfg, run.compute.device
    status = git("status", "--porcelain", "--untracked-files=no")
    env = {"git_commit": git("rev-parse", "HEAD"),
           "git_dirty": None if status is None else bool(status),
           "command": [sys.executable, *sys.argv],
           "versions": {"python": platform.python_version(), **{m.__name__: m.__version__ for m in (
               torch, np, hydra, omegaconf, tokenizers)}},
           "device": {"type": device.type,
                      "name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                               else cpu_name()),
                      "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()},
           "platform": platform.platform()}
    segment = {"started_at": now(), "start_step": run.state.progress.step,
               "resumed_from": str(resumed_from) if resumed_from else None,
               **{k: env[k] for k in ("git_commit", "git_dirty", "command")},
               "world_size": compute.world, "precision": compute.precision,
               "compile": train_cfg.compile, "device": env["device"]}
    record = json.loads(path.read_text()) if resumed_from and path.exists() else {
        "config": run.config.resolved, "overrides": overrides,
        "model_config": asdict(run.config.model_cfg), "n_params": run.state.model.num_params(),
        "world_size": compute.world, "precision": compute.precision,
        "compile": train_cfg.compile, "resumed_from": segment["resumed_from"],
        "data": run.data.meta, **env}
    record["segments"] = [*record.get("segments", []), segment]
    write_json(path, record)


def summarize(run: Run, step: int, tokens_per_sec: Optional[float], diverged: bool,
              full: dict) -> dict:
    """summary.json's content, non-finite numbers null; `full`: evaluate_full's ({}: diverged)."""
    p = run.state.progress
    summary = {"final_val_loss": p.final_val_loss, "best_val_loss": p.best_val_loss,
               "best_step": p.best_step, "init_val_loss": p.init_val_loss, "steps": step,
               "tokens": step * run.config.tokens_per_step, "tokens_per_sec": tokens_per_sec,
               "n_params": run.state.model.num_params(), "diverged": diverged,
               "wall_s": p.wall_s,
               **{k: full.get(k) for k in ("final_val_loss_full", "final_val_bpb_full",
                                           "full_eval_targets", "full_eval_split_targets")},
               **run.data.accuracy("final_val_accuracy", full.get("final_val_accuracy"))}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in summary.items()}
