"""Records as documents (docs/data.md "Sources"), what every source does with the text it reads. A
source yields a split as pieces `(text, ends)`: text continues the current document, `ends` closes
it. A record (a work, a file, a hub row) is normalised and cut into chunks at safe cuts, which
never fall inside a run of line breaks, so a chunk that does not end with a newline continues its
last line or paragraph. data.document=line|paragraph (the text and hub sources) splits records by
line or paragraph.

A *safe cut* is after a newline between two non-space characters (`x\\n|y`), else before a single
space between two (`x| y`). GPT-2's pre-tokenizer never joins text across one, so pieces encode to
the ids of the whole document; a CUT_WINDOW stretch without one is cut between two non-space
characters (for bpe, maybe inside a word).
"""

import re
from collections.abc import Iterable, Iterator

from model.errors import DataError

Piece = tuple[str, bool]   # (text continuing the current document, whether it ends it)
CHUNK_CHARS = 1 << 20      # long records are cut into pieces of about this size
_BLANK_RUN = re.compile(r"\n{3,}")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
CUT_WINDOW = 1 << 16       # how far back from the end of a buffer a safe cut is looked for
SAFE_CUT = re.compile(r"\S\n(?=\S)|\S(?= \S)")
_NON_SPACE_PAIR = re.compile(r"\S(?=\S)")   # the fallback: no whitespace rule can match here


def not_utf8(e: UnicodeDecodeError, where: str, offset: int = 0) -> DataError:
    """`e.object` starts at byte `offset` of the file `where`."""
    return DataError(f"{where} is not valid UTF-8: byte offset {offset + e.start} holds "
                     f"0x{e.object[e.start]:02x} ({e.reason}). Convert the file to UTF-8 (e.g. "
                     "`iconv -f latin1 -t utf-8`) or remove it from the file list.")


def safe_cut(text: str) -> int:
    """The last safe cut in `text` (see the module docstring), 0 when it has none."""
    for pattern in (SAFE_CUT, _NON_SPACE_PAIR):
        for window in (1 << 10, CUT_WINDOW):   # most text has a cut in its last kilobyte
            last = None
            for match in pattern.finditer(text, max(0, len(text) - window)):
                last = match
            if last is not None and (pattern is SAFE_CUT or len(text) >= CUT_WINDOW):
                return last.end()
    return len(text) if len(text) >= CUT_WINDOW else 0


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
    the last one closing the document."""
    held = None
    for chunk in chunks:
        if held is not None:
            yield held, False
        held = chunk
    if held is not None:
        yield held, True


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
