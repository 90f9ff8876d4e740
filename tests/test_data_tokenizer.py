"""data/tokenizer.py: exact round trips, special-token ids, BPE trained on train only."""

import pytest

from data.tokenizer import EOT, PAD, build_tokenizer, encode
from model.errors import DataError

TRAIN = ["To be, or not to be: that is the question.\n", "Whether 'tis nobler in the mind\n"
         "to suffer the slings and arrows of outrageous fortune.\n",
         "  two  spaces\n\n\tand a tab\n"] * 20
VAL = ["Or to take arms against a sea of troubles; \u00e9t\u00e9 \u2014 fin.\n"]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_round_trip_and_specials(kind):
    tok = build_tokenizer(kind, TRAIN, VAL, vocab_size=300)
    assert (tok.token_to_id(PAD), tok.token_to_id(EOT)) == (0, 1)
    for text in TRAIN[:3] + VAL:
        ids = encode(tok, text)
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_char_is_one_id_per_character():
    tok = build_tokenizer("char", TRAIN, VAL, vocab_size=0)
    alphabet = set("".join(TRAIN + VAL))
    assert tok.get_vocab_size() == len(alphabet) + 2
    text = VAL[0]
    ids = encode(tok, text)
    assert len(ids) == len(text)
    assert [tok.id_to_token(i) for i in ids] == list(text)
    with pytest.raises(DataError, match="not in the character tokenizer"):
        encode(tok, "Z\u4e2d")   # neither character occurs in the corpus


def test_bpe_is_byte_level_vocab_size_and_trained_on_train_only():
    tok = build_tokenizer("bpe", TRAIN, ["zebrazebrazebra " * 50], vocab_size=300)
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
    from data.tokenizer import CharTable, alphabet_of, build_char_from_alphabet
    texts = TRAIN + VAL + ["emoji \U0001f600\U0001f680 and \u4e2d\u6587\n",
                           "a literal <|endoftext|> and <|pad|>, <| not special |>\n"]
    tok = build_char_from_alphabet(alphabet_of(iter(texts), group_chars=50))
    assert tok.get_vocab_size() == len(set("".join(texts))) + 2
    table = CharTable(tok)
    for text in texts + ["".join(texts), "<|endoftext|>", "a<|pad|><|endoftext|>b"]:
        assert table.encode(text).tolist() == encode(tok, text), text
    assert table.encode("<|endoftext|>").tolist() == [1]
    with pytest.raises(DataError, match=r"\['Z'\] are not in the character tokenizer"):
        table.encode("aZ")


def test_char_alphabet_is_every_character_once():
    from data.tokenizer import alphabet_of, build_char
    texts = ["ba\n", "\u00e9a", "\U0001f600"]
    assert alphabet_of(iter(texts), group_chars=2) == sorted(set("".join(texts)))
    tok = build_char(texts, [])
    assert [tok.id_to_token(i) for i in range(2, 7)] == sorted(set("".join(texts)))
