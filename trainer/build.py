"""Build a run from the composed config: device, precision, data, model, optimizer, schedule.

`build(cfg)` is what `python train.py <overrides>` runs on; scripts/bench.py times the same
object. It validates everything and writes nothing but the data cache.
"""

import math
import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel as DDP

from data.batching import Batcher, fixed_batches
from data.config import DataConfig
from data.prepare import PreparedData, prepare
from model.attention import ScalingConfig
from model.errors import UserError
from model.gpt import GPT, GPTConfig
from trainer.schema import OptimConfig, TrainerConfig

# Evaluation batches are drawn with this seed, whatever trainer.seed: every run of a sweep is
# scored on the same validation text, so their losses compare.
EVAL_SEED = 0


@dataclass
class Run:
    """Everything a run is made of, built once from the composed config by `build`."""

    c: dict                    # the resolved config as plain containers (saved with checkpoints)
    optim: OptimConfig
    tc: TrainerConfig
    rank: int
    world: int
    device: torch.device
    precision: str
    ctx: object                # autocast context (or nullcontext for float32)
    data: PreparedData
    model_cfg: GPTConfig
    prompts: list              # token ids of trainer.sample_prompts
    batcher: Batcher
    val_batches: list
    train_batches: list
    raw: GPT                   # the plain module: state dicts, diagnostics, sampling
    model: torch.nn.Module     # raw, or torch.compile(raw)
    ddp: torch.nn.Module       # model, or DDP(model) with several processes: runs the step
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    state: dict = field(default_factory=lambda: {
        "step": 0, "best_val_loss": math.inf, "best_step": None, "init_val_loss": None,
        "final_val_loss": None, "wall_s": 0.0})


def build(cfg: DictConfig) -> Run:
    """Validated dataclasses, data, model, optimizer. Writes nothing but the data cache."""
    c = OmegaConf.to_container(cfg, resolve=True)
    data_cfg, scaling = DataConfig(**c["data"]), ScalingConfig(**c["scaling"])
    optim, tc = OptimConfig(**c["optim"]), TrainerConfig(**c["trainer"])
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if tc.batch_size % world:
        raise UserError(f"trainer.batch_size={tc.batch_size} must be a multiple of the number "
                        f"of processes ({world}): the global batch is split evenly.")
    threads = thread_count(tc.threads)
    if threads is not None:
        torch.set_num_threads(threads)
    device = pick_device(tc.device)
    amp = autocast_dtype(tc.precision, device)

    data = prepare(data_cfg)
    model_cfg = GPTConfig(vocab_size=data.vocab_size, scaling=scaling, **c["model"])
    prompts = [data.encode(p) or [data.eot_id] for p in tc.sample_prompts]   # fail early
    batch_kw = dict(block_size=model_cfg.block_size, batch_size=tc.batch_size,
                    packing=data_cfg.packing, pad_id=data.pad_id, rank=rank, world_size=world)
    fixed_kw = dict(n_batches=tc.eval_iters, seed=EVAL_SEED, **batch_kw)
    torch.manual_seed(tc.seed)
    raw = GPT(model_cfg).to(device)
    model = torch.compile(raw) if tc.compile else raw
    ddp = model
    if world > 1:
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = make_optimizer(raw, optim, device)
    return Run(
        c=c, optim=optim, tc=tc, rank=rank, world=world, device=device,
        precision=precision_name(amp),
        ctx=torch.autocast(device.type, dtype=amp) if amp else nullcontext(),
        data=data, model_cfg=model_cfg, prompts=prompts,
        batcher=Batcher(data.train, data.train_docs, seed=tc.seed, **batch_kw),
        val_batches=fixed_batches(data.val, data.val_docs, **fixed_kw),
        train_batches=fixed_batches(data.train, data.train_docs, **fixed_kw),
        raw=raw, model=model, ddp=ddp, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda epoch: lr_at(epoch + 1, optim, tc.max_steps) / optim.lr),
        scaler=torch.amp.GradScaler(device.type, enabled=amp == torch.float16))


# trainer.threads=auto uses at most this many threads. A choice, not a measurement: this
# repository's CPU timings come from 2 cores, so where more threads stop helping the tiny and
# small models has not been measured; set trainer.threads to try more.
MAX_AUTO_THREADS = 8


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask: a container's or taskset's limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def thread_count(threads) -> Optional[int]:
    """trainer.threads as a number (None: leave torch's count alone). auto: OMP_NUM_THREADS
    if set, else the available cores shared by this machine's processes (torchrun's
    LOCAL_WORLD_SIZE), at most MAX_AUTO_THREADS."""
    if threads != "auto":
        return threads
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]):
        return int(os.environ["OMP_NUM_THREADS"])
    per_process = available_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(MAX_AUTO_THREADS, per_process))


def pick_device(name: str) -> torch.device:
    """trainer.device as a torch.device; `cuda` means this process's GPU (LOCAL_RANK)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if name == "auto":
        name = ("cuda" if torch.cuda.is_available()
                else "mps" if torch.backends.mps.is_available() else "cpu")
    if name == "cuda":
        name = f"cuda:{local_rank}"
    if (name.startswith("cuda") and not torch.cuda.is_available()) or (
            name == "mps" and not torch.backends.mps.is_available()):
        raise UserError(f"trainer.device={name} is not available on this machine; use "
                        "trainer.device=auto or cpu.")
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def cpu_has_fast_bf16() -> bool:
    """Native bf16 matmuls (AMX tiles or AVX512-BF16); elsewhere CPU bf16 is emulated, slow.
    docs/benchmarks.md has the measured bf16 and float32 step times."""
    return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


def autocast_dtype(precision: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype for trainer.precision (None = plain float32)."""
    if precision == "auto":
        if device.type == "cuda":
            precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        elif device.type == "cpu" and cpu_has_fast_bf16():
            precision = "bf16"
        else:
            precision = "fp32"
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def precision_name(dtype: Optional[torch.dtype]) -> str:
    """The trainer.precision name of an autocast dtype (None = float32)."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def make_optimizer(model: GPT, optim: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW that decays matrices (linear and embedding weights) but not biases, gains, scales."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # fused: one kernel for all parameters, on the CPU too (docs/benchmarks.md)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                             fused=True if device.type in ("cuda", "cpu") else None)


def lr_at(step: int, optim: OptimConfig, max_steps: int) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warm-up, then cosine to min_lr."""
    if step <= optim.warmup_steps:
        return optim.lr * step / optim.warmup_steps
    progress = min(1.0, (step - optim.warmup_steps) / max(1, max_steps - optim.warmup_steps))
    return optim.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (optim.lr - optim.min_lr)
