"""Training and validation batches from a flat token array (docs/data.md "Batching"): `concat`
rows are random windows of T + 1 tokens across documents (nanoGPT), `pad` rows one piece of one
document each, right-padded. Batch `step` is a pure function of (seed, step), so a resumed run
draws the batches of the uninterrupted one, and every rank draws the same global batch (B rows)
and keeps its b = B // world_size rows, so the batch does not depend on the number of processes.
"""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from model.errors import DataError
from model.gpt import IGNORE_INDEX


@dataclass
class Batch:
    idx: torch.Tensor                      # (b, T) long
    targets: torch.Tensor                  # (b, T) long, IGNORE_INDEX at padding
    valid_mask: Optional[torch.Tensor]     # (b, T) bool, True = real token; None for concat


class Batcher:
    def __init__(self, tokens, docs, *, block_size: int, batch_size: int, packing: str,
                 pad_id: int, seed: int, rank: int = 0, world_size: int = 1):
        if batch_size % world_size:
            raise DataError(f"The global batch_size={batch_size} must split evenly over "
                            f"world_size={world_size} processes; choose a batch size that is a "
                            "multiple of the number of processes.")
        if packing == "concat" and len(tokens) < block_size + 1:
            raise DataError(f"The split has {len(tokens)} tokens, shorter than one block of "
                            f"block_size + 1 = {block_size + 1}; use a smaller block_size or a "
                            "larger corpus.")
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.packing, self.pad_id, self.seed = packing, pad_id, seed
        b = batch_size // world_size
        self.rows = slice(rank * b, (rank + 1) * b)   # this rank's rows of the global batch
        self.pieces = doc_pieces(docs, len(tokens), block_size) if packing == "pad" else None
        if self.pieces is not None and len(self.pieces) == 0:
            raise DataError(f"No document has the 2 tokens one padded row needs; the split "
                            f"({len(tokens)} tokens) is too short for packing=pad.")
        self.step = 0
        self._epoch, self._order = -1, np.arange(0)   # the cached permutation of one epoch

    def next(self) -> Batch:
        starts, lengths = self._global_rows(self.step)
        self.step += 1
        return self._make(starts[self.rows], lengths[self.rows])

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "packing": self.packing,
                "batch_size": self.batch_size, "block_size": self.block_size,
                "n_tokens": len(self.tokens)}

    def load_state_dict(self, d: dict) -> None:
        mine = self.state_dict()
        diff = [k for k in mine if k != "step" and d.get(k) != mine[k]]
        if diff:
            raise DataError(f"The saved sampler state differs from this run in {diff} (saved "
                            f"{ {k: d.get(k) for k in diff} }, now { {k: mine[k] for k in diff} });"
                            " resuming would not replay the same batches. Resume with the same "
                            "data, seed, batch_size and block_size.")
        self.step = int(d["step"])

    def _global_rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of each of the B rows of global batch `step`."""
        B, T = self.batch_size, self.block_size
        if self.packing == "concat":
            rng = np.random.default_rng([self.seed, step])
            starts = rng.integers(0, len(self.tokens) - T, size=B)   # windows of T + 1 tokens
            return starts, np.full(B, T + 1)
        n = len(self.pieces)
        order = [self._epoch_order((step * B + i) // n)[(step * B + i) % n] for i in range(B)]
        return self.pieces[order, 0], self.pieces[order, 1]

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._epoch != epoch:
            self._epoch = epoch
            self._order = np.random.default_rng([self.seed, 1_000_003, epoch]).permutation(
                len(self.pieces))
        return self._order

    def _make(self, starts: np.ndarray, lengths: np.ndarray) -> Batch:
        b, T = len(starts), self.block_size
        rows = np.full((b, T + 1), self.pad_id, dtype=np.int64)
        for r, (s, n) in enumerate(zip(starts, lengths)):
            rows[r, :n] = self.tokens[s:s + n]
        idx = torch.from_numpy(rows[:, :-1].copy())          # (b, T)
        targets = torch.from_numpy(rows[:, 1:].copy())       # (b, T)
        if self.packing == "concat":
            return Batch(idx, targets, None)
        real = torch.arange(T + 1)[None, :] < torch.from_numpy(lengths)[:, None]   # (b, T + 1)
        targets[~real[:, 1:]] = IGNORE_INDEX
        return Batch(idx, targets, real[:, :-1].contiguous())


def doc_pieces(docs, n_tokens: int, block_size: int) -> np.ndarray:
    """(n_pieces, 2) array of (start, length): documents cut every T tokens into pieces of up to
    T + 1 (consecutive ones overlap by one token, so each next-token pair is trained once per
    epoch). A tail of 1 token is dropped: the previous piece already has it as a target."""
    starts = np.asarray(docs, dtype=np.int64)                        # (n_docs,)
    ends = np.append(starts[1:], n_tokens)                             # (n_docs,)
    # piece j of a document starts at start + j*T while it still has a target: j*T < len - 1
    counts = np.maximum(0, -(-(ends - starts - 1) // block_size))      # ceil((len - 1) / T)
    doc = np.repeat(np.arange(len(starts)), counts)                    # (n_pieces,)
    j = np.arange(len(doc)) - np.repeat(np.cumsum(counts) - counts, counts)
    piece_start = starts[doc] + j * block_size
    length = np.minimum(block_size + 1, ends[doc] - piece_start)
    return np.stack([piece_start, length], axis=1)                     # (n_pieces, 2)


def fixed_batches(tokens, docs, *, n_batches: int, **batcher_args) -> list[Batch]:
    """The same validation batches at every evaluation: the first `n_batches` of a fresh
    Batcher (`batcher_args` are its keyword arguments)."""
    batcher = Batcher(tokens, docs, **batcher_args)
    return [batcher.next() for _ in range(n_batches)]
