"""Train a decoder-only GPT whose attention score scale is a config switch.

    python train.py                                        # tiny model, Tiny Shakespeare, CPU
    python train.py scaling=none model=small               # pick any option of any group
    python train.py -m scaling=sqrt_dk,none trainer.seed=1,2      # a sweep under multirun/
    python train.py trainer.resume=auto hydra.run.dir=outputs/DAY/TIME   # continue that run
    torchrun --standalone --nproc_per_node=2 train.py      # data parallel, same global batch

Config groups are in configs/ (model, data, scaling, optim, trainer, experiment); what a run
writes is described in trainer/run_dir.py. Exit codes: 0 done (a diverged run with
trainer.on_nan=stop included), 2 bad config or data, 3 diverged with trainer.on_nan=raise,
128+signal when stopped by SIGINT/SIGTERM (a checkpoint to resume from is written first).
"""

import json
import math
import os
import shlex
import shutil
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from data.batching import Batcher, fixed_batches
from data.config import DataConfig
from data.errors import DataError
from data.prepare import prepare
from model.attention import ScalingConfig
from model.errors import UserError
from model.gpt import GPT, IGNORE_INDEX, GPTConfig
from trainer import checkpoint
from trainer.checkpoint import CheckpointError
from trainer.run_dir import (
    MetricsLog,
    begin_segment,
    end_segment,
    environment,
    remove_if_unstarted,
    write_json,
)
from trainer.schema import OptimConfig, TrainerConfig, register_configs

# Evaluation batches are drawn with this seed, whatever trainer.seed: every run of a sweep is
# scored on the same validation text, so their losses compare.
EVAL_SEED = 0


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived: the step in flight finished and last.pt was written."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class Diverged(Exception):
    """The training loss became non-finite and trainer.on_nan=raise."""


class StopSignal:
    """Turn SIGINT/SIGTERM into a flag the loop reads between steps; a second SIGINT aborts."""

    def __enter__(self):
        self.signum = 0
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum, frame):
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def pick_device(name: str) -> torch.device:
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

    Measured on this repository's 2-core Xeon (docs/benchmarks.md): bf16 autocast steps ran
    1.2-1.4x faster than float32 for the tiny model and 2.2-2.6x for the 10M one, once the
    attention runs SDPA in float32 under CPU autocast (model/attention.py)."""
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
    # fused: one kernel for all parameters; on the CPU 4x faster than the default foreach
    # implementation at ~10M parameters (docs/benchmarks.md)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                             fused=True if device.type in ("cuda", "cpu") else None)


def lr_at(step: int, optim: OptimConfig, max_steps: int) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warm-up, then cosine to min_lr."""
    if step <= optim.warmup_steps:
        return optim.lr * step / optim.warmup_steps
    progress = min(1.0, (step - optim.warmup_steps) / max(1, max_steps - optim.warmup_steps))
    return optim.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (optim.lr - optim.min_lr)


def to_device(batch, device: torch.device):
    """(idx, targets, valid_mask) on the device. On CUDA the copies go from pinned memory with
    non_blocking=True: a copy from pageable memory would synchronise with the GPU every step."""
    def move(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if t is None:
            return None
        if device.type == "cuda":
            return t.pin_memory().to(device, non_blocking=True)
        return t.to(device)
    return move(batch.idx), move(batch.targets), move(batch.valid_mask)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t)
    return t


@torch.no_grad()
def estimate_loss(model, batches, ctx, device) -> float:
    """Mean loss over every real target of the fixed batches of all processes, in eval mode."""
    was_training = model.training
    model.eval()
    total = torch.zeros(2, device=device)   # (sum of token losses, number of real targets)
    for batch in batches:
        idx, targets, valid = to_device(batch, device)
        with ctx:
            loss_sum = model(idx, targets, valid, reduction="sum")[1].float()
        total += torch.stack([loss_sum, (targets != IGNORE_INDEX).sum().float()])
    model.train(was_training)
    loss_sum, count = all_reduce_sum(total).tolist()
    return loss_sum / count


