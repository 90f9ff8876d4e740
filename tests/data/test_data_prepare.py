"""data/prepare.py and data/cache.py: the token cache is reused, invalidated, atomic, shared."""

import hashlib
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from data.batching import EVAL_SEED, Batcher, BatchShape, first_batches
from data.config import DataConfig
from data.padded import PaddedBatcher
from data.prepare import bits_per_byte, load, prepare
from model.errors import DataError

DOCS = ["It is a truth universally acknowledged.\n", "Call me Ishmael.\n",
        "Happy families are all alike; \u00e9t\u00e9.\n"]
VAL = "All this happened, more or less.\n"
REPO = Path(__file__).resolve().parents[2]


def text_cfg(tmp_path: Path, **kw) -> DataConfig:
    for i, doc in enumerate(DOCS):
        f = tmp_path / "corpus" / f"{i}.txt"
        f.parent.mkdir(exist_ok=True)
        if not f.exists():
            f.write_text(doc)
    if not (tmp_path / "val.txt").exists():   # rewriting a file changes its identity
        (tmp_path / "val.txt").write_text(VAL)
    fields = dict(source="text", name="tiny", document="file", cache_dir=str(tmp_path / "cache"),
                  train_files=[str(tmp_path / "corpus" / "*.txt")],
                  val_files=[str(tmp_path / "val.txt")])
    return DataConfig(**{**fields, **kw})


