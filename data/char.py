"""The char tokenizer (data.tokenizer=char, the default), learned when a token cache is built: one
id per character of the corpus, learned in one streaming pass (`alphabet_of`), and applied to the
shards through a lookup table (`CharTable`) instead of the tokenizer's per-string calls. data/bpe.py
is the other tokenizer; data/tokenizer.py holds what both share.
"""

from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer, decoders, models

from data.tokenizer import SPECIALS, SPECIALS_PATTERN, unknown_chars

N_CODE_POINTS = 0x110000


def build_char(chars: Iterable[str]) -> Tokenizer:
    """The char tokenizer over `chars` (single characters), ids in code point order."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(chars)))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    return tok


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
        if "<|" in text and SPECIALS_PATTERN.search(text):   # rare: a literal <|endoftext|>
            parts = SPECIALS_PATTERN.split(text)   # text, special, text, ..., text
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
