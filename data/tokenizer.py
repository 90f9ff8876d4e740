"""Character and byte-level BPE tokenizers, built with the `tokenizers` library.

Both put the special tokens first, so every tokenizer here has pad = 0 and end-of-text = 1
(the model's `generate` pads with 0 by default). The `tokenizers` object is the reference: it is
saved as tokenizer.json, encodes prompts and decodes samples.

- char: a BPE model with no merges over the set of characters in the corpus, so each character
  is one id and decoding concatenates (the Fuse decoder): an exact round trip. The character set
  comes from both splits: it is an alphabet, not a statistic learned from the training text, and
  a validation character missing from it could not be encoded at all. Preparing the token files
  uses `CharTable`, a code point -> id lookup table that gives the same ids without any BPE
  machinery (tests/test_data_tokenizer.py holds the two equal).
- bpe: byte-level BPE (GPT-2 style pre-tokenisation, 256 byte symbols, no prefix space) trained
  on a sample of the training split (data/prepare.py `bpe_sample`), `vocab_size` ids in total
  including the two special tokens.
"""

import re
from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from model.errors import DataError

PAD = "<|pad|>"
EOT = "<|endoftext|>"
SPECIALS = [PAD, EOT]   # ids 0 and 1
N_CODE_POINTS = 0x110000
_SPECIAL = re.compile("|".join(map(re.escape, SPECIALS)))


def code_points(text: str) -> np.ndarray:
    """(len(text),) uint32 Unicode code points, without a Python loop."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def build_char_from_alphabet(chars: Iterable[str]) -> Tokenizer:
    """The char tokenizer over `chars` (single characters), ids in code point order."""
    chars = sorted(set(chars))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    return tok


def build_char(train: list[str], val: list[str]) -> Tokenizer:
    return build_char_from_alphabet(set().union(*map(set, train), *map(set, val)))


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


def build_tokenizer(kind: str, train: list[str], val: list[str], vocab_size: int) -> Tokenizer:
    tok = build_char(train, val) if kind == "char" else build_bpe(train, vocab_size)
    check_specials(tok, kind)
    return tok


def check_specials(tok: Tokenizer, kind: str) -> None:
    if tok.token_to_id(PAD) != 0 or tok.token_to_id(EOT) != 1:
        raise DataError(f"The {kind} tokenizer did not place {PAD} and {EOT} at ids 0 and 1.")


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Encode text; for a char tokenizer, refuse characters outside its alphabet."""
    ids = tok.encode(text, add_special_tokens=False).ids
    if isinstance(tok.decoder, decoders.Fuse) and len(ids) != len(text) - _special_saving(text):
        raise _unknown_chars(sorted({c for c in text if tok.token_to_id(c) is None}))
    return ids


def _special_saving(text: str) -> int:
    """Characters that special-token strings in `text` save (each becomes one id)."""
    return sum(len(m.group(0)) - 1 for m in _SPECIAL.finditer(text))


def _unknown_chars(chars: list[str]) -> DataError:
    return DataError(f"Characters {chars!r} are not in the character tokenizer's alphabet "
                     "(built from the corpus); remove them from the text.")


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
            parts, pos = [], 0
            for m in _SPECIAL.finditer(text):
                parts += [self.encode(text[pos:m.start()]),
                          np.array([self.specials[m[0]]], dtype=np.uint32)]
                pos = m.end()
            return np.concatenate(parts + [self.encode(text[pos:])]).astype(np.uint32)
        ids = self.table[code_points(text)]
        if len(ids) and ids.min() < 0:
            raise _unknown_chars(sorted({c for c in text if self.table[ord(c)] < 0}))
        return ids.view(np.uint32)


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