def attention_record(raw: GPT, batch, device) -> dict:
    """Per-layer attention diagnostics on one fixed batch: mean entropy over heads, max |logit|
    over heads, mean fraction of saturated rows over heads (issue 4)."""
    idx, _, valid = to_device(batch, device)
    stats = raw.attention_stats(idx, valid)
    return {"attn_entropy": [s["entropy"].mean().item() for s in stats],
            "attn_max_logit": [s["max_logit"].max().item() for s in stats],
            "attn_saturated": [s["saturated"].mean().item() for s in stats]}


def qk_grad_record(raw: GPT) -> dict:
    q, k = zip(*(block.attn.qk_grad_norms() for block in raw.blocks))
    return {"q_grad_norm": sum(q) / len(q), "k_grad_norm": sum(k) / len(k),
            "q_grad_norm_layers": list(q), "k_grad_norm_layers": list(k)}


def count_targets(batches, device: torch.device) -> torch.Tensor:
    """Real targets in `batches` of all processes: the divisor of a token-weighted loss."""
    if all(valid is None for _, _, valid in batches):   # concat: every target is real
        world = dist.get_world_size() if dist.is_initialized() else 1
        return torch.tensor(float(world * sum(t.numel() for _, t, _ in batches)), device=device)
    local = sum((targets != IGNORE_INDEX).sum() for _, targets, _ in batches)
    return all_reduce_sum(local.float())


def train_step(model, raw, batcher, optimizer, scheduler, scaler, ctx, tc, optim, device,
               want_qk: bool):
    """One optimizer step over tc.grad_accum micro-batches. `model` is what runs forward
    (raw, compiled or DDP-wrapped), `raw` the plain module. The loss is the sum of the token
    losses of all micro-batches and processes over their count of real targets, so a padded
    micro-batch with few real tokens weighs as few tokens. Returns device tensors (this
    process's share of that loss: their sum over processes is the loss; grad norm) and, if
    want_qk, the q/k projection grad norms (floats: a host sync).
    scripts/bench.py times this function: keep its signature in step with the benchmark."""
    batches = [to_device(batcher.next(), device) for _ in range(tc.grad_accum)]
    n_targets = count_targets(batches, device)
    # DDP averages gradients over processes: scaling by the world size undoes that average.
    world = dist.get_world_size() if dist.is_initialized() else 1
    loss_sum = torch.zeros((), device=device)
    for micro, (idx, targets, valid) in enumerate(batches):
        # DDP all-reduces gradients on the last micro-step only.
        last = micro == tc.grad_accum - 1
        with model.no_sync() if isinstance(model, DDP) and not last else nullcontext():
            with ctx:
                _, loss = model(idx, targets, valid, reduction="sum")
            scaler.scale(loss * (world / n_targets)).backward()
        loss_sum += loss.detach().float()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), optim.grad_clip or math.inf)
    qk = qk_grad_record(raw) if want_qk else {}
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum / n_targets, grad_norm, qk


def resume_path(resume: Optional[str], run_dir: Path) -> Optional[Path]:
    """trainer.resume: null (fresh), auto (run_dir's last.pt if any), or a checkpoint path."""
    if resume is None:
        return None
    if resume == "auto":
        path = run_dir / "checkpoints" / "last.pt"
        return path if path.exists() else None
    return Path(hydra.utils.to_absolute_path(resume))


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
    data: object               # data.prepare.PreparedData
    model_cfg: GPTConfig
    prompts: list              # token ids of trainer.sample_prompts
    batcher: Batcher
    val_batches: list
    train_batches: list
    raw: GPT                   # the plain module: state dicts, diagnostics, sampling
    model: torch.nn.Module     # raw, or torch.compile(raw)
    ddp: torch.nn.Module       # model, or DDP(model) with several processes
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
    if tc.threads is not None:
        torch.set_num_threads(tc.threads)
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


