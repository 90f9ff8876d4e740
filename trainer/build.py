"""Build a run from the composed config: device, precision, data, model, optimizer. `build(cfg)`
validates everything and writes nothing but the data cache."""

import math
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel as DDP

from data.batching import Batch, BatchShape, Sampler, TrainingData
from data.config import DataConfig
from data.prepare import prepare
from model.attention import MultiHeadAttention
from model.config import GPTConfig, ParamConfig, ScalingConfig
from model.errors import UserError
from model.gpt import GPT
from trainer.schema import AUTOCAST, OptimConfig, TrainerConfig

MAX_AUTO_THREADS = 8   # trainer.threads=auto's most: a choice (the timings here are of 2 cores)


@dataclass(frozen=True)
class RunConfig:
    resolved: dict             # the composed config as plain containers: run.json, checkpoints
    model_cfg: GPTConfig
    data_cfg: DataConfig
    optim_cfg: OptimConfig
    train_cfg: TrainerConfig

    @property
    def tokens_per_step(self) -> int:   # all micro-steps and processes together
        return self.train_cfg.batch_size * self.train_cfg.grad_accum * self.model_cfg.block_size


@dataclass(frozen=True)
class Compute:
    rank: int                  # this process (0 writes the run directory)
    world: int                 # the number of processes
    device: torch.device
    precision: str             # what trainer.precision resolved to: fp32 | bf16 | fp16
    autocast: AbstractContextManager   # torch.autocast, or nullcontext for fp32
    threads_chosen: str = ""   # how trainer.threads=auto chose torch's thread count


@dataclass
class Progress:
    step: int = 0
    best_val_loss: float = math.inf
    best_step: Optional[int] = None
    init_val_loss: Optional[float] = None
    final_val_loss: Optional[float] = None
    wall_s: float = 0.0        # summed over every segment (start or resume) of the run

    def add_eval(self, step: int, val_loss: float) -> bool:
        """Record an evaluation's validation loss; whether it is the best so far."""
        self.final_val_loss = val_loss
        if step == 0:
            self.init_val_loss = val_loss
        improved = math.isfinite(val_loss) and val_loss < self.best_val_loss
        if improved:
            self.best_val_loss, self.best_step = val_loss, step
        return improved


# A term added to each micro-batch's summed cross-entropy: f(logits, targets)
LossTerm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# At a check step, after clipping: f(the step's real targets) -> fields of its train record
StepRecord = Callable[[torch.Tensor], dict]


@dataclass(frozen=True)
class StepHooks:
    """What configs attach to the optimizer step; the default run, nothing."""

    loss_term: Optional[LossTerm] = None              # trainer.z_loss: trainer/z_loss.py
    after_step: tuple[Callable[[], None], ...] = ()   # after the optimizer: optim.qk_clip
    records: tuple[StepRecord, ...] = ()              # trainer.diagnostics, trainer.z_loss


@dataclass
class TrainState:
    """What the next optimizer step depends on; last.pt saves it (the hooks are rebuilt)."""

    model: GPT                 # the plain module: weights, diagnostics, evaluation, sampling
    wrapped: torch.nn.Module   # model, compiled and/or DDP-wrapped: the step's forward
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    batcher: Sampler           # data.batching.Batcher, or a generated task's sampler
    hooks: StepHooks = field(default_factory=StepHooks)
    progress: Progress = field(default_factory=Progress)


@dataclass
class Run:
    config: RunConfig
    compute: Compute
    state: TrainState
    data: TrainingData         # data.prepare.PreparedData, or data.recall.RecallData
    eval_batches: dict[str, list[Batch]]   # "val", "train": the same batches every evaluation
    prompts: list[list[int]]               # token ids of trainer.sample_prompts


