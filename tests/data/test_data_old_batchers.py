"""The batching split is behaviour-preserving: data/batching.py's Batcher (concat),
data/padded.py's PaddedBatcher (pad), data/recall.py's RecallBatcher and validation_batches, and
the TrainingData.batches of PreparedData and RecallData draw exactly the rows, targets, masks and
sampler states of the code before the restructure. Its classes are copied below as reference
implementations (Batcher and doc_pieces of data/batching.py, RecallBatcher and
validation_batches of data/recall.py, make_batches of trainer/build.py, all as of commit
04f9306), so a checkpoint written before the split resumes the same batches after it."""

from typing import Optional

import numpy as np
import pytest
import torch

from data.batching import Batch, Batcher, BatchShape, first_batches
from data.config import DataConfig
from data.padded import PaddedBatcher
from data.prepare import PreparedData
from data.recall import (
    EVAL_TRAIN_STREAM,
    TRAIN_STREAM,
    RecallBatcher,
    RecallData,
    generate,
    validation_batches,
    validation_set,
)
from model.config import IGNORE_INDEX
from model.errors import DataError

# ---------------------------------------------------------------- the old code, verbatim
# (only the IGNORE_INDEX import, the class names and the recall config's annotations differ)


class OldBatcher:
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
        self.pieces = old_doc_pieces(docs, len(tokens), block_size) if packing == "pad" else None
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


