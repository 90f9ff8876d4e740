"""Benchmarks: attention against sequence length, the training step, the data path.

    python scripts/bench.py                       # everything; ~15 minutes on a 2-core CPU
    python scripts/bench.py --quick               # seconds: tiny sizes, few repeats (CI)
    python scripts/bench.py --parts step data     # some of: matmul attention step data optim sync
    python scripts/bench.py --parts optim --threads 1   # optim=muon's step against AdamW's
    python scripts/bench.py --device cuda --attn-precision bf16 --configs gpt2_small
    python scripts/bench.py --parts step --configs nanogpt_cpu --nanogpt ~/nanoGPT  # vs nanoGPT

Prints Markdown tables and writes them (--markdown) and everything measured (--json, default
outputs/bench/<time>.json) with the device, thread count, load and library versions.

How it measures (these machines are shared and noisy, so absolute times drift):
- Cases compared with each other are interleaved: every round times each case in turn, the
  order rotating from round to round, so a burst of load hits them all alike. Reported: the
  median over the timed calls and ratios of medians from the same run.
- Device work is finished before every clock read (torch.cuda.synchronize on a GPU).
- Peak memory of one call, beyond what was allocated before it: on CUDA from
  torch.cuda.max_memory_allocated(); on CPU from the allocation and free events that
  torch.profiler records with profile_memory=True, summed in time order (the CPU allocator
  keeps no peak counter). Scratch memory that oneDNN allocates outside PyTorch is not seen.
- MFU = flops_per_token(model, T) x tokens/s / peak matmul rate, where the peak is the best rate
  of a square matmul measured here in the step's dtype, not a datasheet figure.
- The training step is the one train.py runs: each case is what `python train.py <overrides>` builds
  (trainer.build.build: model, AdamW groups, schedule, precision, compile), stepped with
  trainer.step.train_step (batch fetch, forward, backward, clipping, AdamW, schedule).
- The data is a corpus of random characters as long as the Shakespeare training split, with
  exactly the config's vocabulary (65 ids: nanoGPT's character vocabulary), prepared by
  data.prepare into a token cache in a temporary folder and batched by data.batching.Batcher
  (concat packing): the real data path, without needing the corpus or the network.
- Muon against AdamW (--parts optim): the default recipe's step (the nanogpt_cpu shape,
  trainer.precision=auto) built with optim=adamw and with optim=muon, interleaved; Muon's over
  AdamW's median is the ratio. Beside it, the update of Muon's matrices alone (optimizer.step on
  fixed gradients): the run's Muon (trainer/muon.py: Float32Muon in float32, its same-shape
  matrices stacked), the same one matrix at a time, PyTorch's torch.optim.Muon (bfloat16, one
  matrix at a time) and AdamW over the same matrices; and one evaluation's attention diagnostics
  (trainer.diagnostics: trainer/diagnose.py's attention_record on one batch).
- With --nanogpt DIR, nanoGPT's own train.py from that checkout runs as a subprocess with its
  README's CPU command (the nanogpt_cpu shape), in a scratch folder holding copies of its
  train.py, model.py, configurator.py and config file and this bench's tokens as its
  data/<dataset>/train.bin, val.bin and meta.pkl; nothing is written into the checkout. Its
  runs take turns with the step cases (one run before each round), on the same thread count;
  from each run's printed `iter N: ... time X ms` lines the first NANOGPT_WARMUP_ITERS are
  dropped. Reported: its median, and its median over each nanogpt_cpu row's (> 1: ours faster).

Dimension letters: B batch, T time, C model width, H heads.
"""

import argparse
import itertools
import json
import os
import pickle
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import unicodedata
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from data.batching import Batcher, BatchShape
from model.attention import MultiHeadAttention
from model.config import NORMALISERS, SCALINGS, SDPA_NORMALISERS, GPTConfig, ScalingConfig
from model.errors import UserError
from model.gpt import GPT
from scripts.common import ROOT, compose_config, interleave, median_ms, sync, timed
from trainer.build import autocast_dtype, build, pick_device, precision_name
from trainer.diagnose import attention_record
from trainer.muon import Float32Muon
from trainer.run_dir import cpu_name
from trainer.step import train_step

SHAKESPEARE_TRAIN_TOKENS = 4_567_669  # the char-level Shakespeare train split (token cache)


@dataclass(frozen=True)
class StepConfig:
    """A model shape and batch for the training-step benchmark."""

    n_layer: int
    n_head: int
    d_model: int
    block_size: int
    batch_size: int
    vocab_size: int = 65  # Tiny Shakespeare's character vocabulary, as in nanoGPT
    dropout: float = 0.0


CONFIGS = {
    # nanoGPT README's CPU run: 4 layers, 4 heads, 128 wide, block 64, batch 12, dropout 0
    "nanogpt_cpu": StepConfig(4, 4, 128, 64, 12),
    # ~10M parameters: nanoGPT's shakespeare_char GPU shape (configs/model/small.yaml), batch 16,
    # without dropout (a plain GPT, as docs/benchmarks.md's bf16 comparison uses) and with
    # small.yaml's 0.2 (on a CPU dropout > 0 also sends SDPA to its unfused math path)
    "10M": StepConfig(6, 6, 384, 256, 16),
    "10M_dropout": StepConfig(6, 6, 384, 256, 16, dropout=0.2),
    # GPT-2 small (124M) for a GPU; far too slow for a 2-core CPU
    "gpt2_small": StepConfig(12, 12, 768, 1024, 16, vocab_size=50304),
}


