"""Hub corpora (tinyshakespeare, wikitext, TinyStories, FineWeb-Edu) through `datasets`.

`hub_id` is a hub dataset id or a local folder laid out like a hub dataset repository (a
README.md whose YAML header has a `configs:` block, plus data files); both go through
`datasets.load_dataset`, which applies its own offline and proxy settings (`HF_HUB_OFFLINE=1`:
only the local Hugging Face cache; `HF_ENDPOINT`: a mirror; `HTTPS_PROXY`/`HTTP_PROXY`).

A hub id must name a `hub_revision` (a commit sha or a ref such as `refs/convert/parquet`), so
the cache key, which holds the id, config and revision but no content, names fixed text. A
dataset published only as a loading script loads with `datasets` >= 4 from its parquet export,
revision `refs/convert/parquet`. Splits are read in batches of `BATCH_ROWS` rows of the text
column (never as one materialised column); `streaming: true` iterates over the network without
downloading the dataset first. A split may be a row slice, `train[:10000]` or `train[10000:]`,
for datasets that publish only a training split.

Nothing here runs on a cached start: the dataset is opened when a split is first read.
"""

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from data.documents import Piece, article_pieces, chunked, record_pieces
from data.textfiles import file_identity
from model.errors import DataError

BATCH_ROWS = 1024
_SPLIT = re.compile(r"^([\w.-]+)(?:\[(\d*):(\d*)\])?$")


class HubSource:
    def __init__(self, cfg):
        self.cfg, self.name, self.document = cfg, cfg.name, cfg.document
        self.local = os.path.isdir(cfg.hub_id)
        if not self.local and not cfg.hub_revision:
            raise DataError(
                f"data.hub_id={cfg.hub_id!r} has no data.hub_revision: a hub dataset must be "
                "pinned to a commit sha (or a ref such as refs/convert/parquet for a dataset "
                "published as a loading script), so that the token cache, keyed by id, config "
                "and revision, always holds the same text. Set data.hub_revision=<sha> (the "
                "dataset page lists its commits under 'Files and versions').")
        self.splits = {"train": parse_split(cfg.train_split, "train_split"),
                       "val": parse_split(cfg.val_split, "val_split")}
        self.info = {"hub_id": cfg.hub_id, "hub_config": cfg.hub_config,
                     "hub_revision": cfg.hub_revision, "streaming": cfg.streaming,
                     "train_split": cfg.train_split, "val_split": cfg.val_split}
        self._dict = None

    def identity(self) -> dict:
        ident = dict(self.info, text_field=self.cfg.text_field)
        if self.local:   # a folder has no revision: its files' identities stand for it
            files = sorted(p for p in Path(self.cfg.hub_id).rglob("*")
                           if p.is_file() and ".cache" not in p.parts)
            ident["files"] = [file_identity(p) for p in files]
        return ident

    def size(self, split: str) -> Optional[int]:
        """Arrow bytes of the text column of a downloaded split; None when streaming (then the
        BPE sample is the first bpe_sample_mb of the split, not a spread one)."""
        ds = self._split(split)
        return ds.data.nbytes if hasattr(ds, "data") else None

    def pieces(self, split: str) -> Iterator[Piece]:
        rows = (row for batch in self._split(split).iter(batch_size=BATCH_ROWS)
                for row in batch[self.cfg.text_field])
        if self.document == "article":
            yield from article_pieces(rows)
        else:
            for row in rows:
                yield from record_pieces(chunked(row), self.document)

    def _open(self):
        """The DatasetDict (IterableDatasetDict when streaming) of the dataset, once."""
        if self._dict is None:
            import datasets  # imported here: it is slow to import and only hub sources use it
            cfg = self.cfg
            try:
                self._dict = datasets.load_dataset(
                    cfg.hub_id, cfg.hub_config, revision=None if self.local else cfg.hub_revision,
                    streaming=cfg.streaming)
            except Exception as e:   # datasets raises many types (ConnectionError, HfHub...)
                raise load_error(cfg, e) from None
        return self._dict

    def _split(self, split: str):
        name, lo, hi = self.splits[split]
        field = f"data.{'train' if split == 'train' else 'val'}_split"
        ds = self._open()
        if name not in ds:
            raise DataError(f"Dataset {self.cfg.hub_id!r} has no split {name!r} (it has "
                            f"{sorted(ds)}); set {field} to one of them, or to a row slice "
                            "of one, e.g. train[:10000].")
        ds = ds[name]
        columns = ds.column_names   # None for a stream whose features are not published
        if columns is not None and self.cfg.text_field not in columns:
            raise DataError(f"Split {name!r} of {self.cfg.hub_id!r} has no column "
                            f"{self.cfg.text_field!r} (it has {columns}); set data.text_field.")
        ds = ds.select_columns([self.cfg.text_field])
        if lo is None and hi is None:
            return ds
        if hasattr(ds, "select"):   # map-style
            return ds.select(range(lo or 0, len(ds) if hi is None else min(hi, len(ds))))
        ds = ds.skip(lo) if lo else ds
        return ds.take(hi - (lo or 0)) if hi is not None else ds


def parse_split(spec: str, field: str) -> tuple[str, Optional[int], Optional[int]]:
    """'train' -> ('train', None, None); 'train[:100]' -> ('train', None, 100)."""
    m = _SPLIT.match(spec)
    if not m:
        raise DataError(f"data.{field}={spec!r} is not a split name or a row slice; use e.g. "
                        "validation, train[:10000] or train[10000:].")
    lo, hi = (int(x) if x else None for x in m.group(2, 3))
    return m.group(1), lo, hi


def load_error(cfg, e: Exception) -> DataError:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    try:
        import datasets
        offline = offline or bool(datasets.config.HF_HUB_OFFLINE)
    except ImportError:
        pass
    where = ("HF_HUB_OFFLINE is set, so only the local Hugging Face cache was searched, and it "
             "does not hold this dataset at this revision" if offline else
             f"the endpoint is {os.environ.get('HF_ENDPOINT', 'https://huggingface.co')}; set "
             "HF_ENDPOINT for a mirror, HTTPS_PROXY for a proxy, or HF_HUB_OFFLINE=1 to use "
             "only the local Hugging Face cache")
    return DataError(
        f"Could not load dataset {cfg.hub_id!r} (config {cfg.hub_config!r}, revision "
        f"{cfg.hub_revision!r}) for data={cfg.name}: {' '.join(str(e).split())[:300]} ({where}). "
        "Check the id and that the revision exists on the dataset page; to train without the "
        "hub, use data=text with data.train_files=[...], or set data.hub_id to a local folder "
        "laid out like a hub dataset (README.md `configs:` block + parquet files).")
