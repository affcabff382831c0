"""How results show themselves in a notebook: one small HTML view for every result object.

JupyterLab shows an object's ``_repr_html_`` when a cell ends with it. Without one, a
simulation showed no number at all and a calibration 724 lines of escaped YAML. Each
result builds its view from the same rows its console text is made of (so the two
never disagree); this module only turns a title, tables of already formatted cells
and notes into HTML, escaped, with no style sheet and no script (a notebook saved
with it renders the same offline, on GitHub and in nbval's comparison).
"""

from __future__ import annotations

from html import escape


def table_html(rows: list[list[str]], caption: str | None = None) -> str:
    """A table whose first row is the header; cells are text, right-aligned but the
    first column (names), so numbers line up as on the console."""
    if not rows:
        return ""
    head = "".join(f"<th style='text-align:{'left' if i == 0 else 'right'}'>{escape(c)}</th>"
                   for i, c in enumerate(rows[0]))
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:{'left' if i == 0 else 'right'}'>"
                         f"{escape(str(c))}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows[1:])
    cap = f"<caption style='text-align:left'>{escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_view(title: str, lines=(), tables=(), notes=()) -> str:
    """A title, lines of facts, tables (``(caption, rows)``) and notes (small print)."""
    parts = [f"<div><strong>{escape(title)}</strong>"]
    parts += [f"<div>{escape(line)}</div>" for line in lines if line]
    parts += [table_html(rows, caption) for caption, rows in tables if rows]
    parts += [f"<div><small>{escape(n)}</small></div>" for n in notes if n]
    return "".join(parts) + "</div>"


def text_rows(rows: list[list[str]]) -> list[str]:
    """The same rows as fixed-width text lines (the console's view)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                      for i, (v, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
