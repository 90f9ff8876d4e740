"""`pad` batches (data.packing=pad): each row one piece of one document, right-padded,
with a valid mask, so attention never crosses a document. Every piece is trained once per epoch,
in an order that is a pure function of (seed, epoch), so resumed runs draw the same batches.
"""

import numpy as np
import torch

from data.batching import Batch, Batcher, BatchShape
from model.config import IGNORE_INDEX
from model.errors import DataError


class PaddedBatcher(Batcher):
    """Batcher's interface; rows are document pieces (doc_pieces) in a per-epoch permutation."""

    packing = "pad"

    def __init__(self, tokens, docs, shape: BatchShape, pad_id: int, seed: int):
        self.pad_id = pad_id
        self.pieces = doc_pieces(docs, len(tokens), shape.block_size)
        self._epoch, self._order = -1, np.arange(0)   # the cached permutation of one epoch
        super().__init__(tokens, shape, seed)

    def check(self) -> None:
        """DataError unless some document holds one padded row (2 tokens)."""
        if len(self.pieces) == 0:
            raise DataError(f"No document has the 2 tokens one padded row needs; the split "
                            f"({len(self.tokens)} tokens) is too short for packing=pad.")

    def global_rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of each of the B rows of global batch `step`."""
        B, n = self.batch_size, len(self.pieces)
        order = [self._epoch_order((step * B + i) // n)[(step * B + i) % n] for i in range(B)]
        return self.pieces[order, 0], self.pieces[order, 1]

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._epoch != epoch:
            self._epoch = epoch
            self._order = np.random.default_rng([self.seed, 1_000_003, epoch]).permutation(
                len(self.pieces))
        return self._order

    def make(self, starts: np.ndarray, lengths: np.ndarray) -> Batch:
        T = self.block_size
        rows = self.token_rows(starts, lengths, self.pad_id)                      # (b, T + 1)
        idx = torch.from_numpy(rows[:, :-1].copy())                               # (b, T)
        targets = torch.from_numpy(rows[:, 1:].copy())                            # (b, T)
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
