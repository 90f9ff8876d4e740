"""build(cfg, source, ...): a token cache written on a cache miss (data/prepare.py decides;
docs/data.md "The token cache"). The tokenizer learns from the source in one streaming pass
(data/char.py, or data/bpe.py), then each split is read again, encoded in batches while the next
batch is read, and written shard by shard into a temporary folder renamed into place when complete,
so memory stays bounded and a killed build leaves no cache. `verify` re-reads a corpus against the
sha256 a build recorded (data.verify=true).
"""

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from data import cache
from data.char import CharTable, alphabet_of, build_char
from data.config import DataConfig
from data.documents import Piece
from data.tokenizer import EOT, PAD
from model.errors import DataError

BATCH_CHARS = 1 << 22        # characters per encode batch (bounds memory, feeds all cores)
BATCH_PIECES = 1 << 16       # pieces per encode batch, for corpora of many tiny documents
UINT16_IDS = 2**16
SPLITS = ("train", "val")


def close_synced(f) -> None:
    if f is not None and not f.closed:
        f.flush()
        os.fsync(f.fileno())
        f.close()


class ShardWriter:
    """Append token ids (and document starts) to a split's shard files, in order."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int):
        self.folder, self.split, self.dtype = folder, split, np.dtype(dtype)
        self.shard_tokens, self.shard_sizes = shard_tokens, []   # tokens in each shard so far
        self.n_tokens = self.n_docs = 0
        self.file, self.docs = None, open(folder / f"{split}_docs.bin", "wb")

    def write(self, ids: np.ndarray, doc_starts: np.ndarray) -> None:
        """`ids` continue the split; `doc_starts` are the split offsets of documents in them."""
        self.docs.write(np.asarray(doc_starts, dtype=np.int64).tobytes())
        self.n_docs += len(doc_starts)
        ids = np.asarray(ids, dtype=self.dtype)
        while len(ids):
            if self.file is None or self.shard_sizes[-1] == self.shard_tokens:   # next shard
                close_synced(self.file)
                name = cache.shard_name(self.split, len(self.shard_sizes))
                self.file = open(self.folder / name, "wb")
                self.shard_sizes.append(0)
            room = self.shard_tokens - self.shard_sizes[-1]
            part, ids = ids[:room], ids[room:]
            self.file.write(part.tobytes())
            self.shard_sizes[-1] += len(part)
            self.n_tokens += len(part)

    def close(self) -> None:
        close_synced(self.file)
        close_synced(self.docs)


def build_tokenizer(cfg: DataConfig, source) -> Tokenizer:
    """The tokenizer `cfg` asks for, learned from the source's pieces in one streaming pass."""
    if cfg.tokenizer == "char":
        return build_char(alphabet_of(text for split in SPLITS for text, _ in source.pieces(split)))
    from data import bpe  # loaded only for data.tokenizer=bpe
    return bpe.build_bpe(bpe.bpe_sample(source, cfg.bpe_sample_mb << 20), cfg.vocab_size)


@contextmanager
def file_lock(path: Path):
    """Hold an exclusive `fcntl.flock` on `path` (created if needed) for the block: the kernel
    releases it when the file closes, also when the holder crashes, so no stale lock is left."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)   # blocks while another process holds it
        yield


def build(cfg: DataConfig, source, tokens_dir: Path, key: str, progress: bool = True) -> bool:
    """The cache `key`, built under its file lock unless another process built it meanwhile
    (concurrent runs preparing one key: a sweep, DDP ranks); whether it was found built."""
    with file_lock(tokens_dir / f".{key}.lock"):
        if (tokens_dir / key).exists():
            return True
        write_cache(cfg, source, tokens_dir, key, progress)
    return False


def write_cache(cfg: DataConfig, source, tokens_dir: Path, key: str, progress: bool) -> None:
    """Tokenise both splits into a temporary folder, then rename it to `key` in one step; the
    caller holds the key's file lock, so no other build of `key` is running."""
    for old in tokens_dir.glob(f".{key}.*"):   # from builds that were killed
        shutil.rmtree(old, ignore_errors=True)
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
            from data.bpe import bpe_encode_batch  # loaded only for bpe
            encoder = partial(bpe_encode_batch, tok)
        splits, digests = {}, {}
        for split in SPLITS:
            # disable=None: a bar on a terminal only, so logs and captured output stay clean
            bar = tqdm(total=source.size(split), desc=f"{cfg.name} {split}", unit="B",
                       unit_scale=True, unit_divisor=1000, disable=None if progress else True,
                       leave=False)
            writer = ShardWriter(tmp, split, dtype, cfg.shard_tokens)
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


def write_split(encoder, pieces: Iterable[Piece], writer: ShardWriter, eot: int,
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


def verify(source, meta: dict, folder: Path) -> None:
    """Re-read the corpus and compare it with the sha256 recorded when the cache was built."""
    for split in SPLITS:
        digest = hashlib.sha256()
        for _ in batches(source.pieces(split), digest, {"characters": 0, "bytes": 0}):
            pass   # the pieces hashed as write_split hashed them
        if digest.hexdigest() != meta["content_sha256"][split]:
            raise DataError(f"data.verify: the {split} split of data={meta['name']} differs "
                            f"from the text the cache {folder} was built from (rewritten in "
                            f"place, same paths, sizes and times). Delete the folder (`rm -r "
                            f"{folder}`) and run again to rebuild it.")
