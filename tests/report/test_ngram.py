"""scripts/report/ngram.py and scripts/baselines.py: the add-k n-gram reference levels against
counts written out by hand, k chosen on train's held-out tail (not on validation), chunked
counting equal to one chunk, the baselines.json cache, and bigram < unigram on real English
(conftest's `english`)."""

import json
import math
import random
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from scripts import baselines
from scripts.prepare_data import load_config
from scripts.report import ngram

EOT, V = 1, 4  # ids: 0 pad, 1 EOT, 2 "a", 3 "b"
TRAIN = [2, 3, 2, 2, 3, 1, 2, 3, 2, 3]
VAL = [2, 3, 3, 1]


def fake_data(train, val, bytes_per_token=2.0, vocab=V):
    """What ngram.compute reads of a PreparedData."""
    return SimpleNamespace(vocab_size=vocab, eot_id=EOT, train=np.array(train, np.uint16),
                           val=np.array(val, np.uint16),
                           meta={"bytes_per_token": {"val": bytes_per_token}})


def test_three_levels_by_hand():
    """k = 0.5 (a one-value grid), V = 4; every split is preceded by EOT EOT.
    Unigram counts of TRAIN: a 5, b 4, EOT 1 (N 10).
    Bigram counts (EOT before the first token): EOT a 2, a b 4, b a 2, a a 1, b EOT 1.
    Trigram counts: EOT EOT a 1, EOT a b 2, a b a 2, b a a 1, a a b 1, a b EOT 1, b EOT a 1,
    b a b 1. VAL = a b b EOT is scored token by token."""
    k = 0.5
    result = ngram.compute(fake_data(TRAIN, VAL), ngram.Settings(k_grid=(k,)))
    unigram = -(math.log(5.5 / 12) + 2 * math.log(4.5 / 12) + math.log(1.5 / 12)) / 4
    # P(a | EOT) = 2.5/4, P(b | a) = 4.5/7, P(b | b) = 0.5/5, P(EOT | b) = 1.5/5
    bigram = -(math.log(2.5 / 4) + math.log(4.5 / 7) + math.log(0.5 / 5) + math.log(1.5 / 5)) / 4
    # P(a | EOT EOT) = 1.5/3, P(b | EOT a) = 2.5/4, P(b | a b) = 0.5/5, P(EOT | b b) = 0.5/2
    trigram = -(math.log(1.5 / 3) + math.log(2.5 / 4) + math.log(0.5 / 5)
                + math.log(0.5 / 2)) / 4
    expected = {"unigram": unigram, "bigram": bigram, "trigram": trigram}
    assert result["nats_per_token"] == pytest.approx(expected, rel=1e-12)
    assert result["bits_per_byte"] == pytest.approx(
        {name: v / math.log(2) / 2.0 for name, v in expected.items()}, rel=1e-12)
    assert result["distinct"] == {"unigram": 3, "bigram": 5, "trigram": 8}
    assert result["k"] == {"unigram": k, "bigram": k, "trigram": k}


def unigram_loss(fit, scored, k):
    """Mean -ln P of `scored` under add-k unigram counts of `fit`, by Counter."""
    counts = Counter(fit)
    return -sum(math.log((counts[t] + k) / (len(fit) + k * V)) for t in scored) / len(scored)


def test_k_is_chosen_on_the_held_out_tail_of_train():
    """The head of train has only a and b; its tail (the last 10%) and validation differ:
    the tail holds EOTs, which the head never saw (a large k pays), while validation is like
    the head (a small k pays). The chosen k is the tail's, not validation's."""
    train = [2, 3] * 45 + [1] * 10  # 100 tokens, the last 10 held out
    val = [2, 3] * 20
    grid = ngram.K_GRID
    result = ngram.compute(fake_data(train, val))
    on_tail = min(grid, key=lambda k: unigram_loss(train[:90], train[90:], k))
    on_val = min(grid, key=lambda k: unigram_loss(train, val, k))
    assert on_tail != on_val
    assert result["k"]["unigram"] == on_tail
    assert result["held_out_tokens"] == 10
    assert result["nats_per_token"]["unigram"] == pytest.approx(
        unigram_loss(train, val, on_tail), rel=1e-12)


def test_bigram_beats_unigram_on_real_english_and_chunks_change_nothing(english):
    data = ngram.prepare(english, progress=False)
    whole = ngram.compute(data, chunk=1 << 20)
    assert len(data.train) < 1 << 20  # one chunk
    assert whole["nats_per_token"]["bigram"] < whole["nats_per_token"]["unigram"] - 0.3
    for chunk in (1, 7, 100):
        chunked = ngram.compute(data, chunk=chunk)
        assert chunked["nats_per_token"] == pytest.approx(whole["nats_per_token"], rel=1e-12)
        assert chunked["k"] == whole["k"] and chunked["distinct"] == whole["distinct"]


