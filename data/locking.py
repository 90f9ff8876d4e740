"""A cross-process file lock, for a cache shared by concurrent runs.

`fcntl.flock` on a lock file: the kernel releases it when the holder exits or crashes, so a
killed preparation never leaves a stale lock behind (an O_EXCL marker file would).
"""

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path):
    """Hold an exclusive lock on `path` (created if needed) for the duration of the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)   # blocks while another process prepares
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
