"""The long metrics schema every importer produces, and the checks behind it."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal

import polars as pl

from relakit.traces._names import (  # noqa: F401  (the package's names, kept here too)
    COLUMNS,
    LABEL_PAIR,
    LABELS,
    NUMBER_PATTERN,
    parse_label_text,
    parse_number,
)

#: The columns and dtypes of every trace frame, in order (also the simulator's metrics frame).
SCHEMA = pl.Schema(dict(zip(COLUMNS, (pl.Float64(), pl.Int32(), pl.String(), pl.String(),
                                      pl.String(), pl.String(), pl.Float64()), strict=True)))
_NOT_NULL = ("time_s", "node", "name", "value")
KEY_COLUMNS = ("time_s", "node", "name", "tier", "outcome", "le")


def label_text(labels: Mapping[str, str]) -> str | None:
    """The ``labels`` column's text for a label set (None when empty)."""
    if not labels:
        return None
    esc = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}
    return ",".join(f'{k}="{"".join(esc.get(c, c) for c in v)}"'
                    for k, v in sorted(labels.items()))


def canonical_labels(text: str, source, where: str) -> str | None:
    """A ``labels`` cell as :func:`label_text` writes it; TraceError if it is not one."""
    pairs = parse_label_text(text)
    out = label_text(dict(pairs))
    if text.strip() and (out is None or len(pairs) != len(LABEL_PAIR.findall(text))
                         or len(dict(pairs)) != len(pairs)
                         or re.sub(LABEL_PAIR, "", text).strip(", ") != ""):
        raise trace_error(source, where, f"{text!r} is not a label set; expected "
                                         'name="value" pairs separated by commas')
    return out


def columns_of(df: pl.DataFrame) -> list[str]:
    """The schema's columns, and ``labels`` when the frame has one with any value."""
    cols = list(SCHEMA)
    if LABELS in df.columns and df[LABELS].null_count() < df.height:
        cols.append(LABELS)
    return cols

NUMBER_HINT = 'a number such as "12", "0.5", "1e-3", "NaN", "+Inf" or "-Inf"'


class TraceError(ValueError):
    """A recorded trace that cannot be read.

    The message names the file (or frame), where in it the problem is (line,
    column, series or JSON path) and what was expected there. ``source`` and
    ``where`` hold the first two for programs.
    """

    def __init__(self, message: str, *, source: str | None = None, where: str | None = None):
        super().__init__(message)
        self.source = source
        self.where = where


def trace_error(source, where: str | None, problem: str) -> TraceError:
    head = f"{source}: {where}: " if where else f"{source}: "
    return TraceError(head + problem, source=str(source), where=where)


# -- values -------------------------------------------------------------------------------------

def parse_numbers(texts) -> list[float] | None:
    """Many :func:`parse_number` at once, or None if any is not a number (then look closer).

    ``float()`` accepts exactly what ``parse_number`` does once underscores,
    blanks and non-ASCII digits are ruled out, and that is one scan of the text.
    """
    if not set(map(type, texts)) <= {str}:
        return None
    joined = "\n".join(texts)
    if not joined.isascii() or any(c in joined for c in "_ \t\r\x0b\x0c"):
        return None
    try:
        return list(map(float, texts))
    except ValueError:
        return None


def format_le(x: float) -> str:
    """A bucket bound the way Prometheus' Go client writes it (``strconv 'g', -1``).

    ``0.005`` -> ``"0.005"``, ``1.0`` -> ``"1"``, ``1e6`` -> ``"1e+06"``,
    ``inf`` -> ``"+Inf"``. For bounds of up to six significant digits this is
    also what the simulator writes (``f"{b:g}"``), so imported buckets line up.
    """
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == 0:
        return "0"
    sign, digits, exp = Decimal(repr(x)).normalize().as_tuple()
    ds = "".join(map(str, digits))
    e10 = len(ds) + exp - 1  # exponent of the leading digit
    neg = "-" if sign else ""
    if e10 < -4 or e10 >= 6:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{neg}{mant}e{'-' if e10 < 0 else '+'}{abs(e10):02d}"
    if e10 < 0:
        return f"{neg}0.{'0' * (-e10 - 1)}{ds}"
    if len(ds) <= e10 + 1:
        return f"{neg}{ds}{'0' * (e10 + 1 - len(ds))}"
    return f"{neg}{ds[:e10 + 1]}.{ds[e10 + 1:]}"


