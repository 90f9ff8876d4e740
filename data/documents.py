"""Text as the pipeline streams it: pieces of documents, cut where tokenization allows.

Every source (shakespeare.py, hub.py, textfiles.py) yields, per split, a stream of
`(text, ends)` pieces: `text` continues the current document and `ends` closes it. A document
is the unit the padded batching mode never crosses (a work, a story, an article, a line, a
file); a large one arrives as several pieces, so no source ever holds a whole corpus.

Pieces of one document are cut only at a *safe cut*: after a newline that follows a
non-space character and precedes one (`x\\n|y`), else before a single space between two
non-space characters (`x| y`). Byte-level BPE pre-tokenizes with GPT-2's pattern, whose tokens
never span such a cut, so encoding the pieces one by one gives exactly the ids of encoding
the whole document; normalisation (below) never matches across one either. Only a stretch of
`CUT_WINDOW` characters without a safe cut (no space between words: a minified file, a long
URL) is cut elsewhere, between two non-space characters: exact for `char`, while for `bpe` it
can split one pre-token in two.
"""

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from model.errors import DataError

Piece = tuple[str, bool]   # (text continuing the current document, whether it ends it)
CHUNK_CHARS = 1 << 20      # pieces are about this long; the tokenizers encode them in parallel
CUT_WINDOW = 1 << 16       # how far back from the end of a buffer a safe cut is looked for
_SAFE_CUT = re.compile(r"\S\n(?=\S)|\S(?= \S)")
_NON_SPACE_PAIR = re.compile(r"\S(?=\S)")   # the fallback: no whitespace rule can match here


def safe_cut(text: str) -> int:
    """The last safe cut in `text` (see the module docstring), 0 when it has none."""
    for pattern in (_SAFE_CUT, _NON_SPACE_PAIR):
        for window in (1 << 10, CUT_WINDOW):   # most text has a cut in its last kilobyte
            last = None
            for match in pattern.finditer(text, max(0, len(text) - window)):
                last = match
            if last is not None and (pattern is _SAFE_CUT or len(text) >= CUT_WINDOW):
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


def exact_pieces(text: str, size: int) -> list[str]:
    """`text` cut at the first safe cut after every `size` characters, never anywhere else:
    BPE encodes these pieces to exactly the ids of the whole text."""
    out, start = [], 0
    while len(text) - start > 2 * size:
        m = _SAFE_CUT.search(text, start + size)
        if m is None:
            break
        out.append(text[start:m.end()])
        start = m.end()
    out.append(text[start:])
    return out


@dataclass(frozen=True)
class Corpus:
    """A corpus small enough to hold in memory (the default Shakespeare): lists of documents."""

    name: str
    document: str              # what one document is (work / row / article / line / ...)
    train: list[str]
    val: list[str]
    info: dict = field(default_factory=dict)   # source-specific facts recorded in meta.json

    def pieces(self, split: str) -> Iterator[Piece]:
        for doc in self.train if split == "train" else self.val:
            yield from record_pieces(chunked(doc), "row")

    def size(self, split: str) -> int:
        return sum(len(d.encode("utf-8")) for d in (self.train if split == "train" else self.val))


def normalise(text: str) -> str:
    """Unix line endings, no trailing spaces, at most one blank line in a row, one final newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n" if text.strip() else ""


def normalise_stream(chunks: Iterable[str]) -> Iterator[str]:
    """`normalise` of the concatenation of safe-cut chunks, chunk by chunk."""
    started, held = False, ""
    for chunk in chunks:
        text = _normalise_chunk(chunk)
        if not started:
            text = text.lstrip("\n")
            started = bool(text)
        if text:
            if held:
                yield held
            held = text
    if held.strip():
        yield held.rstrip("\n") + "\n"


def _normalise_chunk(text: str) -> str:
    """`normalise`'s three rewrites, each skipped when a plain search finds nothing to do
    (a regex that may start at every space costs more than the rest of preparation)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if " \n" in text or "\t\n" in text:
        lines = text.split("\n")
        text = "\n".join([line.rstrip(" \t") for line in lines[:-1]] + lines[-1:])
    if "\n\n\n" in text:
        text = _BLANK_RUN.sub("\n\n", text)
    return text


def decode_utf8(data: bytes, where: str, offset: int = 0) -> str:
    """Decode bytes as UTF-8 or raise a DataError naming the file and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{where} is not valid UTF-8: byte offset {offset + e.start} holds "
            f"0x{data[e.start]:02x} ({e.reason}). Convert the file to UTF-8 (e.g. `iconv -f "
            "latin1 -t utf-8`) or remove it from the file list."
        ) from None


# A wikitext article starts at a level-1 heading line " = Title = " (level 2 is " = = x = = ").
_BLANK_RUN = re.compile(r"\n{3,}")
_ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def record_pieces(chunks: Iterable[str], document: str) -> Iterator[Piece]:
    """The pieces of one record (a file, a hub row, a work) given as safe-cut chunks.

    row / file / work: the record is one document. line: each line is one. paragraph: blank
    lines separate them. Safe cuts never fall inside a line break run, so a chunk that does not
    end with a newline continues its last line or paragraph into the next chunk.
    """
    if document in ("row", "file", "work"):
        held = None
        for chunk in chunks:
            if held is not None:
                yield held, False
            held = chunk
        if held is not None:
            yield held, True
        return
    if document not in ("line", "paragraph"):
        raise DataError(f"document kind {document!r} is unknown; use row, line, paragraph, "
                        "article, file or work.")
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


def split_documents(texts: list[str], document: str) -> list[str]:
    """The documents of in-memory records, as the streaming pieces would form them."""
    pieces = article_pieces(texts) if document == "article" else (
        p for t in texts for p in record_pieces(chunked(t), document))
    docs, current = [], []
    for text, ends in pieces:
        current.append(text)
        if ends:
            docs.append("".join(current))
            current = []
    return [d for d in docs if d.strip()]


def stream_digest(pieces: Iterable[Piece]) -> str:
    """sha256 over the text of a piece stream with its document boundaries."""
    h = hashlib.sha256()
    for text, ends in pieces:
        h.update(text.encode("utf-8"))
        if ends:
            h.update(b"\xff")   # never part of UTF-8 text: an unambiguous boundary marker
    return h.hexdigest()
