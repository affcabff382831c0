"""Two scenarios side by side: A, B and the paired difference, with their intervals.

``compare(a, b, replications=N)`` runs A and B N times each. With common
random numbers (``crn=True``, the default) replication ``i`` of A and of B run
on the *same* seed, so both see the same arrivals and service demands as far as
the kernel's random streams stay aligned; the difference ``B - A`` of each
pair then cancels most of the noise they share, and the paired t interval
(:func:`relakit.stats.paired_difference`) is narrower than the interval of two
independent samples. ``crn=False`` gives B seeds from a different spawn of the
same SeedSequence (children N..2N-1, A has 0..N-1): the honest baseline.

How much the pairing paid is ``variance_ratio = (var A + var B) / var(B - A)``
over the replications: the factor of replications independent seeds would
have needed for the same half-width (about 1 when the pairs share no noise).

The table has one row per tier and summary number: ``a``, ``a_ci``, ``b``,
``b_ci`` (means and 95 % half-widths), ``difference`` (mean of B - A),
``difference_ci``, ``difference_low``, ``difference_high``, ``significant``
(the interval excludes 0), ``variance_ratio`` and ``pairs``. A number with no
value in some replication (e.g. a quantile of a tier that served nothing) has
nulls in its difference columns.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl

from relakit.replications import CI_SUFFIX, ReplicatedResult, replication_seeds
from relakit.stats import paired_difference
from relakit.vocab import IN_PATH_OUTCOMES, NOT_OK

__all__ = ["COLUMNS", "DEFAULT_REPLICATIONS", "Comparison", "compare"]

#: replications when neither the call nor either scenario asks for more than one
DEFAULT_REPLICATIONS = 10
COLUMNS = ("tier", "number", "a", "a_ci", "b", "b_ci", "difference", "difference_ci",
           "difference_low", "difference_high", "significant", "variance_ratio", "pairs")
#: the numbers the console shows (the table has every summary number)
CONSOLE_NUMBERS = ("success_ratio", "mean_ms", "p50_ms", "p99_ms", "p999_ms", "amplification",
                   *NOT_OK)


class Comparison:
    """The comparison's table (:data:`COLUMNS`), and both sides' replicated results."""

    def __init__(self, table: pl.DataFrame, a: ReplicatedResult, b: ReplicatedResult,
                 info: dict):
        self.table, self.a, self.b, self.info = table, a, b, info

    def __repr__(self) -> str:
        return (f"Comparison(a={self.info['a']!r}, b={self.info['b']!r}, "
                f"replications={self.info['replications']}, crn={self.info['crn']})")

    def row(self, tier: str, number: str) -> dict:
        """One row of the table, by key."""
        sel = self.table.filter((pl.col("tier") == tier) & (pl.col("number") == number))
        if sel.height != 1:
            raise KeyError(f"no row for tier {tier!r} and number {number!r}")
        return sel.row(0, named=True)

    def format(self, tier: str = "all") -> str:
        """The console view of one tier: A, B and B - A as ``mean ± half-width``."""
        rows = self._rows(tier)
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) if k in (0, 4) else v.rjust(w)
                           for k, (v, w) in enumerate(zip(r, widths, strict=True)))
                 for r in rows]
        return "\n".join([self._head(tier), *lines])

    def _repr_html_(self) -> str:
        from relakit.display import html_view

        tiers = self.table["tier"].unique(maintain_order=True).to_list()
        return html_view(f"Comparison: {self.info['a']} vs {self.info['b']}",
                         [self._head("all")],
                         [(f"tier {t}", self._rows(t)) for t in ["all"] + [
                             t for t in tiers if t != "all"]],
                         ["cells: mean ± 95 % half-width; B - A paired by replication"])

    def _head(self, tier: str) -> str:
        i = self.info
        seeds = ("common random numbers (the same seeds for A and B)" if i["crn"] else
                 "independent seeds")
        return (f"A {i['a']}  vs  B {i['b']}: tier {tier}, {i['replications']} "
                f"replications each, {seeds}")

    def _rows(self, tier: str) -> list[list[str]]:
        """One tier's cells, the header first."""
        rows = [["number", "A", "B", "B - A (95 % paired)", "", "variance ratio"]]
        for number in CONSOLE_NUMBERS:
            sel = self.table.filter((pl.col("tier") == tier) & (pl.col("number") == number))
            if sel.height == 0:
                continue
            r = sel.row(0, named=True)
            d = _decimals(number, r)
            rows.append([number, _pm(r["a"], r["a_ci"], d), _pm(r["b"], r["b_ci"], d),
                         _pm(r["difference"], r["difference_ci"], d),
                         "significant" if r["significant"] else "not significant",
                         "-" if r["variance_ratio"] is None or not math.isfinite(
                             r["variance_ratio"]) else f"{r['variance_ratio']:.1f}"])
        return rows

    def write(self, out_dir) -> list[Path]:
        """compare.parquet (the table) and compare.json (info and rows), atomically."""
        from relakit.io import write_json, write_parquet

        out = Path(out_dir)
        return [write_parquet(self.table, out / "compare.parquet"),
                write_json({"info": self.info, "rows": self.table.to_dicts()},
                           out / "compare.json")]


