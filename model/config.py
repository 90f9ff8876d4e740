"""The model's configs, ScalingConfig, ParamConfig and GPTConfig (Hydra groups `scaling`,
`param`, `model`), and the constants data/ and trainer/ share. No torch: the report reads it."""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Optional

from model.errors import (
    ConfigError,
    check_bools,
    check_dropout,
    check_positive_int,
    is_positive_number,
    refuse,
)

IGNORE_INDEX = -100  # targets equal to this are ignored by the loss (F.cross_entropy's default)
SATURATION_THRESHOLD = 0.99  # an attention row is "saturated" when its largest weight exceeds this


class Scale(NamedTuple):
    """A score scale: its formula s(d, c, C) of the head width d, the ScalingConfig c and the
    model width C (a row is called as its formula), and the narrowest head it is defined for."""

    formula: Callable[[int, "ScalingConfig", Optional[int]], float]
    min_d_head: int = 1

    def __call__(self, d: int, c: "ScalingConfig", C: Optional[int] = None) -> float:
        return self.formula(d, c, C)


# The score scales, the one place each is defined. `learned` starts at this value and learns one
# log-scale per head; `qk_norm` is sqrt_dk after scaling.norm with a gain (over one coordinate a
# norm leaves 0 or a sign, hence its min_d_head). Adding a scale: docs/scaling.md.
SCALES = {
    "sqrt_dk": Scale(lambda d, c, C: 1 / math.sqrt(d)),   # Vaswani et al. 2017, sec. 3.2.1
    "none": Scale(lambda d, c, C: 1.0),                   # the ablation
    "dk": Scale(lambda d, c, C: c.attn_mult / d),         # muP (Yang et al. 2022); attn_mult: param
    "constant": Scale(lambda d, c, C: 1 / c.divisor),     # one divisor whatever the width
    "learned": Scale(lambda d, c, C: 1 / math.sqrt(d)),   # a temperature per head (cf. Swin v2)
    "qk_norm": Scale(lambda d, c, C: 1 / math.sqrt(d), min_d_head=2),   # Dehghani et al. 2023
    "uniform": Scale(lambda d, c, C: 0.0),                # the control: what selectivity buys
    "sqrt_dmodel": Scale(lambda d, c, C: 1 / math.sqrt(C)),   # the bug: sqrt_dk / sqrt(n_head)
}
SCALINGS = tuple(SCALES)
LENGTHS = ("fixed", "log_n", "log_n_eval", "ssmax")   # scaling.length: model/length.py
POSITIONS = ("learned", "rope", "nope")   # model.pos: an embedding table, model/rope.py, none
QK_NORMS = ("none", "layernorm", "rmsnorm")   # scaling.qk_norm; [1:]: scaling.norm
ATTN_GATES = ("none", "headwise", "elementwise")   # model.attn_gate: sigmoid(x W_g) per head
PARAMS = ("sp", "mup")
ATTN_IMPLS = ("auto", "explicit", "sdpa")


def softmax_with(z, b):   # e^z_j / (e^b + sum_k e^z_k): one more logit, b, in the denominator
    return (z - z.logsumexp(-1, keepdim=True).logaddexp(b)).exp()


# The normalisers, the one place each is defined: the weights of logits z (.., T, T), -inf where a
# key may not be attended, and b (H, 1, 1), the extra logit of softmax1 (0) and sink (learned, not
# scaled); tensor methods only. Adding a normaliser: docs/scaling.md, "Adding a normaliser".
NORMALISERS = {
    "softmax": lambda z, b: z.softmax(-1),     # Vaswani et al. 2017: rows sum to 1
    "softmax1": softmax_with,                  # Miller 2023, "off by one": b = 0
    "sink": softmax_with,                      # gpt-oss (OpenAI 2025): b learned per head
    # sigmoid(z - ln n), n the keys the row may attend (Ramapuram et al. 2024): no sum to 1
    "sigmoid": lambda z, b: (z - z.isfinite().sum(-1, keepdim=True).type_as(z).log()).sigmoid(),
}
SDPA_NORMALISERS = ("softmax", "softmax1", "sink")   # softmax1, sink: a zero key of logit b