def natural_key(s: str) -> tuple:
    """Sort key putting ``host:9102`` before ``host:9110`` and ``node-2`` before ``node-10``."""
    parts = re.split(r"(\d+)", s)
    return (tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), s)


# -- assembling a frame from parsed samples -----------------------------------------------------


class Rows:
    """Samples collected by an importer, one list per column, before nodes are numbered.

    ``key`` identifies the source series by all its labels, dropped ones too: a
    series seen twice at the same time counts once, while different series that
    collapse onto one row once labels are dropped are added up.

    A sample carries either an ``instance`` string (numbered later), or a ``node``
    integer, or neither (node -1). ``where`` of the first sample of each instance
    is kept so that an instance missing from an explicit list can be pointed at.
    """

    def __init__(self, source):
        self.source = source
        self.time: list[float] = []
        self.instance: list[str | None] = []
        self.node: list[int] = []
        self.name: list[str] = []
        self.tier: list[str | None] = []
        self.outcome: list[str | None] = []
        self.le: list[str | None] = []
        self.value: list[float] = []
        self.labels: list[str | None] = []  # the other labels (see LABELS)
        self.series: list[int] = []  # which source series (full label set) a sample is from
        self._series_ids: dict = {}
        self.first_seen: dict[str, tuple[str, str]] = {}  # instance -> (source, where)
        self._le_cache: dict[str, str] = {}

    def le_label(self, raw: str | None, where: str, source=None) -> str | None:
        """Normalise a bucket bound (``"1.0"`` and ``"1"`` both become ``"1"``)."""
        if raw is None:
            return None
        out = self._le_cache.get(raw)
        if out is None:
            try:
                out = format_le(parse_number(raw))
            except ValueError:
                raise trace_error(source or self.source, where,
                                  f"le={raw!r} is not a bucket bound; expected "
                                  f'a number or "+Inf"') from None
            self._le_cache[raw] = out
        return out

    def add_series(self, times: list[float], values: list[float], *, name: str,
                   instance: str | None, node: int | None, tier: str | None,
                   outcome: str | None, le: str | None, where: str, key, source=None,
                   labels: str | None = None) -> None:
        n = len(times)
        self.labels.extend([labels] * n)
        self.series.extend([self._series_ids.setdefault(key, len(self._series_ids))] * n)
        if instance is not None and instance not in self.first_seen:
            self.first_seen[instance] = (str(source or self.source), where)
        self.time.extend(times)
        self.value.extend(values)
        self.instance.extend([instance] * n)
        self.node.extend([-1 if node is None else node] * n)
        self.name.extend([name] * n)
        self.tier.extend([tier] * n)
        self.outcome.extend([outcome] * n)
        self.le.extend([le] * n)

    def add(self, time: float, value: float, *, name: str, instance: str | None,
            node: int | None, tier: str | None, outcome: str | None, le: str | None,
            where: str, key, source=None, labels: str | None = None) -> None:
        self.labels.append(labels)
        self.series.append(self._series_ids.setdefault(key, len(self._series_ids)))
        if instance is not None and instance not in self.first_seen:
            self.first_seen[instance] = (str(source or self.source), where)
        self.time.append(time)
        self.value.append(value)
        self.instance.append(instance)
        self.node.append(-1 if node is None else node)
        self.name.append(name)
        self.tier.append(tier)
        self.outcome.append(outcome)
        self.le.append(le)

    def frame(self, instances: Iterable[str] | None) -> pl.DataFrame:
        df = pl.DataFrame({
            "time_s": pl.Series(self.time, dtype=pl.Float64),
            "instance": pl.Series(self.instance, dtype=pl.String),
            "node": pl.Series(self.node, dtype=pl.Int32),
            "name": pl.Series(self.name, dtype=pl.String),
            "tier": pl.Series(self.tier, dtype=pl.String),
            "outcome": pl.Series(self.outcome, dtype=pl.String),
            "le": pl.Series(self.le, dtype=pl.String),
            "value": pl.Series(self.value, dtype=pl.Float64),
            LABELS: pl.Series(self.labels, dtype=pl.String),
            "_series": pl.Series(self.series, dtype=pl.Int64),
        })
        return assemble(df, ["_series"], self.first_seen, instances, self.source)


