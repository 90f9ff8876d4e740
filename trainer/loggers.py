"""Experiment loggers: `logger=none|tensorboard|wandb` mirrors the run's records elsewhere.

metrics.jsonl and summary.json stay the record of a run; a logger is a view of them. RunDir
(trainer/run_dir.py) hands the logger every record it writes to metrics.jsonl and the summary
it writes to summary.json, on rank 0 only, so what TensorBoard or W&B shows is what the files
hold. A record becomes scalars named by `tags`: `train/loss`, `eval/val_loss`,
`attn/entropy/layer0`, `attn/entropy/layer0/head1`, `summary/final_val_loss_full`. The
resolved config is logged once per segment as hyperparameters.

The packages are optional (requirements-loggers.txt): `require` names the pip command before
anything runs when the chosen one is missing.
"""

import importlib.util
import math
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from model.errors import ConfigError, invalid

LOGGERS = ("none", "tensorboard", "wandb")
WANDB_MODES = ("offline", "online", "disabled")
# The pip requirement of each logger, as requirements-loggers.txt pins it.
PACKAGES = {"tensorboard": "tensorboard==2.21.0", "wandb": "wandb==0.31.0"}
TENSORBOARD_DIR = "tensorboard"   # event files: <run dir>/tensorboard/
WANDB_DIR = "."                   # wandb.init(dir=...) makes <run dir>/wandb/<run folder>/


@dataclass(frozen=True)
class LoggerConfig:
    """Where the records go besides metrics.jsonl (configs/logger/*.yaml)."""

    name: str = "none"                 # none | tensorboard | wandb
    project: str = "attnscale"         # wandb: the project the run is filed under
    entity: Optional[str] = None       # wandb: team or user (null: the account's default)
    # wandb: offline writes the run into the run folder with no account or network (upload it
    # later with `wandb sync`); online needs `wandb login`; disabled makes wandb a no-op.
    mode: str = "offline"

    def __post_init__(self):
        if self.name not in LOGGERS:
            raise invalid("logger.name", self.name, f"choose {' | '.join(LOGGERS)} "
                          "(or pick the option: logger=tensorboard).")
        if self.mode not in WANDB_MODES:
            raise invalid("logger.mode", self.mode, f"choose {' | '.join(WANDB_MODES)}.")
        if not (isinstance(self.project, str) and self.project.strip()):
            raise invalid("logger.project", self.project, "name a W&B project, e.g. attnscale.")


def require(cfg: LoggerConfig) -> None:
    """ConfigError naming the pip command unless the chosen logger's package is installed.
    Called before the data is prepared and before the run folder is written."""
    package = PACKAGES.get(cfg.name)
    if package and importlib.util.find_spec(package.split("==")[0]) is None:
        raise ConfigError(
            f"logger={cfg.name} needs the {package.split('==')[0]} package, which is not "
            f"installed in this Python ({package} is not part of requirements.txt). Install "
            f"it with `pip install -r requirements-loggers.txt` (both loggers) or "
            f"`pip install {package}`, or train without it: logger=none.")


def tags(record: dict, kind: Optional[str] = None) -> dict[str, float]:
    """The scalars of a metrics.jsonl record (or of the summary, kind "summary") by tag.
    Keys starting with `attn_` go under `attn/`; `attn_heads` (per layer, per head) adds its
    statistics there too. A list nests as layer<i>, a list in a list as head<j>; a dict nests
    by its keys. Missing values (None) and text are left out; booleans become 0 or 1."""
    kind = kind or record.get("kind", "record")
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("kind", "step"):
            continue
        if key == "attn_heads":
            prefix = "attn"
        elif key.startswith("attn_"):
            prefix = "attn/" + key[len("attn_"):]
        else:
            prefix = f"{kind}/{key}"
        flatten(prefix, value, 0, out)
    return out


def flatten(prefix: str, value: Any, depth: int, out: dict[str, float]) -> None:
    """Scalars of `value` under `prefix` into `out` (see `tags`); `depth` counts the lists."""
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{prefix}/{key}", item, depth, out)
    elif isinstance(value, (list, tuple)):
        level = ("layer", "head")[depth] if depth < 2 else f"index{depth}_"
        for i, item in enumerate(value):
            flatten(f"{prefix}/{level}{i}", item, depth + 1, out)
    elif isinstance(value, (bool, int, float)):
        out[prefix] = float(value)


