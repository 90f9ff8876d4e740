"""The `text` source: your own UTF-8 files, given as paths or globs for each split.

Files are streamed in blocks of `BLOCK_BYTES`, decoded, normalised (data/documents.py) and cut
into documents without ever holding a whole file. Without `val_files`, the last `val_fraction`
of the bytes becomes the validation split, cut at the start of a line: whole files from the
end, and the tail of one more file if needed, so the split is deterministic and never shuffles
text between runs.

The cache key uses each file's identity, not its content: resolved path, size, modification
time and a sha256 of three `SAMPLE_BYTES` blocks (start, middle, end). A cached start therefore
reads at most a few hundred kilobytes per file; `data.verify=true` re-reads everything.
"""

import glob
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from data.documents import Piece, decode_utf8, normalise_stream, record_pieces, safe_cut
from model.errors import DataError

BLOCK_BYTES = 1 << 20
SAMPLE_BYTES = 1 << 16


@dataclass(frozen=True)
class Segment:
    """Bytes [start, end) of one file: a whole file, or one side of the validation cut."""

    path: Path
    start: int
    end: int


class TextSource:
    def __init__(self, cfg):
        self.name, self.document = cfg.name, cfg.document
        train = [whole(p) for p in expand(cfg.train_files, "train_files")]
        if cfg.val_files:
            val = [whole(p) for p in expand(cfg.val_files, "val_files")]
        else:
            train, val = split_tail(train, cfg.val_fraction)
        self.segments = {"train": train, "val": val}
        self.val_fraction = None if cfg.val_files else cfg.val_fraction
        self.info = {"train_files": _paths(train), "val_files": _paths(val),
                     "val_fraction": self.val_fraction}

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


def _paths(segments: list[Segment]) -> list[str]:
    return list(dict.fromkeys(str(s.path) for s in segments))


def expand(patterns: list[str], field: str) -> list[Path]:
    """Every pattern must match at least one file; results are sorted per pattern."""
    paths = []
    for pattern in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        files = [Path(h).resolve() for h in hits if os.path.isfile(h)]
        if not files:
            raise DataError(f"data.{field} entry {pattern!r} matches no file (current folder "
                            f"{os.getcwd()}). Check the path, or use an absolute path; Hydra "
                            "runs from the repository root.")
        paths.extend(files)
    return paths


def whole(path: Path) -> Segment:
    return Segment(path, 0, path.stat().st_size)


def file_identity(path: Path) -> dict:
    """Path, size, mtime and a sha256 of three sampled blocks: cheap, and it changes when the
    file is replaced, grown, shrunk or rewritten."""
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for offset in sorted({0, max(0, st.st_size // 2 - SAMPLE_BYTES // 2),
                              max(0, st.st_size - SAMPLE_BYTES)}):
            f.seek(offset)
            h.update(f.read(SAMPLE_BYTES))
    return {"path": str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sampled_sha256": h.hexdigest()}


def read_segment(seg: Segment) -> Iterator[str]:
    """The decoded text of a segment in safe-cut chunks of about BLOCK_BYTES."""
    pending, text, offset = b"", "", seg.start
    with open(seg.path, "rb") as f:
        f.seek(seg.start)
        while offset < seg.end:
            block = f.read(min(BLOCK_BYTES, seg.end - offset))
            if not block:
                raise DataError(
                    f"{seg.path} ended at byte {offset}, but it had {seg.end} bytes when this "
                    "preparation started: the file shrank while it was being read. Nothing was "
                    "written to the cache; run again once the file is complete.")
            data_start, data = offset - len(pending), pending + block
            offset += len(block)
            keep = _incomplete_tail(data) if offset < seg.end else 0   # finish it next block
            data, pending = data[:len(data) - keep], data[len(data) - keep:]
            text += decode_utf8(data, str(seg.path), data_start)
            cut = safe_cut(text)
            if cut:
                yield text[:cut]
                text = text[cut:]
    if text:
        yield text


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of `data` start a UTF-8 sequence that is not finished."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:   # not a continuation byte: the lead byte of the last sequence
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else \
                4 if byte >> 3 == 0b11110 else 1
            return back if need > back else 0
    return 0


def split_tail(segments: list[Segment], fraction: float) -> tuple[list[Segment], list[Segment]]:
    """Move the last `fraction` of the bytes into validation, cut at the start of a line."""
    want = int(round(fraction * sum(s.end - s.start for s in segments)))
    train, val = list(segments), []
    while train and want > 0:
        last = train.pop()
        if last.end - last.start <= want:
            val.insert(0, last)
            want -= last.end - last.start
            continue
        cut = line_start_before(last.path, last.end - want, last.start)
        train.append(Segment(last.path, last.start, cut))
        val.insert(0, Segment(last.path, cut, last.end))
        break
    return [s for s in train if s.end > s.start], val


def line_start_before(path: Path, pos: int, lo: int) -> int:
    """The start of the line holding byte `pos` (looking back no further than `lo`); without a
    newline there, the first character boundary at or after `pos`."""
    with open(path, "rb") as f:
        end = pos
        while end > lo:
            begin = max(lo, end - BLOCK_BYTES)
            f.seek(begin)
            nl = f.read(end - begin).rfind(b"\n")
            if nl >= 0:
                return begin + nl + 1
            end = begin
        f.seek(pos)
        head = f.read(4)
    return pos + next((i for i, b in enumerate(head) if b & 0xC0 != 0x80), len(head))
