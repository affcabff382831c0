"""Hashes of the tables every shipped scenario produces, to hold a kernel refactor to
bit-for-bit equal runs.

``python benchmarks/reference_runs.py record`` runs each ``params/scenarios/*.yaml``
(with its own seed, records on) and writes one SHA-256 per table to
``benchmarks/reference_runs.json``; ``... check`` runs them again and names every
table that differs. A hash covers a table's column names, dtypes and every value's
bytes (floats bit for bit), so a change of a single request's latency shows. Scenarios
slower than ``--max-s`` seconds when recorded are left out (and listed as such).
``record STEM...`` records only those scenarios and keeps the others' hashes (adding a
scenario needs no full run; a kernel change that moves tables is recorded in full).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
import warnings
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "params" / "scenarios"
STORE = Path(__file__).with_suffix(".json")
# run facts that are not the run's outcome (wall time, paths)
SKIP = {"info", "source", "shadow"}


def table_hash(df: pl.DataFrame) -> str:
    h = hashlib.sha256()
    for name in df.columns:
        s = df[name]
        h.update(f"{name}:{s.dtype};".encode())
        if s.dtype in (pl.Utf8, pl.Categorical, pl.Enum) or s.dtype.is_nested():
            h.update("\x1f".join("" if v is None else str(v) for v in s.to_list()).encode())
        else:
            h.update(s.is_null().to_numpy().tobytes())
            h.update(s.to_numpy().tobytes())
    return h.hexdigest()


def tables(obj, prefix: str = "") -> dict:
    """Every polars table reachable from a result, by a dotted name."""
    out = {}
    if isinstance(obj, pl.DataFrame):
        out[prefix] = table_hash(obj)
    elif isinstance(obj, list | tuple):
        for i, x in enumerate(obj):
            out |= tables(x, f"{prefix}[{i}]")
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.name not in SKIP:
                out |= tables(getattr(obj, f.name), f"{prefix}.{f.name}")
    elif hasattr(obj, "summary"):
        for name in ("requests", "metrics", "summary", "decisions", "timeline"):
            if name not in SKIP and hasattr(obj, name):
                out |= tables(getattr(obj, name), f"{prefix}.{name}")
    return out


def run(path: Path) -> tuple[dict, float]:
    from relakit import simulate

    t0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = simulate(path, workers=1)
    return tables(result, path.stem), time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("record", "check"))
    ap.add_argument("--max-s", type=float, default=20.0)
    ap.add_argument("only", nargs="*", help="scenario stems (default: all)")
    a = ap.parse_args()
    if a.mode == "record":  # (scenario stems given: theirs replaced, the others kept)
        store = json.loads(STORE.read_text()) if a.only else {"runs": {}, "slow": {}}
        for path in sorted(SCENARIOS.glob("*.yaml")):
            if a.only and path.stem not in a.only:
                continue
            hashes, cpu = run(path)
            print(f"{path.stem}: {len(hashes)} tables, {cpu:.1f} CPU s", flush=True)
            store["runs"].pop(path.stem, None)
            store["slow"].pop(path.stem, None)
            if cpu <= a.max_s:
                store["runs"][path.stem] = hashes
            else:
                store["slow"][path.stem] = round(cpu, 1)
        STORE.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
        return 0
    store = json.loads(STORE.read_text())
    bad = 0
    for stem, want in sorted(store["runs"].items()):
        if a.only and stem not in a.only:
            continue
        got, cpu = run(SCENARIOS / f"{stem}.yaml")
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        bad += bool(diff)
        print(f"{stem}: {'DIFFERS ' + ', '.join(diff) if diff else 'equal'} ({cpu:.1f} CPU s)",
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
