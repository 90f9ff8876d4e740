"""The token cache: one folder per (corpus content, tokenizer settings) fingerprint.

    <cache_root>/tokens/<name>-<tokenizer>[<vocab>]-<fingerprint[:16]>/
        tokenizer.json            the tokenizer (train.py copies it into each run directory)
        train.bin, val.bin        flat token ids, uint16 or uint32, documents joined by EOT
        train_docs.npy, val_docs.npy   int64 start offset of each document in the .bin file
        meta.json                 counts, bytes per token, settings (written last)

A folder is built under a temporary name and renamed into place in one step, so a folder with
the final name is always complete; an interrupted build leaves only a temporary folder, which
the next build under the lock removes.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
FILES = ("tokenizer.json", "train.bin", "val.bin", "train_docs.npy", "val_docs.npy", "meta.json")


def default_cache_root(cache_dir=None) -> Path:
    """`cache_dir`, else $XDG_CACHE_HOME/attnscale, else ~/.cache/attnscale."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnscale"


def is_complete(folder: Path) -> bool:
    """Every file present and each .bin exactly as long as meta.json says."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        return all((folder / f).is_file() for f in FILES) and all(
            (folder / f"{s}.bin").stat().st_size == meta["splits"][s]["tokens"] * itemsize
            for s in ("train", "val"))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_tokens(folder: Path, split: str, meta: dict) -> np.ndarray:
    """The split's ids as a read-only memmap (no copy into memory)."""
    return np.memmap(folder / f"{split}.bin", dtype=meta["dtype"], mode="r",
                     shape=(meta["splits"][split]["tokens"],))


def remove_leftovers(tokens_dir: Path, key: str) -> None:
    """Delete temporary folders of earlier interrupted builds of `key` (call under its lock)."""
    for old in tokens_dir.glob(f".{key}.*"):
        shutil.rmtree(old, ignore_errors=True)


def publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary folder into place, replacing an incomplete one if present."""
    if final.exists():   # incomplete (is_complete was False under the lock): set it aside first
        stale = final.with_name(f".{final.name}.stale-{os.getpid()}")
        os.rename(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.rename(tmp, final)


def write_meta(folder: Path, meta: dict) -> None:
    path = folder / "meta.json"
    with open(path, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
