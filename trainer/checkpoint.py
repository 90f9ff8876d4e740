"""Checkpoints: the format, save and restore, and the rules for resuming a run.

A checkpoint holds tensors and plain containers only, read with `torch.load(weights_only=True)`:
opening a file someone hands you runs no code from it. best.pt holds the weights, configs and
progress; last.pt adds the optimizer, scheduler, scaler and sampler states and one random-stream
state per process (docs/training.md, "Checkpoint format", tables every field).
"""

import json
import random
import warnings
from dataclasses import asdict, fields
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from hydra.utils import to_absolute_path

from model.errors import UserError
from trainer.build import Progress, Run
from trainer.loggers import LoggerConfig
from trainer.run_dir import atomic_write
from trainer.schema import flat

FORMAT, VERSION = "attnscale-checkpoint", 1
# Settings that may differ between a checkpoint and the run resuming from it: how long to
# train, how often to look, where and how fast to compute, what to sample at the end, where the
# records are mirrored. Every other key of the config must match.
MAY_CHANGE_ON_RESUME = (
    "trainer.max_steps", "trainer.eval_every", "trainer.log_every", "trainer.ckpt_every",
    "trainer.device", "trainer.threads", "trainer.compile", "trainer.precision",
    "trainer.resume", "trainer.on_nan", "trainer.sample_prompts", "trainer.sample_tokens",
    "trainer.sample_temperature", "trainer.sample_top_k", "trainer.full_eval_tokens",
    "data.cache_dir", "model.attn_impl", *(f"logger.{f.name}" for f in fields(LoggerConfig)))


