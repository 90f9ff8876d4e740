"""Records split into documents by line or paragraph (data.document=line|paragraph), for the
text and hub sources (options; the default corpus is one document per work: data/sources.py).
Safe cuts never fall inside a run of line breaks, so a chunk that does not end with a newline
continues its last line or paragraph.
"""

import re
from collections.abc import Iterable, Iterator

from data.sources import Piece, whole_record

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def record_pieces(chunks: Iterable[str], document: str) -> Iterator[Piece]:
    """The pieces of one record given as safe-cut chunks. line: each line is one document;
    paragraph: blank lines separate them; row, file, work: the record is one document."""
    if document in ("row", "file", "work"):
        yield from whole_record(chunks)
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
