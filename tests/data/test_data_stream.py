"""Streaming preparation (data/sources.py, data/documents.py, data/prepare.py, build_cache.py):
pieces encode like whole documents, memory does not grow with the corpus, a cached start reads
no corpus, and damaged or changed inputs stop with one paragraph and nothing lost."""

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from data.bpe import bpe_sample, build_bpe, exact_pieces
from data.config import DataConfig
from data.documents import chunked, normalise, safe_cut
from data.prepare import prepare
from data.text import TextSource
from data.tokenizer import encode
from model.errors import DataError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from bench_data import write_corpus  # noqa: E402

ATOMS = ["the", "cat", "sat", "don't", "it's", "42", "3.14", ",", ".", "!", "?!", "--", " ",
         "  ", "\n", "\n\n", "\n\n\n", "\t", " \n", "\r\n", "\u00e9t\u00e9", "\u4e2d\u6587",
         "\U0001f600", "'s", "<|endoftext|>", "x" * 30]


def random_text(rng: random.Random, n_atoms: int) -> str:
    return "".join(rng.choice(ATOMS) for _ in range(n_atoms))


@pytest.fixture(scope="module")
def zipf_text(tmp_path_factory) -> str:
    """4 MB of scripts/bench_data.py's English-like text (ASCII), generated once: the corpora
    below are slices of it (generating costs about a second per corpus)."""
    return write_corpus(tmp_path_factory.mktemp("zipf") / "4mb.txt", 4 * 10**6).read_text()


def cut(path: Path, text: str, n_bytes: int, start: int = 0, copies: int = 1) -> Path:
    """A corpus file of `copies` times text[start:start + n_bytes] (n_bytes: ASCII text)."""
    part = text[start:start + n_bytes]
    assert len(part) == n_bytes
    with open(path, "w", encoding="utf-8", newline="") as f:
        for _ in range(copies):
            f.write(part)
    return path


@pytest.fixture(scope="module")
def bpe():
    rng = random.Random(0)
    return build_bpe((random_text(rng, 200) for _ in range(200)), 400)


def test_exact_pieces_encode_to_the_ids_of_the_whole_text(bpe):
    rng = random.Random(1)
    for _ in range(300):
        text = random_text(rng, rng.randint(0, 120))
        pieces = exact_pieces(text, rng.randint(1, 20))
        assert "".join(pieces) == text
        ids = [i for p in pieces for i in bpe.encode(p, add_special_tokens=False).ids]
        assert ids == bpe.encode(text, add_special_tokens=False).ids, (text, pieces)


def test_safe_cuts_split_text_without_losing_it():
    rng = random.Random(2)
    for _ in range(300):
        text = random_text(rng, rng.randint(0, 60))
        cut = safe_cut(text)
        if cut:
            assert not text[cut - 1].isspace() or text[cut - 1] == "\n"
            assert not text[cut].isspace() or text[cut] == " "
    long = "a" * 70_000   # no whitespace at all: cut anyway, text kept whole
    assert "".join(chunked(long, 1000)) == long and len(list(chunked(long, 1000))) > 1


def expected_ids(tok, docs: list[str]) -> list[int]:
    return [i for d in docs for i in encode(tok, d) + [1]]


def reference_documents(text: str, document: str) -> list[str]:
    """What a whole-file reader would produce: normalise, then cut into documents."""
    text = normalise(text)
    docs = {"file": [text], "line": text.split("\n"),
            "paragraph": re.split(r"\n\s*\n", text)}[document]
    return [d for d in docs if d.strip()]


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
@pytest.mark.parametrize("document", ["file", "line", "paragraph"])
def test_tiny_read_blocks_give_the_token_stream_of_whole_documents(tmp_path, monkeypatch,
                                                                   tokenizer, document):
    """Blocks of 37 bytes, batches of 64 characters and BPE pieces of 16: every boundary the
    streaming code has falls inside documents, and the tokens are still the whole-file ones."""
    monkeypatch.setattr("data.text.BLOCK_BYTES", 37)
    monkeypatch.setattr("data.build_cache.BATCH_CHARS", 64)
    monkeypatch.setattr("data.bpe.BPE_PIECE_CHARS", 16)
    rng = random.Random(3)
    texts = [random_text(rng, 400) for _ in range(3)]
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"{i}.txt")
        paths[-1].write_text(text, encoding="utf-8", newline="")
    (tmp_path / "val.txt").write_text("val text.\n")
    cfg = DataConfig(source="text", name="s", document=document, tokenizer=tokenizer,
                     vocab_size=300, train_files=[str(p) for p in paths],
                     val_files=[str(tmp_path / "val.txt")], cache_dir=str(tmp_path / "c"))
    data = prepare(cfg)
    docs = [d for t in texts for d in reference_documents(t, document)]
    assert data.train[:].tolist() == expected_ids(data.tokenizer, docs)
    starts = np.cumsum([0] + [len(encode(data.tokenizer, d)) + 1 for d in docs])[:-1]
    assert data.train_docs[:].tolist() == starts.tolist()
    assert data.meta["splits"]["train"]["bytes"] == sum(len(d.encode()) for d in docs)


