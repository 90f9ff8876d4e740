"""Open the source a DataConfig names: one class per source, chosen here and nowhere else.

A source gives the pipeline four things: `identity()` (cheap facts that fix its text, for the
cache key), `pieces(split)` (the split streamed as document pieces, data/documents.py),
`size(split)` (bytes, for the progress bar and the BPE sample; None when unknown) and `info`
(facts recorded in meta.json). Opening a source reads no text.
"""

from pathlib import Path

from data.config import DataConfig
from data.hub import HubSource
from data.shakespeare import ShakespeareSource
from data.textfiles import TextSource
from model.errors import DataError


def open_source(cfg: DataConfig, cache_root: Path):
    if cfg.source == "shakespeare":
        return ShakespeareSource(cache_root, cfg.name)
    if cfg.source == "hub":
        return HubSource(cfg)
    if cfg.source == "text":
        return TextSource(cfg)
    # DataConfig validates the name; this guards configs built some other way
    raise DataError(f"data.source={cfg.source!r} is unknown; use shakespeare, hub or text.")