@dataclass(frozen=True)
class ScalingConfig:
    """Which score scale `s` the attention uses (SCALES above)."""

    name: str = "sqrt_dk"
    divisor: float = 8.0  # `constant`: logits = q.k / divisor whatever d_head
    norm: str = "layernorm"  # the `qk_norm` scale's norm: "layernorm" | "rmsnorm"
    qk_norm: str = "none"  # a norm on each head's q and k before any scale: none | QK_NORMS
    qk_norm_gain: bool = True  # that norm's learnable gain (false: parameter-free)
    softcap: Optional[float] = None  # soft-cap c*tanh(logits/c), after the scale, before the mask
    # `dk`: s = attn_mult / d_head; null: set by param (GPTConfig; docs/scaling.md, section 9)
    attn_mult: Optional[float] = None
    length: str = "fixed"  # the factor g(n) of the logits of a row that may attend n keys
    length_base: Optional[int] = None  # T0 of log_n, log_n_eval, ssmax; null: model.block_size
    normaliser: str = "softmax"  # the weights of the logits (NORMALISERS above)

    def __post_init__(self):
        check_bools("scaling", self)
        legacy = ("scaling=qk_norm is sqrt_dk after scaling.norm with a gain, as its studies ran; "
                  "another norm goes with a scale: scaling=sqrt_dk scaling.qk_norm=rmsnorm")
        refuse("scaling", (
            ("name", self.name, self.name in SCALINGS,
             f"choose one of {', '.join(SCALINGS)} (e.g. scaling=sqrt_dk)."),
            ("divisor", self.divisor, is_positive_number(self.divisor),
             "use a positive finite number (the `constant` scale's divisor)."),
            ("norm", self.norm, self.norm in QK_NORMS[1:] and (
                self.name == "qk_norm" or self.norm == "layernorm"),
             f"choose one of {', '.join(QK_NORMS[1:])} (the qk_norm scale's norm); {legacy}."),
            ("qk_norm", self.qk_norm, self.qk_norm in QK_NORMS, f"choose {', '.join(QK_NORMS)}."),
            ("qk_norm/qk_norm_gain", (self.qk_norm, self.qk_norm_gain), self.name != "qk_norm" or (
                self.qk_norm, self.qk_norm_gain) == ("none", True), f"{legacy} (and "
             "scaling.qk_norm_gain=false for one without a gain)."),
            ("softcap", self.softcap, self.softcap is None or is_positive_number(self.softcap),
             "use null (no soft-cap) or a positive finite number (Gemma 2 uses 50.0)."),
            ("attn_mult", self.attn_mult, self.attn_mult is None or is_positive_number(
                self.attn_mult), "use null (set by param) or a positive finite number "
             "(s = attn_mult / d_head)."),
            ("length", self.length, self.length in LENGTHS, f"choose one of {', '.join(LENGTHS)}."),
            ("length_base", self.length_base, self.length_base is None or (
                type(self.length_base) is int and self.length_base >= 2),
             "use null (model.block_size) or an integer >= 2, the base T0."),
            ("normaliser", self.normaliser, self.normaliser in NORMALISERS,
             f"choose one of {', '.join(NORMALISERS)} (e.g. normaliser=sink).")))


