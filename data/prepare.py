"""prepare(cfg): load the corpus, build or reuse the token cache, return PreparedData.

The cache key hashes the corpus content (every document of both splits) together with the
tokenizer settings and the cache format, so changing either the text or the tokenizer builds a
new cache and an unchanged pair reuses the old one. Concurrent runs preparing the same key
(a sweep, the ranks of a DDP job) serialise on a file lock: the first builds, the rest wait and
then load what it built.
"""

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from data import cache
from data.config import DataConfig
from data.corpus import load_corpus
from data.documents import Corpus
from data.errors import DataError
from data.locking import file_lock
from data.tokenizer import EOT, PAD, build_tokenizer, encode

ENCODE_CHUNK_DOCS = 4096   # documents per encode_batch call: bounds memory on large corpora
UINT16_IDS = 2**16


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    tokenizer_path: Path
    train: np.ndarray        # (N_train,) uint16/uint32 memmap
    val: np.ndarray          # (N_val,)
    train_docs: np.ndarray   # (n_docs,) int64 start offsets into `train`
    val_docs: np.ndarray
    meta: dict
    vocab_size: int
    pad_id: int
    eot_id: int
    reused: bool = False     # True when an existing cache folder was loaded, not built

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def prepare(cfg: DataConfig) -> PreparedData:
    """Build (or reuse) the token cache for `cfg` and return it memory-mapped."""
    root = cache.default_cache_root(cfg.cache_dir)
    tokens_dir = root / "tokens"
    try:
        tokens_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"Cannot create the cache folder {tokens_dir} ({e.strerror}); set "
                        "data.cache_dir to a writable folder.") from None
    corpus = load_corpus(cfg, root)
    key = cache_key(cfg, corpus)
    final = tokens_dir / key
    reused = cache.is_complete(final)
    if not reused:
        with file_lock(tokens_dir / f".{key}.lock"):
            reused = cache.is_complete(final)   # another process may have built it meanwhile
            if not reused:
                cache.remove_leftovers(tokens_dir, key)
                build(cfg, corpus, tokens_dir, key)
    return load(final, reused)


def cache_key(cfg: DataConfig, corpus: Corpus) -> str:
    settings = {"format": cache.FORMAT_VERSION, "corpus": corpus.fingerprint(),
                "document": corpus.document, "tokenizer": cfg.tokenizer,
                "vocab_size": cfg.vocab_size if cfg.tokenizer == "bpe" else None,
                "token_dtype": cfg.token_dtype}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    vocab = str(cfg.vocab_size) if cfg.tokenizer == "bpe" else ""
    return f"{cfg.name}-{cfg.tokenizer}{vocab}-{digest[:16]}"


def token_dtype(requested: str, vocab_size: int) -> str:
    if requested == "auto":
        return "uint16" if vocab_size <= UINT16_IDS else "uint32"
    if requested == "uint16" and vocab_size > UINT16_IDS:
        raise DataError(f"The vocabulary has {vocab_size} ids but data.token_dtype=uint16 holds "
                        f"at most {UINT16_IDS}; set data.token_dtype=uint32 (or auto), or use a "
                        "smaller data.vocab_size.")
    return requested


def build(cfg: DataConfig, corpus: Corpus, tokens_dir: Path, key: str) -> None:
    """Tokenise both splits into a temporary folder, then rename it to `key` in one step."""
    start = time.perf_counter()
    tok = build_tokenizer(cfg.tokenizer, corpus.train, corpus.val, cfg.vocab_size)
    dtype = token_dtype(cfg.token_dtype, tok.get_vocab_size())
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=tokens_dir))
    try:
        tok.save(str(tmp / "tokenizer.json"))
        splits = {name: write_split(tok, docs, tmp, name, dtype)
                  for name, docs in (("train", corpus.train), ("val", corpus.val))}
        meta = {
            "format": cache.FORMAT_VERSION, "key": key, "name": cfg.name, "source": cfg.source,
            "document": corpus.document, "tokenizer": cfg.tokenizer,
            "vocab_size": tok.get_vocab_size(), "requested_vocab_size": cfg.vocab_size,
            "dtype": dtype, "pad_id": tok.token_to_id(PAD), "eot_id": tok.token_to_id(EOT),
            "corpus_fingerprint": corpus.fingerprint(), "splits": splits,
            "bytes_per_token": {s: splits[s]["bytes_per_token"] for s in splits},
            "info": corpus.info, "build_seconds": round(time.perf_counter() - start, 3),
        }
        cache.write_meta(tmp, meta)   # last: a folder with meta.json has all its files
        cache.publish(tmp, tokens_dir / key)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_split(tok: Tokenizer, docs: list[str], folder: Path, split: str, dtype: str) -> dict:
    """Append each document's ids and one EOT to `<split>.bin`; return the split's counts.

    bytes_per_token = UTF-8 bytes of the documents / tokens including the EOT separators, so
    bits per byte = loss_per_token / ln(2) / bytes_per_token over the same token stream.
    """
    eot = tok.token_to_id(EOT)
    starts, n_tokens, n_bytes, n_chars = [], 0, 0, 0
    with open(folder / f"{split}.bin", "wb") as f:
        for i in range(0, len(docs), ENCODE_CHUNK_DOCS):
            chunk = docs[i:i + ENCODE_CHUNK_DOCS]
            for enc in tok.encode_batch(chunk, add_special_tokens=False):
                ids = np.asarray(enc.ids + [eot], dtype=dtype)
                starts.append(n_tokens)
                n_tokens += len(ids)
                f.write(ids.tobytes())
            n_bytes += sum(len(d.encode("utf-8")) for d in chunk)
            n_chars += sum(len(d) for d in chunk)
        f.flush()
        os.fsync(f.fileno())
    np.save(folder / f"{split}_docs.npy", np.asarray(starts, dtype=np.int64))
    return {"documents": len(docs), "characters": n_chars, "bytes": n_bytes,
            "tokens": n_tokens, "bytes_per_token": n_bytes / n_tokens}


def load(folder: Path, reused: bool = True) -> PreparedData:
    meta = json.loads((folder / "meta.json").read_text())
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return PreparedData(
        tokenizer=tok, tokenizer_path=folder / "tokenizer.json",
        train=cache.read_tokens(folder, "train", meta), val=cache.read_tokens(folder, "val", meta),
        train_docs=np.load(folder / "train_docs.npy"), val_docs=np.load(folder / "val_docs.npy"),
        meta=meta, vocab_size=meta["vocab_size"], pad_id=meta["pad_id"], eot_id=meta["eot_id"],
        reused=reused,
    )
