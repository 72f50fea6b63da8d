"""The generated Grafana dashboards, checked structurally (no Grafana server installs here, so nothing
here renders them; tests/test_dashboards_prometheus.py runs every query against a real Prometheus).

What a Grafana import needs and what our conventions promise: the dashboard model's fields, unique
panel ids, panels that do not overlap on the 24-column grid, every panel, target, annotation and
variable bound to the ``$datasource`` variable, a description and a unit on every panel, links
between the four dashboards, the SLO line drawn; every metric and label a query names exists in
the metric catalogue or is recorded by the generated alert rules; the burn-rate and error-budget
panels read exactly the recorded series the efficiency page alert fires on; the ConfigMaps carry
kube-prometheus-stack's label, stay under 256 KiB and pass the Kubernetes schema. That the committed
files are a fresh generation is tests/test_generate.py's.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pytest
import yaml

from dashboard_model import ROOT, ROW, legend_labels, load_all, names, panels, queries
from nvrx_slo.alerts import conventions, duration
from nvrx_slo.alerts import files as alert_files
from nvrx_slo.alerts import spec as slo_spec
from nvrx_slo.alerts.plan import Severity
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.dashboards import files as dashboard_files
from nvrx_slo.dashboards import queries as q

MODELS = load_all()
SPEC = slo_spec.load()
PLAN = SPEC.plan()
RULES = yaml.safe_load((ROOT / alert_files.RULES).read_text(encoding="utf-8"))
JOB_UIDS = {"nvrx-slo-overview", "nvrx-slo-checkpointing", "nvrx-slo-recovery", "nvrx-slo-ranks"}  # one job's
FLEET = "nvrx-slo-fleet"
UIDS = JOB_UIDS | {FLEET}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRAFANA_BUILTINS = {"__interval", "__rate_interval", "__range", "__all"}


def _each_panel():
    return [pytest.param(uid, p, id=f"{uid}:{p['id']}") for uid, m in MODELS.items() for p in panels(m)]


def test_the_five_dashboards_have_their_stable_uids():
    assert set(MODELS) == UIDS


@pytest.mark.parametrize("uid", sorted(UIDS))
def test_dashboard_model_has_what_an_import_needs(uid):
    m = MODELS[uid]
    for field, kind in [("title", str), ("uid", str), ("panels", list), ("schemaVersion", int), ("version", int),
                        ("templating", dict), ("annotations", dict), ("time", dict), ("tags", list), ("links", list)]:
        assert isinstance(m[field], kind), field
    assert m["panels"] and m["time"]["from"] and m["time"]["to"]
    assert "generated" in m["description"].lower() and "do not edit" in m["description"]
    assert m["id"] is None, "an exported dashboard carries no database id"


@pytest.mark.parametrize("uid", sorted(UIDS))
def test_panel_ids_are_unique_and_grid_positions_do_not_overlap(uid):
    ps = panels(MODELS[uid])
    ids = [p["id"] for p in ps]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    boxes = [(p["title"], p["gridPos"]) for p in ps]
    for _, g in boxes:
        assert all(isinstance(g[k], int) for k in "hwxy") and g["w"] > 0 and g["h"] > 0
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, g
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        apart = (a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"]
                 or a["y"] + a["h"] <= b["y"] or b["y"] + b["h"] <= a["y"])
        assert apart, f"{ta!r} {a} overlaps {tb!r} {b}"


@pytest.mark.parametrize("uid, panel", _each_panel())
def test_every_panel_is_bound_to_the_datasource_variable_and_described(uid, panel):
    assert panel["datasource"] == DATASOURCE
    if panel["type"] == ROW:
        return  # a row header holds no query, and Grafana shows no description for it
    assert panel["description"] and len(panel["description"]) > 20
    assert panel["targets"], "a panel without a query"
    ref_ids = [t["refId"] for t in panel["targets"]]
    assert len(ref_ids) == len(set(ref_ids))
    for t in panel["targets"]:
        assert t["datasource"] == DATASOURCE and t["expr"].strip()
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["unit"], "no unit"
    steps = defaults["thresholds"]["steps"]
    assert steps and steps[0]["value"] is None, "thresholds need a base step (value null)"
    assert [s["value"] for s in steps[1:]] == sorted(s["value"] for s in steps[1:]), "threshold steps must ascend"


@pytest.mark.parametrize("uid", sorted(JOB_UIDS))
def test_variables_annotations_and_links(uid):
    m = MODELS[uid]
    variables = {v["name"]: v for v in m["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "job", "pod"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job", "pod"):
        assert variables[name]["datasource"] == DATASOURCE
    assert variables["pod"]["includeAll"] and variables["pod"]["allValue"] == q.POD_ALL_VALUE
    used = {v for x in queries({uid: m}) for v in re.findall(r"\$\{?(\w+)", x.expr)}
    assert used - GRAFANA_BUILTINS <= set(variables) - {"datasource"}, "a query uses an undefined variable"
    assert {a["name"] for a in m["annotations"]["list"]} == {"Restarts", "Checkpoints"}
    assert all(a["datasource"] == DATASOURCE and a["enable"] for a in m["annotations"]["list"])
    link, = m["links"]  # one tag link reaches every sibling
    assert link["type"] == "dashboards" and link["includeVars"] and link["keepTime"]
    assert all(set(link["tags"]) <= set(other["tags"]) for other in MODELS.values())


def test_the_fleet_has_every_jobs_namespaces_and_links_each_job_to_its_own_dashboards():
    """Every job of the selected namespaces (all by default, a namespace-less job's too); no one job's
    variables or events; each table row links to its job's dashboards with the job's variables."""
    m = MODELS[FLEET]
    variables = {v["name"]: v for v in m["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace"]
    ns = variables["namespace"]
    assert ns["includeAll"] and ns["multi"] and ns["allValue"] == q.NAMESPACE_ALL_VALUE == ".*"
    assert m["annotations"]["list"] == []
    for x in queries({FLEET: m}):
        if not x.where.startswith("variable "):
            assert 'namespace=~"$namespace"' in x.expr and "$job" not in x.expr and "$pod" not in x.expr, x.expr
    tables = [p for p in panels(m) if p["type"] == "table"]
    assert tables
    for table in tables:
        links = table["fieldConfig"]["defaults"]["links"]
        assert links, table["title"]
        for link in links:
            path, _, query = link["url"].partition("?")
            uid = path.removeprefix("/d/")
            assert uid in JOB_UIDS, link
            names = {v["name"] for v in MODELS[uid]["templating"]["list"]}
            asked = {part.split("=")[0].removeprefix("var-") for part in query.split("&") if part.startswith("var-")}
            assert asked == {"namespace", "job"} <= names, link


def test_every_dashboard_link_in_the_alert_rules_opens_a_dashboard_with_its_variables():
    """The alerts' ``dashboard_url`` names one of these uids and only variables these dashboards have."""
    urls = [r["annotations"]["dashboard_url"] for g in RULES["groups"] for r in g["rules"] if "alert" in r]
    assert urls
    for url in urls:
        path, _, query = url.partition("?")
        assert path.rsplit("/d/", 1)[1] in MODELS, url
        names = {v["name"] for v in MODELS[path.rsplit("/d/", 1)[1]]["templating"]["list"]}
        assert {part.split("=")[0].removeprefix("var-") for part in query.split("&")} <= names, url


def _threshold_lines(model):
    for p in panels(model):
        custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
        if custom.get("thresholdsStyle", {}).get("mode", "off") != "off":
            yield p["title"], [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_the_slo_lines_are_drawn_from_the_alerts_spec():
    objectives = SPEC.objectives
    lines = dict(_threshold_lines(MODELS["nvrx-slo-overview"]))
    assert objectives[slo_spec.Slo.EFFICIENCY].target in lines["Efficiency vs objective"]
    pages = {w.factor for w in PLAN.burn_windows if w.severity is Severity.PAGE}
    assert pages <= set(lines["Burn rates"])
    lines = dict(_threshold_lines(MODELS["nvrx-slo-checkpointing"]))
    assert objectives[slo_spec.Slo.CHECKPOINT_OVERLAP].target in lines["Overlap ratio"]
    assert pytest.approx(objectives[slo_spec.Slo.CHECKPOINT_BLOCKING].budget) in lines["Blocking share of wall"]
    assert SPEC.alerts.checkpoint_stale_after in lines["Checkpoint age"]
    lines = dict(_threshold_lines(MODELS["nvrx-slo-recovery"]))
    assert SPEC.recovery_threshold in lines["Restart latency by level"]
    lines = dict(_threshold_lines(MODELS["nvrx-slo-ranks"]))
    assert SPEC.alerts.straggler_skew in lines["Straggler view: step-time skew"]
    assert SPEC.alerts.idle_ratio in lines["Accelerator idle per rank"]


def _catalogue_series():
    """Every series name the exporter can emit -> its labels."""
    out = {}
    for m in cat.CATALOGUE:
        if m.kind in (cat.Kind.HISTOGRAM, cat.Kind.SUMMARY):
            if m.kind is cat.Kind.HISTOGRAM:
                out[m.name + "_bucket"] = set(m.all_labels) | {"le"}
            out[m.name + "_sum"] = out[m.name + "_count"] = set(m.all_labels)
        else:
            out[m.name] = set(m.all_labels)
    return out


ALERTS_LABELS = {"alertname", "alertstate", "severity", *cat.IDENTITY_LABELS}


def _level_labels(record: str) -> set[str]:
    """The labels a recording rule's level (``level:metric:operations``) says it keeps."""
    level = record.split(":")[0]
    per_rank = ("pod", cat.RANK_LABEL) if level.endswith("_pod_rank") else ()
    return set() if level == "global" else {*conventions.JOB_LABELS, *per_rank}


def _recorded_series():
    """Every series the committed alert rules record -> its labels (its level's, the rule's own, and a
    cost record's dimensions)."""
    extra = conventions.cost_records(PLAN)
    return {r["record"]: {*_level_labels(r["record"]), *r.get("labels", {}), *extra.get(r["record"], ())}
            for g in RULES["groups"] for r in g["rules"] if "record" in r}


@pytest.mark.parametrize("query", [pytest.param(x, id=f"{x.dashboard}:{x.where}") for x in queries(MODELS)])
def test_every_metric_and_label_a_query_names_is_in_the_catalogue_or_recorded_by_the_alert_rules(query):
    known = {**_catalogue_series(), **_recorded_series()}
    metrics, labels, _ = names(query.expr)
    assert metrics, f"no metric found in {query.expr}"
    unknown = metrics - set(known) - {q.ALERTS}
    assert not unknown, f"not in the catalogue nor recorded by {alert_files.RULES}: {sorted(unknown)}"
    allowed = set().union(*(known.get(x, ALERTS_LABELS) for x in metrics))
    assert labels | legend_labels(query.legend) <= allowed, f"labels not on {sorted(metrics)}"


def _records_the_page_alert_reads() -> set[str]:
    """The recorded series the efficiency SLO's page (critical) alert compares with its factors."""
    alert, = [r for g in RULES["groups"] for r in g["rules"]
              if r.get("alert") == conventions.BURN_ALERTS[slo_spec.Slo.EFFICIENCY].value
              and r["labels"][conventions.SEVERITY_LABEL] == Severity.PAGE.value]
    return names(alert["expr"])[0]


def _overview_targets(title: str) -> list[dict]:
    panel, = [p for p in panels(MODELS["nvrx-slo-overview"]) if p["title"] == title]
    return panel["targets"]


def test_the_burn_rate_panels_read_the_recorded_series_the_page_alert_fires_on():
    """One series per page window, each the alert's own record of the efficiency SLO, legend = its window;
    the budget stat reads the recorded budget. Nothing recomputes the SLI from raw series."""
    mine = f'{conventions.SLO_LABEL}="{slo_spec.Slo.EFFICIENCY.value}"'
    read = _records_the_page_alert_reads()
    pages = [w for w in PLAN.burn_windows if w.severity is Severity.PAGE]
    assert read == {conventions.burn_rate_record(s) for w in pages for s in (w.long, w.short)}
    targets = _overview_targets("Burn rates")
    by_metric = {}
    for t in targets:
        metric, = names(t["expr"])[0]
        assert mine in t["expr"] and metric == conventions.burn_rate_record(duration.parse(t["legendFormat"]))
        by_metric[metric] = t
    assert set(by_metric) == read and len(targets) == len(read)
    fastest = max(pages, key=lambda w: w.factor).long
    stat, = _overview_targets(f"Burn rate ({duration.format(fastest)})")
    assert names(stat["expr"])[0] == {conventions.burn_rate_record(fastest)} and mine in stat["expr"]
    budget, = _overview_targets("Error budget remaining")
    assert names(budget["expr"])[0] == {conventions.ERROR_BUDGET_REMAINING} and mine in budget["expr"]
    recorded = {(r["record"], r.get("labels", {}).get(conventions.SLO_LABEL))
                for g in RULES["groups"] for r in g["rules"] if "record" in r}
    assert {(m, slo_spec.Slo.EFFICIENCY.value) for m in (*read, conventions.ERROR_BUDGET_REMAINING)} <= recorded


def test_the_job_idle_panel_reads_what_the_idle_alert_compares_and_names_its_source():
    """Same recorded series, window and order of sources as the alert, bound to the selected job."""
    alert, = [r for g in RULES["groups"] for r in g["rules"]
              if r.get("alert") == conventions.Alert.ACCELERATOR_IDLE.value]
    panel, = [p for p in panels(MODELS["nvrx-slo-ranks"]) if p["title"] == "Accelerator idle, job"]
    target, = panel["targets"]
    assert target["legendFormat"] == "job ({{source}})"
    unbound = target["expr"]
    for matcher in q.JOB_MATCHERS:
        assert unbound.count(matcher) == len(conventions.IDLE_SOURCES)
        unbound = unbound.replace(f", {matcher}", "")
    assert " ".join(unbound.split()) in " ".join(alert["expr"].split())
    assert names(target["expr"])[0] == {conventions.ACCELERATOR_IDLE}


def test_the_name_parser_finds_what_it_should():
    metrics, labels, functions = names(
        'histogram_quantile(0.99, sum by (le, level) (rate(nvrx_restart_duration_seconds_bucket{pod=~"a|b"}[5m])))'
        ' / on() group_left() sum(nvrx_x offset $__interval) > 1e-05')
    assert metrics == {"nvrx_restart_duration_seconds_bucket", "nvrx_x"}
    assert labels == {"le", "level", "pod"}
    assert functions == {"histogram_quantile", "sum", "rate"}


def test_configmaps_carry_the_grafana_label_the_same_json_and_stay_small():
    path = ROOT / dashboard_files.CONFIGMAPS
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# ") and "do not edit" in text.splitlines()[0]
    docs = list(yaml.safe_load_all(text))
    assert len(docs) == len(UIDS)
    for doc in docs:
        assert doc["kind"] == "ConfigMap" and doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        (key, body), = doc["data"].items()
        assert json.loads(body)["uid"] + ".json" == key
        assert body == (ROOT / dashboard_files.JSON_DIR / key).read_text(encoding="utf-8")
        assert len(yaml.safe_dump(doc).encode()) < dashboard_files.CONFIGMAP_LIMIT_BYTES


def test_configmaps_pass_the_kubernetes_schema():
    result = subprocess.run([sys.executable, "-m", "kubernetes_validate", "-k", "1.33.0", "--strict",
                             str(ROOT / dashboard_files.CONFIGMAPS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_oversized_configmap_is_refused():
    with pytest.raises(ValueError, match="over 262144"):
        dashboard_files.to_configmaps({"nvrx-slo-huge": "x\n" * (dashboard_files.CONFIGMAP_LIMIT_BYTES // 2)})


def test_a_label_the_metric_does_not_carry_is_refused_at_generation():
    with pytest.raises(ValueError, match="no label"):
        q.series(cat.CKPT_FAILURES, rank="0")
    with pytest.raises(ValueError, match="needs a histogram"):
        q.series(cat.WALL, "_bucket")