@dataclass(frozen=True)
class ParamConfig:
    """How initialisation, learning rates and the read-out scale with the width: `sp` (GPT-2's)
    or `mup` (Yang et al. 2022; docs/scaling.md, section 9, and model/mup.py)."""

    name: str = "sp"
    base_width: int = 128  # the d_model where mup is sp: the default model's (GPTConfig.d_model)
    output_mult: float = 1.0  # logits * output_mult / m (mup's MuReadout output_mult)
    # q's projection starts at zero (uniform attention at step 0); null: true under mup only
    zero_query: Optional[bool] = None

    def __post_init__(self):
        check_positive_int("param.base_width", self.base_width)
        refuse("param", (
            ("name", self.name, self.name in PARAMS,
             f"choose one of {', '.join(PARAMS)} (e.g. param=mup on the command line)."),
            ("output_mult", self.output_mult, is_positive_number(self.output_mult),
             "use a positive finite number."),
            ("zero_query", self.zero_query,
             self.zero_query is None or isinstance(self.zero_query, bool),
             "use null (true under mup, false under sp), true or false.")))
        if self.zero_query is None:   # frozen: the one place the default is filled in
            object.__setattr__(self, "zero_query", self.name == "mup")


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
    # Initial std of W_q and W_k; null keeps GPT-2's 0.02. 1/sqrt(d_model) gives the
    # unit-variance q and k that s = 1/sqrt(d_head) assumes (docs/scaling.md)
    qk_init_std: Optional[float] = None
    pos: str = "learned"  # learned: an embedding table; rope: rotated q, k (model/rope.py); nope
    rope_base: float = 10000.0  # RoPE's theta: pair i turns by position * rope_base^(-2i/d_head)
    attn_gate: str = "none"  # each head's output times sigmoid(x W_g): ATTN_GATES (Qiu et al. 2025)
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
        check_bools("model", self)   # model.bias: true or false, not 1 or "no"
        if self.pos not in POSITIONS or not is_positive_number(self.rope_base) or (
                self.pos == "rope" and self.d_head % 2):
            raise ConfigError(f"model.pos={self.pos!r} (model.rope_base={self.rope_base!r}, "
                              f"d_head {self.d_head}): choose one of {', '.join(POSITIONS)}; "
                              "rope needs a positive rope_base and an even d_head.")
        for key, cls in (("scaling", ScalingConfig), ("param", ParamConfig)):
            if not isinstance(getattr(self, key), cls):
                raise ConfigError(f"model.{key} must be a {cls.__name__}, got "
                                  f"{type(getattr(self, key)).__name__}; build it first.")
        norm = self.scaling.qk_norm   # over one coordinate a norm leaves 0 or a sign
        narrowest = max(SCALES[self.scaling.name].min_d_head, 1 + (norm != "none"))
        if self.d_head < narrowest:
            raise ConfigError(f"model.d_head={self.d_head} is too narrow for scaling.name="
                              f"{self.scaling.name} with scaling.qk_norm={norm}, defined for "
                              f"d_head >= {narrowest} (model/config.py, SCALES); widen "
                              "model.d_head (or model.d_model) or choose another scale or norm.")
        refuse("model", (("attn_impl", self.attn_impl, self.attn_impl in ATTN_IMPLS,
                          f"choose one of {', '.join(ATTN_IMPLS)}."),
                         ("attn_gate", self.attn_gate, self.attn_gate in ATTN_GATES,
                          f"choose one of {', '.join(ATTN_GATES)}.")))
        if self.attn_impl == "sdpa" and self.scaling.softcap is not None:
            raise ConfigError(f"model.attn_impl='sdpa' cannot apply scaling.softcap="
                              f"{self.scaling.softcap}: SDPA has no soft-cap; set "
                              "model.attn_impl=explicit (or auto) or scaling.softcap=null.")
        if self.attn_impl == "sdpa" and self.scaling.normaliser not in SDPA_NORMALISERS:
            raise ConfigError(f"model.attn_impl='sdpa' cannot compute scaling.normaliser="
                              f"{self.scaling.normaliser}: SDPA normalises by a softmax; set "
                              "model.attn_impl=explicit (or auto) or another scaling.normaliser.")
        if self.scaling.name == "dk" and self.scaling.attn_mult is None:   # filled in once:
            # 1 under sp (s = 1/d_head); under mup sqrt(d_head / m), so that s = 1/sqrt(d_head)
            # at the base width (mup's 8 / d_head at d_head 64)
            mult = 1.0 if self.param.name == "sp" else math.sqrt(self.d_head / self.width_mult)
            object.__setattr__(self, "scaling", replace(self.scaling, attn_mult=mult))
        if self.scaling.length != "fixed" and self.scaling.length_base is None:   # filled in once
            object.__setattr__(self, "scaling", replace(self.scaling, length_base=self.block_size))
        if self.qk_init_std is not None and not is_positive_number(self.qk_init_std):
            raise ConfigError(f"model.qk_init_std={self.qk_init_std!r} must be null (GPT-2's "
                              "0.02, the default) or a positive number, e.g. 1/sqrt(d_model).")

    @property
    def width_mult(self) -> float:
        """muP's m = d_model / param.base_width; 1 under param=sp."""
        return self.d_model / self.param.base_width if self.param.name == "mup" else 1.0