def assemble(df: pl.DataFrame, series_cols: list[str], first_seen, instances, source):
    """The schema frame from parsed samples: number the instances, merge series, sort.

    ``df`` holds the schema columns plus ``instance`` (String, null if none) and
    ``series_cols`` that tell source series apart by all their labels.
    """
    mapping = instance_mapping(first_seen, instances, source)
    if mapping:
        inst = pl.col("instance")
        df = df.with_columns(node=pl.when(inst.is_null()).then(pl.col("node")).otherwise(
            inst.replace_strict(mapping, default=None, return_dtype=pl.Int32)))
    subset = [*series_cols, "time_s"]
    if df.select(pl.struct(subset).is_duplicated().any()).item():
        # the same series twice (overlapping queries, a repeated row): count it once; with
        # two different values no choice is right, so none is made
        clash = (df.group_by(subset).agg(pl.col("value").n_unique().alias("n"),
                                         pl.col("value").min().alias("lo"),
                                         pl.col("value").max().alias("hi"),
                                         pl.col("name").first().alias("metric"))
                 .filter(pl.col("n") > 1))
        if clash.height:
            c = clash.sort("time_s").row(0, named=True)
            raise trace_error(source, None,
                              f"{clash.height} sample(s) with two different values for one "
                              f"series at one time, e.g. {c['metric']} at {c['time_s']:g} s: "
                              f"{c['lo']:g} and {c['hi']:g}; expected one value per series and "
                              "time")
        df = df.unique(subset, keep="first", maintain_order=True)
    cols = columns_of(df)
    if LABELS in cols:
        df = df.with_columns(pl.col(LABELS).cast(pl.Categorical))
    return sort_trace(sum_duplicates(df.select(cols)))


def instance_mapping(first_seen: Mapping[str, tuple[str, str]], instances: Iterable[str] | None,
                     source) -> dict[str, int]:
    """``instance -> node``: the natural order of the names, or the explicit list's order."""
    if instances is None:
        return {name: i for i, name in enumerate(sorted(first_seen, key=natural_key))}
    if isinstance(instances, str):
        raise TypeError("instances must be a list of instance names, not a string")
    order = list(instances)
    mapping: dict[str, int] = {}
    for i, name in enumerate(order):
        if name in mapping:
            raise trace_error(source, None, f"instance {name!r} is listed twice in instances=; "
                                            f"expected each instance once")
        mapping[name] = i
    for name, (src, where) in first_seen.items():
        if name not in mapping:
            raise trace_error(src, where, f"instance {name!r} is not in instances={order!r}; "
                                             f"expected one of those (or instances=None)")
    return mapping


def sum_duplicates(df: pl.DataFrame) -> pl.DataFrame:
    """Series that differ only in dropped labels are added up, as ``sum without (...)``."""
    keys = list(KEY_COLUMNS) + ([LABELS] if LABELS in df.columns else [])
    if df.height == 0 or not df.select(pl.struct(keys).is_duplicated().any()).item():
        return df
    return df.group_by(keys, maintain_order=True).agg(pl.col("value").sum()).select(
        list(df.columns))


def sort_trace(df: pl.DataFrame) -> pl.DataFrame:
    """By ``time_s``, ``node``, ``name``, then bucket bound numerically; otherwise stable."""
    le_num = pl.col("le").cast(pl.Float64, strict=False)
    return df.sort([pl.col("time_s"), pl.col("node"), pl.col("name"), le_num],
                   maintain_order=True, nulls_last=False)


# -- validation ---------------------------------------------------------------------------------


