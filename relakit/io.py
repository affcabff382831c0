"""Writing results so that a crash never leaves a half-written file behind.

Every file is written under a temporary name in its own folder and renamed
into place; a rename within one file system is atomic, so a reader sees
either the old file or the whole new one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path


def folder_name(name: str) -> str:
    """A run's name as one safe folder name: ``out/<name>`` stays inside ``out/`` whatever
    the file says (``../x``, ``a/b``, ``~``). Letters, digits, ``.``, ``_`` and ``-`` are
    kept; any other run of characters becomes ``-``; leading dots and dashes go."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).lstrip(".-")
    return safe or "run"


def atomic_write(path: str | os.PathLike, write: Callable[[str], None],
                 mode: int | None = None) -> Path:
    """Call ``write(tmp_path)`` and rename the result to ``path``; ``mode`` (e.g.
    0o600 for a file holding a secret) instead of the usual 0666 & ~umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        if mode is None:
            umask = os.umask(0)  # mkstemp makes 0600 files; give the usual 0666 & ~umask
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_parquet(df, path) -> Path:
    """A polars frame, or a pyarrow table (zstd, as polars writes), to ``path``."""
    if hasattr(df, "write_parquet"):
        return atomic_write(path, lambda tmp: df.write_parquet(tmp))
    import pyarrow.parquet as pq

    return atomic_write(path, lambda tmp: pq.write_table(df, tmp, compression="zstd"))


def write_parquet_chunks(frames, path) -> Path:
    """One parquet file from a stream of frames of one schema, none held after it is written.

    polars' streaming sink pulls the frames one at a time (through its IO-source
    hook), so a long table goes to disk in the memory of about one frame.
    """
    frames = iter(frames)
    try:
        from polars.io.plugins import register_io_source
    except ImportError:  # an older polars without IO sources: one frame, as before
        import polars as pl

        return write_parquet(pl.concat(list(frames)), path)
    first = next(frames, None)
    if first is None:
        raise ValueError(f"{path}: no frames to write (expected at least one, possibly "
                         "empty, to give the schema)")
    schema, pending = first.schema, [first]
    del first

    def source(with_columns, predicate, n_rows, batch_size):
        if not pending:  # a second pull would find the stream spent: never write half
            raise RuntimeError(f"{path}: the frames were already consumed")
        for df in itertools.chain([pending.pop()], frames):
            if with_columns is not None:
                df = df.select(with_columns)
            if predicate is not None:
                df = df.filter(predicate)
            yield df

    lazy = register_io_source(source, schema=schema)
    return atomic_write(path, lambda tmp: lazy.sink_parquet(tmp))


def write_json(obj, path, mode: int | None = None) -> Path:
    def dump(tmp):
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=2, sort_keys=False, default=_jsonable)
            fh.write("\n")

    return atomic_write(path, dump, mode)


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"cannot write {type(x).__name__} as JSON")
