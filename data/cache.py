"""The token cache: one folder per (source identity, tokenizer settings) key.

    <cache_root>/tokens/<name>-<tokenizer>[<vocab>]-<key[:16]>/
        tokenizer.json            the tokenizer (train.py copies it into each run directory)
        train-00000.bin, ...      token ids in shards of `shard_tokens`, uint16 or uint32,
        val-00000.bin, ...        documents joined by EOT (data/shards.py)
        train_docs.bin, val_docs.bin   int64 start offset of each document in its split
        meta.json                 counts, shard sizes, content sha256, settings (written last)

A folder is built under a temporary name and renamed into place in one step, so a folder with
the final name is complete unless something changed it afterwards, which loading detects (every
file's size is checked against meta.json) and reports instead of rebuilding over it. An
interrupted build leaves only a temporary folder, which the next build under the lock removes.
"""

import json
import os
import shutil
from pathlib import Path

from data.shards import open_split
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


def is_complete(folder: Path) -> bool:
    """Every file meta.json lists is present with the size it says."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        for split in ("train", "val"):
            open_split(folder, split, meta)
        return (folder / "tokenizer.json").is_file()
    except (OSError, ValueError, KeyError, TypeError):   # DataError is a ValueError
        return False


def remove_leftovers(tokens_dir: Path, key: str) -> None:
    """Delete temporary folders of earlier interrupted builds of `key` (call under its lock)."""
    for old in tokens_dir.glob(f".{key}.*"):
        shutil.rmtree(old, ignore_errors=True)


def publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary folder into place."""
    os.rename(tmp, final)


def write_meta(folder: Path, meta: dict) -> None:
    path = folder / "meta.json"
    with open(path, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
