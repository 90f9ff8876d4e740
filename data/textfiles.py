"""The `text` source: your own UTF-8 files, given as paths or globs for each split.

Without `val_files`, the last `val_fraction` of the characters becomes the validation split
(whole documents from the end, and the last line-aligned part of one more if needed), so the
split is deterministic and never shuffles text between runs.
"""

import glob
import os
from pathlib import Path

from data.documents import Corpus, decode_utf8, normalise, split_documents
from data.errors import DataError


def load_text(cfg) -> Corpus:
    train_paths = expand(cfg.train_files, "train_files")
    train = _read_documents(train_paths, cfg.document)
    if cfg.val_files:
        val_paths = expand(cfg.val_files, "val_files")
        val = _read_documents(val_paths, cfg.document)
    else:
        val_paths = []
        train, val = split_tail(train, cfg.val_fraction)
    info = {"train_files": [str(p) for p in train_paths], "val_files": [str(p) for p in val_paths],
            "val_fraction": None if cfg.val_files else cfg.val_fraction}
    return Corpus(name=cfg.name, document=cfg.document, train=train, val=val, info=info)


def expand(patterns: list[str], field: str) -> list[Path]:
    """Every pattern must match at least one file; results are sorted per pattern."""
    paths = []
    for pattern in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        files = [Path(h) for h in hits if os.path.isfile(h)]
        if not files:
            raise DataError(f"data.{field} entry {pattern!r} matches no file (current folder "
                            f"{os.getcwd()}). Check the path, or use an absolute path; Hydra "
                            "runs from the repository root.")
        paths.extend(files)
    return paths


def _read_documents(paths: list[Path], document: str) -> list[str]:
    texts = [normalise(decode_utf8(p.read_bytes(), str(p))) for p in paths]
    return split_documents(texts, document)


def split_tail(docs: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """Move the last `fraction` of the characters into a validation list of documents."""
    want = int(round(fraction * sum(len(d) for d in docs)))
    train, val = list(docs), []
    while train and want > 0:
        last = train.pop()
        if len(last) <= want:
            val.insert(0, last)
            want -= len(last)
            continue
        cut = last.rfind("\n", 0, len(last) - want) + 1 or len(last) - want
        train.append(last[:cut])
        val.insert(0, last[cut:])
        break
    return [d for d in train if d.strip()], [d for d in val if d.strip()]