def build(cfg: DictConfig, jobs_at_once: Optional[int] = None) -> Run:
    """Validated configs, data, model, optimizer; `jobs_at_once`: for trainer.threads=auto."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    data_cfg, train_cfg = DataConfig(**resolved["data"]), TrainerConfig(**resolved["trainer"])
    optim_cfg = OptimConfig(**resolved["optim"])
    shape = BatchShape(train_cfg.batch_size, resolved["model"]["block_size"], process_rank(),
                       world_size())
    threads, threads_chosen = choose_threads(train_cfg.threads, jobs_at_once)
    if threads is not None:
        torch.set_num_threads(threads)
    device = pick_device(train_cfg.device)
    amp = autocast_dtype(train_cfg.precision, device)
    compute = Compute(shape.rank, shape.world, device, precision_name(amp),
                      torch.autocast(device.type, dtype=amp) if amp else nullcontext(),
                      threads_chosen)

    if data_cfg.source == "recall":
        from data.recall import RecallData  # loaded only for data=recall
        data = RecallData(data_cfg)
    else:
        data = prepare(data_cfg)
    model_cfg = GPTConfig(vocab_size=data.vocab_size, scaling=ScalingConfig(**resolved["scaling"]),
                          param=ParamConfig(**resolved["param"]), **resolved["model"])
    prompts = [data.encode(p) or [data.eot_id] for p in train_cfg.sample_prompts]  # fail early
    eval_batches, batcher = data.batches(shape, train_cfg.eval_iters, train_cfg.seed)
    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg, attention_class(model_cfg.attn_impl, amp, device)).to(device)
    hooks = step_hooks(model, optim_cfg.qk_clip, train_cfg)
    wrapped = torch.compile(model) if train_cfg.compile else model
    if shape.world > 1:
        wrapped = DDP(wrapped, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = make_optimizer(model, optim_cfg, device, compute.precision)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda epoch: lr_at(epoch + 1, optim_cfg, train_cfg.max_steps) / optim_cfg.lr)
    state = TrainState(
        model, wrapped, optimizer, schedule,
        torch.amp.GradScaler(device.type, enabled=amp == torch.float16), batcher, hooks)
    config = RunConfig(resolved, model_cfg, data_cfg, optim_cfg, train_cfg)
    return Run(config, compute, state, data, eval_batches, prompts)


def step_hooks(model: GPT, qk_clip: Optional[float], train_cfg: TrainerConfig) -> StepHooks:
    """trainer.z_loss's, optim.qk_clip's and trainer.diagnostics' hooks, each loaded only when
    named."""
    loss_term, after_step, records = None, (), ()
    if train_cfg.z_loss:
        from trainer.z_loss import ZLoss
        loss_term = ZLoss(train_cfg.z_loss)
        after_step, records = (loss_term.clear,), (loss_term.record,)
    if qk_clip is not None:
        from trainer.qk_clip import setup
        after_step = (*after_step, setup(model, qk_clip))
    if train_cfg.diagnostics:
        from trainer.diagnose import grad_record
        records = (partial(grad_record, model), *records)
    return StepHooks(loss_term, after_step, records)


def attention_class(attn_impl: str, amp: Optional[torch.dtype],
                    device: torch.device) -> type[MultiHeadAttention]:
    """MultiHeadAttention, or model/cpu_autocast.py's route: attn_impl=auto, CPU autocast."""
    if attn_impl == "auto" and amp is not None and device.type == "cpu":
        from model.cpu_autocast import CPUAutocastAttention  # loaded only for this route
        return CPUAutocastAttention
    return MultiHeadAttention


