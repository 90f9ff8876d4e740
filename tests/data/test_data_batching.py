"""data/batching.py (concat) and data/padded.py (pad): shapes, masks, targets, determinism,
resuming, the DDP row split, and batches drawn across the token shards of data/cache.py."""

import numpy as np
import pytest
import torch

from data.batching import Batcher, BatchShape, first_batches
from data.build_cache import ShardWriter
from data.cache import ShardedTokens, shard_name
from data.padded import PaddedBatcher, doc_pieces
from model.config import IGNORE_INDEX
from model.errors import DataError

PAD, EOT = 0, 1
# Three documents of lengths 7, 3 and 12 (EOT included), ids unique per position (>= 2).
TOKENS = np.concatenate([np.arange(10, 16), [EOT], np.arange(20, 22), [EOT],
                         np.arange(30, 41), [EOT]]).astype(np.uint16)
DOCS = np.array([0, 7, 10], dtype=np.int64)


SHAPE = BatchShape(batch_size=6, block_size=4)


def batcher(packing, tokens=TOKENS, docs=DOCS, shape=SHAPE, seed=3):
    """A Batcher (concat) or PaddedBatcher (pad) of `tokens`."""
    if packing == "pad":
        return PaddedBatcher(tokens, docs, shape, PAD, seed)
    return Batcher(tokens, shape, seed)


def test_concat_windows_are_shifted_consecutive_tokens():
    b = batcher("concat").next()
    assert b.idx.shape == b.targets.shape == (6, 4) and b.idx.dtype == torch.long
    assert b.valid_mask is None
    flat = torch.from_numpy(TOKENS.astype(np.int64))
    for row_idx, row_tgt in zip(b.idx, b.targets):
        start = int(np.flatnonzero(TOKENS == row_idx[0].item())[0])
        assert torch.equal(row_idx, flat[start:start + 4])
        assert torch.equal(row_tgt, flat[start + 1:start + 5])


def test_doc_pieces_cut_every_block_and_overlap_by_one():
    assert doc_pieces(DOCS, len(TOKENS), 4).tolist() == [
        [0, 5], [4, 3], [7, 3], [10, 5], [14, 5], [18, 4]]
    assert doc_pieces([0, 1], 3, 4).tolist() == [[1, 2]]   # a 1-token document has no target


def test_pad_rows_stay_in_one_document_with_masks_and_ignored_targets():
    pieces = {start: length for start, length in doc_pieces(DOCS, len(TOKENS), 4).tolist()}
    tokens = torch.from_numpy(TOKENS.astype(np.int64))
    bt = batcher("pad", shape=BatchShape(3, 4))
    seen = []
    for _ in range(2):   # 6 pieces, 3 per batch: one epoch visits each piece once
        b = bt.next()
        assert b.valid_mask.dtype == torch.bool and b.valid_mask.shape == (3, 4)
        for idx, tgt, mask in zip(b.idx, b.targets, b.valid_mask):
            start = int(np.flatnonzero(TOKENS == idx[0].item())[0])
            L = pieces[start]                       # real tokens in the row, targets included
            n = min(L, 4)                           # real tokens in idx
            assert mask.tolist() == [True] * n + [False] * (4 - n)   # right padding
            assert torch.equal(idx[:n], tokens[start:start + n]) and (idx[n:] == PAD).all()
            assert torch.equal(tgt[:L - 1], tokens[start + 1:start + L])
            assert (tgt[L - 1:] == IGNORE_INDEX).all()
            seen.append(start)
    assert sorted(seen) == sorted(pieces)


def test_same_seed_same_batches_other_seed_other_batches():
    for packing in ("concat", "pad"):
        a, b, c = batcher(packing), batcher(packing), batcher(packing, seed=4)
        xa, xb, xc = ([x.next().idx for _ in range(5)] for x in (a, b, c))
        assert all(torch.equal(p, q) for p, q in zip(xa, xb))
        assert not all(torch.equal(p, q) for p, q in zip(xa, xc))


