"""Checkpoints: the format (docs/training.md, "Checkpoint format"), saving and reading. Tensors
and plain containers only, read with `torch.load(weights_only=True)`: opening a file runs no code
from it. best.pt: weights, configs, progress; last.pt adds the state of training.
"""

import random
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from model.errors import UserError
from trainer.build import Run
from trainer.files import atomic_write

# version 2: W_q, W_k, W_v are separate matrices; version 1's fused ones are split on reading
FORMAT, VERSION = "attnscale-checkpoint", 2


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
        first_line = (str(err).splitlines() or [""])[0][:120]
        raise CheckpointError(path, (
            "it holds objects other than tensors and plain containers, which are not unpickled "
            "since that could run code: it is corrupt, or another program's or an older "
            "attnscale's file." if "Weights only load failed" in str(err) else
            f"it is not a readable PyTorch file ({type(err).__name__}: {first_line}); it is "
            "truncated, corrupt or not a checkpoint.")) from None
    fields = ckpt if isinstance(ckpt, dict) else {}
    if fields.get("format") != FORMAT or fields.get("version") not in (1, VERSION):
        raise CheckpointError(path, (
            f"it is not an attnscale checkpoint of format version 1 or {VERSION} (format "
            f"{fields.get('format')!r}, version {fields.get('version')!r}): another program's "
            "file, or one of another attnscale version."))
    if ckpt["version"] == 1:   # loaded only for such a file
        from trainer.checkpoint_v1 import unfuse_qkv
        return {**ckpt, "model": unfuse_qkv(ckpt["model"])}
    return ckpt


def save(run: Run, path: Path, full: bool = True) -> None:
    """Write the checkpoint (full=False: best.pt); call on every rank, rank 0 writes."""
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
