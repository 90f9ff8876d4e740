"""Documents to token ids (docs/data.md "Tokenizers"): `char`, one id per character (the shards
are written through the lookup table `CharTable`), and `bpe`, byte-level BPE; pad 0, EOT 1.
Pieces of a document are cut only at *safe cuts*: after a newline between two non-space
characters (`x\\n|y`), else before a single space between two (`x| y`). GPT-2's pre-tokenizer
never joins text across one, so pieces encode to the ids of the whole document; a CUT_WINDOW
stretch without one is cut between two non-space characters (for bpe, maybe inside a word).
"""

import array
import itertools
import math
import re
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.config import DataConfig
from model.errors import DataError

PAD, EOT = "<|pad|>", "<|endoftext|>"
SPECIALS = [PAD, EOT]        # ids 0 and 1
N_CODE_POINTS = 0x110000
BPE_PIECE_CHARS = 1 << 12    # BPE encodes and trains on exact pieces of about this size
CUT_WINDOW = 1 << 16         # how far back from the end of a buffer a safe cut is looked for
SPLITS = ("train", "val")
_SPECIAL = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")
_SAFE_CUT = re.compile(r"\S\n(?=\S)|\S(?= \S)")
_NON_SPACE_PAIR = re.compile(r"\S(?=\S)")   # the fallback: no whitespace rule can match here


def build_tokenizer(cfg: DataConfig, source) -> Tokenizer:
    """The tokenizer `cfg` asks for, learned from the source's pieces in one streaming pass."""
    if cfg.tokenizer == "char":
        return build_char(alphabet_of(text for split in SPLITS for text, _ in source.pieces(split)))
    return build_bpe(bpe_sample(source, cfg.bpe_sample_mb << 20), cfg.vocab_size)


def build_char(chars: Iterable[str]) -> Tokenizer:
    """The char tokenizer over `chars` (single characters), ids in code point order."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(chars)))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    return tok


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


def alphabet_of(texts: Iterable[str], group_chars: int = 1 << 20) -> list[str]:
    """Every distinct character of `texts`, found with a boolean table over code points
    (short texts are joined into groups of about `group_chars` first)."""
    seen = np.zeros(N_CODE_POINTS, dtype=bool)
    group, size = [], 0
    for text in texts:
        group.append(text)
        size += len(text)
        if size >= group_chars:
            seen[code_points("".join(group))] = True
            group, size = [], 0
    seen[code_points("".join(group))] = True
    return [chr(c) for c in np.flatnonzero(seen)]


def code_points(text: str) -> np.ndarray:
    """(len(text),) uint32 Unicode code points, without a Python loop."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Encode text; for a char tokenizer, refuse characters outside its alphabet."""
    if isinstance(tok.decoder, decoders.Fuse):   # char (a special-token string is one id)
        unknown = {c for c in _SPECIAL.sub("", text) if tok.token_to_id(c) is None}
        if unknown:
            raise unknown_chars(unknown)
    return tok.encode(text, add_special_tokens=False).ids


def unknown_chars(chars: set[str]) -> DataError:
    return DataError(f"Characters {sorted(chars)!r} are not in the character tokenizer's "
                     "alphabet (built from the corpus); remove them from the text.")


class CharTable:
    """The char tokenizer as a lookup table: code point -> id, -1 outside the alphabet."""

    def __init__(self, tok: Tokenizer):
        self.table = np.full(N_CODE_POINTS, -1, dtype=np.int32)
        for token, i in tok.get_vocab().items():
            if token not in SPECIALS:
                self.table[ord(token)] = i
        self.specials = {s: tok.token_to_id(s) for s in SPECIALS}

    def encode(self, text: str) -> np.ndarray:
        """(n,) uint32 ids, the same as `encode(tok, text)`: special-token strings included."""
        if "<|" in text and _SPECIAL.search(text):   # rare: a literal <|endoftext|> in the text
            parts = _SPECIAL.split(text)   # text, special, text, ..., text
            return np.concatenate([self.encode(p) if i % 2 == 0 else
                                   np.array([self.specials[p]], np.uint32)
                                   for i, p in enumerate(parts)]).astype(np.uint32)
        ids = self.table[code_points(text)]
        if len(ids) and ids.min() < 0:
            raise unknown_chars({c for c in text if self.table[ord(c)] < 0})
        return ids.view(np.uint32)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """texts -> (flat ids, ids per text), one id per character."""
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        flat = self.encode("".join(texts))
        if len(flat) != lengths.sum():   # a special-token string: encode text by text
            rows = [self.encode(t) for t in texts]
            lengths = np.array([len(r) for r in rows], dtype=np.int64)
            flat = np.concatenate(rows)
        return flat, lengths


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


def safe_cut(text: str) -> int:
    """The last safe cut in `text` (see the module docstring), 0 when it has none."""
    for pattern in (_SAFE_CUT, _NON_SPACE_PAIR):
        for window in (1 << 10, CUT_WINDOW):   # most text has a cut in its last kilobyte
            last = None
            for match in pattern.finditer(text, max(0, len(text) - window)):
                last = match
            if last is not None and (pattern is _SAFE_CUT or len(text) >= CUT_WINDOW):
                return last.end()
    return len(text) if len(text) >= CUT_WINDOW else 0


def exact_pieces(text: str, size: int) -> list[str]:
    """`text` cut at the first safe cut after every `size` characters, never anywhere else:
    BPE encodes these pieces to exactly the ids of the whole text."""
    out, start = [], 0
    while len(text) - start > 2 * size:
        m = _SAFE_CUT.search(text, start + size)
        if m is None:
            break
        out.append(text[start:m.end()])
        start = m.end()
    out.append(text[start:])
    return out
