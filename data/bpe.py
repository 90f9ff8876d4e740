"""Byte-level BPE (data.tokenizer=bpe): the tokenizer learns from a spread sample of the training
split, and text is encoded in exact pieces, cut only at safe cuts, so they encode to the ids of
the whole text.
"""

import array
import itertools
import math
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.documents import SAFE_CUT
from data.tokenizer import SPECIALS

BPE_PIECE_CHARS = 1 << 12    # BPE encodes and trains on exact pieces of about this size


def build_bpe(train: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on the texts `train` yields (consumed once, never stored)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train, trainer=trainer)
    return tok


def bpe_sample(source, max_bytes: int) -> Iterator[str]:
    """Every k-th exact piece of the training split, k chosen to take about `max_bytes` spread
    over the split (all of a smaller split; the first `max_bytes` of one of unknown size)."""
    size = source.size("train")
    stride = max(1, math.ceil(size / max_bytes)) if size else 1
    pieces = (p for text, _ in source.pieces("train") for p in exact_pieces(text, BPE_PIECE_CHARS))
    taken = 0
    for i, piece in enumerate(pieces):
        if i % stride == 0 and piece:
            yield piece
            taken += len(piece)
            if taken >= max_bytes:
                return


def bpe_encode_batch(tok: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """texts -> (flat ids, ids per text): their exact pieces, encoded in parallel."""
    pieces = [exact_pieces(t, BPE_PIECE_CHARS) for t in texts]
    owner = np.repeat(np.arange(len(texts)), [len(p) for p in pieces])   # (n_pieces,)
    encodings = tok.encode_batch_fast(list(itertools.chain.from_iterable(pieces)),
                                      add_special_tokens=False)
    flat = array.array("I")   # extending a C array is the cheapest way out of Python ints
    for e in encodings:
        flat.extend(e.ids)
    piece_len = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
    lengths = np.bincount(owner, weights=piece_len, minlength=len(texts)).astype(np.int64)
    return np.frombuffer(flat, dtype=np.uint32), lengths


def exact_pieces(text: str, size: int) -> list[str]:
    """`text` cut at the first safe cut after every `size` characters, never anywhere else:
    BPE encodes these pieces to exactly the ids of the whole text."""
    out, start = [], 0
    while len(text) - start > 2 * size:
        m = SAFE_CUT.search(text, start + size)
        if m is None:
            break
        out.append(text[start:m.end()])
        start = m.end()
    out.append(text[start:])
    return out