@pytest.mark.parametrize("packing", ["concat", "pad"])
def test_resume_replays_the_uninterrupted_run(packing):
    straight = batcher(packing)
    expected = [straight.next() for _ in range(7)]
    first = batcher(packing)
    for _ in range(3):
        first.next()
    state = first.state_dict()
    resumed = batcher(packing)
    resumed.load_state_dict(state)
    for want in expected[3:]:
        got = resumed.next()
        assert torch.equal(got.idx, want.idx) and torch.equal(got.targets, want.targets)
    assert state == {**batcher(packing, seed=9).state_dict(), "seed": 3, "step": 3}


@pytest.mark.parametrize("packing", ["concat", "pad"])
def test_ranks_split_the_global_batch(packing):
    whole = batcher(packing)
    parts = [batcher(packing, shape=BatchShape(6, 4, r, 3)) for r in range(3)]
    for _ in range(4):
        full = whole.next()
        pieces = [p.next() for p in parts]
        assert all(p.idx.shape == (2, 4) for p in pieces)
        assert torch.equal(torch.cat([p.idx for p in pieces]), full.idx)
        assert torch.equal(torch.cat([p.targets for p in pieces]), full.targets)


def test_first_batches_repeat_exactly():
    one, two = (first_batches(batcher("pad", shape=BatchShape(4, 4), seed=0), 3) for _ in range(2))
    assert len(one) == 3
    for a, b in zip(one, two):
        assert torch.equal(a.idx, b.idx) and torch.equal(a.valid_mask, b.valid_mask)


def test_bad_batching_input():
    with pytest.raises(DataError, match="22 tokens, shorter than one block"):
        batcher("concat", shape=BatchShape(6, 22))
    batcher("concat", shape=BatchShape(6, 21))   # exactly one window of 22 tokens fits
    with pytest.raises(DataError, match=r"trainer.batch_size=6 must be a multiple of the number "
                                        r"of processes \(4\)"):
        batcher("concat", shape=BatchShape(6, 4, 0, 4))
    with pytest.raises(DataError, match="No document has the 2 tokens"):
        batcher("pad", np.array([EOT], dtype=np.uint16), np.array([0]), BatchShape(1, 4), 0)


def sharded(tmp_path, tokens: np.ndarray, shard_tokens: int, pieces: int = 3) -> ShardedTokens:
    """`tokens` written through ShardWriter in `pieces` uneven writes, read back as shards."""
    writer = ShardWriter(tmp_path, "train", "uint16", shard_tokens)
    for part in np.array_split(tokens, pieces):
        writer.write(part, np.zeros(0, np.int64))
    writer.close()
    assert writer.shard_sizes == [len(a) for a in np.array_split(
        tokens, range(shard_tokens, len(tokens), shard_tokens))]
    paths = [tmp_path / shard_name("train", i) for i in range(len(writer.shard_sizes))]
    return ShardedTokens(paths, writer.shard_sizes, "uint16")


def test_sharded_tokens_slice_like_one_array(tmp_path):
    tokens = sharded(tmp_path, TOKENS, shard_tokens=5)
    assert len(tokens.shards) == 5 and len(tokens) == len(TOKENS)
    for a in range(len(TOKENS) + 1):
        for b in range(a, len(TOKENS) + 2):
            got = tokens[a:b]
            assert isinstance(got, np.ndarray) and np.array_equal(got, TOKENS[a:b]), (a, b)
    assert [tokens[i] for i in range(-3, 3)] == TOKENS[list(range(-3, 3))].tolist()
    assert np.array_equal(tokens[2:20:3], TOKENS[2:20:3]) and list(tokens) == TOKENS.tolist()
    with pytest.raises(IndexError):
        tokens[len(TOKENS)]


@pytest.mark.parametrize("packing", ["concat", "pad"])
def test_batches_across_shards_equal_batches_of_one_array(tmp_path, packing):
    """Shards of 3 tokens: nearly every window crosses a shard boundary."""
    tokens = sharded(tmp_path, TOKENS, shard_tokens=3)
    flat, split = batcher(packing), batcher(packing, tokens)
    for _ in range(5):
        a, b = flat.next(), split.next()
        assert torch.equal(a.idx, b.idx) and torch.equal(a.targets, b.targets)
