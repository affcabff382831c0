"""Replications: the seeds of independent runs, and their summaries folded into intervals.

One seeded run is one draw; a number worth quoting is a mean over independent
replications with its Student t half-width. This module is the one place that
says how replication seeds are made and how per-replication summary tables
become one table of means and ``<name>_ci`` half-widths, so ``simulate``,
``compare``, sweeps and figures agree. It imports neither numba nor the kernel.

Seeds: replication ``i`` of a scenario with seed ``s`` runs with
``replication_seeds(s, n)[i]``, from ``numpy.random.SeedSequence(s).spawn(n)``;
a spawned child depends only on ``s`` and ``i``, so the first ``k`` seeds do
not change when ``n`` grows, and any replication can be rerun alone with
``relakit simulate --seed SEED``. With ``n == 1`` the scenario's own seed is
used unchanged, so a single run is the run it always was.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from relakit.stats import t_interval

__all__ = ["CI_SUFFIX", "replication_seeds", "summarise_replications"]

CI_SUFFIX = "_ci"  # column of a number's 95 % half-width: `p99_ms` -> `p99_ms_ci`


def replication_seeds(seed: int, n: int) -> list[int]:
    """Seeds of replications ``0 .. n-1`` (see the module docstring): 63-bit integers."""
    n = int(n)
    if n < 1:
        raise ValueError(f"replications: must be an integer >= 1, got {n}")
    if n == 1:
        return [int(seed)]
    children = np.random.SeedSequence(int(seed)).spawn(n)
    return [int(c.generate_state(1, np.uint64)[0] >> np.uint64(1)) for c in children]


def summarise_replications(runs: pl.DataFrame, by: str | list[str] = "tier",
                           confidence: float = 0.95) -> pl.DataFrame:
    """Per group, every numeric column's mean over replications and its ``_ci`` half-width.

    ``runs`` has one row per replication and group (a ``replication`` column,
    optional ``seed``, the ``by`` keys, the numbers). The result keeps the ``by``
    keys, gives each number its mean under its own name and its Student t
    half-width as ``<name>_ci`` (``nan`` with one replication, or where a
    replication has no value, e.g. a quantile of a tier that served nothing),
    and ``replications``: how many rows the group had. Rows keep the first-seen
    order of the groups.
    """
    keys = [by] if isinstance(by, str) else list(by)
    skip = set(keys) | {"replication", "seed"}
    numbers = [c for c, t in runs.schema.items() if c not in skip and t.is_numeric()]
    out = []
    for group in runs.select(keys).unique(maintain_order=True).iter_rows(named=True):
        sel = runs
        for k, v in group.items():
            sel = sel.filter(pl.col(k) == v)
        row = dict(group)
        for c in numbers:
            x = sel[c].cast(pl.Float64).to_numpy()
            if x.size and np.all(np.isfinite(x)):
                iv = t_interval(x, confidence)
                row[c], row[c + CI_SUFFIX] = iv.mean, iv.half_width
            else:
                finite = x[np.isfinite(x)]
                row[c] = float(finite.mean()) if finite.size else float("nan")
                row[c + CI_SUFFIX] = float("nan")
        row["replications"] = sel.height
        out.append(row)
    return pl.DataFrame(out)