def validate_trace(df: pl.DataFrame, source: str = "<frame>") -> pl.DataFrame:
    """Check ``df`` against the long metrics schema and return it normalised.

    Normalised means: exactly the columns ``time_s`` (Float64), ``node`` (Int32),
    ``name``, ``tier``, ``outcome``, ``le`` (String; the last three nullable) and
    ``value`` (Float64), in that order, sorted by ``time_s``, ``node``, ``name``
    (then bucket bound). Integer and float columns of other widths are cast;
    categorical label columns become strings. Raises :class:`TraceError` naming
    ``source`` and the problem: a missing or extra column, a column of the wrong
    type, a null ``time_s``/``node``/``name``/``value``, a non-finite ``time_s``,
    a node below -1 or an ``le`` that is not a number or ``+Inf``.
    """
    if not isinstance(df, pl.DataFrame):
        raise trace_error(source, None, f"expected a polars DataFrame, got {type(df).__name__}")
    missing = [c for c in SCHEMA if c not in df.columns]
    extra = [c for c in df.columns if c not in SCHEMA and c != LABELS]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing column(s) {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected column(s) {', '.join(extra)}")
        raise trace_error(source, None, "; ".join(parts) +
                          f"; expected exactly {', '.join(SCHEMA)} (and optionally {LABELS})")
    casts = []
    for col, want in SCHEMA.items():
        have = df.schema[col]
        if have == pl.Null():
            ok = True  # all null: the null check below says which rows, if that matters
        elif want == pl.String():
            ok = have == pl.String() or isinstance(have, pl.Categorical | pl.Enum)
        elif col == "node":
            ok = have.is_integer()
        else:
            ok = have.is_numeric()
        if not ok:
            kind = {"node": "an integer", "name": "a string", "value": "a number",
                    "time_s": "a number"}.get(col, "a string or null")
            raise trace_error(source, f"column {col}",
                              f"has dtype {have}; expected {kind} column ({want})")
        if col == "node" and have != pl.Int32() and df.height:
            lo, hi = df.select(pl.col(col).min().alias("lo"), pl.col(col).max().alias("hi")).row(0)
            if lo is not None and (lo < -2**31 or hi >= 2**31):
                raise trace_error(source, "column node", f"values {lo}..{hi} do not fit Int32; "
                                                         f"expected node indices >= -1")
        casts.append(pl.col(col).cast(want))
    if LABELS in df.columns:
        have = df.schema[LABELS]
        if not (have in (pl.String(), pl.Null()) or isinstance(have, pl.Categorical | pl.Enum)):
            raise trace_error(source, f"column {LABELS}", f"has dtype {have}; expected a "
                              'string column of label sets such as job="api",mode="user"')
        casts.append(pl.col(LABELS).cast(pl.String).cast(pl.Categorical))
    out = df.select(casts)
    for col in _NOT_NULL:
        n = out[col].null_count()
        if n:
            row = out.with_row_index("_row").filter(pl.col(col).is_null())["_row"][0]
            raise trace_error(source, f"column {col}",
                              f"{n} null value(s), first at row {row}; expected no nulls "
                              f"(only tier, outcome and le may be null)")
    bad = out.with_row_index("_row").filter(~pl.col("time_s").is_finite())
    if bad.height:
        raise trace_error(source, "column time_s",
                          f"value {bad['time_s'][0]} at row {bad['_row'][0]}; "
                          f"expected finite seconds")
    bad = out.with_row_index("_row").filter(pl.col("node") < -1)
    if bad.height:
        raise trace_error(source, "column node",
                          f"value {bad['node'][0]} at row {bad['_row'][0]}; expected a node "
                          f"index >= 0, or -1 for series with no instance")
    for le in out["le"].drop_nulls().unique().to_list():
        try:
            parse_number(le)
        except ValueError:
            raise trace_error(source, "column le", f"value {le!r} is not a bucket bound; "
                                                   f'expected a number or "+Inf"') from None
    return sort_trace(out)


def read_text(path) -> str:
    """The file's text, with a missing or unreadable file reported as a TraceError."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:  # a BOM is dropped
            return fh.read()
    except UnicodeDecodeError as e:
        raise trace_error(path, f"byte {e.start}", "is not UTF-8; expected a UTF-8 text file") \
            from None
    except OSError as e:
        raise trace_error(path, None, f"cannot read: {e.strerror or e}") from None
