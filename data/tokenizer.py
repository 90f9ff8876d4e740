"""Documents to token ids (docs/data.md "Tokenizers"): `char`, one id per character (the shards
are written through the lookup table `CharTable`), and `bpe`, byte-level BPE (an option:
data/bpe.py, which data.prepare.build_tokenizer loads only for data.tokenizer=bpe); pad 0, EOT 1.
Pieces of a document are cut only at *safe cuts*: after a newline between two non-space
characters (`x\\n|y`), else before a single space between two (`x| y`). GPT-2's pre-tokenizer
never joins text across one, so pieces encode to the ids of the whole document; a CUT_WINDOW
stretch without one is cut between two non-space characters (for bpe, maybe inside a word).
"""

import re
from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer, decoders, models

from model.errors import DataError

PAD, EOT = "<|pad|>", "<|endoftext|>"
SPECIALS = [PAD, EOT]        # ids 0 and 1
N_CODE_POINTS = 0x110000
CUT_WINDOW = 1 << 16         # how far back from the end of a buffer a safe cut is looked for
SPLITS = ("train", "val")
_SPECIAL = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")
SAFE_CUT = re.compile(r"\S\n(?=\S)|\S(?= \S)")
_NON_SPACE_PAIR = re.compile(r"\S(?=\S)")   # the fallback: no whitespace rule can match here


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


def safe_cut(text: str) -> int:
    """The last safe cut in `text` (see the module docstring), 0 when it has none."""
    for pattern in (SAFE_CUT, _NON_SPACE_PAIR):
        for window in (1 << 10, CUT_WINDOW):   # most text has a cut in its last kilobyte
            last = None
            for match in pattern.finditer(text, max(0, len(text) - window)):
                last = match
            if last is not None and (pattern is SAFE_CUT or len(text) >= CUT_WINDOW):
                return last.end()
    return len(text) if len(text) >= CUT_WINDOW else 0