def hyperparameters(config: dict, prefix: str = "") -> dict[str, Any]:
    """The resolved config as flat `group.key` entries of numbers, booleans or text (lists and
    null written as text): what TensorBoard's HParams tab accepts."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(hyperparameters(value, f"{prefix}{key}."))
        elif isinstance(value, (bool, int, float, str)):
            out[prefix + key] = value
        else:
            out[prefix + key] = str(value)
    return out


class NoLogger:
    """logger=none: metrics.jsonl only."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """Event files in <run dir>/tensorboard/ (`tensorboard --logdir outputs`)."""

    def __init__(self, run_dir: Path, config: dict, start_step: int):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # A resumed run drops the records past its checkpoint from metrics.jsonl and redoes
        # those steps: purge_step hides the earlier segment's events from that step on.
        self.writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR),
                                    purge_step=start_step + 1 if start_step else None)
        for summary in hparams(hyperparameters(config), {}):
            self.writer.file_writer.add_summary(summary)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A W&B run in <run dir>/wandb/. Offline by default: `wandb sync <run dir>/wandb/offline-run-*`
    uploads it. A resumed run keeps the id of its earlier segment, read from the name of the
    folder wandb wrote (`offline-run-<time>-<id>`)."""

    def __init__(self, cfg: LoggerConfig, run_dir: Path, config: dict):
        import wandb

        earlier = sorted((run_dir / "wandb").glob("*run-*-*"))
        run_id = earlier[-1].name.rsplit("-", 1)[-1] if earlier else uuid.uuid4().hex[:8]
        try:
            self.run = wandb.init(mode=cfg.mode, dir=str(run_dir / WANDB_DIR),
                                  project=cfg.project, entity=cfg.entity, config=config,
                                  id=run_id, resume="allow", **wandb_names(run_dir))
        except wandb.Error as err:   # online without an account or network, for example
            why = " ".join(str(err).split()).rstrip(".")
            raise ConfigError(f"logger=wandb could not start a run (logger.mode={cfg.mode}): "
                              f"{why}. Use logger.mode=offline to write the run without an "
                              "account or network.") from None

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def summary(self, scalars: dict[str, float]) -> None:
        self.run.summary.update(scalars)

    def close(self) -> None:
        self.run.finish()


def wandb_names(run_dir: Path) -> dict[str, str]:
    """W&B's run name is the run folder; in a sweep, the job's folder inside the sweep folder,
    and the sweep folder is the group that gathers the sweep's runs."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from trainer.launch import shown

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        sweep = Path(HydraConfig.get().sweep.dir)
        return {"name": os.path.relpath(run_dir, sweep), "group": shown(sweep)}
    return {"name": shown(run_dir)}


def open_logger(cfg: LoggerConfig, run_dir: Path, config: dict, start_step: int) -> "Mirror":
    """The logger `cfg` names, for the run in `run_dir` continuing after `start_step`, with the
    resolved `config` as its hyperparameters."""
    require(cfg)
    if cfg.name == "tensorboard":
        return Mirror(TensorBoardLogger(run_dir, config, start_step))
    if cfg.name == "wandb":
        return Mirror(WandbLogger(cfg, run_dir, config))
    return Mirror(NoLogger())


class Mirror:
    """What RunDir calls: each metrics.jsonl record and the summary, as scalars by tag."""

    def __init__(self, backend):
        self.backend, self.open = backend, True

    def record(self, record: dict) -> None:
        if self.open:
            self.backend.log(record["step"], tags(record))

    def summary(self, summary: dict) -> None:
        """The summary as scalars `summary/<field>` at the last step (and as W&B's run
        summary). Non-finite values arrive as null (summary.json has no NaN): left out."""
        if not self.open:
            return
        scalars = {k: v for k, v in tags(summary, "summary").items() if math.isfinite(v)}
        self.backend.log(summary["steps"], scalars)
        if isinstance(self.backend, WandbLogger):
            self.backend.summary({k.split("/", 1)[1]: v for k, v in scalars.items()})

    def close(self) -> None:
        if self.open:
            self.open = False
            self.backend.close()
