"""Several processes under torchrun (docs/training.md, "Several processes"): they join one
process group, share rank 0's run directory, and leave the group together."""

from pathlib import Path

import torch
import torch.distributed as dist


def join(run_dir: Path, device: str) -> Path:
    """Join the process group that torchrun's variables describe; rank 0's run directory."""
    dist.init_process_group("nccl" if torch.cuda.is_available() and device != "cpu" else "gloo")
    shared = [str(run_dir)]
    dist.broadcast_object_list(shared, src=0)   # only rank 0's Hydra made a directory
    return Path(shared[0])


def leave(together: bool) -> None:
    """Leave the process group, at one barrier if every process got here `together`."""
    if together:
        # gloo's worker threads release a finished collective's tensors after the caller has
        # moved on; a process that reaches interpreter shutdown before they do aborts
        # ("terminate called without an active exception").
        dist.barrier()
    dist.destroy_process_group()


def rank_argv(argv: list[str]) -> list[str]:
    """The argv Hydra reads on a torchrun rank above 0: it makes no run directory."""
    kept = [a for a in argv if not a.startswith(("hydra.run.dir=", "hydra.output_subdir="))]
    return [*kept, "hydra.run.dir=.", "hydra.output_subdir=null"]