def process_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over every process, in place (unchanged with one process)."""
    if dist.is_initialized():
        dist.all_reduce(t)
    return t


def choose_threads(threads, jobs: Optional[int] = None) -> tuple[Optional[int], str]:
    """trainer.threads as a number (None: torch's own), and how auto chose it: OMP_NUM_THREADS,
    else the cores shared by this machine's torchrun processes or a joblib sweep's `jobs`; with
    how idle threads wait (train.py sets OMP_WAIT_POLICY=PASSIVE: other runs may share them)."""
    if threads != "auto":
        return threads, ""
    omp, waits = (os.environ.get("OMP_NUM_THREADS", ""),
                  f"; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    if jobs is None and omp.isdigit() and int(omp):
        return int(omp), f"trainer.threads=auto: OMP_NUM_THREADS={int(omp)}{waits}"
    try:   # the affinity mask: a container's or taskset's limit
        cores = len(os.sched_getaffinity(0))
    except AttributeError:   # macOS and Windows have no affinity call
        cores = os.cpu_count() or 1
    sharing = jobs or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    how = f"trainer.threads=auto: {cores} core(s) available" + (
        f" / {jobs} sweep job(s) at once (hydra.launcher.n_jobs)" if jobs is not None else
        f" / {sharing} torchrun process(es)" if sharing > 1 else "")
    return (max(1, min(MAX_AUTO_THREADS, cores // sharing)),
            f"{how}, at most {MAX_AUTO_THREADS}{waits}")


def pick_device(name: str, key: str = "trainer.device") -> torch.device:
    """trainer.device (or the setting `key`) as a torch.device; `cuda` means this process's GPU
    (LOCAL_RANK)."""
    if (name.startswith("cuda") and not torch.cuda.is_available()) or (
            name == "mps" and not torch.backends.mps.is_available()):
        raise UserError(f"{key}={name} is not available on this machine; use {key}=auto or "
                        "cpu.")
    if name == "auto":
        name = ("cuda" if torch.cuda.is_available()
                else "mps" if torch.backends.mps.is_available() else "cpu")
    if name == "cuda":
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"{key}={name} is not a device; use {key}=auto, cpu, cuda, cuda:N or "
                        "mps.") from None
    if device.type == "cuda":
        if (device.index or 0) >= torch.cuda.device_count():
            raise UserError(f"{key}={name}: this machine has {torch.cuda.device_count()} GPU(s), "
                            f"numbered from 0; use {key}=cuda or a smaller index.")
        torch.cuda.set_device(device)
    return device


DTYPES = dict(zip(AUTOCAST, (None, torch.bfloat16, torch.float16)))   # fp32: no autocast


def autocast_dtype(precision: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype of trainer.precision (None: float32); auto: docs/training.md."""
    if precision == "auto" and device.type == "cuda":
        precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    elif precision == "auto":
        amx = device.type == "cpu" and torch.cpu._is_amx_tile_supported()
        precision = "bf16" if amx else "fp32"
    return DTYPES[precision]


def precision_name(dtype: Optional[torch.dtype]) -> str:   # None: fp32
    return {d: name for name, d in DTYPES.items()}[dtype]


def make_optimizer(model: GPT, optim_cfg: OptimConfig, device: torch.device,
                   precision: str = "fp32") -> torch.optim.Optimizer:
    """AdamW that decays matrices (linear and embedding weights) but not biases, gains, scales;
    muP's and optim.qk_lr_mult's groups where set. Fused: one kernel, on the CPU too. optim=muon:
    Muon for the matrices it takes, in the run's `precision` (trainer/muon.py), AdamW the rest."""
    on_muon = []
    if optim_cfg.name == "muon":
        from trainer.muon import muon_parameters, with_muon  # loaded only for optim=muon
        on_muon = muon_parameters(model, optim_cfg)
    taken = {id(p) for p in on_muon}
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
    if model.config.param.name == "mup":
        from model import mup  # loaded only for param=mup
        groups = mup.param_groups(params, model, optim_cfg.lr, optim_cfg.weight_decay)
    else:
        groups = [{"params": [p for p in params if p.dim() >= 2],
                   "weight_decay": optim_cfg.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if optim_cfg.qk_lr_mult != 1.0:
        from trainer.qk_lr_mult import qk_groups  # loaded only when it is not 1
        groups = qk_groups(groups, model, optim_cfg.lr, optim_cfg.qk_lr_mult)
    adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=optim_cfg.lr,
                              betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                              fused=True if device.type in ("cuda", "cpu") else None)
    return with_muon(adamw, on_muon, model, optim_cfg, precision) if on_muon else adamw


def lr_at(step: int, optim_cfg: OptimConfig, max_steps: int) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warm-up, then cosine to min_lr."""
    if step <= optim_cfg.warmup_steps:
        return optim_cfg.lr * step / optim_cfg.warmup_steps
    progress = min(1.0, (step - optim_cfg.warmup_steps)
                   / max(1, max_steps - optim_cfg.warmup_steps))
    return optim_cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (
        optim_cfg.lr - optim_cfg.min_lr)
