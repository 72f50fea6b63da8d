"""Panel helpers: the one place grafanalib builds blocks, so its quirks are handled once.

grafanalib 0.7.1 is unmaintained and emits an old ``schemaVersion`` that Grafana migrates on
load; the dashboard modules never touch it directly. Conventions applied here, once:

* every panel, target, variable and annotation is bound to the ``$datasource`` variable;
* every panel has a description (a required argument) and a unit;
* panels flow left to right on Grafana's 24-column grid (``layout``), ids are assigned in order;
* every dashboard carries the namespace / job / pod variables, links to its siblings (by tag),
  a stable uid, and a "generated — do not edit" note in its description.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import attr
from grafanalib import core as g

from nvrx_slo import file_format
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.dashboards import queries as q

DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": f"${{{q.VAR_DATASOURCE}}}"}
TAG = "nvrx-slo"
GRID_WIDTH = 24

# Grafana unit ids.
SECONDS = "s"
RATIO = "percentunit"
BYTES_PER_SECOND = "Bps"
COUNT = "short"
PER_SECOND = "ops"

GREEN, YELLOW, RED, BLUE = "green", "yellow", "red", "blue"


@dataclass(frozen=True)
class Query:
    """One PromQL target. ``instant`` for single-value panels (stat, table)."""

    expr: str
    legend: str = ""
    instant: bool = False


Steps = Sequence[tuple[float | None, str]]  # (from value, colour); the first value is None (base)


def thresholds(*steps: tuple[float | None, str]) -> list[dict[str, Any]]:
    """Grafana threshold steps; grafanalib's own ``Threshold`` writes the base as the string 'null'."""
    if not steps or steps[0][0] is not None:
        raise ValueError("the first threshold step is the base: (None, colour)")
    return [{"color": colour, "value": value} for value, colour in steps]


def _targets(queries: Sequence[Query], fmt: str = g.TIME_SERIES_TARGET_FORMAT) -> list[g.Target]:
    if not queries:
        raise ValueError("a panel needs at least one query")
    return [
        g.Target(expr=x.expr, legendFormat=x.legend, refId=chr(ord("A") + i), instant=x.instant,
                 format=fmt, datasource=DATASOURCE, intervalFactor=1)
        for i, x in enumerate(queries)
    ]


def _grid(w: int, h: int) -> g.GridPos:
    if not 1 <= w <= GRID_WIDTH:
        raise ValueError(f"panel width {w} outside 1..{GRID_WIDTH}")
    return g.GridPos(h=h, w=w, x=0, y=0)


def timeseries(title: str, description: str, queries: Sequence[Query], unit: str, *,
               steps: Steps = ((None, GREEN),), stack: bool = False, bars: bool = False,
               soft_max: int | None = None, w: int = 12, h: int = 8) -> g.TimeSeries:
    """A time-series panel; with threshold steps beyond the base, each is drawn as a dashed line."""
    return g.TimeSeries(
        title=title, description=description, dataSource=DATASOURCE, targets=_targets(queries),
        unit=unit, gridPos=_grid(w, h), thresholds=thresholds(*steps),
        thresholdsStyleMode="dashed" if len(steps) > 1 else "off",
        stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none"},
        fillOpacity=60 if stack else 10, drawStyle="bars" if bars else "line",
        valueMin=0, axisSoftMax=soft_max, legendDisplayMode="table", legendPlacement="bottom",
        legendCalcs=["lastNotNull", "max"], tooltipMode="multi", showPoints="never",
    )


def stat(title: str, description: str, queries: Sequence[Query], unit: str, *,
         steps: Steps = ((None, BLUE),), decimals: int | None = None, w: int = 6, h: int = 5) -> g.Stat:
    """A single-value panel coloured by threshold steps (instant queries, last value)."""
    return g.Stat(
        title=title, description=description, dataSource=DATASOURCE,
        targets=_targets([Query(x.expr, x.legend, instant=True) for x in queries]),
        format=unit, decimals=decimals, gridPos=_grid(w, h), thresholds=thresholds(*steps),
        reduceCalc="lastNotNull", graphMode="none", colorMode="value", noValue="no data",
    )


def table(title: str, description: str, query: Query, *, w: int = 12, h: int = 8,
          links: Sequence[tuple[str, str]] = ()) -> g.Table:
    """A table of one instant query, one row per series (labels as columns); ``links``: (title, URL)
    data links on every cell (``${__data.fields.<label>}`` is a row's label value)."""
    extra = {"fieldConfig": {"defaults": {"links": [{"title": t, "url": url} for t, url in links]}}} if links else None
    return g.Table(
        title=title, description=description, dataSource=DATASOURCE,
        targets=_targets([Query(query.expr, query.legend, instant=True)], g.TABLE_TARGET_FORMAT),
        gridPos=_grid(w, h), unit=COUNT, thresholds=thresholds((None, BLUE)),
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True}}}], extraJson=extra,
    )


