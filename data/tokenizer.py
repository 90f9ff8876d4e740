"""Documents to token ids (docs/data.md "Tokenizers"): `char`, one id per character (data/char.py
learns it and encodes the shards through a lookup table), and `bpe`, byte-level BPE
(data/bpe.py, for data.tokenizer=bpe); both are built only when a token cache is, and
saved in it as tokenizer.json. Here: what both share, pad 0, EOT 1, and `encode`.
Pieces of a document are cut only at *safe cuts*: after a newline between two non-space
characters (`x\\n|y`), else before a single space between two (`x| y`). GPT-2's pre-tokenizer
never joins text across one, so pieces encode to the ids of the whole document; a CUT_WINDOW
stretch without one is cut between two non-space characters (for bpe, maybe inside a word).
"""

import re

from tokenizers import Tokenizer, decoders

from model.errors import DataError

PAD, EOT = "<|pad|>", "<|endoftext|>"
SPECIALS = [PAD, EOT]        # ids 0 and 1
SPECIALS_PATTERN = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")
CUT_WINDOW = 1 << 16         # how far back from the end of a buffer a safe cut is looked for
SPLITS = ("train", "val")
SAFE_CUT = re.compile(r"\S\n(?=\S)|\S(?= \S)")
_NON_SPACE_PAIR = re.compile(r"\S(?=\S)")   # the fallback: no whitespace rule can match here


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
