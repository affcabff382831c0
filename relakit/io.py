"""Writing results so that a crash never leaves a half-written file behind.

Every file is written under a temporary name in its own folder and renamed
into place; a rename within one file system is atomic, so a reader sees
either the old file or the whole new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` and rename the result to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)  # mkstemp makes 0600 files; give the usual 0666 & ~umask
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_parquet(df, path) -> Path:
    return atomic_write(path, lambda tmp: df.write_parquet(tmp))


def write_parquet_chunks(frames, path) -> Path:
    """One parquet file from frames of one schema, each a row group, none held after it is
    written: a long table goes to disk in the memory of one chunk."""
    import pyarrow.parquet as pq

    def write(tmp):
        writer = None
        try:
            for df in frames:
                table = df.to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema, compression="zstd")
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise ValueError(f"{path}: no frames to write (expected at least one, "
                             "possibly empty, to give the schema)")

    return atomic_write(path, write)


def write_json(obj, path) -> Path:
    def dump(tmp):
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=2, sort_keys=False, default=_jsonable)
            fh.write("\n")

    return atomic_write(path, dump)


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"cannot write {type(x).__name__} as JSON")