def heatmap(title: str, description: str, query: Query, unit: str, *, w: int = 12, h: int = 8) -> g.Heatmap:
    """Series as rows (``tsbuckets``: the legend names the row), colour = value, e.g. one row per rank."""
    return g.Heatmap(
        title=title, description=description, dataSource=DATASOURCE, targets=_targets([query]),
        gridPos=_grid(w, h), thresholds=thresholds((None, BLUE)), dataFormat="tsbuckets", yBucketBound="middle",
        hideZeroBuckets=False,
        color=g.HeatmapColor(mode="scheme", colorScheme="interpolateOranges", exponent=0.5),
        tooltip=g.Tooltip(shared=False), yAxis=g.YAxis(format=COUNT, decimals=0),
        # Cell unit in fieldConfig, options left empty: Grafana migrates a panel with empty options
        # from this (angular) heatmap model to its current heatmap.
        extraJson={"fieldConfig": {"defaults": {"unit": unit}}},
    )


def row(title: str) -> g.RowPanel:
    return g.RowPanel(title=title, dataSource=DATASOURCE, gridPos=_grid(GRID_WIDTH, 1))


def layout(panels: Sequence[Any]) -> list[Any]:
    """Flow panels left to right on the 24-column grid, wrapping into lines; number them from 1."""
    placed, x, y, line_h = [], 0, 0, 0
    for pid, panel in enumerate(panels, start=1):
        pos = panel.gridPos
        if x + pos.w > GRID_WIDTH or isinstance(panel, g.RowPanel):
            x, y, line_h = 0, y + line_h, 0
        placed.append(attr.evolve(panel, id=pid, gridPos=g.GridPos(h=pos.h, w=pos.w, x=x, y=y)))
        x, line_h = x + pos.w, max(line_h, pos.h)
        if isinstance(panel, g.RowPanel):
            x, y, line_h = 0, y + pos.h, 0
    return placed


def annotation(name: str, expr: str, colour: str, title: str, tags: tuple[str, ...]) -> dict[str, Any]:
    """A Prometheus annotation query: a marker wherever ``expr`` returns a value (step = ``$__interval``)."""
    return {
        "name": name, "datasource": DATASOURCE, "enable": True, "hide": False, "iconColor": colour,
        "expr": expr, "titleFormat": title, "tagKeys": ",".join(tags),
        "textFormat": "", "useValueForTime": False,
    }


def _variables() -> list[g.Template]:
    def label_values(label: str, matchers: str) -> str:
        selector = f"{cat.WALL.name}{{{matchers}}}" if matchers else cat.WALL.name
        return f"label_values({selector}, {label})"

    ns = f'{q.NAMESPACE_LABEL}="${q.VAR_NAMESPACE}"'
    job = f'{ns}, {q.JOB_LABEL}="${q.VAR_JOB}"'
    common = {"dataSource": DATASOURCE, "refresh": g.REFRESH_ON_TIME_RANGE_CHANGE, "sort": g.SORT_ALPHA_ASC}
    return [
        g.Template(name=q.VAR_DATASOURCE, label="Data source", query="prometheus", type="datasource"),
        g.Template(name=q.VAR_NAMESPACE, label="Namespace", query=label_values(q.NAMESPACE_LABEL, ""), **common),
        g.Template(name=q.VAR_JOB, label="Job", query=label_values(q.JOB_LABEL, ns), **common),
        g.Template(name=q.VAR_POD, label="Pod", query=label_values(q.POD_LABEL, job), multi=True,
                   includeAll=True, allValue=q.POD_ALL_VALUE, default="$__all", **common),
    ]


def _fleet_variables() -> list[g.Template]:
    """The fleet's: the data source and the namespace, every one by default (one job's variables
    do not apply to a dashboard of every job)."""
    return [
        g.Template(name=q.VAR_DATASOURCE, label="Data source", query="prometheus", type="datasource"),
        g.Template(name=q.VAR_NAMESPACE, label="Namespace", query=f"label_values({cat.WALL.name}, {q.NAMESPACE_LABEL})",
                   dataSource=DATASOURCE, refresh=g.REFRESH_ON_TIME_RANGE_CHANGE, sort=g.SORT_ALPHA_ASC, multi=True,
                   includeAll=True, allValue=q.NAMESPACE_ALL_VALUE, default="$__all"),
    ]


def _events() -> list[dict[str, Any]]:
    """Restarts and durable checkpoints, marked on every time-series panel of every dashboard."""
    return [
        annotation("Restarts", q.moved(cat.RESTARTS, (q.LEVEL_LABEL,)), RED, "restart ({{level}})", (q.LEVEL_LABEL,)),
        annotation("Checkpoints", q.moved(cat.CKPT_LAST_SUCCESS, (q.POD_LABEL,)), BLUE,
                   "checkpoint durable ({{pod}})", (q.POD_LABEL,)),
    ]


def dashboard(*, uid: str, title: str, module: str, description: str, panels: Sequence[Any],
              fleet: bool = False) -> g.Dashboard:
    """A complete dashboard: variables, event annotations, sibling links, shared crosshair, the
    generated note. ``fleet``: every job's, with the namespace variable only and no job's events."""
    note = file_format.note("nvrx-slo generate dashboards", f"dashboards/{module}.py")
    return g.Dashboard(
        uid=uid, title=title, description=f"{description} ({note})", tags=[TAG],
        panels=layout(panels), templating=g.Templating(list=_fleet_variables() if fleet else _variables()),
        annotations=g.Annotations(list=[] if fleet else _events()),
        links=[g.DashboardLink(type="dashboards", tags=[TAG], asDropdown=False, includeVars=True,
                               keepTime=True, title="nvrx-slo dashboards")],
        time=g.Time("now-6h", "now"), refresh="30s", timezone="browser", editable=False,
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR, sharedCrosshair=True,
    )
