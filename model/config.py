"""The model's configs: ScalingConfig (Hydra group `scaling`) and GPTConfig (group `model`),
frozen dataclasses that validate themselves when built, and the constants other layers share.
This file imports no torch, so the report (scripts/report/) reads the scale names without it.
"""

from dataclasses import dataclass, field
from typing import Optional

from model.errors import ConfigError, check_dropout, check_positive_int, is_positive_number

IGNORE_INDEX = -100  # targets equal to this are ignored by the loss (F.cross_entropy's default)
SATURATION_THRESHOLD = 0.99  # an attention row is "saturated" when its largest weight exceeds this

SCALINGS = ("sqrt_dk", "none", "dk", "constant", "learned", "qk_norm", "uniform")
QK_NORMS = ("layernorm", "rmsnorm")
ATTN_IMPLS = ("auto", "explicit", "sdpa")


@dataclass(frozen=True)
class ScalingConfig:
    """Which score scale `s` the attention uses (the table in the module docstring)."""

    name: str = "sqrt_dk"
    divisor: float = 8.0  # `constant`: logits = q.k / divisor whatever d_head
    norm: str = "layernorm"  # `qk_norm`: "layernorm" | "rmsnorm"
    softcap: Optional[float] = None  # soft-cap c*tanh(logits/c), after the scale, before the mask

    def __post_init__(self):
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
    scaling: ScalingConfig = field(default_factory=ScalingConfig)

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
        if not isinstance(self.scaling, ScalingConfig):
            raise ConfigError(f"model.scaling must be a ScalingConfig, got "
                              f"{type(self.scaling).__name__}; build it with "
                              "ScalingConfig(**cfg) before GPTConfig.")
        check_attn_impl(self.attn_impl, self.scaling)
        if self.qk_init_std is not None and not is_positive_number(self.qk_init_std):
            raise ConfigError(f"model.qk_init_std={self.qk_init_std!r} must be null (GPT-2's "
                              "0.02, the default) or a positive finite number, e.g. "
                              "1/sqrt(model.d_model) for unit-variance q and k at initialisation.")