# ---------------------------------------------------------------- timing and memory helpers

def peak_memory(calls: dict[str, Callable[[], object]], device: torch.device) -> dict[str, int]:
    """Per call: most bytes held at once during one run of it, beyond what existed before it."""
    if device.type == "cuda":
        peaks = {}
        for name, call in calls.items():
            sync(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            call()
            sync(device)
            peaks[name] = torch.cuda.max_memory_allocated(device) - before
        return peaks
    # CPU: one profiler session, each call inside a named range; the allocation (+) and free (-)
    # events within a range, summed in time order, peak at the call's peak memory.
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for name, call in calls.items():
            with record_function(name):
                call()
    events = list(prof.profiler.kineto_results.events())
    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    spans = {e.name(): (e.start_ns(), e.start_ns() + e.duration_ns()) for e in events
             if e.name() in calls}
    return {name: max(itertools.accumulate((n for t, n in memory if lo <= t <= hi), initial=0))
            for name, (lo, hi) in spans.items()}


def flops_per_token(model: GPT, seq_len: int) -> float:
    """Training FLOPs per token, PaLM appendix B style: 6 N + 12 L H D T. N is the weights
    of every matmul (projections, MLP, the tied LM head; no embeddings, norms or biases),
    6 = 2 (multiply-add) x 3 (forward + backward); 12 L H D T is Q K^T and W V over the full
    T x T square, T = seq_len."""
    cfg = model.config
    n_matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return float(6 * n_matmul + 12 * cfg.n_layer * cfg.n_head * cfg.d_head * seq_len)


# ---------------------------------------------------------------- environment and peak rate

def environment(device: torch.device) -> dict:
    """What a reader needs to compare these numbers with theirs."""
    env = {"device": str(device), "python": platform.python_version(),
           "torch": torch.__version__, "numpy": np.__version__, "platform": platform.platform(),
           "cpu": cpu_name(), "cpu_count": os.cpu_count(),
           "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
           "torch_threads": torch.get_num_threads(), "loadavg_start": list(os.getloadavg())}
    if device.type == "cpu":
        env["amx"] = torch.cpu._is_amx_tile_supported()
        env["avx512_bf16"] = torch.cpu._is_avx512_bf16_supported()
    if device.type == "cuda":
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
    return env


def peak_matmul(dtype: torch.dtype, sizes: tuple[int, ...], repeats: int,
                device: torch.device) -> dict:
    """Best FLOP/s of an n x n by n x n matmul in dtype over sizes and repeats."""
    best = {"dtype": precision_name(None if dtype == torch.float32 else dtype), "flops": 0.0}
    for n in sizes:
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        def matmul(a=a, b=b):
            return a @ b
        timed(matmul, device)  # warm-up: library initialisation, kernel selection
        seconds = min(timed(matmul, device) for _ in range(repeats))
        flops = 2 * n**3 / seconds
        if flops > best["flops"]:
            best.update(n=n, flops=flops)
    return best


# ---------------------------------------------------------------- 1. attention

def attention_call(layer: MultiHeadAttention, B: int, T: int,
                   amp: Optional[torch.dtype]) -> Callable[[], None]:
    """One forward+backward of `layer` (causal) on x (B, T, C), on the layer's device."""
    device = next(layer.parameters()).device
    C = layer.proj.out_features
    torch.manual_seed(0)
    x = torch.randn(B, T, C, device=device, requires_grad=True)
    grad_y = torch.randn(B, T, C, device=device)
    ctx = torch.autocast(device.type, dtype=amp) if amp else nullcontext()

    def call() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        with ctx:
            y = layer(x, causal=True)  # (B, T, C)
        y.backward(grad_y)
    return call


def attention_layer(impl: str, scaling: str, C: int, H: int, device: torch.device,
                    normaliser: str = "softmax") -> MultiHeadAttention:
    """One attention layer of width C in H heads of C // H, seeded."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=1, n_head=H, d_model=C, attn_impl=impl,
                       scaling=ScalingConfig(name=scaling, normaliser=normaliser))
    return MultiHeadAttention(config).to(device)


def attention_cases() -> list[tuple[str, str, str]]:
    """(impl, scaling, normaliser): every scale under softmax on both paths, and every other
    normaliser under sqrt_dk on each path that computes it (sigmoid: explicit only)."""
    return [(impl, s, "softmax") for impl in ("explicit", "sdpa") for s in SCALINGS] + [
        (impl, "sqrt_dk", n) for n in NORMALISERS if n != "softmax"
        for impl in ("explicit", "sdpa") if impl == "explicit" or n in SDPA_NORMALISERS]


def bench_attention(args, device: torch.device) -> list[dict]:
    """Rows (T, impl, scaling, normaliser): fwd+bwd median ms, peak bytes, ratios within the
    same T: to the explicit path, to sqrt_dk (same normaliser), to softmax (same scale)."""
    amp = autocast_dtype(args.attn_precision, device)
    rows = []
    for T in args.seq_lens:
        B = max(1, args.attn_tokens // T)
        calls = {(impl, s, n): attention_call(attention_layer(
            impl, s, args.attn_width, args.attn_heads, device, n), B, T, amp)
            for impl, s, n in attention_cases()}
        for call in calls.values():
            call()  # warm-up
        names = {"/".join(key): key for key in calls}
        peaks = {names[n]: b for n, b in peak_memory({n: calls[names[n]] for n in names},
                                                       device).items()}
        times = interleave(calls, args.attn_rounds, 1, device)
        ms = {key: median_ms(t) for key, t in times.items()}
        for (impl, s, n), t in times.items():
            rows.append({"T": T, "B": B, "impl": impl, "scaling": s, "normaliser": n,
                         "ms": ms[impl, s, n], "times_ms": [1e3 * x for x in t],
                         "peak_bytes": peaks[impl, s, n],
                         "speedup_vs_explicit": ms["explicit", s, n] / ms[impl, s, n],
                         "time_vs_sqrt_dk": ms[impl, s, n] / ms[impl, "sqrt_dk", n],
                         "time_vs_softmax": ms[impl, s, n] / ms[impl, s, "softmax"],
                         "memory_vs_explicit": peaks[impl, s, n] / peaks["explicit", s, n]})
        del calls
        print(f"attention T={T} done", file=sys.stderr)
    return rows


# ---------------------------------------------------------------- 2. training step and 3. data

def corpus(folder: Path, n_chars: int, vocab_size: int, seed: int = 0) -> list[str]:
    """Data overrides for a text corpus of random characters whose char vocabulary (two special
    tokens, newline and vocab_size - 3 other characters) has exactly vocab_size ids."""
    alphabet = [c for c in map(chr, range(0x21, 0x30000)) if c.isprintable() and not c.isspace()
                and unicodedata.category(c)[0] != "M" and unicodedata.normalize("NFC", c) == c]
    alphabet = np.array(alphabet[:vocab_size - 3])
    rng = np.random.default_rng(seed)
    for name, n in (("train", n_chars), ("val", max(n_chars // 10, 1000))):
        path = folder / f"{name}-{vocab_size}-{n_chars}.txt"
        if not path.exists():
            chars = alphabet[rng.integers(0, len(alphabet), n)]
            if name == "train":
                chars[:len(alphabet)] = alphabet  # every character at least once
            lines = ("".join(chars[i:i + 100]) for i in range(0, n, 100))  # lines of 100
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return ["data=text", f"data.name=bench{vocab_size}",
            f"data.train_files=[{folder}/train-{vocab_size}-{n_chars}.txt]",
            f"data.val_files=[{folder}/val-{vocab_size}-{n_chars}.txt]",
            f"data.cache_dir={folder}/cache"]


class StepCase:
    """One training run as train.py builds it (model, optimizer, schedule, precision, compile,
    batches), stepped with trainer.step.train_step."""

    def __init__(self, cfg: StepConfig, precision: str, compile_: bool, data: list[str],
                 device: torch.device, options: tuple[str, ...] = ()):
        overrides = data + [*options,
            f"model.n_layer={cfg.n_layer}", f"model.n_head={cfg.n_head}",
            f"model.d_model={cfg.d_model}", f"model.block_size={cfg.block_size}",
            f"model.dropout={cfg.dropout}", f"trainer.batch_size={cfg.batch_size}",
            f"trainer.precision={precision}", f"trainer.compile={compile_}",
            f"trainer.device={device}", "trainer.threads=null",  # keep this process's count
            "trainer.eval_iters=1", "trainer.max_steps=100000", "trainer.sample_prompts=[]"]
        self.cfg, self.precision, self.compile, self.device = cfg, precision, compile_, device
        self.run = build(compose_config(overrides))
        self.raw = self.run.state.model
        if self.run.data.vocab_size != cfg.vocab_size:
            raise RuntimeError(f"the bench corpus has {self.run.data.vocab_size} token ids, "
                               f"not the {cfg.vocab_size} the config asks for")

    def step(self) -> None:
        config = self.run.config
        train_step(self.run.state, self.run.compute, config.optim_cfg, config.train_cfg)


def bench_steps(args, device: torch.device, folder: Path) -> tuple:
    """Rows per (config, precision, compile), per config's batch fetch, and nanoGPT's summary
    (None without --nanogpt)."""
    step_rows, data_rows, nanogpt = [], [], None
    for name in args.configs:
        cfg = CONFIGS[name]
        data = corpus(folder, args.n_tokens, cfg.vocab_size)
        cases = {(p, c): StepCase(cfg, p, c, data, device)
                 for c in args.compile for p in args.precisions}
        warmup = {key: [timed(case.step, device) for _ in range(args.warmup)]
                  for key, case in cases.items()}
        prepared = next(iter(cases.values())).run.data
        fetcher = Batcher(prepared.train, BatchShape(cfg.batch_size, cfg.block_size), seed=1)
        calls = {key: case.step for key, case in cases.items()}
        calls["fetch"] = lambda fetcher=fetcher: fetcher.next().to(device)
        beside = nanogpt_beside(args, name, prepared, folder)
        times = interleave(calls, args.rounds, args.per_round, device,
                           beside.run if beside else None)
        peaks = peak_memory({f"{p} {c}": case.step for (p, c), case in cases.items()}, device)
        rows = step_table(name, cfg, cases, times, warmup, peaks)
        if beside:
            nanogpt = beside.summary()
            compare_with_nanogpt(rows, nanogpt["ms"])
        step_rows += rows
        data_rows.append(data_row(name, times))
        print(f"step {name} done", file=sys.stderr)
    return step_rows, data_rows, nanogpt


def step_table(name: str, cfg: StepConfig, cases: dict, times: dict,
               warmup: dict, peaks: dict) -> list[dict]:
    """One row per case; "mfu" is filled in by `run` once the peak rate is known. "peak_bytes":
    the most one step holds at once beyond the weights, optimizer state and anything else
    allocated before it (activations, gradients, temporaries; `peak_memory`)."""
    tokens = cfg.batch_size * cfg.block_size
    base = median_ms(times["fp32", False]) if ("fp32", False) in times else None
    rows = []
    for (p, c), case in cases.items():
        ms = median_ms(times[p, c])
        tok_s = tokens / (ms / 1e3)
        flops = flops_per_token(case.raw, cfg.block_size) * tok_s
        dtype = precision_name(autocast_dtype(p, case.device))
        auto = precision_name(autocast_dtype("auto", case.device))
        rows.append({"config": name, "precision": p, "dtype": dtype, "is_auto": dtype == auto,
                     "compile": c, "ms": ms,
                     "times_ms": [1e3 * t for t in times[p, c]], "tokens_per_s": tok_s,
                     "n_params": case.raw.num_params(), "model_flops_per_s": flops,
                     "mfu": None, "peak_bytes": peaks[f"{p} {c}"],
                     "speedup_vs_fp32_eager": base / ms if base else None,
                     "warmup_s": warmup[p, c]})
    return rows


def compare_with_nanogpt(rows: list[dict], nanogpt_ms: float) -> None:
    """Adds nanoGPT's median step, timed in the same run, and its ratio to each row's
    (nanoGPT ms / our ms: above 1 where our step is faster)."""
    for row in rows:
        row["nanogpt_ms"] = nanogpt_ms
        row["speedup_vs_nanogpt"] = nanogpt_ms / row["ms"]


def data_row(name: str, times: dict) -> dict:
    fetch = median_ms(times["fetch"])
    steps = {key: median_ms(t) for key, t in times.items() if key != "fetch"}
    fastest = min(steps, key=steps.get)
    return {"config": name, "fetch_ms": fetch, "fastest_step": list(fastest),
            "fastest_step_ms": steps[fastest], "share_of_fastest_step": fetch / steps[fastest]}


# ---------------------------------------------------------------- 5. Muon against AdamW

OPTIMIZERS = ("adamw", "muon")


class OneMatrixAtATime(Float32Muon):
    """The run's Muon with no stacking: what stacking same-shape matrices saves."""

    @staticmethod
    def stacks(shapes: list[torch.Size]) -> list[list[int]]:
        return [[i] for i in range(len(shapes))]


def bench_optim(args, device: torch.device, folder: Path) -> dict:
    """The default recipe's training step under optim=adamw and optim=muon, interleaved (median
    ms, Muon's over AdamW's); the update of Muon's matrices alone by each implementation; one
    evaluation's attention diagnostics."""
    cfg = CONFIGS["nanogpt_cpu"]
    data = corpus(folder, args.n_tokens, cfg.vocab_size)
    cases = {name: StepCase(cfg, "auto", False, data, device, (f"optim={name}",))
             for name in OPTIMIZERS}
    muon_run = cases["muon"].run
    matrices = [p for g in muon_run.state.optimizer.muon.param_groups for p in g["params"]]
    batch = muon_run.eval_batches["val"][0]
    calls = {name: case.step for name, case in cases.items()}
    calls["diagnostics"] = lambda: attention_record(muon_run.state.model, batch, device)
    for call in calls.values():
        for _ in range(args.warmup):
            call()
    times = interleave(calls, args.rounds, args.per_round, device)
    ms = {name: median_ms(t) for name, t in times.items()}
    return {"config": "nanogpt_cpu", "precision": muon_run.compute.precision,
            "muon": muon_run.state.optimizer.name,
            "steps": {name: {"ms": ms[name], "times_ms": [1e3 * t for t in times[name]]}
                      for name in OPTIMIZERS},
            "muon_over_adamw": ms["muon"] / ms["adamw"],
            "diagnostics_ms": ms["diagnostics"],
            "updates": update_times(matrices, args, device)}


def update_times(matrices: list[torch.Tensor], args, device: torch.device) -> dict:
    """optimizer.step on copies of `matrices` with fixed gradients, by each implementation of
    Muon and by AdamW, interleaved: median ms."""
    def optimizer(kind) -> torch.optim.Optimizer:
        params = [torch.nn.Parameter(m.detach().clone()) for m in matrices]
        for p in params:
            p.grad = torch.randn_like(p)
        if kind is torch.optim.AdamW:
            return kind(params, fused=device.type in ("cuda", "cpu"))
        return kind(params, lr=0.02)

    kinds = {"Float32Muon (the run's, stacked)": Float32Muon,
             "Float32Muon, one matrix at a time": OneMatrixAtATime,
             "torch.optim.Muon (bfloat16)": torch.optim.Muon, "AdamW": torch.optim.AdamW}
    steps = {name: optimizer(kind).step for name, kind in kinds.items()}
    for step in steps.values():
        step()   # warm-up: the momentum buffers and kernels
    times = interleave(steps, args.rounds, args.per_round, device)
    return {"matrices": len(matrices), "shapes": sorted({tuple(m.shape) for m in matrices}),
            "ms": {name: median_ms(t) for name, t in times.items()}}


# ---------------------------------------------------------------- nanoGPT, same run

# What a nanoGPT checkout must hold: the bench runs its README's CPU command, which names the
# config file, and train.py execs configurator.py from the working folder.
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py")
# Iterations dropped from each run: iteration 0 includes the evaluation train.py always runs
# first, and nanoGPT itself lets its loop settle for 5 iterations before estimating MFU.
NANOGPT_WARMUP_ITERS = 5
NANOGPT_DATASET = "bench"
ITER_LINE = re.compile(r"^iter (\d+): loss \S+, time ([0-9.]+) ?ms", re.MULTILINE)


class NanoGPTError(Exception):
    """Why nanoGPT could not be timed; main prints it as one paragraph and exits with code 2."""


def check_nanogpt(args: argparse.Namespace, device: torch.device) -> None:
    """Refuses --nanogpt before anything is measured when the comparison cannot run."""
    checkout = args.nanogpt
    missing = [name for name in NANOGPT_FILES if not (checkout / name).is_file()]
    if missing:
        raise NanoGPTError(
            f"--nanogpt {checkout} is not a nanoGPT checkout: it has no {', '.join(missing)}. "
            "Pass the folder of a clone of github.com/karpathy/nanoGPT (the one holding "
            "train.py, model.py, configurator.py and config/). The bench copies those files "
            "into a scratch folder and writes its own data there, so nothing in the checkout "
            "changes and nanoGPT's data preparation (a download) is not needed.")
    if device.type != "cpu":
        raise NanoGPTError(
            f"--nanogpt runs nanoGPT's README command for a CPU (--device=cpu), so it compares "
            f"with a CPU step only, and this run's device is {device}: add --device cpu.")
    if "step" not in args.parts or (args.configs is not None
                                     and "nanogpt_cpu" not in args.configs):
        raise NanoGPTError(
            "--nanogpt times nanoGPT beside the nanogpt_cpu training step (its CPU shape): "
            "keep `step` in --parts and nanogpt_cpu in --configs.")
    if args.nanogpt_iters < 1:
        raise NanoGPTError(f"--nanogpt-iters {args.nanogpt_iters}: time at least 1 iteration.")


def nanogpt_command(iters: int) -> list[str]:
    """nanoGPT README's CPU command (python train.py config/train_shakespeare_char.py
    --device=cpu ...) in the nanogpt_cpu shape, cut to NANOGPT_WARMUP_ITERS + iters iterations
    (train.py runs 0..max_iters), without evaluation after iteration 0 or checkpoints."""
    cfg = CONFIGS["nanogpt_cpu"]
    max_iters = NANOGPT_WARMUP_ITERS + iters - 1
    return ["python", "train.py", "config/train_shakespeare_char.py", "--device=cpu",
            "--compile=False", "--eval_iters=20", "--log_interval=1",
            f"--block_size={cfg.block_size}", f"--batch_size={cfg.batch_size}",
            f"--n_layer={cfg.n_layer}", f"--n_head={cfg.n_head}", f"--n_embd={cfg.d_model}",
            f"--max_iters={max_iters}", "--lr_decay_iters=2000", f"--dropout={cfg.dropout}",
            f"--eval_interval={max_iters + 1}", "--always_save_checkpoint=False",
            f"--dataset={NANOGPT_DATASET}"]


def iteration_times(stdout: str, iters: int) -> list[float]:
    """The ms of iterations NANOGPT_WARMUP_ITERS on from train.py's log lines."""
    times = [float(ms) for it, ms in ITER_LINE.findall(stdout)
             if int(it) >= NANOGPT_WARMUP_ITERS]
    if len(times) != iters:
        raise NanoGPTError(
            f"nanoGPT's train.py printed {len(times)} lines `iter N: loss X, time Y ms` from "
            f"iteration {NANOGPT_WARMUP_ITERS} on, not the {iters} expected: its log format is "
            f"not the one this bench reads. The end of its output:\n{tail(stdout)}")
    return times


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class NanoGPT:
    """nanoGPT's own train.py, run from copies of a checkout's files in a scratch folder: every
    run() is one subprocess on this process's thread count, whose iteration times are kept."""

    def __init__(self, checkout: Path, folder: Path, iters: int):
        self.checkout, self.folder, self.iters = checkout.resolve(), folder, iters
        self.command = nanogpt_command(iters)
        self.threads = torch.get_num_threads()
        self.times_ms: list[float] = []
        self.runs = 0
        for name in NANOGPT_FILES:  # copies: python would write __pycache__ next to the files
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.checkout / name, folder / name)

    def write_data(self, train: np.ndarray, val: np.ndarray, vocab_size: int) -> None:
        """The files train.py reads: data/<dataset>/train.bin and val.bin (uint16 token ids)
        and meta.pkl (vocab_size), here this bench's own tokens instead of Shakespeare."""
        if vocab_size > 2**16:
            raise NanoGPTError(f"nanoGPT reads uint16 token ids; {vocab_size} ids do not fit")
        data_dir = self.folder / "data" / NANOGPT_DATASET
        data_dir.mkdir(parents=True, exist_ok=True)
        np.asarray(train, dtype=np.uint16).tofile(data_dir / "train.bin")
        np.asarray(val, dtype=np.uint16).tofile(data_dir / "val.bin")
        with open(data_dir / "meta.pkl", "wb") as f:
            pickle.dump({"vocab_size": vocab_size}, f)

    def run(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads),
                   MKL_NUM_THREADS=str(self.threads))
        proc = subprocess.run([sys.executable, *self.command[1:]], cwd=self.folder, env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise NanoGPTError(
                f"nanoGPT's train.py (copied from {self.checkout}) failed with exit code "
                f"{proc.returncode}; it ran as `{' '.join(self.command)}` with "
                f"OMP_NUM_THREADS={self.threads}. The end of its stderr:\n{tail(proc.stderr)}")
        self.times_ms += iteration_times(proc.stdout, self.iters)
        self.runs += 1

    def summary(self) -> dict:
        return {"checkout": str(self.checkout), "command": " ".join(self.command),
                "threads": self.threads, "runs": self.runs, "iters_per_run": self.iters,
                "warmup_iters_dropped": NANOGPT_WARMUP_ITERS, "times_ms": self.times_ms,
                "ms": statistics.median(self.times_ms)}


def nanogpt_beside(args: argparse.Namespace, name: str, prepared,
                   folder: Path) -> Optional[NanoGPT]:
    """With --nanogpt, nanoGPT ready to take turns with the nanogpt_cpu config's step cases, on
    the same tokens (prepared: data.prepare's PreparedData)."""
    if not args.nanogpt or name != "nanogpt_cpu":
        return None
    nanogpt = NanoGPT(args.nanogpt, folder / "nanogpt", args.nanogpt_iters)
    nanogpt.write_data(prepared.train[:], prepared.val[:], prepared.vocab_size)
    return nanogpt


# ---------------------------------------------------------------- 4. host-device syncs

def check_syncs(args, device: torch.device, folder: Path, n_steps: int = 5) -> dict:
    """Host-device synchronisations in trainer.step.train_step (a non-logging step), on CUDA.

    torch.cuda.set_sync_debug_mode("warn") warns at every synchronising call (.item(), a
    blocking copy, ...); the warnings of n_steps steps after a warm-up step are counted.
    """
    if device.type != "cuda":
        return {"measured": False, "why": f"a {device.type} has no host-device sync to find"}
    cfg = CONFIGS[args.configs[0]]
    case = StepCase(cfg, "auto", False, corpus(folder, args.n_tokens, cfg.vocab_size), device)
    case.step()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(n_steps):
                case.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    messages = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
    return {"measured": True, "config": args.configs[0], "steps": n_steps,
            "syncs_per_step": len(messages) / n_steps, "messages": sorted(set(messages))[:5]}


# ---------------------------------------------------------------- report

def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def mib(n: int) -> float:
    return n / 2**20


def markdown(result: dict) -> str:
    env = result["env"]
    hardware = env["cpu"] if env["device"] == "cpu" else env.get("gpu")
    out = [f"# Benchmark ({env['device']}, {hardware})",
           "", f"torch {env['torch']}, Python {env['python']}, {env['torch_threads']} threads, "
           f"load average {env['loadavg_start'][0]:.2f} at start and "
           f"{env['loadavg_end'][0]:.2f} at end. Command: `{result['command']}`"]
    if result.get("matmul"):
        end = result.get("matmul_end") or [{}] * len(result["matmul"])
        out += ["", "## Peak matmul rate (measured at the start, used for MFU, and at the end)",
                "", table(["dtype", "n", "GFLOP/s", "GFLOP/s at end"],
                          [[m["dtype"], m["n"], m["flops"] / 1e9, e.get("flops", 0) / 1e9]
                           for m, e in zip(result["matmul"], end)])]
    if result.get("attention"):
        out += ["", "## Attention layer, forward+backward "
                f"({result['args']['attn_precision']}; C={result['args']['attn_width']}, "
                f"H={result['args']['attn_heads']}, B x T = {result['args']['attn_tokens']})", "",
                attention_markdown(result["attention"]), "",
                "## Attention normalisers, sqrt_dk (time over softmax's on the same path)", "",
                normaliser_markdown(result["attention"])]
    if result.get("step"):
        out += ["", "## Training step (train.py's train_step)", "",
                step_markdown(result["step"], "nanogpt" in result)]
    if result.get("nanogpt"):
        out += ["", nanogpt_markdown(result["nanogpt"])]
    if result.get("data"):
        out += ["", "## Data path (Batcher.next + Batch.to)", "",
                table(["config", "fetch ms", "fastest step", "step ms", "share"],
                      [[r["config"], r["fetch_ms"], " ".join(map(str, r["fastest_step"])),
                        r["fastest_step_ms"], f"{100 * r['share_of_fastest_step']:.2f}%"]
                       for r in result["data"]])]
    if result.get("optim"):
        out += ["", optim_markdown(result["optim"])]
    if result.get("sync"):
        out += ["", "## Host-device syncs per train_step", "", json.dumps(result["sync"])]
    return "\n".join(out) + "\n"


def step_markdown(rows: list[dict], with_nanogpt: bool) -> str:
    """The step table; nanoGPT's columns only when it was timed in this run."""
    headers = ["config", "params", "precision", "compile", "ms/step", "tokens/s", "MFU",
               "step peak MiB", "vs fp32 eager"]
    headers += ["nanoGPT ms", "vs nanoGPT"] if with_nanogpt else []
    body = []
    for r in rows:
        line = [r["config"], f"{r['n_params'] / 1e6:.2f}M",
                r["precision"] + (" (auto)" if r["is_auto"] else ""), r["compile"], r["ms"],
                r["tokens_per_s"], r["mfu"], r["peak_bytes"] / 2**20, r["speedup_vs_fp32_eager"]]
        line += [r.get("nanogpt_ms"), r.get("speedup_vs_nanogpt")] if with_nanogpt else []
        body.append(line + [" / ".join(f"{s:.2f}" for s in r["warmup_s"])])
    return table(headers + ["warm-up s"], body)


def optim_markdown(optim: dict) -> str:
    """The step under each optimizer, Muon's update alone by each implementation, and one
    evaluation's attention diagnostics against a step."""
    steps, updates = optim["steps"], optim["updates"]
    adamw = steps["adamw"]["ms"]
    step_rows = [["adamw", "AdamW", steps["adamw"]["ms"], 1.0],
                 ["muon", optim["muon"], steps["muon"]["ms"], optim["muon_over_adamw"]]]
    alone = updates["ms"]
    update_rows = [[name, ms, ms / alone["AdamW"]] for name, ms in alone.items()]
    shapes = ", ".join("x".join(map(str, s)) for s in updates["shapes"])
    return "\n".join([
        f"## Muon against AdamW ({optim['config']}, {optim['precision']}: the default recipe's "
        "step)", "", table(["optim", "optimizer", "ms/step", "vs AdamW"], step_rows), "",
        f"The update alone: optimizer.step on Muon's {updates['matrices']} matrices ({shapes}), "
        "fixed gradients", "", table(["implementation", "ms", "vs AdamW"], update_rows), "",
        f"One evaluation's attention diagnostics (trainer.diagnostics, one batch): "
        f"{optim['diagnostics_ms']:.3g} ms, {optim['diagnostics_ms'] / adamw:.2f} AdamW steps."])


def nanogpt_markdown(nanogpt: dict) -> str:
    return (f"nanoGPT ms: median of {len(nanogpt['times_ms'])} iterations of nanoGPT's train.py "
            f"(from {nanogpt['checkout']}), {nanogpt['runs']} runs of "
            f"{nanogpt['warmup_iters_dropped']} + {nanogpt['iters_per_run']} iterations, the "
            f"first {nanogpt['warmup_iters_dropped']} of each dropped, one run before each round "
            f"of the step cases, OMP_NUM_THREADS={nanogpt['threads']}: `{nanogpt['command']}`. "
            f"vs nanoGPT: nanoGPT ms / ms/step.")


def attention_markdown(rows: list[dict]) -> str:
    """The scales under softmax: explicit and SDPA, each scale's time over sqrt_dk's."""
    by = {(r["T"], r["impl"], r["scaling"]): r for r in rows if r["normaliser"] == "softmax"}
    body = []
    for T, s in sorted({(T, s) for T, _, s in by}, key=lambda k: (k[0], SCALINGS.index(k[1]))):
        e, d = by[T, "explicit", s], by[T, "sdpa", s]
        body.append([T, e["B"], s, e["ms"], d["ms"], d["speedup_vs_explicit"],
                     e["time_vs_sqrt_dk"], d["time_vs_sqrt_dk"], mib(e["peak_bytes"]),
                     mib(d["peak_bytes"]), d["memory_vs_explicit"]])
    return table(["T", "B", "scaling", "explicit ms", "sdpa ms", "sdpa speedup",
                  "explicit vs sqrt_dk", "sdpa vs sqrt_dk", "explicit MiB", "sdpa MiB",
                  "sdpa/explicit memory"], body)


def normaliser_markdown(rows: list[dict]) -> str:
    """The normalisers under sqrt_dk: each path's time over softmax's ("-": no SDPA path)."""
    by = {(r["T"], r["impl"], r["normaliser"]): r for r in rows if r["scaling"] == "sqrt_dk"}
    body = []
    order = list(NORMALISERS)
    for T, n in sorted({(T, n) for T, _, n in by}, key=lambda k: (k[0], order.index(k[1]))):
        e, d = by[T, "explicit", n], by.get((T, "sdpa", n), {})
        body.append([T, e["B"], n, e["ms"], d.get("ms"), e["time_vs_softmax"],
                     d.get("time_vs_softmax"), mib(e["peak_bytes"]),
                     mib(d["peak_bytes"]) if d else None])
    return table(["T", "B", "normaliser", "explicit ms", "sdpa ms", "explicit vs softmax",
                  "sdpa vs softmax", "explicit MiB", "sdpa MiB"], body)


# ---------------------------------------------------------------- command line

QUICK = {"seq_lens": [16, 32], "attn_tokens": 64, "attn_width": 32, "attn_heads": 2,
         "attn_rounds": 2, "configs": ["nanogpt_cpu"], "rounds": 2, "per_round": 1, "warmup": 1,
         "n_tokens": 10_000, "matmul_sizes": [64, 128], "nanogpt_iters": 3}
FULL = {"seq_lens": [64, 128, 256, 512, 1024, 2048], "attn_tokens": 4096, "attn_width": 384,
        "attn_heads": 6, "attn_rounds": 7, "configs": None, "rounds": 5, "per_round": 3,
        "warmup": 3,
        "n_tokens": SHAKESPEARE_TRAIN_TOKENS, "matmul_sizes": None, "nanogpt_iters": 20}
PARTS = ("attention", "step", "optim", "sync")


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (seconds)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                   help="step includes the peak matmul rate and the data path")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--seq-lens", type=int, nargs="+")
    p.add_argument("--attn-tokens", type=int, help="B x T of the attention benchmark")
    p.add_argument("--attn-width", type=int, help="C of the attention layer")
    p.add_argument("--attn-heads", type=int, help="H of the attention layer")
    p.add_argument("--attn-precision", default="fp32", help="fp32 | bf16 | fp16 | auto")
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS))
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="also time torch.compile'd steps (default: on, off with --quick)")
    p.add_argument("--attn-rounds", type=int, help="rounds of one call per attention case")
    p.add_argument("--rounds", type=int, help="rounds of the training-step cases")
    p.add_argument("--per-round", type=int, help="steps per case per round")
    p.add_argument("--warmup", type=int, help="steps per case before timing (reported)")
    p.add_argument("--n-tokens", type=int, help="length of the random token file")
    p.add_argument("--matmul-sizes", type=int, nargs="+")
    p.add_argument("--nanogpt", type=Path, metavar="DIR",
                   help="a nanoGPT checkout: time its train.py (README CPU command) in this run, "
                        "taking turns with the nanogpt_cpu step, and report the ratio")
    p.add_argument("--nanogpt-iters", type=int, help="timed iterations per nanoGPT run "
                   f"(after {NANOGPT_WARMUP_ITERS} dropped ones; default 20, 3 with --quick)")
    p.add_argument("--json", type=Path, help="default outputs/bench/<time>.json")
    p.add_argument("--markdown", type=Path, help="also write the tables here")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.compile = [False, True] if (args.compile if args.compile is not None
                                     else not args.quick) else [False]
    return args


