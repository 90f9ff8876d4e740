"""Training configs (optim, trainer, logger) and the typed Hydra schema. The frozen dataclasses
(these, GPTConfig, ScalingConfig, ParamConfig, DataConfig) hold the defaults and validate
themselves; Hydra merges overrides into typed copies, so a typo or a wrongly typed override
fails at once. A file in configs/<group>/ states only what it changes.
"""

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from data.config import DataConfig
from model.config import GPTConfig, ParamConfig, ScalingConfig
from model.errors import check_bools, check_positive_int, check_sampling, is_positive_number, refuse

AUTOCAST = ("fp32", "bf16", "fp16")   # trainer/build.py maps them to autocast dtypes
PRECISIONS = ("auto", *AUTOCAST)
LOGGERS = ("none", "tensorboard", "wandb")
WANDB_MODES = ("offline", "online", "disabled")
ON_NAN = ("stop", "raise")
OPTIMIZERS = ("adamw", "muon")   # optim.name: configs/optim/<name>.yaml
ADJUST_LR_FNS = ("original", "match_rms_adamw")   # torch.optim.Muon's adjust_lr_fn


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up and cosine decay (nanoGPT's shakespeare_char defaults); with
    name=muon, Muon for the blocks' matrices and AdamW for the rest (trainer/muon.py)."""

    name: str = "adamw"                # adamw | muon (configs/optim/)
    lr: float = 1e-3                   # AdamW's (under muon: embeddings, vectors)
    weight_decay: float = 0.1          # applied to matrices only (weights of Linear, Embedding)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])   # 0.99: few tokens a step
    eps: float = 1e-8
    warmup_steps: int = 100
    min_lr: float = 1e-4               # lr / 10 (Chinchilla, nanoGPT), reached at max_steps
    grad_clip: float = 1.0             # max global L2 norm; 0 turns clipping off
    # QK-Clip threshold tau (Kimi K2: 100): after each step, shrink W_q and W_k of any head
    # whose largest logit exceeded tau (trainer/qk_clip.py); null = off
    qk_clip: Optional[float] = None
    # W_q's and W_k's learning rate is lr x qk_lr_mult, their weight decay weight_decay /
    # qk_lr_mult (docs/scaling.md, "The scale under Adam"); under param=mup, x muP's own LR
    qk_lr_mult: float = 1.0
    # optim=muon's keys (read only there): torch.optim.Muon's group. The defaults are nanochat's
    # (gpt.py: matrix_lr 0.02, momentum 0.95, Nesterov, 5 Newton-Schulz steps, no decay)
    muon_lr: float = 0.02              # the peak; the schedule scales it as it scales lr
    muon_weight_decay: float = 0.0     # decoupled: each step multiplies by 1 - muon_lr x this
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5                  # Newton-Schulz iterations
    # original: muon_lr x sqrt(max(1, rows/cols)) (Jordan); match_rms_adamw: x 0.2 sqrt(max(rows,
    # cols)), the update's RMS of AdamW's, so AdamW's lr and weight decay carry over (Moonlight)
    adjust_lr_fn: str = "original"
    # the parameters Muon trains, as patterns of their names (fnmatch: blocks.*.mlp.*.weight);
    # null: every 2-D parameter inside the blocks (q, k, v, attention output, MLP in and out)
    muon_params: Optional[list[str]] = None

    def __post_init__(self):
        check_bools("optim", self)
        refuse("optim", (
            ("name", self.name, self.name in OPTIMIZERS,
             f"choose {' | '.join(OPTIMIZERS)} (or pick the option: optim=muon)."),
            ("lr", self.lr, self.lr > 0 and math.isfinite(self.lr),
             "use a positive finite learning rate, e.g. 1e-3."),
            ("min_lr", self.min_lr, 0 <= self.min_lr <= self.lr,
             f"use a value in [0, optim.lr={self.lr}]."),
            ("betas", self.betas, len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
             "use two numbers in [0, 1), e.g. [0.9,0.99]."),
            ("weight_decay/eps", (self.weight_decay, self.eps),
             self.weight_decay >= 0 and self.eps > 0, "weight_decay must be >= 0 and eps > 0."),
            ("warmup_steps", self.warmup_steps, self.warmup_steps >= 0, "use 0 or more steps."),
            ("grad_clip", self.grad_clip, self.grad_clip >= 0,
             "use 0 (off) or a positive norm."),
            ("qk_clip", self.qk_clip, self.qk_clip is None or is_positive_number(self.qk_clip),
             "use null (off) or a positive logit threshold, e.g. 100 (Kimi K2's)."),
            ("qk_lr_mult", self.qk_lr_mult, is_positive_number(self.qk_lr_mult),
             "use a positive finite multiplier of W_q's and W_k's learning rate, e.g. 1.0 "
             "(the global LR) or d_head**-0.25 (sqrt_dk's equivalent for scaling=none)."),
            ("muon_lr", self.muon_lr, is_positive_number(self.muon_lr),
             "use a positive finite learning rate for Muon's matrices, e.g. 0.02 (nanochat's)."),
            ("muon_weight_decay", self.muon_weight_decay, self.muon_weight_decay >= 0
             and math.isfinite(self.muon_weight_decay), "use 0 (off) or a positive decay."),
            ("momentum", self.momentum, 0 <= self.momentum < 1,
             "use a number in [0, 1), e.g. 0.95."),
            ("ns_steps", self.ns_steps, type(self.ns_steps) is int and 1 <= self.ns_steps < 100,
             "use a whole number of Newton-Schulz iterations from 1 to 99, e.g. 5: with none "
             "the update is not orthogonalised (torch.optim.Muon refuses 100 or more)."),
            ("adjust_lr_fn", self.adjust_lr_fn, self.adjust_lr_fn in ADJUST_LR_FNS,
             f"choose {' | '.join(ADJUST_LR_FNS)} (docs/training.md, \"Optimiser\")."),
            ("muon_params", self.muon_params, self.muon_params is None or (
                len(self.muon_params) > 0 and all(isinstance(p, str) and p.strip()
                                                  for p in self.muon_params)),
             "use null (every 2-D parameter inside the blocks) or a list of name patterns, "
             "e.g. [blocks.*.attn.*_proj.weight].")))


@dataclass(frozen=True)
class TrainerConfig:
    """How long, how big, on what, and what to write. Batch sizes are global (all processes)."""

    max_steps: int = 2000              # nanoGPT's CPU run: val ~1.88 after 2000 iterations
    batch_size: int = 12               # sequences per micro-step, summed over processes
    grad_accum: int = 1                # micro-steps per optimizer step
    eval_every: int = 250
    eval_iters: int = 20               # fixed validation batches per evaluation
    log_every: int = 10                # train records, progress bar and non-finite check
    ckpt_every: int = 500
    precision: str = "auto"            # auto | fp32 | bf16 | fp16 (auto: trainer/build.py)
    compile: bool = False              # torch.compile (checkpoints hold the plain weights)
    device: str = "auto"               # auto (cuda, then mps, then cpu) | cpu | cuda:N | mps
    # CPU threads: auto (trainer/build.py, printed at start), a number, or null (torch's own).
    # Idle threads sleep (train.py sets OMP_WAIT_POLICY=PASSIVE): runs may share the cores.
    threads: Any = "auto"
    seed: int = 1337
    resume: Optional[str] = None       # null | auto (this run dir's last.pt) | path/to/last.pt
    on_nan: str = "stop"               # stop: end with diverged=true, exit 0 | raise: exit 3
    # samples.txt at the end: a continuation of each prompt (e.g. ["\n","ROMEO:"]); [] = none
    sample_prompts: list[str] = field(default_factory=list)
    sample_tokens: int = 200
    sample_temperature: float = 0.8
    sample_top_k: Optional[int] = 200
    # The end-of-run score of the whole validation split covers at most this many targets, an
    # even fixed subset (null: every split whole)
    full_eval_tokens: Optional[int] = 4_000_000
    # After training, the loss with windows of each length (trainer/long_eval.py; pairs for
    # data.task=kv); [] = none
    eval_lengths: list[int] = field(default_factory=list)
    # The attention statistics of each evaluation and W_q's and W_k's gradient norms at each
    # check step (trainer/diagnose.py)
    diagnostics: bool = False
    # z-loss coefficient (PaLM: 1e-4): z_loss * mean (log Z)^2 of the output softmax joins the
    # training loss (trainer/z_loss.py); 0 = off
    z_loss: float = 0.0

    def __post_init__(self):
        for key in ("max_steps", "batch_size", "grad_accum", "eval_every", "eval_iters",
                    "log_every", "ckpt_every"):
            check_positive_int(f"trainer.{key}", getattr(self, key))
        check_bools("trainer", self)
        check_sampling(("trainer.sample_tokens", "trainer.sample_temperature",
                        "trainer.sample_top_k"), self.sample_tokens, self.sample_temperature,
                       self.sample_top_k)
        refuse("trainer", (
            ("precision", self.precision, self.precision in PRECISIONS,
             f"choose {' | '.join(PRECISIONS)}."),
            ("on_nan", self.on_nan, self.on_nan in ON_NAN, f"choose {' | '.join(ON_NAN)}."),
            ("device", self.device, self.device.split(":")[0] in ("auto", "cpu", "cuda", "mps"),
             "choose auto, cpu, cuda, cuda:N or mps."),
            ("threads", self.threads, self.threads in ("auto", None) or (
                type(self.threads) is int and self.threads >= 1),   # a bool is not a count
             "use auto, a number of threads >= 1, or null (leave PyTorch's count as it is)."),
            ("z_loss", self.z_loss, self.z_loss >= 0 and math.isfinite(self.z_loss),
             "use 0 (off) or a small positive coefficient, e.g. 1e-4."),
            ("full_eval_tokens", self.full_eval_tokens, self.full_eval_tokens is None
             or self.full_eval_tokens >= 1, "use null (the whole split) or a positive count.")))


@dataclass(frozen=True)
class LoggerConfig:
    """Where the records go besides metrics.jsonl (configs/logger/*.yaml)."""

    name: str = "none"                 # none | tensorboard | wandb
    project: str = "attnscale"         # wandb: the project the run is filed under
    entity: Optional[str] = None       # wandb: team or user (null: the account's default)
    # wandb: offline writes the run into the run folder (upload it later with `wandb sync`);
    # online needs `wandb login`; disabled makes wandb a no-op
    mode: str = "offline"

    def __post_init__(self):
        refuse("logger", (
            ("name", self.name, self.name in LOGGERS,
             f"choose {' | '.join(LOGGERS)} (or pick the option: logger=tensorboard)."),
            ("mode", self.mode, self.mode in WANDB_MODES, f"choose {' | '.join(WANDB_MODES)}."),
            ("project", self.project, isinstance(self.project, str) and bool(
                self.project.strip()), "name a W&B project, e.g. attnscale.")))


def hydra_schema(cls: type, exclude: tuple[str, ...] = ()) -> type:
    """A mutable copy of `cls`'s fields (names, types, defaults) minus `exclude`, for Hydra to
    merge into (a frozen one makes OmegaConf's node read-only). A bool field is Any here: OmegaConf
    would read 2, "yes" or "on" as true, and the dataclass refuses what is not true or false."""
    hints = typing.get_type_hints(cls)
    specs = [(f.name, Any if hints[f.name] in (bool, Optional[bool]) else hints[f.name],
              field(default=f.default) if f.default is not dataclasses.MISSING else
              field(default_factory=f.default_factory)
              if f.default_factory is not dataclasses.MISSING else field(default=MISSING))
             for f in dataclasses.fields(cls) if f.name not in exclude]
    return dataclasses.make_dataclass(f"{cls.__name__}Schema", specs)


def flat(config: dict, prefix: str = "") -> dict:
    """A nested config as flat `group.key` entries: {"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for k, v in config.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


# Each top-level config group and the dataclass that types and validates it.
GROUPS = {"model": GPTConfig, "data": DataConfig, "scaling": ScalingConfig, "param": ParamConfig,
          "optim": OptimConfig, "trainer": TrainerConfig, "logger": LoggerConfig}


def group_schemas() -> dict[str, type]:
    """Each group's Hydra schema: the keys a command line may set (trainer/overrides.py)."""
    # vocab_size comes from the tokenizer; scaling and param are groups at the top level.
    return {name: hydra_schema(cls, exclude=("vocab_size", "scaling", "param")
                               if name == "model" else ()) for name, cls in GROUPS.items()}


def register_configs() -> None:
    """Store the schema `config_schema` that configs/config.yaml lists first in its defaults."""
    config = dataclasses.make_dataclass(
        "Config", [(name, schema, field(default_factory=schema))
                   for name, schema in group_schemas().items()])
    ConfigStore.instance().store(name="config_schema", node=config)
