"""data/tokenizer.py, data/char.py: exact round trips, special-token ids, BPE trained on train
only."""

import pytest

from data.build_cache import build_tokenizer
from data.config import DataConfig
from data.tokenizer import EOT, PAD, encode
from model.errors import DataError

TRAIN = ["To be, or not to be: that is the question.\n", "Whether 'tis nobler in the mind\n"
         "to suffer the slings and arrows of outrageous fortune.\n",
         "  two  spaces\n\n\tand a tab\n"] * 20
VAL = ["Or to take arms against a sea of troubles; \u00e9t\u00e9 \u2014 fin.\n"]


class ListSource:
    """A source over in-memory documents, one piece each, as data/sources.py's sources stream."""

    def __init__(self, train: list[str], val: list[str]):
        self.splits = {"train": train, "val": val}

    def pieces(self, split: str):
        return ((doc, True) for doc in self.splits[split])

    def size(self, split: str) -> int:
        return sum(len(d.encode("utf-8")) for d in self.splits[split])


def tokenizer(kind: str, train: list[str], val: list[str], vocab_size: int = 300):
    """The tokenizer prepare() builds for these documents."""
    return build_tokenizer(DataConfig(tokenizer=kind, vocab_size=vocab_size),
                           ListSource(train, val))


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_round_trip_and_specials(kind):
    tok = tokenizer(kind, TRAIN, VAL)
    assert (tok.token_to_id(PAD), tok.token_to_id(EOT)) == (0, 1)
    for text in TRAIN[:3] + VAL:
        ids = encode(tok, text)
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_char_is_one_id_per_character():
    tok = tokenizer("char", TRAIN, VAL)
    alphabet = set("".join(TRAIN + VAL))
    assert tok.get_vocab_size() == len(alphabet) + 2
    text = VAL[0]
    ids = encode(tok, text)
    assert len(ids) == len(text)
    assert [tok.id_to_token(i) for i in ids] == list(text)
    with pytest.raises(DataError, match="not in the character tokenizer"):
        encode(tok, "Z\u4e2d")   # neither character occurs in the corpus


def test_bpe_is_byte_level_vocab_size_and_trained_on_train_only():
    tok = tokenizer("bpe", TRAIN, ["zebrazebrazebra " * 50])
    assert tok.get_vocab_size() == 300
    # a word only in validation is never merged into one token, a frequent train word is
    assert len(encode(tok, "zebra")) > 1
    assert len(encode(tok, " the")) == 1
    # unseen characters still round-trip through their bytes
    text = "\u4e2d\u6587 \U0001f600"
    assert tok.decode(encode(tok, text), skip_special_tokens=False) == text


def test_char_table_gives_the_tokenizer_objects_ids():
    """The lookup table that writes the token files and the saved `tokenizers` object agree,
    also on astral characters and on literal special-token strings in the text."""
    from data.char import CharTable, alphabet_of, build_char
    texts = TRAIN + VAL + ["emoji \U0001f600\U0001f680 and \u4e2d\u6587\n",
                           "a literal <|endoftext|> and <|pad|>, <| not special |>\n"]
    tok = build_char(alphabet_of(iter(texts), group_chars=50))
    assert tok.get_vocab_size() == len(set("".join(texts))) + 2
    table = CharTable(tok)
    for text in texts + ["".join(texts), "<|endoftext|>", "a<|pad|><|endoftext|>b"]:
        assert table.encode(text).tolist() == encode(tok, text), text
    assert table.encode("<|endoftext|>").tolist() == [1]
    with pytest.raises(DataError, match=r"\['Z'\] are not in the character tokenizer"):
        table.encode("aZ")


def test_char_alphabet_is_every_character_once():
    from data.char import alphabet_of
    texts = ["ba\n", "\u00e9a", "\U0001f600"]
    assert alphabet_of(iter(texts), group_chars=2) == sorted(set("".join(texts)))
    tok = tokenizer("char", texts, [])
    assert [tok.id_to_token(i) for i in range(2, 7)] == sorted(set("".join(texts)))
