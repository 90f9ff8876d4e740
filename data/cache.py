"""The token cache on disk, as data/build_cache.py writes it (docs/data.md "The token cache"):
token shards `<split>-<index>.bin` (documents joined by EOT), `<split>_docs.bin` (int64 document
starts), tokenizer.json and meta.json (counts, shard sizes, content sha256; written last)."""

import os
from pathlib import Path

import numpy as np

from model.errors import DataError

FORMAT_VERSION = 2


def default_cache_root(cache_dir=None) -> Path:
    """`cache_dir`, else $XDG_CACHE_HOME/attnscale, else ~/.cache/attnscale."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnscale"


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


class ShardedTokens:
    """A split's shards as one read-only 1-D token array of memmaps (the processes of a DDP job
    share the page cache): `len()`, `x[i]`, `x[a:b]` -> np.ndarray, across shard boundaries."""

    def __init__(self, paths: list[Path], sizes: list[int], dtype: str):
        self.dtype = np.dtype(dtype)
        self.shards = [np.memmap(p, dtype=self.dtype, mode="r", shape=(n,))
                       for p, n in zip(paths, sizes)]
        self.bounds = np.cumsum([0] + list(sizes))   # (n_shards + 1,) start of each shard

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def __getitem__(self, key):
        if not isinstance(key, slice):   # also what iterating over it calls
            i = range(len(self))[key]   # a negative index counts from the end; IndexError
            return self[i:i + 1][0]
        start, stop, step = key.indices(len(self))
        stop = max(start, stop)
        parts = [shard[max(start, lo) - lo:min(stop, hi) - lo]
                 for shard, lo, hi in zip(self.shards, self.bounds, self.bounds[1:])
                 if lo < stop and hi > start]
        if len(parts) == 1:   # a view, not a copy
            return np.asarray(parts[0])[::step]
        return (np.concatenate(parts) if parts else np.zeros(0, self.dtype))[::step]


def open_split(folder: Path, split: str, meta: dict) -> tuple[ShardedTokens, np.ndarray]:
    """The split's tokens and document starts, after checking every file meta.json lists."""
    info = meta["splits"][split]
    itemsize = np.dtype(meta["dtype"]).itemsize
    shards = [shard_name(split, i) for i in range(len(info["shards"]))]
    expected = [(name, n * itemsize) for name, n in zip(shards, info["shards"])]
    for name, size in expected + [(f"{split}_docs.bin", info["documents"] * 8)]:
        have = (folder / name).stat().st_size if (folder / name).is_file() else None
        if have != size:
            state = "is missing" if have is None else f"has {have} bytes instead of {size}"
            raise DataError(f"The token cache {folder} is damaged: {name} {state} (meta.json "
                            f"lists {len(shards)} {split} shards). Delete it (`rm -r {folder}`) "
                            "and run again to rebuild it. Other cache folders are not affected.")
    tokens = ShardedTokens([folder / s for s in shards], info["shards"], meta["dtype"])
    docs = np.memmap(folder / f"{split}_docs.bin", dtype=np.int64, mode="r",
                     shape=(info["documents"],)) if info["documents"] else np.zeros(0, np.int64)
    return tokens, docs
