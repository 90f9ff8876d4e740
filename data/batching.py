"""Batches from a flat token array (docs/data.md "Batching"), and what the trainer reads of its
data. Batch `step` is a pure function of (seed, step); every rank draws the same global batch
(B rows) and keeps its b = B // world_size rows."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

import numpy as np
import torch

from model.errors import DataError

# Evaluation batches are drawn with this seed, whatever trainer.seed: every run of a sweep is
# scored on the same validation text, so their losses compare.
EVAL_SEED = 0


@dataclass
class Batch:
    idx: torch.Tensor                      # (b, T) long
    targets: torch.Tensor                  # (b, T) long, IGNORE_INDEX at padding
    valid_mask: Optional[torch.Tensor]     # (b, T) bool, True = real token; None for concat

    def to(self, device: torch.device) -> tuple:
        """(idx, targets, valid_mask) on the device; on CUDA from pinned memory, not blocking."""
        pin = device.type == "cuda"
        return tuple(t if t is None else (t.pin_memory() if pin else t).to(device, non_blocking=pin)
                     for t in (self.idx, self.targets, self.valid_mask))


@dataclass(frozen=True)
class BatchShape:
    """A global batch of `batch_size` rows of `block_size` tokens, split over `world` processes."""

    batch_size: int
    block_size: int
    rank: int = 0
    world: int = 1

    def __post_init__(self):
        if self.batch_size % self.world:
            raise DataError(f"trainer.batch_size={self.batch_size} must be a multiple of the "
                            f"number of processes ({self.world}): the global batch is split "
                            "evenly.")

    @property
    def rows(self) -> slice:   # this process's rows of the global batch
        b = self.batch_size // self.world
        return slice(self.rank * b, (self.rank + 1) * b)


class Sampler(Protocol):
    """Training batches one after another; its state, a step counter and the settings that fix
    the batches, resumes them (trainer/resume.py checks the settings)."""

    def next(self) -> Batch: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, d: dict) -> None: ...


class TrainingData(Protocol):
    """What the trainer reads of its data: data/prepare.py's PreparedData, data/recall.py's
    RecallData."""

    vocab_size: int
    pad_id: int
    eot_id: int
    tokenizer_path: Optional[Path]   # copied into the run directory; None: ids are not text
    meta: dict                       # run.json's "data"
    scores_answers: bool             # targets are answers: accuracy is reported (RecallData)
    val: Optional[Sequence[int]]     # the validation tokens scored at the end; None: answers

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids) -> str: ...
    def describe(self) -> str: ...   # the data part of the run's start line
    def val_bpb(self, loss: float) -> Optional[float]: ...   # bits per byte; None: not text
    def accuracy(self, name: str, value: Optional[float]) -> dict: ...   # {name: value} or {}

    def whole_validation(self, shape: BatchShape) -> Optional[list[Batch]]:
        """The answer set the end-of-run score reads (this rank's rows); None: it reads `val`."""

    def batches(self, shape: BatchShape, n_eval: int,
                seed: int) -> tuple[dict[str, list[Batch]], Sampler]:
        """The fixed evaluation batches ("val", "train": `n_eval` each, the same at every
        evaluation and in every run of a sweep) and the training sampler drawing with `seed`."""


class Batcher:
    """`concat` batches (nanoGPT's): each row a random window of T + 1 tokens of `tokens`, across
    documents. data/padded.py's PaddedBatcher (data.packing=pad) draws and fills rows its way."""

    packing = "concat"

    def __init__(self, tokens, shape: BatchShape, seed: int):
        self.tokens, self.block_size, self.batch_size = tokens, shape.block_size, shape.batch_size
        self.seed, self.rows, self.step = seed, shape.rows, 0   # rows: this rank's of the batch
        self.check()

    def check(self) -> None:
        if len(self.tokens) < self.block_size + 1:
            raise DataError(f"The split has {len(self.tokens)} tokens, shorter than one block of "
                            f"block_size + 1 = {self.block_size + 1}; use a smaller block_size "
                            "or a larger corpus.")

    def next(self) -> Batch:
        starts, lengths = self.global_rows(self.step)
        self.step += 1
        return self.make(starts[self.rows], lengths[self.rows])

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "packing": self.packing,
                "batch_size": self.batch_size, "block_size": self.block_size,
                "n_tokens": len(self.tokens)}

    def load_state_dict(self, d: dict) -> None:
        self.step = int(d["step"])

    def global_rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of each of the B rows of global batch `step`."""
        B, T = self.batch_size, self.block_size
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(self.tokens) - T, size=B)   # windows of T + 1 tokens
        return starts, np.full(B, T + 1)

    def token_rows(self, starts: np.ndarray, lengths: np.ndarray, fill: int) -> np.ndarray:
        """(b, T + 1) int64: row r holds tokens[starts[r]:][:lengths[r]], then `fill`."""
        rows = np.full((len(starts), self.block_size + 1), fill, dtype=np.int64)
        for r, (s, n) in enumerate(zip(starts, lengths)):
            rows[r, :n] = self.tokens[s:s + n]
        return rows

    def make(self, starts: np.ndarray, lengths: np.ndarray) -> Batch:
        rows = self.token_rows(starts, lengths, 0)            # (b, T + 1), every row full
        idx = torch.from_numpy(rows[:, :-1].copy())          # (b, T)
        targets = torch.from_numpy(rows[:, 1:].copy())       # (b, T)
        return Batch(idx, targets, None)


def first_batches(sampler: Sampler, n_batches: int) -> list[Batch]:
    """The first `n_batches` of a fresh sampler: the same evaluation batches every time."""
    return [sampler.next() for _ in range(n_batches)]