def matmul_peaks(args, device: torch.device) -> list[dict]:
    return [peak_matmul(dtype, tuple(args.matmul_sizes), 5, device)
            for dtype in (torch.float32, torch.bfloat16)]


def run(args: argparse.Namespace, device: torch.device, folder: Path) -> dict:
    if args.configs is None:
        args.configs = ["nanogpt_cpu", "10M"] + (["gpt2_small"] if device.type == "cuda" else [])
    if args.matmul_sizes is None:
        args.matmul_sizes = [4096, 8192] if device.type == "cuda" else [1024, 2048]
    result = {"command": " ".join(["python scripts/bench.py", *sys.argv[1:]]),
              "env": environment(device), "args": {k: v for k, v in vars(args).items()
                                                   if k not in ("json", "markdown")}}
    if "step" in args.parts:
        result["matmul"] = matmul_peaks(args, device)
        result["step"], result["data"], nanogpt = bench_steps(args, device, folder)
        if nanogpt:
            result["nanogpt"] = nanogpt
    if "attention" in args.parts:
        result["attention"] = bench_attention(args, device)
    if "step" in args.parts:
        # measured again at the end: load only lowers a rate, so the better one is the peak
        result["matmul_end"] = matmul_peaks(args, device)
        best = {m["dtype"]: max(m["flops"], e["flops"])
                for m, e in zip(result["matmul"], result["matmul_end"])}
        for row in result["step"]:
            row["mfu"] = row["model_flops_per_s"] / best[row["dtype"]]
    if "optim" in args.parts:
        result["optim"] = bench_optim(args, device, folder)
    if "sync" in args.parts:
        result["sync"] = check_syncs(args, device, folder)
    result["env"]["loadavg_end"] = list(os.getloadavg())
    return result


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = pick_device(args.device, "--device")
    except UserError as e:
        print(f"bench.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        if args.nanogpt:
            check_nanogpt(args, device)
        with tempfile.TemporaryDirectory(prefix="attnscale-bench-") as folder:
            result = run(args, device, Path(folder))
    except NanoGPTError as e:
        print(f"bench.py: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    text = markdown(result)
    print(text)
    path = args.json or ROOT / "outputs" / "bench" / time.strftime("bench-%Y%m%d-%H%M%S.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    print(f"wrote {path}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
