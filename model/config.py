"""The model's configs: ScalingConfig (Hydra group `scaling`), ParamConfig (group `param`) and
GPTConfig (group `model`), frozen dataclasses that validate themselves when built, and the
constants data/ and trainer/ share.
This file imports no torch, so the report (scripts/report/) reads the scale names without it.
"""

import math
from dataclasses import dataclass, field, replace
from typing import Optional

from model.errors import ConfigError, check_dropout, check_positive_int, is_positive_number

IGNORE_INDEX = -100  # targets equal to this are ignored by the loss (F.cross_entropy's default)
SATURATION_THRESHOLD = 0.99  # an attention row is "saturated" when its largest weight exceeds this

# The score scales, the one place each is defined: s as a function of the head width d and the
# ScalingConfig c. Only the chosen one is evaluated. `learned` starts at this value and learns
# one log-scale per head; `qk_norm` normalises q and k first; `uniform` makes every logit 0, so
# each allowed key gets the same weight. Adding a scale: docs/scaling.md, "Adding a scale".
SCALES = {
    "sqrt_dk": lambda d, c: 1 / math.sqrt(d),    # Vaswani et al. 2017, sec. 3.2.1
    "none": lambda d, c: 1.0,                    # the ablation
    "dk": lambda d, c: c.attn_mult / d,          # muP (Yang et al. 2022); attn_mult from param
    "constant": lambda d, c: 1 / c.divisor,      # one divisor whatever the width
    "learned": lambda d, c: 1 / math.sqrt(d),    # a temperature per head (cf. Swin v2)
    "qk_norm": lambda d, c: 1 / math.sqrt(d),    # LN(q).LN(k) (Dehghani et al. 2023)
    "uniform": lambda d, c: 0.0,                 # the control: what selectivity buys
}
SCALINGS = tuple(SCALES)
LENGTHS = ("fixed", "log_n", "log_n_eval", "ssmax")   # scaling.length: model/length.py
POSITIONS = ("learned", "rope", "nope")   # model.pos: an embedding table, model/rope.py, none
QK_NORMS = ("layernorm", "rmsnorm")
PARAMS = ("sp", "mup")
ATTN_IMPLS = ("auto", "explicit", "sdpa")


@dataclass(frozen=True)
class ScalingConfig:
    """Which score scale `s` the attention uses (SCALES above)."""

    name: str = "sqrt_dk"
    divisor: float = 8.0  # `constant`: logits = q.k / divisor whatever d_head
    norm: str = "layernorm"  # `qk_norm`: "layernorm" | "rmsnorm"
    softcap: Optional[float] = None  # soft-cap c*tanh(logits/c), after the scale, before the mask
    # `dk`: s = attn_mult / d_head. null: 1 under param=sp (s = 1/d_head, docs/results/'s dk);
    # under param=mup sqrt(d_head at param.base_width), so that s = 1/sqrt(d_head) there, as
    # mup's 8/d_head is at d_head 64 (GPTConfig fills it in; docs/scaling.md, section 9)
    attn_mult: Optional[float] = None
    length: str = "fixed"  # the factor g(n) of the logits of a row that may attend n keys
    length_base: Optional[int] = None  # T0 of log_n, log_n_eval, ssmax; null: model.block_size

    def __post_init__(self):
        if self.length not in LENGTHS or self.length_base is not None and not (
                type(self.length_base) is int and self.length_base >= 2):
            raise ConfigError(f"scaling.length={self.length!r}, scaling.length_base="
                              f"{self.length_base!r}: choose the length from {', '.join(LENGTHS)}"
                              " and the base T0 as null (model.block_size) or an integer >= 2.")
        if self.name not in SCALINGS:
            raise ConfigError(f"scaling.name={self.name!r} is not a known score scale; choose "
                              f"one of {', '.join(SCALINGS)} (e.g. scaling=sqrt_dk on the "
                              "command line).")
        if not is_positive_number(self.divisor):
            raise ConfigError(f"scaling.divisor={self.divisor!r} must be a positive finite number "
                              "(the fixed divisor of the `constant` scale, 8.0 by default).")
        if self.norm not in QK_NORMS:
            raise ConfigError(f"scaling.norm={self.norm!r} is not a known qk normalisation; "
                              f"set scaling.norm to one of {', '.join(QK_NORMS)}.")
        if self.softcap is not None and not is_positive_number(self.softcap):
            raise ConfigError(f"scaling.softcap={self.softcap!r} must be null (no soft-cap) or "
                              "a positive finite number (Gemma 2 uses 50.0).")
        if self.attn_mult is not None and not is_positive_number(self.attn_mult):
            raise ConfigError(f"scaling.attn_mult={self.attn_mult!r} must be null (set by "
                              "param) or a positive finite number (s = attn_mult / d_head).")


@dataclass(frozen=True)
class ParamConfig:
    """How initialisation, learning rates and the read-out scale with the width d_model: `sp`
    (GPT-2's initialisation, one learning rate) or `mup` (Yang et al. 2022, Tensor Programs V;
    docs/scaling.md, section 9). With m = d_model / base_width under mup (m = 1 under sp), the
    hidden matrices start with std / sqrt(m) (model/gpt.py) and train at lr / m
    (trainer/build.py), and the logits are multiplied by output_mult / m."""

    name: str = "sp"
    base_width: int = 128  # the d_model where mup is sp: the default model's (GPTConfig.d_model)
    output_mult: float = 1.0  # logits * output_mult / m (mup's MuReadout output_mult)
    # q's projection starts at zero: every logit 0, uniform attention at step 0 (Yang et al.
    # 2022 recommend it); null: true under mup, false under sp (filled in when built)
    zero_query: Optional[bool] = None

    def __post_init__(self):
        if self.name not in PARAMS:
            raise ConfigError(f"param.name={self.name!r} is not a known parameterisation; choose "
                              f"one of {', '.join(PARAMS)} (e.g. param=mup on the command line).")
        check_positive_int("param.base_width", self.base_width)
        if not is_positive_number(self.output_mult):
            raise ConfigError(f"param.output_mult={self.output_mult!r} must be a positive finite "
                              "number (1.0 by default).")
        if self.zero_query is None:   # frozen: the one place the default is filled in
            object.__setattr__(self, "zero_query", self.name == "mup")
        elif not isinstance(self.zero_query, bool):
            raise ConfigError(f"param.zero_query={self.zero_query!r} must be null (true under "
                              "mup, false under sp), true or false.")


