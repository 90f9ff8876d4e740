"""Reading checkpoints (trainer/checkpoint.py writes them): resuming, sampling, evaluating.
`torch.load(weights_only=True)`: opening a file runs no code from it. Format version 1 fused W_q,
W_k and W_v into one `qkv` weight: its weights load split; its optimizer state cannot be resumed
(trainer/resume.py refuses it).
"""

import warnings
from pathlib import Path

import torch

from model.config import GPTConfig, ParamConfig, ScalingConfig
from model.errors import UserError
from trainer.checkpoint import FORMAT, VERSION


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
    if ckpt["version"] == 1:   # W_q, W_k, W_v fused into one `qkv` weight
        return {**ckpt, "model": unfuse_qkv(ckpt["model"])}
    return ckpt


def model_config(fields: dict) -> GPTConfig:
    """The GPTConfig of a checkpoint's model_config (one from before `param` existed: sp)."""
    return GPTConfig(**{**fields, "scaling": ScalingConfig(**fields["scaling"]),
                        "param": ParamConfig(**fields.get("param", {}))})


def unfuse_qkv(weights: dict) -> dict:
    """Version 1's model weights with each fused `attn.qkv` (rows q, then k, then v) split
    into `attn.q_proj`, `attn.k_proj`, `attn.v_proj`."""
    out = {}
    for name, tensor in weights.items():
        prefix, dot, kind = name.rpartition(".qkv.")
        if not dot:
            out[name] = tensor
            continue
        for proj, part in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0)):
            out[f"{prefix}.{proj}.{kind}"] = part.clone()
    return out
