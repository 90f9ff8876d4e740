"""The run directory's plain files, without torch (the report reads them too)."""

import json
import os
from pathlib import Path
from typing import Any

from model.errors import UserError


def atomic_write(path: Path, write: Any) -> None:
    """Call write(file) on a temporary file next to `path`, fsync it, then rename it over."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path: Path, obj: dict) -> None:
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def read_metrics(path: Path) -> list[dict]:
    """The records of metrics.jsonl. A last line that is not JSON was torn by a kill mid-write
    and is dropped (its step is redone on resume); a bad line elsewhere is reported."""
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records += [json.loads(line)] if line.strip() else []
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise UserError(f"{path} line {number} is not JSON, and only a last line can be torn "
                            "by an interrupted write. Repair or delete that line, or start a new "
                            "run without trainer.resume.") from None
    return records


def display_path(path: Path) -> str:
    """`path` relative to the working directory when inside it, else absolute."""
    inside = path.resolve().is_relative_to(Path.cwd().resolve())
    return os.path.relpath(path) if inside else str(path)

