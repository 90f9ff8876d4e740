"""What several scripts share: the config `python train.py <overrides>` would compose, one
paragraph and exit code 2 for a bad override or input, and interleaved timing (bench.py and
bench_bounds.py compare cases timed in turn, so a burst of load reaches them all alike)."""

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data.config import DataConfig
from model.errors import UserError
from trainer.schema import register_configs

ROOT = Path(__file__).resolve().parent.parent   # the repository


def compose_config(overrides: list[str]) -> DictConfig:
    """The config `python train.py <overrides>` would run."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        return compose("config", overrides=overrides)


def load_config(overrides: list[str]) -> DataConfig:
    """The DataConfig `python train.py <overrides>` would use."""
    cfg = compose_config(overrides)
    return DataConfig(**OmegaConf.to_container(cfg.data, resolve=True))


def readable_errors(command) -> int:
    """Run command(); a bad override, config or input becomes one error paragraph and exit 2."""
    try:
        command()
    except (HydraException, OmegaConfBaseException, UserError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of fn takes, device work included."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def interleave(cases: dict[str, Callable[[], object]], rounds: int, per_round: int,
               device: torch.device,
               before_round: Optional[Callable[[], object]] = None) -> dict[str, list[float]]:
    """Time every case per_round times in each round, rotating the order; seconds per call.

    before_round, untimed, starts every round: a process that times itself (nanoGPT's train.py)
    then takes turns with the cases, so that a burst of load reaches it too.
    """
    names = list(cases)
    times = {name: [] for name in names}
    for r in range(rounds):
        if before_round is not None:
            before_round()
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].extend(timed(cases[name], device) for _ in range(per_round))
    return times


def median_ms(seconds: list[float]) -> float:
    return 1e3 * statistics.median(seconds)