def check_attn_impl(attn_impl: str, scaling: ScalingConfig) -> None:
    """ConfigError unless attn_impl is known and can apply the scaling (SDPA has no soft-cap)."""
    if attn_impl not in ATTN_IMPLS:
        raise ConfigError(f"model.attn_impl={attn_impl!r} is not known; choose one of "
                          f"{', '.join(ATTN_IMPLS)}.")
    if attn_impl == "sdpa" and scaling.softcap is not None:
        raise ConfigError(f"model.attn_impl='sdpa' cannot apply scaling.softcap={scaling.softcap}: "
                          "SDPA has no soft-cap; set model.attn_impl=explicit (or auto) or "
                          "scaling.softcap=null.")


@dataclass(frozen=True)
class GPTConfig:
    """Model shape and options; field names are the `model.<field>` Hydra keys."""

    vocab_size: int
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_head: Optional[int] = None  # None -> d_model // n_head (must divide), set when built
    dropout: float = 0.0
    bias: bool = True
    attn_impl: str = "auto"  # auto | explicit | sdpa
    # Initial std of the q and k projection weights; null keeps GPT-2's 0.02. A q, k component
    # has variance d_model * std^2 at step 0, so 1/sqrt(d_model) gives the unit-variance q and k
    # that s = 1/sqrt(d_head) assumes (docs/scaling.md); 0.02 gives d_model * 0.0004.
    qk_init_std: Optional[float] = None
    pos: str = "learned"  # learned: an embedding table; rope: rotated q, k (model/rope.py); nope
    rope_base: float = 10000.0  # RoPE's theta: pair i turns by position * rope_base^(-2i/d_head)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    param: ParamConfig = field(default_factory=ParamConfig)

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            check_positive_int(f"model.{name}", getattr(self, name))
        if self.d_head is not None:
            check_positive_int("model.d_head", self.d_head)
        elif self.d_model % self.n_head != 0:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by model.n_head="
                              f"{self.n_head}; set model.d_head explicitly or change "
                              "model.n_head (or model.d_model).")
        else:   # frozen: the one place the default width is filled in
            object.__setattr__(self, "d_head", self.d_model // self.n_head)
        check_dropout("model.dropout", self.dropout)
        if self.pos not in POSITIONS or not is_positive_number(self.rope_base) or (
                self.pos == "rope" and self.d_head % 2):
            raise ConfigError(f"model.pos={self.pos!r} (model.rope_base={self.rope_base!r}, "
                              f"d_head {self.d_head}): choose one of {', '.join(POSITIONS)}; "
                              "rope needs a positive rope_base and an even d_head.")
        if not isinstance(self.scaling, ScalingConfig):
            raise ConfigError(f"model.scaling must be a ScalingConfig, got "
                              f"{type(self.scaling).__name__}; build it with "
                              "ScalingConfig(**cfg) before GPTConfig.")
        check_attn_impl(self.attn_impl, self.scaling)
        if not isinstance(self.param, ParamConfig):
            raise ConfigError(f"model.param must be a ParamConfig, got "
                              f"{type(self.param).__name__}; build it with ParamConfig(**cfg) "
                              "before GPTConfig.")
        if self.scaling.name == "dk" and self.scaling.attn_mult is None:   # filled in once
            object.__setattr__(self, "scaling",
                               replace(self.scaling, attn_mult=self.base_attn_mult()))
        if self.scaling.length != "fixed" and self.scaling.length_base is None:   # filled in once
            object.__setattr__(self, "scaling", replace(self.scaling, length_base=self.block_size))
        if self.qk_init_std is not None and not is_positive_number(self.qk_init_std):
            raise ConfigError(f"model.qk_init_std={self.qk_init_std!r} must be null (GPT-2's "
                              "0.02, the default) or a positive finite number, e.g. "
                              "1/sqrt(model.d_model) for unit-variance q and k at initialisation.")

    @classmethod
    def from_dict(cls, fields: dict) -> "GPTConfig":
        """A GPTConfig from dataclasses.asdict's form (a checkpoint's model_config), its nested
        configs rebuilt; a checkpoint from before `param` existed is sp (ParamConfig())."""
        return cls(**{**fields, "scaling": ScalingConfig(**fields["scaling"]),
                      "param": ParamConfig(**fields.get("param", {}))})

    @property
    def width_mult(self) -> float:
        """muP's m = d_model / param.base_width; 1 under param=sp."""
        return self.d_model / self.param.base_width if self.param.name == "mup" else 1.0

    def base_attn_mult(self) -> float:
        """scaling.attn_mult's default: 1 under sp; under mup sqrt of the head width at the base
        width with n_head fixed, d_head / m, so that s = attn_mult / d_head is 1/sqrt(d_head)
        there (mup writes 8 / d_head for d_head 64 at its base)."""
        return 1.0 if self.param.name == "sp" else math.sqrt(self.d_head / self.width_mult)