def compare(a, b, replications: int | None = None, crn: bool = True, seed: int | None = None,
            workers: int | None = None, scheduler: str | None = None,
            progress=None) -> Comparison:
    """Run scenarios ``a`` and ``b`` (paths, dicts or :class:`~relakit.scenario.Scenario`)
    ``replications`` times each and compare every summary number, per tier.

    ``replications`` defaults to the larger of the scenarios' ``replications:``, or
    :data:`DEFAULT_REPLICATIONS` when both say 1 (a comparison of single runs has no
    interval). ``seed`` (default A's scenario seed) is the SeedSequence both sides'
    seeds are spawned from. Per-request records are never kept.
    """
    from relakit.checks import check_run, enforce
    from relakit.experiment import replication_count, run_replicated
    from relakit.scenario import load_scenario

    sa, sb = load_scenario(a), load_scenario(b)
    if replications is None:
        n = max(sa.replications, sb.replications)
        n = DEFAULT_REPLICATIONS if n == 1 else n
    else:
        n = replication_count(replications)
    if n < 2:
        raise ValueError(f"replications: a comparison needs at least 2, got {n}")
    enforce(check_run(sa, False))
    enforce(check_run(sb, False))
    base = sa.seed if seed is None else int(seed)
    if crn:
        seeds_a = seeds_b = replication_seeds(base, n)
    else:
        both = replication_seeds(base, 2 * n)
        seeds_a, seeds_b = both[:n], both[n:]
    ra, rb = run_replicated([(sa, base, seeds_a), (sb, base, seeds_b)], False, workers,
                            scheduler, progress)
    info = {"a": sa.source if sa.source != "<dict>" else sa.name,
            "b": sb.source if sb.source != "<dict>" else sb.name,
            "replications": n, "crn": bool(crn), "seed": base, "seeds_a": seeds_a,
            "seeds_b": seeds_b, "confidence": 0.95, "difference": "B - A, paired by replication",
            "wall_s": ra.info["wall_s"]}
    return Comparison(comparison_table(ra.runs, rb.runs), ra, rb, info)


def comparison_table(runs_a: pl.DataFrame, runs_b: pl.DataFrame) -> pl.DataFrame:
    """Per tier and number: means and half-widths of A and B, and the paired B - A.

    Rows pair by ``replication`` (its index, the same seed under CRN)."""
    skip = {"tier", "replication", "seed"}
    # an in-path outcome (issue 33) is a column only where a side has the mechanism: the
    # other side counts 0 of it, so the difference is shown, not dropped
    for o in IN_PATH_OUTCOMES:
        if (o in runs_a.columns) != (o in runs_b.columns):
            if o in runs_a.columns:
                runs_b = runs_b.with_columns(pl.lit(0, dtype=runs_a[o].dtype).alias(o))
            else:
                runs_a = runs_a.with_columns(pl.lit(0, dtype=runs_b[o].dtype).alias(o))
    numbers = [c for c, t in runs_a.schema.items()
               if c not in skip and t.is_numeric() and c in runs_b.columns]
    out = []
    for tier in runs_a["tier"].unique(maintain_order=True).to_list():
        ta = runs_a.filter(pl.col("tier") == tier).sort("replication")
        tb = runs_b.filter(pl.col("tier") == tier).sort("replication")
        if ta["replication"].to_list() != tb["replication"].to_list():
            raise ValueError(f"tier {tier}: A and B have different replications to pair")
        for c in numbers:
            xa = ta[c].cast(pl.Float64).to_numpy()
            xb = tb[c].cast(pl.Float64).to_numpy()
            row = {"tier": tier, "number": c, **_side("a", xa), **_side("b", xb),
                   "difference": None, "difference_ci": None, "difference_low": None,
                   "difference_high": None, "significant": None, "variance_ratio": None,
                   "pairs": int(xa.size)}
            if xa.size and np.all(np.isfinite(xa)) and np.all(np.isfinite(xb)):
                row.update(paired_difference(xb, xa).columns())
            out.append(row)
    schema = {"tier": pl.String, "number": pl.String, **dict.fromkeys(
        ("a", "a_ci", "b", "b_ci", "difference", "difference_ci", "difference_low",
         "difference_high"), pl.Float64), "significant": pl.Boolean,
        "variance_ratio": pl.Float64, "pairs": pl.Int64}
    return pl.DataFrame(out, schema=schema).select(COLUMNS)


def _side(name: str, x: np.ndarray) -> dict:
    from relakit.replications import summarise_replications

    one = summarise_replications(pl.DataFrame({"tier": ["t"] * x.size, "v": x}))
    return {name: one["v"][0], f"{name}_ci": one["v" + CI_SUFFIX][0]}


def _decimals(number: str, row: dict) -> int:
    if number.endswith("_ms"):
        v = abs(row["a"]) if row["a"] == row["a"] and row["a"] else 1.0
        return int(np.clip(2 - math.floor(math.log10(v)), 0, 3))
    return {"success_ratio": 4, "amplification": 3}.get(number, 1)


def _pm(mean, ci, d: int) -> str:
    if mean is None or mean != mean:
        return "-"
    return f"{mean:.{d}f} ± {ci:.{d}f}" if ci is not None and ci == ci else f"{mean:.{d}f}"
