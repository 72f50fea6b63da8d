"""Read the generated Grafana dashboards back as plain JSON: panels, queries, and the names in PromQL.

Shared by the dashboard tests. It reads the committed files, not the Python definitions, so the
tests check what Grafana would import. PromQL is parsed just far enough to list metric and label
names (Prometheus 2.42 has no parse API); the live test then runs every query for real.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from nvrx_slo.dashboards import files as dashboard_files

ROOT = Path(__file__).resolve().parents[1]
ROW = "row"


@dataclass(frozen=True)
class Query:
    dashboard: str  # uid
    where: str  # panel title, "annotation <name>" or "variable <name>"
    expr: str
    legend: str = ""
    instant: bool = False


def load_all() -> dict[str, dict]:
    """uid -> dashboard JSON, from the committed files."""
    out = {}
    for path in sorted((ROOT / dashboard_files.JSON_DIR).glob("*.json")):
        model = json.loads(path.read_text(encoding="utf-8"))
        out[model["uid"]] = model
    return out


def panels(model: dict) -> list[dict]:
    """Every panel, rows' nested panels included."""
    out = []
    for panel in model["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$")


def queries(models: dict[str, dict]) -> list[Query]:
    """Every PromQL expression: panel targets, annotations, and query variables' selectors."""
    out = []
    for uid, model in models.items():
        for panel in panels(model):
            for t in panel.get("targets", []):
                out.append(Query(uid, panel["title"], t["expr"], t.get("legendFormat", ""), bool(t.get("instant"))))
        for a in model["annotations"]["list"]:
            out.append(Query(uid, f"annotation {a['name']}", a["expr"]))
        for v in model["templating"]["list"]:
            if v["type"] == "query":
                match = _LABEL_VALUES.match(v["query"])
                assert match, f"{uid}: variable {v['name']}: not label_values(selector, label): {v['query']}"
                out.append(Query(uid, f"variable {v['name']}", match.group(1), "{{" + match.group(2) + "}}"))
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"(?<![\w.:$])([a-zA-Z_:][\w:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan"}
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def names(expr: str) -> tuple[set[str], set[str], set[str]]:
    """(metric names, label names, function names) in one PromQL expression."""
    labels: set[str] = set()
    for match in _MATCHERS.finditer(expr):
        labels |= set(_MATCHER_LABEL.findall(_STRING.sub('""', match.group(1))))
    rest = _MATCHERS.sub(" ", _STRING.sub('""', expr))
    for match in _LABEL_LIST.finditer(rest):
        labels |= {x.strip() for x in match.group(1).split(",") if x.strip()}
    rest = _RANGE.sub(" ", _LABEL_LIST.sub(" ", rest))
    metrics, functions = set(), set()
    for ident, call in _IDENT.findall(rest):
        if call:
            functions.add(ident)
        elif ident not in _KEYWORDS:
            metrics.add(ident)
    return metrics, labels, functions


def legend_labels(legend: str) -> set[str]:
    return set(_LEGEND_LABEL.findall(legend))
