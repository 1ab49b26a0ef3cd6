#!/usr/bin/env python3
"""Check a Grafana dashboard of this folder (`make monitoring-check`).

The JSON parses; the `datasource` (Prometheus) and `policy` variables are
there as the README says; every panel but a row has a datasource and at
least one target, every target a datasource, a PromQL expression and a
refId unique in its panel; panel ids are unique and panels sit inside the
24-column grid; an expression uses no variable the dashboard does not
define (Grafana's own `$__rate_interval`, `$__interval`, `$__range` aside).

Whether the expressions evaluate, and return data for the traffic they
describe, is tested against a real Prometheus scraping a real Envoy:
tests/e2e/test_monitoring.py.

Standard library only: runs with any Python 3.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
PROMETHEUS_DS = {"type": "prometheus", "uid": "${datasource}"}


def panels(dashboard: dict):
    """Every panel, rows' nested panels included (rows themselves too)."""
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def targets(dashboard: dict):
    """(panel title, refId, expr) of every query of the dashboard."""
    for p in panels(dashboard):
        for t in p.get("targets", []):
            yield p.get("title", ""), t.get("refId", ""), t.get("expr", "")


def check(dashboard: dict) -> list[str]:
    errors: list[str] = []
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        errors.append("no `datasource` variable of type datasource (prometheus)")
    pol = variables.get("policy")
    if not pol or "label_values(loopguard_matched_total, policy)" not in json.dumps(pol.get("query")):
        errors.append("no `policy` variable from label_values(loopguard_matched_total, policy)")
    elif not (pol.get("multi") and pol.get("includeAll")):
        errors.append("the `policy` variable must be multi-value with All")
    if not isinstance(dashboard.get("schemaVersion"), int) or dashboard["schemaVersion"] < 36:
        errors.append(f"schemaVersion {dashboard.get('schemaVersion')!r}: expected 36 or later")

    ids: set = set()
    for p in panels(dashboard):
        title = p.get("title") or f"panel id {p.get('id')}"
        if p.get("id") in ids:
            errors.append(f"{title}: panel id {p.get('id')} is used twice")
        ids.add(p.get("id"))
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")) or g["x"] + g["w"] > 24:
            errors.append(f"{title}: gridPos {g} is not inside the 24-column grid")
        if p.get("type") == "row":
            continue
        if not p.get("title"):
            errors.append(f"panel id {p.get('id')}: no title")
        if not p.get("description"):
            errors.append(f"{title}: no description")
        if p.get("datasource") != PROMETHEUS_DS:
            errors.append(f"{title}: datasource {p.get('datasource')!r}, expected {PROMETHEUS_DS}")
        ts = p.get("targets") or []
        if not ts:
            errors.append(f"{title}: no targets")
        refs = [t.get("refId") for t in ts]
        if len(set(refs)) != len(refs) or not all(refs):
            errors.append(f"{title}: refIds {refs} are not unique and set")
        for t in ts:
            where = f"{title} / {t.get('refId')}"
            if t.get("datasource") != PROMETHEUS_DS:
                errors.append(f"{where}: datasource {t.get('datasource')!r}, expected {PROMETHEUS_DS}")
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                errors.append(f"{where}: no expr")
                continue
            if expr.count("(") != expr.count(")") or expr.count("{") != expr.count("}"):
                errors.append(f"{where}: unbalanced brackets in {expr!r}")
            for m in VARIABLE.finditer(expr):
                name = next(g for g in m.groups() if g)
                if name not in variables and name not in BUILTINS:
                    errors.append(f"{where}: unknown variable ${name} in {expr!r}")
    titles = [p.get("title") for p in panels(dashboard) if p.get("type") != "row"]
    dup = sorted({t for t in titles if titles.count(t) > 1})
    if dup:
        errors.append(f"panel titles used twice: {dup}")
    return errors


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} DASHBOARD.json", file=sys.stderr)
        return 2
    path = Path(argv[1])
    try:
        dashboard = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    errors = check(dashboard)
    for e in errors:
        print(f"{path}: {e}", file=sys.stderr)
    if errors:
        return 1
    n = sum(1 for p in panels(dashboard) if p.get("type") != "row")
    print(f"{path}: {n} panels, {sum(1 for _ in targets(dashboard))} queries, all with a datasource and targets")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
