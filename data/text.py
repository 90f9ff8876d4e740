"""The `text` source (data=text): your own UTF-8 files, streamed (docs/data.md "Sources").
"""

import codecs
import glob
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from data.config import DataConfig
from data.documents import Piece, normalise_stream, not_utf8, record_pieces, safe_cut
from data.sources import file_identity
from model.errors import DataError

BLOCK_BYTES = 1 << 20      # text files are read in blocks of this size

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