def restore(r: Run, path: Path) -> None:
    """Load every piece of state the next step depends on from a last.pt checkpoint."""
    try:
        ckpt = checkpoint.read(path)
    except CheckpointError as err:
        raise UserError(f"Cannot resume from {err.path} (trainer.resume={r.tc.resume}): "
                        f"{err.problem} Resume from checkpoints/last.pt of a run trained by "
                        "this version of train.py, or start a new run without trainer.resume."
                        ) from None
    checkpoint.check_resumable(ckpt, r.c, r.model_cfg.vocab_size, path)
    r.raw.load_state_dict(ckpt["model"])
    r.optimizer.load_state_dict(ckpt["optimizer"])
    r.scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt["scaler"]:   # empty when saved without fp16 (a disabled scaler has no state)
        r.scaler.load_state_dict(ckpt["scaler"])
    r.batcher.load_state_dict(ckpt["sampler"])
    r.state.update({k: ckpt[k] for k in r.state})
    rngs = ckpt["rng"]
    checkpoint.set_rng_state(rngs[r.rank] if len(rngs) == r.world else rngs[0], r.device)


def save(r: Run, path: Path, full: bool = True) -> None:
    """Write a checkpoint (rank 0). full=False: weights only, for best.pt. Call on every rank:
    the RNG states of all processes are gathered."""
    rngs = [None] * r.world
    if r.world > 1:
        dist.all_gather_object(rngs, checkpoint.rng_state(r.device))
    else:
        rngs = [checkpoint.rng_state(r.device)]
    if r.rank != 0:
        return
    content = {"model": r.raw.state_dict(), "model_config": asdict(r.model_cfg), "config": r.c,
               "pad_id": r.data.pad_id, **r.state}
    if full:
        content.update(optimizer=r.optimizer.state_dict(), scheduler=r.scheduler.state_dict(),
                       scaler=r.scaler.state_dict(), sampler=r.batcher.state_dict(), rng=rngs,
                       world_size=r.world)
    checkpoint.write(path, content)


def evaluate(r: Run, log: Optional[MetricsLog], ckpt_dir: Path, step: int, lr: float,
             tokens_per_sec: Optional[float]) -> None:
    """Validation and training loss on the fixed batches, attention diagnostics, best.pt."""
    val_loss = estimate_loss(r.model, r.val_batches, r.ctx, r.device)
    record = {"kind": "eval", "step": step,
              "train_loss": estimate_loss(r.model, r.train_batches, r.ctx, r.device),
              "val_loss": val_loss,
              "val_bpb": val_loss / math.log(2) / r.data.meta["bytes_per_token"]["val"],
              "lr": lr, "tokens_per_sec": tokens_per_sec}
    r.state["final_val_loss"] = val_loss
    if step == 0:
        r.state["init_val_loss"] = val_loss
    improved = math.isfinite(val_loss) and val_loss < r.state["best_val_loss"]
    if improved:
        r.state["best_val_loss"], r.state["best_step"] = val_loss, step
    if r.rank == 0:
        record.update(attention_record(r.raw, r.val_batches[0], r.device))
        log.write(record)
        tqdm.write(f"step {step}: train {record['train_loss']:.4f}, val {val_loss:.4f} "
                   f"({record['val_bpb']:.3f} bits/byte), lr {lr:.2e}"
                   + (f", {tokens_per_sec:,.0f} tokens/s" if tokens_per_sec else ""))
    if improved:
        save(r, ckpt_dir / "best.pt", full=False)


