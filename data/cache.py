"""The token cache on disk: one folder per (source identity, tokenizer settings) key.

    <cache_root>/tokens/<name>-<tokenizer>[<vocab>]-<key[:16]>/
        tokenizer.json            the tokenizer (train.py copies it into each run directory)
        train-00000.bin, ...      token ids in shards of `shard_tokens` (the last one shorter),
        val-00000.bin, ...        uint16 or uint32, documents joined by EOT
        train_docs.bin, val_docs.bin   int64 start offset of each document in its split
        meta.json                 counts, shard sizes, content sha256, settings (written last)

A folder is built under a temporary name and renamed into place (data/prepare.py), so one with
the final name is complete; a later change to it is found when it is loaded (every file's size
is checked against meta.json) and reported, never rebuilt over. `ShardedTokens` maps the shards
read-only (all processes of a DDP job share the page cache) as one 1-D array: `len()`, `x[i]`,
`x[a:b]` -> np.ndarray, across shard boundaries.
"""

import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from model.errors import DataError

FORMAT_VERSION = 2


def default_cache_root(cache_dir=None) -> Path:
    """`cache_dir`, else $XDG_CACHE_HOME/attnscale, else ~/.cache/attnscale."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnscale"


def exists(folder: Path) -> bool:
    """Whether a finished cache folder is there (its files are checked when it is loaded)."""
    if not folder.exists():
        return False
    if not (folder / "meta.json").is_file():
        raise DataError(f"The token cache {folder} has no meta.json: it was changed after it "
                        f"was built. Delete it (`rm -r {folder}`) and run again to rebuild it.")
    return True


def remove_leftovers(tokens_dir: Path, key: str) -> None:
    """Delete temporary folders of earlier interrupted builds of `key` (call under its lock)."""
    for old in tokens_dir.glob(f".{key}.*"):
        shutil.rmtree(old, ignore_errors=True)


def write_meta(folder: Path, meta: dict) -> None:
    path = folder / "meta.json"
    with open(path, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def file_lock(path: Path):
    """Hold an exclusive lock on `path` (created if needed) for the duration of the block.

    `fcntl.flock`: the kernel releases it when the holder exits or crashes, so a killed
    preparation never leaves a stale lock behind (an O_EXCL marker file would)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)   # blocks while another process prepares
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


class ShardWriter:
    """Append token ids (and document starts) to a split's shard files, in order."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int):
        self.folder, self.split, self.dtype = folder, split, np.dtype(dtype)
        self.shard_tokens, self.shard_sizes = shard_tokens, []   # tokens in each shard so far
        self.n_tokens = self.n_docs = 0
        self._file, self._docs = None, open(folder / f"{split}_docs.bin", "wb")

    def write(self, ids: np.ndarray, doc_starts: np.ndarray) -> None:
        """`ids` continue the split; `doc_starts` are the documents starting in them (offsets
        into the split)."""
        self._docs.write(np.asarray(doc_starts, dtype=np.int64).tobytes())
        self.n_docs += len(doc_starts)
        ids = np.asarray(ids, dtype=self.dtype)
        while len(ids):
            if self._file is None or self.shard_sizes[-1] == self.shard_tokens:   # next shard
                self._close(self._file)
                self._file = open(self.folder / shard_name(self.split, len(self.shard_sizes)), "wb")
                self.shard_sizes.append(0)
            room = self.shard_tokens - self.shard_sizes[-1]
            part, ids = ids[:room], ids[room:]
            self._file.write(part.tobytes())
            self.shard_sizes[-1] += len(part)
            self.n_tokens += len(part)

    def close(self) -> None:
        self._close(self._file)
        self._close(self._docs)

    @staticmethod
    def _close(f) -> None:
        if f is not None and not f.closed:
            f.flush()
            os.fsync(f.fileno())
            f.close()


class ShardedTokens:
    """A split's shards as one read-only 1-D token array (see the module docstring)."""

    def __init__(self, paths: list[Path], sizes: list[int], dtype: str):
        self.dtype = np.dtype(dtype)
        self.shards = [np.memmap(p, dtype=self.dtype, mode="r", shape=(n,))
                       for p, n in zip(paths, sizes)]
        self.bounds = np.cumsum([0] + list(sizes))   # (n_shards + 1,) start of each shard

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self[start:stop][::step]
            return self._range(start, max(start, stop))
        i = int(key) + len(self) if int(key) < 0 else int(key)
        if not 0 <= i < len(self):
            raise IndexError(f"token index {key} out of range for {len(self)} tokens")
        s = int(np.searchsorted(self.bounds, i, side="right")) - 1
        return self.shards[s][i - self.bounds[s]]

    def _range(self, start: int, stop: int) -> np.ndarray:
        parts = [shard[max(start, lo) - lo:min(stop, hi) - lo]
                 for shard, lo, hi in zip(self.shards, self.bounds, self.bounds[1:])
                 if lo < stop and hi > start]
        if len(parts) == 1:
            return np.asarray(parts[0])
        return np.concatenate(parts) if parts else np.zeros(0, self.dtype)


def open_split(folder: Path, split: str, meta: dict) -> tuple[ShardedTokens, np.ndarray]:
    """The split's tokens and document starts, after checking every file meta.json lists."""
    info = meta["splits"][split]
    itemsize = np.dtype(meta["dtype"]).itemsize
    expected = [(shard_name(split, i), n * itemsize) for i, n in enumerate(info["shards"])]
    expected.append((f"{split}_docs.bin", info["documents"] * 8))
    for name, size in expected:
        path = folder / name
        have = path.stat().st_size if path.is_file() else None
        if have != size:
            state = "is missing" if have is None else f"has {have} bytes instead of {size}"
            raise DataError(
                f"The token cache {folder} is damaged: {name} {state} (meta.json lists "
                f"{len(info['shards'])} {split} shards). The folder was changed after it was "
                f"built; delete it (`rm -r {folder}`) and run again to rebuild it. Other cache "
                "folders are not affected.")
    tokens = ShardedTokens([folder / shard_name(split, i) for i in range(len(info["shards"]))],
                           info["shards"], meta["dtype"])
    docs = np.memmap(folder / f"{split}_docs.bin", dtype=np.int64, mode="r",
                     shape=(info["documents"],)) if info["documents"] else np.zeros(0, np.int64)
    return tokens, docs