def old_doc_pieces(docs, n_tokens: int, block_size: int) -> np.ndarray:
    starts = np.asarray(docs, dtype=np.int64)                        # (n_docs,)
    ends = np.append(starts[1:], n_tokens)                             # (n_docs,)
    counts = np.maximum(0, -(-(ends - starts - 1) // block_size))      # ceil((len - 1) / T)
    doc = np.repeat(np.arange(len(starts)), counts)                    # (n_pieces,)
    j = np.arange(len(doc)) - np.repeat(np.cumsum(counts) - counts, counts)
    piece_start = starts[doc] + j * block_size
    length = np.minimum(block_size + 1, ends[doc] - piece_start)
    return np.stack([piece_start, length], axis=1)                     # (n_pieces, 2)


def old_fixed_batches(tokens, docs, *, n_batches: int, **batcher_args) -> list[Batch]:
    batcher = OldBatcher(tokens, docs, **batcher_args)
    return [batcher.next() for _ in range(n_batches)]


class OldRecallBatcher:
    def __init__(self, cfg: DataConfig, *, batch_size: int, rank: int = 0,
                 world_size: int = 1, stream: int = TRAIN_STREAM):
        self.cfg, self.batch_size, self.stream, self.step = cfg, batch_size, stream, 0
        b = batch_size // world_size
        self.rows = slice(rank * b, (rank + 1) * b)   # this rank's rows of the global batch

    def next(self) -> Batch:
        rng = np.random.default_rng([self.cfg.seed, self.stream, self.step])
        self.step += 1
        inputs, targets = generate(self.cfg, rng, self.batch_size)
        return Batch(torch.from_numpy(inputs[self.rows]), torch.from_numpy(targets[self.rows]),
                     None)

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.cfg.seed, "task": self.cfg.task,
                "batch_size": self.batch_size, "seq_len": self.cfg.seq_len}


def old_validation_batches(cfg: DataConfig, *, batch_size: int, rank: int = 0,
                           world_size: int = 1, limit: Optional[int] = None) -> list[Batch]:
    inputs, targets = validation_set(cfg)
    b = batch_size // world_size
    rows = [(s + rank * b, min(s + (rank + 1) * b, len(inputs)))
            for s in range(0, len(inputs), batch_size)[:limit]]
    return [Batch(torch.from_numpy(inputs[lo:hi].copy()), torch.from_numpy(targets[lo:hi].copy()),
                  None) for lo, hi in rows if lo < hi]


def old_make_batches(data, data_cfg: DataConfig, eval_iters: int, seed: int, batch_size: int,
                     block_size: int, rank: int, world: int):
    """trainer/build.py's make_batches (EVAL_SEED was 0), its TrainerConfig fields unpacked."""
    if data_cfg.source == "recall":
        kw = dict(batch_size=batch_size, rank=rank, world_size=world)
        train_sample = OldRecallBatcher(data_cfg, stream=EVAL_TRAIN_STREAM, **kw)
        return ({"val": old_validation_batches(data_cfg, limit=eval_iters, **kw),
                 "train": [train_sample.next() for _ in range(eval_iters)]},
                OldRecallBatcher(data_cfg, **kw))
    kw = dict(block_size=block_size, batch_size=batch_size, packing=data_cfg.packing,
              pad_id=data.pad_id, rank=rank, world_size=world)
    return ({split: old_fixed_batches(getattr(data, split), getattr(data, f"{split}_docs"),
                                      n_batches=eval_iters, seed=0, **kw)
             for split in ("val", "train")},
            OldBatcher(data.train, data.train_docs, seed=seed, **kw))


# ---------------------------------------------------------------- comparisons

PAD, EOT = 0, 1


def corpus(seed: int, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents of 1 to 40 tokens (EOT included: 1-token ones have no target), ids >= 2."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 41, size=n_docs)
    docs = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    tokens = rng.integers(2, 500, size=int(lengths.sum())).astype(np.uint16)
    tokens[np.cumsum(lengths) - 1] = EOT
    return tokens, docs


def assert_same(new: Batch, old: Batch) -> None:
    assert torch.equal(new.idx, old.idx) and new.idx.dtype == old.idx.dtype == torch.long
    assert torch.equal(new.targets, old.targets) and new.targets.dtype == old.targets.dtype
    if old.valid_mask is None:
        assert new.valid_mask is None
    else:
        assert torch.equal(new.valid_mask, old.valid_mask)


def new_batcher(packing: str, tokens, docs, shape: BatchShape, seed: int) -> Batcher:
    if packing == "pad":
        return PaddedBatcher(tokens, docs, shape, PAD, seed)
    return Batcher(tokens, shape, seed)


# World sizes 1-4 of global batches of 12 and 8 rows, blocks of 4 and 16 tokens.
LAYOUTS = [(B, T, world) for B, T in ((12, 4), (8, 16)) for world in (1, 2, 3, 4)
           if B % world == 0]


@pytest.mark.parametrize("packing", ["concat", "pad"])
@pytest.mark.parametrize("B, T, world", LAYOUTS)
def test_batchers_draw_the_rows_of_the_old_batcher(packing, B, T, world):
    tokens, docs = corpus(seed=B + T, n_docs=40)
    steps = 3 * len(old_doc_pieces(docs, len(tokens), T)) // B + 2   # pad: three epochs and more
    for seed in (0, 5):
        for rank in range(world):
            old = OldBatcher(tokens, docs, block_size=T, batch_size=B, packing=packing,
                             pad_id=PAD, seed=seed, rank=rank, world_size=world)
            new = new_batcher(packing, tokens, docs, BatchShape(B, T, rank, world), seed)
            for _ in range(steps):
                assert_same(new.next(), old.next())
                assert new.state_dict() == old.state_dict()


@pytest.mark.parametrize("packing", ["concat", "pad"])
def test_an_old_sampler_state_resumes_the_old_batches(packing):
    """A checkpoint written before the split (its sampler state) resumes the old stream."""
    tokens, docs = corpus(seed=1, n_docs=30)
    old = OldBatcher(tokens, docs, block_size=8, batch_size=6, packing=packing, pad_id=PAD,
                     seed=3, rank=1, world_size=2)
    for _ in range(11):
        old.next()
    new = new_batcher(packing, tokens, docs, BatchShape(6, 8, 1, 2), 3)
    new.load_state_dict(old.state_dict())
    for _ in range(9):
        assert_same(new.next(), old.next())


def test_doc_pieces_are_the_old_ones():
    for seed in range(4):
        tokens, docs = corpus(seed, n_docs=25)
        for T in (1, 3, 4, 16, 64):
            assert np.array_equal(PaddedBatcher(tokens, docs, BatchShape(2, T), PAD, 0).pieces,
                                  old_doc_pieces(docs, len(tokens), T))


@pytest.mark.parametrize("packing", ["concat", "pad"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_prepared_data_batches_are_old_make_batches(packing, world):
    train, train_docs = corpus(seed=2, n_docs=50)
    val, val_docs = corpus(seed=3, n_docs=12)
    data = PreparedData(tokenizer=None, tokenizer_path=None, train=train, val=val,
                        train_docs=train_docs, val_docs=val_docs, meta={}, vocab_size=500,
                        pad_id=PAD, eot_id=EOT, packing=packing)
    cfg = DataConfig(packing=packing)
    for rank in range(world):
        fixed, sampler = data.batches(BatchShape(8, 8, rank, world), n_eval=3, seed=11)
        old_fixed, old_sampler = old_make_batches(data, cfg, eval_iters=3, seed=11,
                                                  batch_size=8, block_size=8, rank=rank,
                                                  world=world)
        assert list(fixed) == list(old_fixed) == ["val", "train"]
        for split in fixed:
            assert len(fixed[split]) == len(old_fixed[split]) == 3
            for a, b in zip(fixed[split], old_fixed[split]):
                assert_same(a, b)
        for _ in range(12):
            assert_same(sampler.next(), old_sampler.next())
        assert sampler.state_dict() == old_sampler.state_dict()


def recall_cfg(**kw) -> DataConfig:
    return DataConfig(source="recall", name="recall", document="sequence", **kw)


@pytest.mark.parametrize("task", ["copy", "mqar"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_recall_batchers_draw_the_old_sequences(task, world):
    cfg = recall_cfg(task=task, seed=4)
    for stream in (TRAIN_STREAM, EVAL_TRAIN_STREAM):
        for rank in range(world):
            old = OldRecallBatcher(cfg, batch_size=8, rank=rank, world_size=world, stream=stream)
            new = RecallBatcher(cfg, BatchShape(8, cfg.seq_len, rank, world), stream)
            for _ in range(4):
                assert_same(new.next(), old.next())
                assert new.state_dict() == old.state_dict()


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_recall_validation_batches_are_the_old_rows(world):
    """130 sequences in global batches of 12: a short last batch, some ranks without rows."""
    cfg = recall_cfg(val_sequences=130, seq_len=40, copy_len=8)
    for rank in range(world):
        shape = BatchShape(12, cfg.seq_len, rank, world)
        for limit in (None, 1, 2, 11, 12):
            new = validation_batches(cfg, shape, limit=limit)
            old = old_validation_batches(cfg, batch_size=12, rank=rank, world_size=world,
                                         limit=limit)
            assert len(new) == len(old) > 0
            for a, b in zip(new, old):
                assert_same(a, b)
        whole = RecallData(cfg).whole_validation(shape)   # the end-of-run score's batches
        old = old_validation_batches(cfg, batch_size=12, rank=rank, world_size=world)
        assert len(whole) == len(old)
        for a, b in zip(whole, old):
            assert_same(a, b)


@pytest.mark.parametrize("task", ["copy", "mqar"])
def test_recall_data_batches_are_old_make_batches(task):
    cfg = recall_cfg(task=task, val_sequences=50, seed=2)
    for world in (1, 2):
        for rank in range(world):
            fixed, sampler = RecallData(cfg).batches(BatchShape(16, cfg.seq_len, rank, world),
                                                      n_eval=4, seed=123)
            old_fixed, old_sampler = old_make_batches(None, cfg, eval_iters=4, seed=123,
                                                      batch_size=16, block_size=cfg.seq_len,
                                                      rank=rank, world=world)
            assert list(fixed) == list(old_fixed)
            for split in fixed:
                assert len(fixed[split]) == len(old_fixed[split]) > 0
                for a, b in zip(fixed[split], old_fixed[split]):
                    assert_same(a, b)
            for _ in range(3):
                assert_same(sampler.next(), old_sampler.next())
            assert sampler.state_dict() == old_sampler.state_dict()


def test_first_batches_are_the_old_fixed_batches():
    tokens, docs = corpus(seed=9, n_docs=20)
    for packing in ("concat", "pad"):
        new = first_batches(new_batcher(packing, tokens, docs, BatchShape(4, 4), 0), 5)
        old = old_fixed_batches(tokens, docs, n_batches=5, block_size=4, batch_size=4,
                                packing=packing, pad_id=PAD, seed=0)
        for a, b in zip(new, old, strict=True):
            assert_same(a, b)
