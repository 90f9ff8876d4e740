"""What the char and bpe tokenizers share (docs/data.md "Tokenizers"): the special tokens, pad 0
and end-of-text 1, and `encode`. data/char.py and data/bpe.py build them with a token cache."""

import re

from tokenizers import Tokenizer, decoders

from model.errors import DataError

PAD, EOT = "<|pad|>", "<|endoftext|>"
SPECIALS = [PAD, EOT]        # ids 0 and 1
SPECIALS_PATTERN = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Encode text; for a char tokenizer, refuse characters outside its alphabet."""
    if isinstance(tok.decoder, decoders.Fuse):   # char (a special-token string is one id)
        unknown = {c for c in SPECIALS_PATTERN.sub("", text) if tok.token_to_id(c) is None}
        if unknown:
            raise unknown_chars(unknown)
    return tok.encode(text, add_special_tokens=False).ids


def unknown_chars(chars: set[str]) -> DataError:
    return DataError(f"Characters {sorted(chars)!r} are not in the character tokenizer's "
                     "alphabet (built from the corpus); remove them from the text.")

