"""Everything a training run writes into its run directory, and reads back on resume.

    run.json          resolved config, overrides, git commit, library versions, device
    metrics.jsonl     one JSON object per logged step ("kind": "train") and evaluation ("eval")
    summary.json      written once, when the run ends (or diverges)
    tokenizer.json    copy of the tokenizer the run used
    checkpoints/      last.pt (every trainer.ckpt_every steps and at the end), best.pt
    samples.txt       generated continuations of trainer.sample_prompts

Files are replaced atomically (write a temporary file, fsync, rename), so a run killed at any
moment leaves either the old or the new checkpoint, never half of one.
"""

import json
import os
import platform
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from model.errors import UserError

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
            # Records past the checkpoint belong to steps that are about to be redone.
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
            atomic_write(path, lambda f: f.write("".join(k + "\n" for k in kept).encode()))
        self.file = open(path, "a", buffering=1)

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.file.close()


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"trainer.resume: no checkpoint at {path}. Pass trainer.resume=auto "
                        "with hydra.run.dir=<run dir>, or the path of a .pt file in a run's "
                        "checkpoints/ folder.")
    # weights_only=False: the file holds RNG states (numpy arrays, tuples) written by this code.
    return torch.load(path, map_location="cpu", weights_only=False)


# Model settings that may change on resume: they change how, not what, is computed.
RESUMABLE_MODEL_FIELDS = ("attn_impl", "dropout")


def check_same_model(saved: dict, current: dict, path: Path) -> None:
    """Refuse to resume into a model whose config differs from the checkpoint's."""
    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
        return out

    old, new = flat(saved), flat(current)
    diff = [k for k in sorted(old.keys() | new.keys())
            if k not in RESUMABLE_MODEL_FIELDS and old.get(k) != new.get(k)]
    if diff:
        listed = "; ".join(f"{k if k.startswith('scaling.') else 'model.' + k}: "
                           f"checkpoint {old.get(k)!r}, now {new.get(k)!r}" for k in diff)
        raise UserError(f"Cannot resume from {path}: the model config differs from the "
                        f"checkpoint's ({listed}). Resume with the checkpoint's settings, or "
                        "start a new run without trainer.resume.")
