"""Character and byte-level BPE tokenizers, both built with the `tokenizers` library.

Both put the special tokens first, so every tokenizer here has pad = 0 and end-of-text = 1
(the model's `generate` pads with 0 by default).

- char: a BPE model with no merges over the set of characters in the corpus, so each character
  is one id and decoding concatenates (the Fuse decoder): an exact round trip. The character set
  comes from both splits: it is an alphabet, not a statistic learned from the training text, and
  a validation character missing from it could not be encoded at all.
- bpe: byte-level BPE (GPT-2 style pre-tokenisation, 256 byte symbols, no prefix space) trained
  on the training split only, `vocab_size` ids in total including the two special tokens.
"""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.errors import DataError

PAD = "<|pad|>"
EOT = "<|endoftext|>"
SPECIALS = [PAD, EOT]   # ids 0 and 1


def build_char(train: list[str], val: list[str]) -> Tokenizer:
    chars = sorted(set().union(*map(set, train), *map(set, val)) - set(SPECIALS))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    return tok


def build_bpe(train: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train, trainer=trainer, length=len(train))
    return tok


def build_tokenizer(kind: str, train: list[str], val: list[str], vocab_size: int) -> Tokenizer:
    tok = build_char(train, val) if kind == "char" else build_bpe(train, vocab_size)
    if tok.token_to_id(PAD) != 0 or tok.token_to_id(EOT) != 1:
        raise DataError(f"The {kind} tokenizer did not place {PAD} and {EOT} at ids 0 and 1.")
    return tok


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Encode text; for a char tokenizer, refuse characters outside its alphabet."""
    ids = tok.encode(text, add_special_tokens=False).ids
    if isinstance(tok.decoder, decoders.Fuse) and len(ids) != len(text):
        unknown = sorted({c for c in text if tok.token_to_id(c) is None})
        raise DataError(f"Characters {unknown!r} are not in the character tokenizer's "
                        "alphabet (built from the corpus); remove them from the text.")
    return ids
