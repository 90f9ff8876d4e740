"""The `hub` source (data=wikitext103, data=tinystories, ...): corpora through the Hugging Face
`datasets` library (docs/data.md "Sources").
"""

import os
import re
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Optional

from data.config import DataConfig
from data.documents import Piece, chunked, record_pieces
from data.sources import file_identity
from model.errors import DataError

BATCH_ROWS = 1024          # hub splits are read this many rows at a time
_ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")   # wikitext level 1; level 2 is " = = x = = "

# hub: corpora through `datasets.load_dataset`, which applies its own offline and proxy settings.
# `hub_id` is a dataset id pinned to a `hub_revision` (the cache key holds no content), or a local
# folder laid out like a hub dataset. Splits are opened when first read, never on a cached start.
_SPLIT = re.compile(r"^([\w.-]+)(?:\[(\d*):(\d*)\])?$")   # name, or name[lo:hi]


class HubSource:
    def __init__(self, cfg: DataConfig):
        self.cfg, self.local = cfg, os.path.isdir(cfg.hub_id)
        if not self.local and not cfg.hub_revision:
            raise DataError(f"data.hub_id={cfg.hub_id!r} has no data.hub_revision: pin it to a "
                            "commit sha from the dataset page's 'Files and versions' (or a ref "
                            "such as refs/convert/parquet), so its token cache always holds the "
                            "same text.")
        self.splits = {}
        for split in ("train", "val"):
            spec = getattr(cfg, f"{split}_split")
            m = _SPLIT.match(spec)
            if not m:
                raise DataError(f"data.{split}_split={spec!r} is not a split name or a row "
                                "slice; use e.g. validation, train[:10000] or train[10000:].")
            self.splits[split] = m.group(1), *(int(x) if x else None for x in m.group(2, 3))
        self.info = {k: getattr(cfg, k) for k in ("hub_id", "hub_config", "hub_revision",
                                                  "streaming", "train_split", "val_split")}

    def identity(self) -> dict:
        ident = dict(self.info, text_field=self.cfg.text_field)
        if self.local:   # a folder has no revision: its files' identities stand for it
            files = sorted(p for p in Path(self.cfg.hub_id).rglob("*")
                           if p.is_file() and ".cache" not in p.parts)
            ident["files"] = [file_identity(p) for p in files]
        return ident

    def size(self, split: str) -> Optional[int]:
        """Arrow bytes of a downloaded split; None when streaming."""
        ds = self._split(split)
        return ds.data.nbytes if hasattr(ds, "data") else None

    def pieces(self, split: str) -> Iterator[Piece]:
        rows = (row for batch in self._split(split).iter(batch_size=BATCH_ROWS)
                for row in batch[self.cfg.text_field])
        if self.cfg.document == "article":
            yield from article_pieces(rows)
        else:
            for row in rows:
                yield from record_pieces(chunked(row), self.cfg.document)

    @cached_property
    def _dict(self):
        """The DatasetDict (IterableDatasetDict when streaming) of the dataset, opened once."""
        import datasets  # imported here: it is slow to import and only hub sources use it
        cfg = self.cfg
        try:
            return datasets.load_dataset(cfg.hub_id, cfg.hub_config, streaming=cfg.streaming,
                                         revision=None if self.local else cfg.hub_revision)
        except Exception as e:   # datasets raises many types (ConnectionError, HfHub...)
            where = ("HF_HUB_OFFLINE is set, so only the local Hugging Face cache was searched"
                     if datasets.config.HF_HUB_OFFLINE else "endpoint " + os.environ.get(
                         "HF_ENDPOINT", "https://huggingface.co") + "; set HF_ENDPOINT for a "
                     "mirror, HTTPS_PROXY for a proxy, or HF_HUB_OFFLINE=1")
            raise DataError(
                f"Could not load dataset {cfg.hub_id!r} (config {cfg.hub_config!r}, revision "
                f"{cfg.hub_revision!r}) for data={cfg.name}: {' '.join(str(e).split())[:300]} "
                f"({where}). Check the id and revision on the dataset page; to train without "
                "the hub, use data=text, or set data.hub_id to a local folder laid out like a "
                "hub dataset (README.md `configs:` block + parquet files).") from None

    def _split(self, split: str):
        (name, lo, hi), field = self.splits[split], self.cfg.text_field
        if name not in self._dict:
            raise DataError(f"Dataset {self.cfg.hub_id!r} has no split {name!r} (it has "
                            f"{sorted(self._dict)}); set data.{split}_split to one of them, or "
                            "to a row slice of one, e.g. train[:10000].")
        ds = self._dict[name]
        if ds.column_names is not None and field not in ds.column_names:   # None: unpublished
            raise DataError(f"Split {name!r} of {self.cfg.hub_id!r} has no column {field!r} "
                            f"(it has {ds.column_names}); set data.text_field.")
        ds = ds.select_columns([field])
        ds = ds.skip(lo) if lo else ds
        return ds.take(hi - (lo or 0)) if hi is not None else ds


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