def peak_growth_mib(corpora: list[Path], tokenizer: str, document: str) -> list[float]:
    """Per corpus, the peak RSS of a fresh process preparing it, minus its RSS just before
    prepare(); the processes run at once (each on one thread, into its own cache).

    The peak is VmHWM, this process's own high-water mark: ru_maxrss is not, it starts at the RSS
    of the parent that spawned it (Linux keeps it across fork and exec), so under pytest it read
    the same ~200 MiB for every corpus and the comparison passed whatever prepare() held.
    File reads and encode batches of 16 KiB and a 1 MiB BPE sample: the peak levels off by 3 MB
    of text for char and 1 MB for bpe (measured; with 1 MiB batches it still grows up to ~12 MB,
    so the smaller corpus must be past that point for "about the same peak" to hold)."""
    script = """
        import sys
        sys.path.insert(0, {repo!r})
        import data.build_cache
        import data.prepare as prep
        import data.text
        from data.config import DataConfig
        data.build_cache.BATCH_CHARS = data.text.BLOCK_BYTES = 1 << 14
        cfg = DataConfig(source="text", name="m", document={document!r},
                         tokenizer={tokenizer!r}, train_files=[{corpus!r}],
                         bpe_sample_mb=1, cache_dir={cache!r})
        def kib(field):
            line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
            return int(line.split()[1])
        before = kib("VmRSS")
        assert not prep.prepare(cfg, progress=False).reused
        print((kib("VmHWM") - before) / 1024)
    """
    procs = [subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script.format(
            repo=str(REPO), document=document, tokenizer=tokenizer, corpus=str(corpus),
            cache=str(corpus.with_suffix(".cache"))))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RAYON_NUM_THREADS": "1"}) for corpus in corpora]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    return [float(out) for out, _ in outs]


@pytest.mark.parametrize("tokenizer, document, small_mb, large_mb", [
    ("char", "file", 3, 15), ("char", "paragraph", 3, 15), ("bpe", "file", 1, 5)])
def test_memory_does_not_grow_with_the_corpus(tmp_path, zipf_text, tokenizer, document, small_mb,
                                              large_mb):
    """Five times the text (the small corpus five times over), about the same peak: the growth
    stays far below the extra text (whole-corpus strings, or one encoding of a whole file, would
    add more than that: over 40 MiB here, measured with reads or encode batches of 1 GiB)."""
    small = cut(tmp_path / "small.txt", zipf_text, small_mb * 10**6)
    large = cut(tmp_path / "large.txt", zipf_text, small_mb * 10**6, copies=large_mb // small_mb)
    grow_small, grow_large = peak_growth_mib([small, large], tokenizer, document)
    extra_text_mib = (large_mb - small_mb) * 10**6 / 2**20
    assert grow_large - grow_small < 0.25 * extra_text_mib, (grow_small, grow_large)


def text_cfg(tmp_path: Path, corpus: Path, **kw) -> DataConfig:
    return DataConfig(**{**dict(source="text", name="c", document="paragraph",
                                train_files=[str(corpus)], cache_dir=str(tmp_path / "cache")),
                         **kw})


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def test_cached_start_reads_no_corpus(tmp_path, monkeypatch, zipf_text):
    corpus = cut(tmp_path / "corpus.txt", zipf_text, 2 * 10**6)
    built = prepare(text_cfg(tmp_path, corpus))

    def no_reading(*args, **kw):
        raise AssertionError("a cached start read the corpus")

    monkeypatch.setattr("data.text.read_segment", no_reading)
    monkeypatch.setattr("data.build_cache.build", no_reading)
    again = prepare(text_cfg(tmp_path, corpus))
    assert again.reused and again.folder == built.folder
    assert np.array_equal(again.train[:], built.train[:])
    with pytest.raises(AssertionError, match="read the corpus"):   # verify does read it
        prepare(text_cfg(tmp_path, corpus, verify=True))


def test_verify_finds_content_rewritten_in_place(tmp_path, zipf_text):
    corpus = cut(tmp_path / "corpus.txt", zipf_text, 400_000)
    data = prepare(text_cfg(tmp_path, corpus))
    assert prepare(text_cfg(tmp_path, corpus, verify=True)).reused   # unchanged: passes
    st = corpus.stat()
    raw = bytearray(corpus.read_bytes())
    i = raw.index(b"e", 100_000)   # outside the three sampled blocks of the identity
    raw[i:i + 1] = b"o"
    corpus.write_bytes(bytes(raw))
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))   # same size, same mtime
    before = snapshot(tmp_path / "cache")
    assert prepare(text_cfg(tmp_path, corpus)).reused   # identity unchanged: reused unread
    with pytest.raises(DataError, match=r"(?s)data.verify: the train split .* differs .*"
                                        "rewritten in place.*rm -r"):
        prepare(text_cfg(tmp_path, corpus, verify=True))
    assert snapshot(tmp_path / "cache") == before and data.folder.exists()


