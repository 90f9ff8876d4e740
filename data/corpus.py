"""Load the corpus a DataConfig names: one function per source, chosen here and nowhere else."""

from pathlib import Path

from data.config import DataConfig
from data.documents import Corpus
from data.errors import DataError
from data.hub import load_hub
from data.shakespeare import load_shakespeare
from data.textfiles import load_text


def load_corpus(cfg: DataConfig, cache_root: Path) -> Corpus:
    """Return the train/validation documents of the source, checked to be non-empty."""
    if cfg.source == "shakespeare":
        corpus = load_shakespeare(cache_root, cfg.name)
    elif cfg.source == "hub":
        corpus = load_hub(cfg)
    elif cfg.source == "text":
        corpus = load_text(cfg)
    else:   # DataConfig validates the name; this guards configs built some other way
        raise DataError(f"data.source={cfg.source!r} is unknown; use shakespeare, hub or text.")
    for split, docs in (("train", corpus.train), ("validation", corpus.val)):
        if not any(d.strip() for d in docs):
            raise DataError(f"The {split} split of data={cfg.name} (source {cfg.source}) is "
                            "empty after reading; point the config at files or a split that "
                            "contain text.")
    return corpus
