"""Everything a training run writes into its run directory, and reads back on resume.

    run.json          resolved config, overrides, git commit, library versions, device; and
                      "segments": one record per start or resume (git commit, command, times,
                      step range, how it ended)
    metrics.jsonl     one JSON object per logged step ("kind": "train") and evaluation ("eval")
    summary.json      written once, when the run ends (or diverges)
    tokenizer.json    copy of the tokenizer the run used
    checkpoints/      last.pt (every trainer.ckpt_every steps and at the end), best.pt
    samples.txt       generated continuations of trainer.sample_prompts

Files are replaced atomically (write a temporary file, fsync, rename), so a run killed at any
moment leaves either the old or the new checkpoint, never half of one.
"""

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
from typing import Any, Optional

import numpy as np
import torch

from model.errors import UserError
from trainer.build import MAX_AUTO_THREADS, Run, available_cores

HYDRA_FILES = {".hydra"}   # what Hydra writes into a run directory before train.py starts


def atomic_write(path: Path, write: Any) -> None:
    """Call write(file) on a temporary file next to `path`, fsync it, then rename it over."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path: Path, obj: dict) -> None:
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def remove_if_unstarted(run_dir: Path) -> None:
    """Delete a run directory that holds only Hydra's bookkeeping (the run failed to start)."""
    if run_dir.resolve() == Path.cwd().resolve() or not run_dir.is_dir():
        return
    if set(os.listdir(run_dir)) <= HYDRA_FILES:
        shutil.rmtree(run_dir)


def environment(device: torch.device) -> dict:
    """Git commit, library versions and device: what a reader needs to rerun this run."""
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

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "command": [sys.executable, *sys.argv],
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "numpy": np.__version__, "hydra": hydra.__version__,
                     "omegaconf": omegaconf.__version__, "tokenizers": tokenizers.__version__},
        "device": {"type": device.type,
                   "name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                            else cpu_name()),
                   "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "platform": platform.platform(),
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


class MetricsLog:
    """Append-only metrics.jsonl, flushed per record so a plot script can read a live run."""

    def __init__(self, path: Path, resume_step: Optional[int] = None):
        self.path = path
        if resume_step is not None and path.exists():
            kept = [json.dumps(r) for r in read_metrics(path) if r["step"] <= resume_step]
            atomic_write(path, lambda f: f.write("".join(k + "\n" for k in kept).encode()))
        self.file = open(path, "a", buffering=1)

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.file.close()


def read_metrics(path: Path) -> list[dict]:
    """The records of metrics.jsonl. A last line that is not JSON was torn by a kill in the
    middle of a write and is dropped (its step is redone on resume); a bad line anywhere else
    is damage this code did not make, and is reported."""
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise UserError(f"{path} line {number} is not JSON, and it is not the last line "
                            "(only a last line can be torn by an interrupted write). Repair "
                            "or delete that line, or start a new run without trainer.resume."
                            ) from None
    return records


def begin_segment(path: Path, run: dict, segment: dict, resumed: bool) -> None:
    """run.json: what the run is, as its first segment wrote it, and one record per segment
    (each start or resume). A resumed run keeps what is there and appends its segment."""
    record = json.loads(path.read_text()) if resumed and path.exists() else run
    record["segments"] = [*record.get("segments", []), segment]
    write_json(path, record)


def end_segment(path: Path, **fields) -> None:
    """Complete the last segment of run.json (end step, end time, how it ended)."""
    record = json.loads(path.read_text())
    record["segments"][-1].update(fields)
    write_json(path, record)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def open_run_dir(r: Run, run_dir: Path, resumed_from: Optional[Path],
                 overrides: list[str]) -> MetricsLog:
    """Print what is about to run; add this segment to run.json, copy tokenizer.json, open
    metrics.jsonl (dropping the records of steps past the checkpoint)."""
    print(f"data {r.c['data']['name']}: {len(r.data.train):,} train / {len(r.data.val):,} val "
          f"tokens, vocab {r.data.vocab_size}; model {r.raw.num_params() / 1e6:.2f}M "
          f"parameters; {r.device} {r.precision}, {torch.get_num_threads()} thread(s)"
          + (f" (trainer.threads=auto: {available_cores()} core(s) available, at most "
             f"{MAX_AUTO_THREADS})" if r.tc.threads == "auto" else "")
          + f" x {r.world} process(es)"
          + (f"; resuming from {resumed_from} at step {r.state['step']}" if resumed_from else "")
          + ("; trainer.resume=auto found no checkpoint: starting fresh"
             if r.tc.resume == "auto" and not resumed_from else ""))
    run_dir.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(run_dir / "metrics.jsonl",
                     resume_step=r.state["step"] if resumed_from else None)
    env = environment(r.device)
    segment = {"started_at": now(), "start_step": r.state["step"],
               "resumed_from": str(resumed_from) if resumed_from else None,
               "git_commit": env["git_commit"], "git_dirty": env["git_dirty"],
               "command": env["command"], "world_size": r.world, "precision": r.precision,
               "compile": r.tc.compile, "device": env["device"]}
    begin_segment(run_dir / "run.json", {
        "config": r.c, "overrides": overrides, "model_config": asdict(r.model_cfg),
        "n_params": r.raw.num_params(), "world_size": r.world, "precision": r.precision,
        "compile": r.tc.compile, "resumed_from": segment["resumed_from"], "data": r.data.meta,
        **env}, segment, resumed=resumed_from is not None)
    shutil.copyfile(r.data.tokenizer_path, run_dir / "tokenizer.json")
    return log


def summarize(r: Run, step: int, tokens_per_sec: Optional[float], diverged: bool,
              full: dict) -> dict:
    """summary.json's content; non-finite numbers become null (JSON has no NaN). `full` holds
    the whole-split evaluation (trainer.evaluate.evaluate_full; null fields if diverged)."""
    s = r.state
    tokens_per_step = r.tc.batch_size * r.tc.grad_accum * r.model_cfg.block_size
    summary = {"final_val_loss": s["final_val_loss"], "best_val_loss": s["best_val_loss"],
               "best_step": s["best_step"], "init_val_loss": s["init_val_loss"],
               "steps": step, "tokens": step * tokens_per_step, "tokens_per_sec": tokens_per_sec,
               "n_params": r.raw.num_params(), "diverged": diverged, "wall_s": s["wall_s"],
               "final_val_loss_full": full.get("final_val_loss_full"),
               "final_val_bpb_full": full.get("final_val_bpb_full"),
               "full_eval_targets": full.get("full_eval_targets"),
               "full_eval_split_targets": full.get("full_eval_split_targets")}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in summary.items()}
