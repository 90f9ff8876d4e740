"""Experiment loggers: `logger=tensorboard|wandb` mirrors the run's records elsewhere.

metrics.jsonl and summary.json stay the record of a run: RunDir (trainer/run_dir.py) hands the
logger every record and the summary it writes, on rank 0 only, as scalars named by `tags`
(`train/loss`, `attn/entropy/layer0/head1`,
`summary/final_val_loss_full`), and the resolved config once per segment as hyperparameters. The
packages are optional (`require`). A W&B run of a sweep's job is grouped by the sweep folder,
which wandb_run reads from Hydra's state.
"""

import importlib.util
import math
import os
import re
import uuid
from pathlib import Path
from typing import Any, Optional

from model.errors import ConfigError
from trainer.files import display_path
from trainer.schema import LoggerConfig, flat

# The pip requirement of each logger, as requirements-loggers.txt pins it.
PACKAGES = {"tensorboard": "tensorboard==2.21.0", "wandb": "wandb==0.31.0"}


def require(cfg: LoggerConfig) -> None:
    """ConfigError naming the pip command unless the chosen logger's package is installed."""
    package = PACKAGES.get(cfg.name)
    if package and importlib.util.find_spec(package.split("==")[0]) is None:
        raise ConfigError(
            f"logger={cfg.name} needs the {package.split('==')[0]} package, which is not "
            f"installed in this Python ({package} is not part of requirements.txt). Install "
            f"it with `pip install -r requirements-loggers.txt` (both loggers) or "
            f"`pip install {package}`, or train without it: logger=none.")


def tags(record: dict, kind: Optional[str] = None) -> dict[str, float]:
    """The scalars of a metrics.jsonl record (or of the summary, kind "summary") by tag: keys
    `attn_*` and `attn_heads` go under `attn/`, a list nests as layer<i>, a list in a list as
    head<j>, a dict by its keys. None and text are left out; booleans become 0 or 1."""
    kind = kind or record.get("kind", "record")
    out: dict[str, float] = {}
    for key, value in record.items():
        if key not in ("kind", "step"):
            prefix = ("attn" if key == "attn_heads" else "attn/" + key[len("attn_"):]
                      if key.startswith("attn_") else f"{kind}/{key}")
            add_scalars(prefix, value, 0, out)
    return out


def add_scalars(prefix: str, value: Any, depth: int, out: dict[str, float]) -> None:
    """Scalars of `value` under `prefix` into `out` (see `tags`); `depth` counts the lists."""
    if isinstance(value, dict):
        for key, item in value.items():
            add_scalars(f"{prefix}/{key}", item, depth, out)
    elif isinstance(value, (list, tuple)):
        level = ("layer", "head")[depth] if depth < 2 else f"index{depth}_"
        for i, item in enumerate(value):
            add_scalars(f"{prefix}/{level}{i}", item, depth + 1, out)
    elif isinstance(value, (bool, int, float)):
        out[prefix] = float(value)


def hyperparameters(config: dict) -> dict[str, Any]:
    """The resolved config as flat `group.key` entries of numbers, booleans or text (lists and
    null as text): what TensorBoard's HParams tab accepts."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v)
            for k, v in flat(config).items()}


class ExperimentLogger:
    """What RunDir calls: each record and the summary as scalars, into TensorBoard event files
    (<run dir>/tensorboard/) or a W&B run (<run dir>/wandb/; offline by default, `wandb sync`
    uploads it)."""

    def __init__(self, cfg: LoggerConfig, run_dir: Path, config: dict, start_step: int):
        require(cfg)
        self.name, self.open = cfg.name, True
        if cfg.name == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams

            # A resumed run redoes the steps past its checkpoint (dropped from metrics.jsonl):
            # purge_step hides the earlier segment's events from that step on.
            self.writer = SummaryWriter(str(run_dir / "tensorboard"),
                                        purge_step=start_step + 1 if start_step else None)
            for summary in hparams(hyperparameters(config), {}):
                self.writer.file_writer.add_summary(summary)
        elif cfg.name == "wandb":
            self.run = wandb_run(cfg, run_dir, config)

    def record(self, record: dict) -> None:
        if self.open:
            self.log(record["step"], tags(record))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        if self.name == "tensorboard":
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, step)
        elif self.name == "wandb":
            self.run.log(scalars, step=step)

    def summary(self, summary: dict) -> None:
        """The summary as scalars `summary/<field>` at the last step (and as W&B's run
        summary); non-finite values arrive as null (JSON has no NaN) and are left out."""
        if not self.open:
            return
        scalars = {k: v for k, v in tags(summary, "summary").items() if math.isfinite(v)}
        self.log(summary["steps"], scalars)
        if self.name == "wandb":
            self.run.summary.update({k.split("/", 1)[1]: v for k, v in scalars.items()})

    def close(self) -> None:
        if self.open and self.name == "tensorboard":
            self.writer.close()
        elif self.open and self.name == "wandb":
            self.run.finish()
        self.open = False


def wandb_run(cfg: LoggerConfig, run_dir: Path, config: dict):
    """A W&B run in <run dir>/wandb/, named by the run folder (in a sweep: the job's folder,
    grouped by the sweep folder). A resumed run keeps the id of its earlier segment, read from
    the name of the folder wandb wrote (`offline-run-<time>-<id>`, `-<n>` added when a segment
    started in the same second as the one before)."""
    import wandb
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    earlier = [m[1] for f in sorted((run_dir / "wandb").glob("*run-*-*"))
               if (m := re.search(r"run-\d{8}_\d{6}-([^-]+)", f.name))]
    run_id = earlier[-1] if earlier else uuid.uuid4().hex[:8]
    names = {"name": display_path(run_dir)}
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        sweep = Path(HydraConfig.get().sweep.dir)
        names = {"name": os.path.relpath(run_dir, sweep), "group": display_path(sweep)}
    try:
        return wandb.init(mode=cfg.mode, dir=str(run_dir), project=cfg.project,
                          entity=cfg.entity, config=config, id=run_id, resume="allow", **names)
    except wandb.Error as err:   # online without an account or network, for example
        why = " ".join(str(err).split()).rstrip(".")
        raise ConfigError(f"logger=wandb could not start a run (logger.mode={cfg.mode}): "
                          f"{why}. Use logger.mode=offline to write the run without an "
                          "account or network.") from None
