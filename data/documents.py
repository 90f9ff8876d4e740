"""A corpus as the rest of the pipeline sees it: two lists of documents and a fingerprint.

Every source (shakespeare.py, hub.py, textfiles.py) returns a `Corpus`. A document is the unit
the padded batching mode never crosses: a work, a story, an article, a line, a file.
"""

import hashlib
import re
from dataclasses import dataclass, field

from data.errors import DataError


@dataclass(frozen=True)
class Corpus:
    name: str
    document: str              # what one document is (work / row / article / line / ...)
    train: list[str]
    val: list[str]
    info: dict = field(default_factory=dict)   # source-specific facts recorded in meta.json

    def fingerprint(self) -> str:
        """sha256 over every document of both splits, with split and document boundaries."""
        h = hashlib.sha256()
        for split, docs in (("train", self.train), ("val", self.val)):
            h.update(f"\0split:{split}:{len(docs)}\0".encode())
            for doc in docs:
                data = doc.encode("utf-8")
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
        return h.hexdigest()


def normalise(text: str) -> str:
    """Unix line endings, no trailing spaces, at most one blank line in a row, one final newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n" if text.strip() else ""


def decode_utf8(data: bytes, where: str) -> str:
    """Decode bytes as UTF-8 or raise a DataError naming the file and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{where} is not valid UTF-8: byte offset {e.start} holds 0x{data[e.start]:02x} "
            f"({e.reason}). Convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or "
            "remove it from the file list."
        ) from None


# A wikitext article starts at a level-1 heading line " = Title = " (level 2 is " = = x = = ").
_ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")


def split_documents(texts: list[str], document: str) -> list[str]:
    """Turn source records into documents: as they are, by line, by paragraph or by article."""
    if document in ("row", "file", "work"):
        docs = list(texts)
    elif document == "line":
        docs = [line for t in texts for line in t.split("\n")]
    elif document == "paragraph":
        docs = [p for t in texts for p in re.split(r"\n\s*\n", t)]
    elif document == "article":
        docs = _group_articles(texts)
    else:
        raise DataError(f"document kind {document!r} is unknown; use row, line, paragraph, "
                        "article, file or work.")
    return [d for d in docs if d.strip()]


def _group_articles(rows: list[str]) -> list[str]:
    """Join wikitext-style rows (one line each) into articles at each level-1 heading."""
    articles: list[list[str]] = []
    for row in rows:
        if _ARTICLE_HEADING.match(row.rstrip("\n")) or not articles:
            articles.append([])
        articles[-1].append(row)
    return ["".join(a) for a in articles]
