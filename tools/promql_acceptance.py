"""How much of a corpus of Prometheus rule files relakit accepts (issue 32).

Usage: ``python tools/promql_acceptance.py FILE_OR_DIR ...`` (plain rule files, or
Kubernetes ``PrometheusRule`` objects, whose ``spec.groups`` is a rule file). Prints
the share of distinct expressions relakit parses, the share of files
``relakit.control.rules.load_rules`` loads whole, and the refusals grouped by what
they name, so a refusal that names no construct shows up as such. With
``--promtool`` only files ``promtool check rules`` accepts are counted (the corpus
must be valid Prometheus for the rate to mean anything).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from relakit.control import promql, rules
from relakit.validate import ScenarioError


def rule_docs(path: Path) -> list[dict]:
    """The rule-file mappings in a file (a PrometheusRule's spec, or the file)."""
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "PrometheusRule":
            doc = doc.get("spec", {})
        if isinstance(doc, dict) and isinstance(doc.get("groups"), list):
            out.append({"groups": doc["groups"]})
    return out


def promtool_ok(doc: dict) -> bool:
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(doc, f)
    proc = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True)
    Path(f.name).unlink()
    return proc.returncode == 0


def reason(message: str) -> str:
    """A refusal's kind: the construct it names, with positions and names cut."""
    m = re.search(r"unsupported (function|aggregation|operator) '([^']+)'", message)
    if m:
        return f"unsupported {m.group(1)} '{m.group(2)}'"
    return re.sub(r" at (line \d+ )?column \d+.*$", "", re.sub(r"'[^']*'|\"[^\"]*\"", "…",
                                                                 message))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--promtool", action="store_true",
                    help="count only files promtool check rules accepts")
    args = ap.parse_args(argv)
    if args.promtool and shutil.which("promtool") is None:
        ap.error("--promtool: promtool is not installed (make setup installs it)")
    files = sorted(p for a in args.paths for p in ([a] if a.is_file() else
                                                  [*a.rglob("*.yml"), *a.rglob("*.yaml")]))
    exprs, reasons, n_files, whole, skipped = {}, collections.Counter(), 0, 0, 0
    file_failures = collections.Counter()
    for path in files:
        for doc in rule_docs(path):
            if args.promtool and not promtool_ok(doc):
                skipped += 1
                continue
            n_files += 1
            for g in doc["groups"]:
                for r in g.get("rules") or []:
                    e = str(r.get("expr", "")).strip()
                    if e and e not in exprs:
                        try:
                            promql.parse(e)
                            exprs[e] = None
                        except promql.PromQLError as exc:
                            exprs[e] = str(exc)
                            reasons[reason(str(exc))] += 1
            try:
                rules.load_rules(doc)
                whole += 1
            except ScenarioError as exc:
                file_failures[reason(str(exc).split("': ", 1)[-1])] += 1
    ok = sum(v is None for v in exprs.values())
    print(f"{len(files)} files, {n_files} rule files counted"
          + (f" ({skipped} refused by promtool, left out)" if args.promtool else ""))
    print(f"expressions: {ok} of {len(exprs)} distinct accepted "
          f"({100 * ok / max(len(exprs), 1):.1f} %)")
    print(f"rule files loaded whole: {whole} of {n_files} "
          f"({100 * whole / max(n_files, 1):.1f} %)")
    for text, n in reasons.most_common():
        print(f"  {n:5d}  {text}")
    if file_failures:
        print("files refused by:")
        for text, n in file_failures.most_common():
            print(f"  {n:5d}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