def complete(folder: Path) -> bool:
    """Whether `folder` loads: meta.json, tokenizer.json and every shard it lists, full size."""
    try:
        load(folder)
        return True
    except (OSError, ValueError, KeyError, TypeError):   # DataError is a ValueError
        return False


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` except lock files (which a run may create)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def test_char_cache_contents_and_numbers(tmp_path):
    data = prepare(text_cfg(tmp_path))
    assert not data.reused and data.tokenizer_path.name == "tokenizer.json"
    assert data.tokenizer_path.parent.parent == tmp_path / "cache" / "tokens"
    assert (data.pad_id, data.eot_id, data.train.dtype) == (0, 1, np.uint16)
    chars = sum(len(d) for d in DOCS)
    assert len(data.train) == chars + len(DOCS)             # one id per character + EOTs
    assert data.train_docs.tolist() == [0, len(DOCS[0]) + 1, len(DOCS[0]) + len(DOCS[1]) + 2]
    assert data.decode(data.train[:]) == "<|endoftext|>".join(DOCS) + "<|endoftext|>"
    assert data.decode(data.val[:-1]) == VAL and data.val[-1] == data.eot_id
    bytes_ = sum(len(d.encode()) for d in DOCS)
    assert data.meta["bytes_per_token"]["train"] == pytest.approx(bytes_ / len(data.train))
    assert data.meta["splits"]["val"] == {"documents": 1, "characters": len(VAL),
                                          "bytes": len(VAL), "tokens": len(VAL) + 1,
                                          "bytes_per_token": len(VAL) / (len(VAL) + 1),
                                          "shards": [len(VAL) + 1]}
    assert data.vocab_size == len(set("".join(DOCS) + VAL)) + 2
    assert data.encode("Call") == data.train[len(DOCS[0]) + 1:len(DOCS[0]) + 5].tolist()


def test_bpe_cache_and_uint32(tmp_path):
    data = prepare(text_cfg(tmp_path, tokenizer="bpe", vocab_size=300, token_dtype="uint32"))
    assert data.train.dtype == np.uint32 and data.vocab_size <= 300
    assert data.decode(data.train[:]) == "<|endoftext|>".join(DOCS) + "<|endoftext|>"
    assert data.meta["bytes_per_token"]["train"] > 1.0   # merges make tokens longer than bytes


def test_reuse_and_invalidation(tmp_path):
    first = prepare(text_cfg(tmp_path))
    again = prepare(text_cfg(tmp_path))
    assert again.reused and again.tokenizer_path == first.tokenizer_path
    assert np.array_equal(first.train[:], again.train[:])
    folders = {first.tokenizer_path.parent}
    for kw in ({"tokenizer": "bpe", "vocab_size": 300}, {"tokenizer": "bpe", "vocab_size": 280},
               {"token_dtype": "uint32"}):
        data = prepare(text_cfg(tmp_path, **kw))
        assert not data.reused
        folders.add(data.tokenizer_path.parent)
    (tmp_path / "corpus" / "1.txt").write_text("Call me Ishmael!\n")   # one character changed
    changed = prepare(text_cfg(tmp_path))
    assert not changed.reused and changed.tokenizer_path.parent not in folders
    assert len(folders) == 4


def test_interrupted_build_leaves_no_cache(tmp_path, monkeypatch):
    cfg = text_cfg(tmp_path)
    import data.build_cache as build_cache
    real = build_cache.write_split

    def crash_after_train(encoder, pieces, writer, eot, bar):
        if writer.split == "val":
            raise KeyboardInterrupt
        return real(encoder, pieces, writer, eot, bar)

    monkeypatch.setattr(build_cache, "write_split", crash_after_train)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg)
    tokens = tmp_path / "cache" / "tokens"
    assert [p.name for p in tokens.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(build_cache, "write_split", real)
    assert not prepare(cfg).reused


def test_killed_build_is_cleaned_up_and_rebuilt(tmp_path):
    cfg = text_cfg(tmp_path)
    script = f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        import data.build_cache as build_cache
        import data.prepare as prep
        from data.config import DataConfig
        real = build_cache.write_split
        def die(encoder, pieces, writer, eot, bar):
            if writer.split == "val":
                os._exit(9)   # like SIGKILL: no cleanup runs
            return real(encoder, pieces, writer, eot, bar)
        build_cache.write_split = die
        prep.prepare(DataConfig(**{cfg.__dict__!r}))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)])
    assert proc.returncode == 9
    tokens = tmp_path / "cache" / "tokens"
    leftovers = [p for p in tokens.iterdir() if ".tmp-" in p.name]
    assert len(leftovers) == 1 and not complete(leftovers[0])
    data = prepare(cfg)
    assert not data.reused and complete(data.tokenizer_path.parent)
    assert not any(".tmp-" in p.name for p in tokens.iterdir())


def test_two_processes_prepare_at_once(tmp_path):
    cfg = text_cfg(tmp_path, tokenizer="bpe", vocab_size=300)
    script = f"""
        import json, sys, time
        sys.path.insert(0, {str(REPO)!r})
        import data.build_cache as build_cache
        import data.prepare as prep
        from data.config import DataConfig
        real = build_cache.write_cache
        def slow_build(*args):
            time.sleep(1.0)   # hold the lock long enough for the other process to wait on it
            real(*args)
        build_cache.write_cache = slow_build
        data = prep.prepare(DataConfig(**{cfg.__dict__!r}))
        print(json.dumps({{"reused": data.reused, "sum": int(data.train[:].sum())}}))
    """
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(r["reused"] for r in results) == [False, True]   # one built, one reused
    assert results[0]["sum"] == results[1]["sum"]
    folders = [p for p in (tmp_path / "cache" / "tokens").iterdir() if p.is_dir()]
    assert len(folders) == 1 and complete(folders[0])


def test_shakespeare_source_through_prepare(tmp_path, monkeypatch):
    from conftest import MINI_WORKS, make_tar
    tar = make_tar(tmp_path / "mini.tar.gz", MINI_WORKS)
    monkeypatch.setattr("data.shakespeare.fetch_archive", lambda root: tar)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    data = prepare(DataConfig(cache_dir=str(tmp_path / "cache")))
    assert data.meta["info"]["works"] == 7 and data.meta["document"] == "work"
    assert (len(data.train_docs), len(data.val_docs)) == (2, 5)
    assert data.decode(data.train[:data.train_docs[1] - 1]).startswith("The Tragedie of Cymbeline")


def test_errors_leave_the_existing_cache_intact(tmp_path, monkeypatch):
    prepare(text_cfg(tmp_path))
    before = snapshot(tmp_path / "cache")
    huge = tmp_path / "huge.txt"   # 70,000 distinct characters: more ids than uint16 holds
    huge.write_text("".join(chr(0x10000 + i) for i in range(70_000)))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc\xff")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    import datasets
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)   # as HF_HUB_OFFLINE=1 does
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    cases = [
        (dict(token_dtype="uint16", train_files=[str(huge)]),
         f"{70_000 + len(set(VAL)) + 2} ids but data.token_dtype"),
        (dict(train_files=[str(tmp_path / "missing" / "*.txt")]), "matches no file"),
        (dict(train_files=[str(bad)]), "bad.txt is not valid UTF-8: byte offset 3"),
        (dict(train_files=[str(empty)]), "is empty"),
        (dict(source="hub", hub_id="nobody/nothing", document="row"), "no data.hub_revision"),
        (dict(source="hub", hub_id="nobody/nothing", hub_revision="0" * 40, document="row"),
         "revision '0000000000000000000000000000000000000000'.*HF_HUB_OFFLINE is set"),
    ]
    from conftest import make_hub_folder
    no_val = make_hub_folder(tmp_path / "hub-no-val", {"train": ["a\n", "b\n", "c\n"]}, shards=3)
    cases.append((dict(source="hub", hub_id=str(no_val), document="row"),
                  r"no split 'validation' \(it has \['train'\]\)"))
    for kw, needle in cases:
        with pytest.raises(DataError, match=needle):
            prepare(text_cfg(tmp_path, **kw))
        assert snapshot(tmp_path / "cache") == before, kw
    with pytest.raises(DataError, match="data.source='web'"):
        text_cfg(tmp_path, source="web")
    assert prepare(text_cfg(tmp_path)).reused


@pytest.mark.parametrize("packing", ["concat", "pad"])
def test_prepared_data_is_the_trainers_training_data(tmp_path, packing):
    """What the trainer reads of a corpus (data.batching.TrainingData): the start line's data
    part, no answer scoring, and batches cut as data.packing says (evaluation rows with
    EVAL_SEED, the same whatever the training seed)."""
    data = prepare(text_cfg(tmp_path, packing=packing))
    chars = sum(len(d) for d in DOCS)
    assert data.packing == packing and data.scores_answers is False
    assert data.describe() == (f"{chars + len(DOCS)} train / {len(VAL) + 1} val tokens, vocab "
                               f"{data.vocab_size}")
    shape = BatchShape(batch_size=2, block_size=8)
    fixed, sampler = data.batches(shape, n_eval=3, seed=5)
    kind = PaddedBatcher if packing == "pad" else Batcher
    assert type(sampler) is kind and sampler.seed == 5 and sampler.tokens is data.train
    for split in ("val", "train"):
        args = (getattr(data, f"{split}_docs"), shape, data.pad_id) if packing == "pad" else (
            shape,)
        want = first_batches(kind(getattr(data, split), *args, EVAL_SEED), 3)
        assert len(fixed[split]) == 3
        for got, ref in zip(fixed[split], want):
            assert torch.equal(got.idx, ref.idx) and torch.equal(got.targets, ref.targets)
    assert all(torch.equal(a.idx, b.idx) for a, b in
               zip(fixed["val"], data.batches(shape, n_eval=3, seed=6)[0]["val"]))


def test_bits_per_byte_converts_nats_per_token():
    assert bits_per_byte(math.log(2), 1.0) == pytest.approx(1.0)
    assert bits_per_byte(3 * math.log(2), 1.5) == pytest.approx(2.0)   # 3 bits over 1.5 bytes