def start_run_dir(r: Run, run_dir: Path, resumed_from: Optional[Path]) -> MetricsLog:
    """Print what is about to run; add this segment to run.json, copy tokenizer.json, open
    metrics.jsonl (dropping the records of steps past the checkpoint)."""
    print(f"data {r.c['data']['name']}: {len(r.data.train):,} train / {len(r.data.val):,} val "
          f"tokens, vocab {r.data.vocab_size}; model {r.raw.num_params() / 1e6:.2f}M "
          f"parameters; {r.device} {r.precision}, {torch.get_num_threads()} thread(s) x "
          f"{r.world} process(es)"
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
        "config": r.c, "overrides": overrides(), "model_config": asdict(r.model_cfg),
        "n_params": r.raw.num_params(), "world_size": r.world, "precision": r.precision,
        "compile": r.tc.compile, "resumed_from": segment["resumed_from"], "data": r.data.meta,
        **env}, segment, resumed=resumed_from is not None)
    shutil.copyfile(r.data.tokenizer_path, run_dir / "tokenizer.json")
    return log


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def finished(r: Run, run_dir: Path) -> Optional[str]:
    """Why a resumed run has nothing left to do (None if it has): its checkpoint is at
    trainer.max_steps, or its summary.json says it diverged."""
    if r.state["step"] >= r.tc.max_steps:
        return (f"its checkpoint is at step {r.state['step']} and trainer.max_steps="
                f"{r.tc.max_steps}; raise trainer.max_steps to train it further")
    summary = run_dir / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("diverged"):
        return ("it diverged (summary.json); start a new run, e.g. with a lower optim.lr, to "
                "try again")
    return None


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train as `cfg` says, writing into run_dir (rank 0); return the summary.

    Raises UserError before writing anything if the config, data or checkpoint is bad,
    Interrupted after a signal, Diverged on a non-finite loss with trainer.on_nan=raise.
    Returns None, writing nothing, when a resumed run is already finished.
    """
    # 1. Build everything, resume if asked; only then write the run directory.
    r = build(cfg)
    tc, optim = r.tc, r.optim
    ckpt_path = resume_path(tc.resume, run_dir)
    if ckpt_path is not None:
        restore(r, ckpt_path)
        reason = finished(r, run_dir)
        if reason:
            if r.rank == 0:
                print(f"Nothing to do: the run in {run_dir} is finished ({reason}). Its files "
                      "are left as they are.")
            return None
    else:
        torch.manual_seed(tc.seed + r.rank)   # dropout masks differ across processes
    ckpt_dir = run_dir / "checkpoints"
    log = start_run_dir(r, run_dir, ckpt_path) if r.rank == 0 else None

    # 2. The loop. Host-device syncs (.item()) happen only at check steps (logging, evaluation,
    # checkpointing); the non-finite check and, with several processes, the stop signal wait
    # for them.
    step = first_step = last_check = r.state["step"]
    start = t0 = time.perf_counter()
    tokens_per_step = tc.batch_size * tc.grad_accum * r.model_cfg.block_size
    bar = tqdm(total=tc.max_steps, initial=step, dynamic_ncols=True,
               disable=r.rank != 0 or not sys.stderr.isatty())
    if step == 0:
        evaluate(r, log, ckpt_dir, 0, lr_at(1, optim, tc.max_steps), None)
    nonfinite = torch.zeros((), device=r.device)
    tokens_per_sec, train_time, diverged, interrupted = None, 0.0, False, None
    with StopSignal() as stop:
        while step < tc.max_steps:
            step += 1
            done = step == tc.max_steps
            check = (done or step % tc.log_every == 0 or step % tc.eval_every == 0
                     or step % tc.ckpt_every == 0 or (r.world == 1 and stop.signum))
            lr = r.scheduler.get_last_lr()[0]
            loss, grad_norm, qk = train_step(r.ddp, r.raw, r.batcher, r.optimizer, r.scheduler,
                                             r.scaler, r.ctx, tc, optim, r.device,
                                             want_qk=bool(check))
            nonfinite += (~torch.isfinite(loss)).float()
            bar.update(1)
            if not check:
                continue
            # one collective: the loss (the sum of its per-process shares), the non-finite count
            # and the stop requests of all processes
            loss, bad, stop_asked = all_reduce_sum(torch.stack([loss, nonfinite, torch.tensor(
                float(stop.signum > 0), device=r.device)])).tolist()
            elapsed = time.perf_counter() - t0
            train_time += elapsed
            tokens_per_sec = tokens_per_step * (step - last_check) / elapsed
            last_check = step
            if bad > 0:
                diverged = True
                if r.rank == 0:
                    tqdm.write(f"step {step}: non-finite training loss; stopping "
                               f"(trainer.on_nan={tc.on_nan}).")
                break
            if r.rank == 0:
                log.write({"kind": "train", "step": step, "loss": loss, "lr": lr,
                           "tokens_per_sec": tokens_per_sec, "grad_norm": grad_norm.item(), **qk})
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}",
                                tok_s=f"{tokens_per_sec:,.0f}")
            if done or step % tc.eval_every == 0:
                evaluate(r, log, ckpt_dir, step, lr, tokens_per_sec)
            r.state.update(step=step, wall_s=r.state["wall_s"] + time.perf_counter() - start)
            start = time.perf_counter()
            if done or step % tc.ckpt_every == 0 or stop_asked > 0:
                save(r, ckpt_dir / "last.pt")
            if stop_asked > 0 and not done:
                interrupted = stop.signum or signal.SIGTERM
                break
            t0 = time.perf_counter()
    bar.close()
    if log is not None:
        log.close()
    if interrupted:
        if r.rank == 0:
            end_segment(run_dir / "run.json", ended_at=now(), end_step=step, ended="interrupted")
        raise Interrupted(interrupted, step, ckpt_dir / "last.pt")

    # 3. Samples from the best weights, then the summary.
    if r.rank == 0 and not diverged and tc.sample_prompts:
        write_samples(r, run_dir, ckpt_dir / "best.pt")
    r.state["wall_s"] += time.perf_counter() - start
    s = r.state
    summary = {"final_val_loss": s["final_val_loss"], "best_val_loss": s["best_val_loss"],
               "best_step": s["best_step"], "init_val_loss": s["init_val_loss"],
               "steps": step, "tokens": step * tokens_per_step,
               "tokens_per_sec": (tokens_per_step * (last_check - first_step) / train_time
                                  if train_time else None),
               "n_params": r.raw.num_params(), "diverged": diverged, "wall_s": s["wall_s"]}
    summary = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
               for k, v in summary.items()}
    if r.rank == 0:
        write_json(run_dir / "summary.json", summary)
        end_segment(run_dir / "run.json", ended_at=now(), end_step=step,
                    ended="diverged" if diverged else "finished")
    if diverged and tc.on_nan == "raise":
        raise Diverged(f"non-finite training loss at step {step}; the last good checkpoint is "
                       f"{ckpt_dir / 'last.pt'} (trainer.on_nan=raise)")
    return summary


def write_samples(r: Run, run_dir: Path, best: Path) -> None:
    """samples.txt: one continuation per trainer.sample_prompts, from the best weights."""
    if best.exists():
        r.raw.load_state_dict(checkpoint.read(best)["model"])
    gen = torch.Generator(device=r.device).manual_seed(r.tc.seed)
    r.raw.eval()
    outs = r.raw.generate(r.prompts, r.tc.sample_tokens, temperature=r.tc.sample_temperature,
                          top_k=r.tc.sample_top_k, pad_id=r.data.pad_id, generator=gen)
    text = "".join(f"--- prompt {p!r} ---\n{p}{r.data.decode(o)}\n\n"
                   for p, o in zip(r.tc.sample_prompts, outs))
    (run_dir / "samples.txt").write_text(text)


def overrides() -> list[str]:
    """The command-line overrides of this run (empty when called outside Hydra's main)."""
    from hydra.core.hydra_config import HydraConfig
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def hydra_quoted(value: str) -> str:
    """A Hydra override value that may hold `=` and `,` (a sweep job's folder name)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def shown(path: Path) -> str:
    """`path` relative to the working directory when inside it, else absolute."""
    inside = path.resolve().is_relative_to(Path.cwd().resolve())
    return os.path.relpath(path) if inside else str(path)


def resume_commands(run_dir: Path, world: int) -> list[tuple[str, str]]:
    """(what, shell command) pairs that continue this run: the job alone, in its own folder
    (hydra.mode=RUN: a preset's MULTIRUN would ignore hydra.run.dir; hydra.output_subdir=null
    keeps the job's .hydra/ as its first segment wrote it), and, in a sweep, the whole sweep
    (its command again with trainer.resume=auto in the same sweep folder)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    launcher = (["python", sys.argv[0]] if world == 1 else
                ["torchrun", "--standalone", f"--nproc_per_node={world}", sys.argv[0]])
    own = ("trainer.resume=", "hydra.mode=", "hydra.run.", "hydra.sweep.", "hydra.sweeper.",
           "hydra.output_subdir=")
    job = [*launcher, *(o for o in hc.overrides.task if not o.startswith(own)),
           *(o for o in hc.overrides.hydra if not o.startswith(own)),
           "trainer.resume=auto", "hydra.mode=RUN", "hydra.output_subdir=null",
           f"hydra.run.dir={hydra_quoted(shown(run_dir))}"]
    commands = [("this run", shlex.join(job))]
    if hc.mode == RunMode.MULTIRUN:
        again = [a for a in sys.argv[1:] if not a.startswith(("trainer.resume=",
                                                                "hydra.sweep.dir="))]
        sweep = [*launcher, *again, "trainer.resume=auto",
                 f"hydra.sweep.dir={hydra_quoted(shown(Path(hc.sweep.dir)))}"]
        commands.append(("the whole sweep (finished jobs are skipped, the others continue or "
                         "start)", shlex.join(sweep)))
    return commands


def paragraph(err: BaseException) -> str:
    return " ".join(str(err).split())


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() and
                                cfg.trainer.device != "cpu" else "gloo")
        shared = [str(run_dir)]
        dist.broadcast_object_list(shared, src=0)   # only rank 0's Hydra made a directory
        run_dir = Path(shared[0])
    rank = dist.get_rank() if dist.is_initialized() else 0
    try:
        summary = train(cfg, run_dir)
    except (UserError, DataError) as err:
        if rank == 0:
            remove_if_unstarted(run_dir)
        print(f"error: {paragraph(err)}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as err:
        if rank == 0:
            world = dist.get_world_size() if dist.is_initialized() else 1
            how = "".join(f"\nResume {what} with:\n  {command}"
                          for what, command in resume_commands(run_dir, world))
            print(f"{err}; checkpoint {err.checkpoint}.{how}", file=sys.stderr)
        sys.exit(128 + err.signum)
    except Diverged as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(3)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if summary is None:   # a finished run, resumed: nothing was written
        if rank == 0:
            remove_if_unstarted(run_dir)
        return
    if rank == 0:
        print(f"best val loss {summary['best_val_loss']:.4f} at step {summary['best_step']} "
              f"(final {summary['final_val_loss']:.4f}; {summary['steps']} steps, "
              f"{summary['wall_s']:.0f} s)" if not summary["diverged"] else
              f"diverged at step {summary['steps']} (non-finite loss)")
        print(f"run dir: {shown(run_dir)}")


def main() -> None:
    register_configs()
    if int(os.environ.get("RANK", "0")) > 0:
        # Only rank 0 owns a run directory: the other processes' Hydra must not make one.
        sys.argv = [a for a in sys.argv if not a.startswith(("hydra.run.dir=",
                                                             "hydra.output_subdir="))]
        sys.argv += ["hydra.run.dir=.", "hydra.output_subdir=null"]
    hydra_main()


if __name__ == "__main__":
    main()
