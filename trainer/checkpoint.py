"""Checkpoints: the format (docs/training.md, "Checkpoint format") and saving it; reading is
trainer/checkpoint_read.py's. Tensors and plain containers only. best.pt: weights, configs,
progress; last.pt adds the state of training.
"""

import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from trainer.build import Run
from trainer.files import atomic_write

# version 2: W_q, W_k, W_v are separate matrices; version 1's fused ones are split on reading
FORMAT, VERSION = "attnscale-checkpoint", 2


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