class CheckpointError(UserError):
    """A checkpoint that cannot be used; `problem` says why, callers say what to do."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def read(path: Path) -> dict:
    """The checkpoint at `path`, or CheckpointError naming what is wrong with the file."""
    if not path.is_file():
        raise CheckpointError(path, "there is no such file.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch's advice on legacy formats, not ours
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:   # torch raises KeyError, EOFError, RuntimeError, UnpicklingError
        if "Weights only load failed" in str(err):
            raise CheckpointError(path, (
                "it does not read as tensors and plain containers: either it is corrupt, or it "
                "holds other Python objects (checkpoints of older attnscale versions and other "
                "programs' files do), which are not unpickled since that could run code."
                )) from None
        first_line = (str(err).splitlines() or [""])[0][:120]
        raise CheckpointError(path, (
            f"it is not a readable PyTorch file ({type(err).__name__}: {first_line}); it is "
            "truncated, corrupt or not a checkpoint.")) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(path, (
            "it is a PyTorch file but not an attnscale checkpoint (it has no format entry "
            f"{FORMAT!r}): another program's file, or one from an older attnscale version."))
    if ckpt.get("version") != VERSION:
        raise CheckpointError(path, (
            f"it is an attnscale checkpoint of format version {ckpt.get('version')!r}; this "
            f"code reads version {VERSION}."))
    return ckpt


def save(run: Run, path: Path, full: bool = True) -> None:
    """Write the run's checkpoint (full=False: best.pt). Call on every rank: the random streams
    of all processes are gathered, rank 0 writes."""
    compute, state = run.compute, run.state
    rngs = [rng_state(compute.device)] * compute.world   # every process's own, once gathered
    if compute.world > 1:
        dist.all_gather_object(rngs, rngs[0])
    if compute.rank != 0:
        return
    content = {"model": state.model.state_dict(), "model_config": asdict(run.config.model_cfg),
               "config": run.config.resolved, "pad_id": run.data.pad_id,
               **asdict(state.progress)}
    if full:
        content.update(optimizer=state.optimizer.state_dict(),
                       scheduler=state.scheduler.state_dict(), scaler=state.scaler.state_dict(),
                       sampler=state.batcher.state_dict(), rng=rngs, world_size=compute.world)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: torch.save({"format": FORMAT, "version": VERSION, **content}, f))


def resume_path(resume: Optional[str], run_dir: Path) -> Optional[Path]:
    """trainer.resume: null (fresh), auto (run_dir's last.pt if any), or a checkpoint path."""
    if resume == "auto":
        path = run_dir / "checkpoints" / "last.pt"
        return path if path.exists() else None
    return None if resume is None else Path(to_absolute_path(resume))


def restore(run: Run, path: Path) -> None:
    """Load every piece of state the next step depends on from a last.pt checkpoint."""
    try:
        ckpt = read(path)
    except CheckpointError as err:
        raise UserError(f"Cannot resume from {err.path} (trainer.resume="
                        f"{run.config.train_cfg.resume}): {err.problem} Resume from "
                        "checkpoints/last.pt of a run trained by this version of train.py, or "
                        "start a new run without trainer.resume.") from None
    check_resumable(ckpt, run.config.resolved, run.config.model_cfg.vocab_size, path)
    compute, state = run.compute, run.state
    state.model.load_state_dict(ckpt["model"])
    state.optimizer.load_state_dict(ckpt["optimizer"])
    state.scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt["scaler"]:   # empty when saved without fp16 (a disabled scaler has no state)
        state.scaler.load_state_dict(ckpt["scaler"])
    state.batcher.load_state_dict(ckpt["sampler"])
    state.progress = Progress(**{f.name: ckpt[f.name] for f in fields(Progress)})
    rngs = ckpt["rng"]   # one per process; a run resumed on another process count uses the first
    set_rng_state(rngs[compute.rank] if len(rngs) == compute.world else rngs[0], compute.device)


def rng_state(device: torch.device) -> dict:
    """This process's random streams (Python, NumPy, torch CPU, its own GPU) as tensors."""
    py_version, py_keys, py_gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {"python": torch.tensor(py_keys, dtype=torch.int64), "python_version": py_version,
             "python_gauss": py_gauss,
             "numpy": torch.from_numpy(np_keys.astype(np.int64)), "numpy_pos": int(np_pos),
             "numpy_gauss": [int(np_has_gauss), float(np_gauss)],
             "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what `rng_state` saved; a saved CUDA stream goes to this process's device."""
    random.setstate((state["python_version"], tuple(state["python"].tolist()),
                     state["python_gauss"]))
    has_gauss, gauss = state["numpy_gauss"]
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32),
                         state["numpy_pos"], has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def check_resumable(ckpt: dict, config: dict, vocab_size: int, path: Path) -> None:
    """Refuse to resume from `ckpt` into a run whose settings differ, naming the keys."""
    if "optimizer" not in ckpt:
        raise UserError(f"Cannot resume from {path}: it holds weights only (a best.pt); "
                        "resume from checkpoints/last.pt, which holds the whole training state.")
    # the vocabulary size is not a setting but follows from the data's tokenizer
    saved = {**flat(ckpt["config"]), "model.vocab_size": ckpt["model_config"]["vocab_size"]}
    now = {**flat(config), "model.vocab_size": vocab_size}
    diff = [k for k in sorted(saved.keys() | now.keys())
            if k not in MAY_CHANGE_ON_RESUME and saved.get(k) != now.get(k)]
    if diff:
        listed = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" for k in diff)
        raise UserError(f"Cannot resume from {path}: the settings differ from the checkpoint's "
                        f"({listed}). Resume with the checkpoint's settings, or start a new run "
                        f"without trainer.resume. Only {', '.join(MAY_CHANGE_ON_RESUME)} may "
                        "change on resume.")


def finished(step: int, max_steps: int, run_dir: Path, rank: int) -> bool:
    """Whether a resumed run has nothing left to do (its checkpoint is at trainer.max_steps, or
    its summary.json says it diverged); rank 0 says why."""
    summary = run_dir / "summary.json"
    if step >= max_steps:
        reason = (f"its checkpoint is at step {step} and trainer.max_steps={max_steps}; raise "
                  "trainer.max_steps to train it further")
    elif summary.is_file() and json.loads(summary.read_text()).get("diverged"):
        reason = ("it diverged (summary.json); start a new run, e.g. with a lower optim.lr, to "
                  "try again")
    else:
        return False
    if rank == 0:
        print(f"Nothing to do: the run in {run_dir} is finished ({reason}). Its files are left "
              "as they are.")
    return True