def test_a_corpus_that_shrank_since_the_build_gets_its_own_cache(tmp_path, zipf_text):
    corpus = cut(tmp_path / "corpus.txt", zipf_text, 300_000)
    old = prepare(text_cfg(tmp_path, corpus))
    before = snapshot(old.folder)
    text = corpus.read_text()
    corpus.write_text(text[:len(text) // 2])
    new = prepare(text_cfg(tmp_path, corpus))
    assert not new.reused and new.folder != old.folder
    assert len(new.train) + len(new.val) < 0.6 * (len(old.train) + len(old.val))
    assert snapshot(old.folder) == before   # the old cache is untouched


def test_a_corpus_that_shrinks_during_the_build_stops_it(tmp_path, monkeypatch, zipf_text):
    corpus = cut(tmp_path / "corpus.txt", zipf_text, 300_000)
    good = cut(tmp_path / "good.txt", zipf_text, 50_000, start=3 * 10**6)
    prepare(text_cfg(tmp_path, good))
    before = snapshot(tmp_path / "cache")
    import data.build_cache as build_cache
    real = build_cache.build_tokenizer

    def truncate_then_train(cfg, source):
        with open(corpus, "r+b") as f:
            f.truncate(100_000)
        return real(cfg, source)

    monkeypatch.setattr(build_cache, "build_tokenizer", truncate_then_train)
    with pytest.raises(DataError, match=r"corpus.txt ended at byte 100000, but it had "
                                        r"\d+ bytes .* shrank .* Nothing was written"):
        prepare(text_cfg(tmp_path, corpus))
    assert snapshot(tmp_path / "cache") == before
    assert not [p for p in (tmp_path / "cache" / "tokens").iterdir() if ".tmp-" in p.name]


def test_shards_of_a_tiny_size_hold_the_same_stream(tmp_path, zipf_text):
    corpus = cut(tmp_path / "corpus.txt", zipf_text, 200_000)
    one = prepare(text_cfg(tmp_path, corpus))
    many = prepare(text_cfg(tmp_path, corpus, shard_tokens=7_000))
    assert many.folder != one.folder and len(many.train.shards) > 20
    shards = many.meta["splits"]["train"]["shards"]
    assert set(shards[:-1]) == {7_000} and 0 < shards[-1] <= 7_000 and sum(shards) == len(one.train)
    assert np.array_equal(many.train[:], one.train[:]) and np.array_equal(many.val[:], one.val[:])
    assert np.array_equal(many.train_docs[:], one.train_docs[:])
    names = sorted(p.name for p in many.folder.glob("train-*.bin"))
    assert names[0] == "train-00000.bin" and len(names) == len(shards)


@pytest.mark.parametrize("damage", ["missing", "truncated", "docs"])
def test_a_damaged_cache_stops_with_the_fix_and_is_kept(tmp_path, damage, zipf_text):
    corpus = cut(tmp_path / "corpus.txt", zipf_text, 100_000)
    other = prepare(text_cfg(tmp_path, corpus, tokenizer="bpe", vocab_size=300))
    data = prepare(text_cfg(tmp_path, corpus, shard_tokens=20_000))
    shard = data.folder / "train-00001.bin"
    if damage == "missing":
        shard.unlink()
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])
    else:
        (data.folder / "train_docs.bin").unlink()
    before = snapshot(tmp_path / "cache")
    needle = {"missing": "train-00001.bin is missing", "docs": "train_docs.bin is missing",
              "truncated": "train-00001.bin has 100 bytes instead of 40000"}[damage]
    with pytest.raises(DataError, match=rf"damaged: {needle} .*rm -r .*Other cache folders"):
        prepare(text_cfg(tmp_path, corpus, shard_tokens=20_000))
    assert snapshot(tmp_path / "cache") == before
    assert prepare(text_cfg(tmp_path, corpus, tokenizer="bpe", vocab_size=300)).reused
    assert other.folder.exists()


def test_bpe_sample_is_bounded_spread_and_deterministic(tmp_path, zipf_text):
    corpus = cut(tmp_path / "corpus.txt", zipf_text, 3 * 10**6)
    source = TextSource(text_cfg(tmp_path, corpus, document="file"))
    pieces = list(bpe_sample(source, 400_000))
    taken = sum(map(len, pieces))
    assert 300_000 < taken < 410_000   # about the size asked for, at most one piece more
    assert pieces == list(bpe_sample(source, 400_000))
    text = corpus.read_text()
    positions = [text.index(p[:200]) for p in pieces[::max(1, len(pieces) // 5)]]
    assert positions[0] < 0.1 * len(text) and max(positions) > 0.75 * len(text)   # spread
    everything = "".join(bpe_sample(source, 10 * 10**6))   # larger than the split: all of it
    assert len(everything) == sum(len(t) for t, _ in source.pieces("train"))


def test_meta_records_identity_digests_and_timings(tmp_path, zipf_text):
    corpus = cut(tmp_path / "corpus.txt", zipf_text, 100_000)
    data = prepare(text_cfg(tmp_path, corpus))
    meta = json.loads((data.folder / "meta.json").read_text())
    assert meta["identity"]["files"][0]["bytes"] == corpus.stat().st_size
    assert set(meta["content_sha256"]) == {"train", "val"} and meta["encode_seconds"] >= 0