def test_cache_hit_and_reference_levels_of_a_run_dir(english, tmp_path, monkeypatch, capsys):
    overrides = ["data=text", f"data.train_files={list(english.train_files)}".replace("'", ""),
                 f"data.val_files={list(english.val_files)}".replace("'", ""),
                 f"data.cache_dir={english.cache_dir}"]
    assert baselines.main(overrides) == 0
    first = capsys.readouterr().out
    assert first.startswith("computed: ") and "unigram" in first
    data = ngram.prepare(english, progress=False)
    stored = json.loads((data.folder / ngram.FILE).read_text())

    def no_compute(*args, **kwargs):
        raise AssertionError("recomputed although baselines.json is cached")
    monkeypatch.setattr(ngram, "compute", no_compute)
    assert baselines.main(overrides) == 0
    assert capsys.readouterr().out.startswith("cached: ")
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(
        "data:\n" + "".join(f"  {key}: {json.dumps(value)}\n"
                            for key, value in vars(english).items()))
    for source in (run_dir, english):
        assert ngram.reference_levels(source) == stored["nats_per_token"]
    # other settings (a cap) make the cached file stale: computed again
    monkeypatch.undo()
    assert baselines.main([*overrides, "--max-train-tokens", "500"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("computed: ") and "capped: only the first 500 of" in out
    # the report takes the cached file whatever its settings: the capped levels, not recomputed
    capped = json.loads((data.folder / ngram.FILE).read_text())["nats_per_token"]
    assert capped != stored["nats_per_token"]
    monkeypatch.setattr(ngram, "compute", no_compute)
    assert ngram.reference_levels(english) == capped


def counter_levels(fit, scored, eot, V, ks, before=None):
    """Mean -ln P per order of `scored` (after the 2 tokens `before`, EOT EOT by default) under
    add-k counts of `fit` preceded by EOT EOT, by Counter: count(ctx) = the n-grams of `fit`
    that start with ctx."""
    s = [eot, eot, *map(int, fit)]
    t = [*map(int, [eot, eot] if before is None else before), *map(int, scored)]
    levels = {}
    for n, name in ngram.ORDERS.items():
        grams = Counter(tuple(s[i - n + 1:i + 1]) for i in range(2, len(s)))
        contexts = Counter()
        for gram, c in grams.items():
            contexts[gram[:-1]] += c
        nll = [math.log(contexts[tuple(t[i - n + 1:i])] + ks[name] * V)
               - math.log(grams[tuple(t[i - n + 1:i + 1])] + ks[name]) for i in range(2, len(t))]
        levels[name] = sum(nll) / len(nll)
    return levels


WORDS = "the cat dog sat ran on mat rug and big red old".split()
AFTER = {w: random.Random(w).sample(WORDS, 2) for w in WORDS}   # 2 possible successors each


def markov_text(seed: int, words: int) -> str:
    """A walk of `words` words over AFTER, 12 to a line."""
    rng, out = random.Random(seed), ["the"]
    for i in range(words - 1):
        out.append(("\n" if i % 12 == 11 else " ") + rng.choice(AFTER[out[-1].strip()]))
    return "".join(out) + "\n"


def test_bpe_levels_by_counter_and_bits_per_byte_from_the_bytes(tmp_path):
    """data.tokenizer=bpe (at most 300 ids; the merges stop once every word is one token) on
    a generated word chain: each k and the three levels against Counter, bigram below unigram, and
    bits/byte = nats/token * tokens / (ln 2 * UTF-8 bytes of the validation text)."""
    text = {"train": markov_text(1, 1500), "val": markov_text(2, 300)}
    for split, body in text.items():
        (tmp_path / f"{split}.txt").write_text(body)
    overrides = ["data=text", f"data.train_files=[{tmp_path}/train.txt]",
                 f"data.val_files=[{tmp_path}/val.txt]", "data.tokenizer=bpe",
                 "data.vocab_size=300", f"data.cache_dir={tmp_path}/cache"]
    assert baselines.main(overrides) == 0
    data = ngram.prepare(load_config(overrides), progress=False)
    result = json.loads((data.folder / ngram.FILE).read_text())
    train, val, V, eot = list(data.train), list(data.val), data.vocab_size, data.eot_id
    assert 258 < V <= 300 and len(train) < len(text["train"]) / 3   # merged: a token a word
    cut = len(train) - round(ngram.HELD_OUT * len(train))
    tail = {k: counter_levels(train[:cut], train[cut:], eot, V, dict.fromkeys(result["k"], k),
                              before=train[cut - 2:cut]) for k in ngram.K_GRID}
    assert result["k"] == {name: min(ngram.K_GRID, key=lambda k: tail[k][name])
                           for name in ngram.ORDERS.values()}   # chosen on train's tail
    nats = result["nats_per_token"]
    assert nats == pytest.approx(counter_levels(train, val, eot, V, result["k"]), rel=1e-9)
    assert all(math.isfinite(v) for v in nats.values()) and nats["bigram"] < nats["unigram"]
    val_bytes = len(text["val"].encode("utf-8"))
    assert result["bits_per_byte"] == pytest.approx(
        {name: v * len(val) / (math.log(2) * val_bytes) for name, v in nats.items()}, rel=1e-12)
