"""The SLO spec, the burn-rate windows, and the generated rules and Alertmanager config.

The promtool suites (tests/test_alerts_promtool.py) check what the rules *do*; this file checks
the spec's errors, the window arithmetic, the files on disk (promtool/amtool lint, the Kubernetes
wrappers; their drift is tests/test_generate.py's) and the conventions every alert must follow.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from alert_suites import SUITES, spec_for, suites
from needs import tool
from nvrx_slo.alerts import duration, idle, plan, spec
from nvrx_slo.alerts import files as alert_files
from nvrx_slo.alerts.conventions import DASHBOARD_OF, Alert, Dashboard
from nvrx_slo.contracts import catalogue

ROOT = Path(__file__).resolve().parents[1]
RUNBOOKS = ROOT / "docs" / "runbooks"
RUNBOOK_SECTIONS = ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation")


def _default() -> dict[str, Any]:
    return yaml.safe_load(spec.DEFAULT_PATH.read_text())


@pytest.fixture(scope="module")
def rendered() -> dict[Path, str]:
    s = spec.load()
    return alert_files.render(s, s.plan(), "alerts/slo.yaml")


@pytest.fixture(scope="module")
def rule_file(rendered: dict[Path, str]) -> dict[str, Any]:
    return yaml.safe_load(rendered[alert_files.RULES])


@pytest.fixture(scope="module")
def alerting_rules(rule_file: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rule_file["groups"] for r in g["rules"] if "alert" in r]


# --- the spec -----------------------------------------------------------------------------


def test_the_default_spec_holds_the_documented_objectives() -> None:
    s = spec.load()
    assert s.period == 30 * 86400
    assert {slo: o.target for slo, o in s.objectives.items()} == {
        spec.Slo.EFFICIENCY: 0.99, spec.Slo.RECOVERY: 0.99,
        spec.Slo.CHECKPOINT_BLOCKING: 0.99, spec.Slo.CHECKPOINT_OVERLAP: 0.95,
    }
    assert s.recovery_threshold == 10.0
    assert [o.slo for o in s.objectives.values() if o.page] == [spec.Slo.EFFICIENCY]


def _set(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(_default())
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize("path, value, message", [
    ("version", 2, "version: this nvrx-slo reads spec version 1, got 2"),
    ("period", "30 days", "period: '30 days' is not a duration like 30d"),
    ("period", "0s", "period: '0s' must be longer than zero"),
    ("objectives.efficiency.target", 1.5, "objectives.efficiency.target: must be a number in (0, 1), got 1.5"),
    ("objectives.efficiency.target", True, "objectives.efficiency.target: must be a number in (0, 1), got True"),
    ("objectives.efficiency.page", "yes", "objectives.efficiency.page: must be true or false, got 'yes'"),
    ("objectives.efficency", {"target": 0.9, "page": True}, "objectives.efficency: unknown key"),
    ("objectives.checkpoint_overlap", _DELETE, "objectives.checkpoint_overlap: missing"),
    ("objectives.recovery.threshold", "7s",
     "objectives.recovery.threshold: must be a bucket bound of nvrx_restart_duration_seconds"),
    ("alerts.restart_storm.restarts", 0, "alerts.restart_storm.restarts: must be a whole number ≥ 1, got 0"),
    ("alerts.straggler.skew", 0.9, "alerts.straggler.skew: must be a number greater than 1, got 0.9"),
    ("alerts.training_stalled.after", 600, "alerts.training_stalled.after: '600' is not a duration"),
    ("links.runbook_url", "https://example.com/runbooks", "links.runbook_url: must contain {alert}"),
    ("alertmanager.pager_url", "", "alertmanager.pager_url: must be a non-empty string"),
    ("min_window", "30d", "period: for a period of 30d the 1h window becomes 30d, no longer than its short window 30d"),
    ("cost.currency", "usd", "cost.currency: must be an ISO 4217 code such as USD, got 'usd'"),
    ("cost.accelerator_hour.default", -1, "cost.accelerator_hour.default: must be a number in (0, 1e+06), got -1"),
    ("cost.accelerator_hour.default", "cheap", "cost.accelerator_hour.default: must be a number in (0, 1e+06)"),
    ("cost.accelerator_hour", {}, "cost.accelerator_hour: must price at least one model, or default"),
    ("cost.per_gpu", 3, "cost.per_gpu: unknown key"),
    ("cost.currency", _DELETE, "cost.currency: missing"),
])
def test_a_bad_spec_is_rejected_naming_the_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(spec.SpecError) as err:
        spec.from_dict(_set(path, value))
    assert message in str(err.value)


def test_the_cost_section_is_optional_and_prices_by_model_then_default() -> None:
    """No section: no price (the rules record accelerator-hours and OpenCost's prices only); a model
    without a price of its own takes the default."""
    assert spec.from_dict(_set("cost", _DELETE)).price is None
    price = spec.load().price
    assert price is not None and price.currency == "USD"
    assert (price.of("NVIDIA H100 80GB HBM3"), price.of("unknown"), price.of(None)) == (3.5, 2.5, 2.5)
    assert spec.load().targets.price == price  # what the reports are handed


def test_a_spec_file_error_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "slo.yaml"
    bad.write_text("version: 1\nperiod: [\n")
    with pytest.raises(spec.SpecError, match=f"{re.escape(str(bad))}: not valid YAML"):
        spec.load(bad)
    with pytest.raises(spec.SpecError, match="cannot read"):
        spec.load(tmp_path / "missing.yaml")


# --- windows --------------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=400 * 86400))
def test_durations_round_trip(seconds: int) -> None:
    assert duration.parse(duration.format(seconds)) == seconds


def test_the_30_day_policy_is_the_workbook_table() -> None:
    thirty_days = plan.plan_for(30 * 86400, 60, 60)
    pairs = thirty_days.burn_windows
    assert [(duration.format(p.long), duration.format(p.short), p.factor, p.severity.value) for p in pairs] == [
        ("1h", "5m", 14.4, "critical"), ("6h", "30m", 6.0, "critical"),
        ("1d", "2h", 3.0, "warning"), ("3d", "6h", 1.0, "warning"),
    ]
    assert [duration.format(w) for w in thirty_days.windows] == [
        "5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d",
    ]


def test_windows_scale_with_the_period_and_keep_the_budget_shares() -> None:
    for period in (3600, 7 * 86400, 28 * 86400):
        for reference, pair in zip(plan.POLICY, plan.plan_for(period, 1, 1).burn_windows, strict=True):
            share = pair.factor * pair.long / period
            assert share == pytest.approx(reference.factor * reference.long / plan.REFERENCE_PERIOD, rel=0.01)


def test_min_window_raises_only_the_windows_below_it() -> None:
    assert [duration.format(w) for w in plan.plan_for(3600, 4, 1).windows] == [
        "4s", "5s", "10s", "30s", "2m", "6m", "1h"]


# --- generated files --------------------------------------------------------------------------


@pytest.mark.external
def test_promtool_accepts_every_rule_file(tmp_path: Path) -> None:
    """The plain file, the PrometheusRule's groups (promtool rejects the wrapper itself), a 1h-period
    file, and one of a spec without a cost section (OpenCost's prices only)."""
    hour_spec = spec_for(SUITES / "hour")
    hour = alert_files.render(hour_spec, hour_spec.plan(), "test")[alert_files.RULES]
    (tmp_path / "hour.yaml").write_text(hour)
    unpriced = spec.from_dict(_set("cost", _DELETE))
    (tmp_path / "unpriced.yaml").write_text(alert_files.render(unpriced, unpriced.plan(), "test")[alert_files.RULES])
    wrapped = yaml.safe_load((ROOT / alert_files.PROMETHEUS_RULE).read_text())["spec"]
    (tmp_path / "prometheusrule-groups.yaml").write_text(yaml.safe_dump(wrapped))
    files = [ROOT / alert_files.RULES, tmp_path / "prometheusrule-groups.yaml", tmp_path / "hour.yaml",
             tmp_path / "unpriced.yaml"]
    result = subprocess.run(
        [tool("promtool"), "check", "rules", *map(str, files)], capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.external
def test_amtool_accepts_the_alertmanager_config() -> None:
    result = subprocess.run(
        [tool("amtool"), "check-config",
         str(ROOT / alert_files.ALERTMANAGER)], capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_prometheus_rule_wraps_the_same_groups_with_the_release_label(rendered: dict[Path, str],
                                                                          rule_file: dict) -> None:
    wrapper = yaml.safe_load(rendered[alert_files.PROMETHEUS_RULE])
    assert (wrapper["apiVersion"], wrapper["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert wrapper["metadata"]["labels"]["release"] == spec.load().release
    assert wrapper["spec"]["groups"] == rule_file["groups"]


def test_alertmanager_routes_by_severity_groups_by_job_and_inhibits_tickets_during_a_page(
        rendered: dict[Path, str]) -> None:
    config = yaml.safe_load(rendered[alert_files.ALERTMANAGER])
    route = config["route"]
    assert route["group_by"] == ["namespace", "job_name"]
    assert [(r["matchers"], r["receiver"]) for r in route["routes"]] == [
        (['severity="critical"'], "pager"), (['severity="warning"'], "ticket"),
    ]
    assert config["inhibit_rules"] == [{
        "source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'],
        "equal": ["namespace", "job_name"],
    }]
    crd = yaml.safe_load(rendered[alert_files.ALERTMANAGER_CONFIG])
    assert crd["kind"] == "AlertmanagerConfig"
    assert crd["spec"]["inhibitRules"][0]["equal"] == ["namespace", "job_name"]
    assert [r["receiver"] for r in crd["spec"]["route"]["routes"]] == ["pager", "ticket"]


# --- conventions every alert follows ---------------------------------------------------------


def _promtool_alert_tests() -> dict[str, tuple[bool, bool]]:
    """alertname -> (a test expects it firing, a test expects it silent)."""
    seen: dict[str, tuple[bool, bool]] = {}
    for suite in suites():
        for group in (yaml.safe_load(suite.read_text()) or {}).get("tests", []):
            for case in group.get("alert_rule_test", []):
                fires, silent = seen.get(case["alertname"], (False, False))
                seen[case["alertname"]] = (fires or bool(case["exp_alerts"]), silent or not case["exp_alerts"])
    return seen


def test_every_alert_has_a_runbook_page_and_a_promtool_test_both_ways(alerting_rules: list[dict]) -> None:
    names = {r["alert"] for r in alerting_rules}
    assert names == {a.value for a in Alert}
    tests = _promtool_alert_tests()
    for name in sorted(names):
        page = RUNBOOKS / f"{name}.md"
        assert page.exists(), f"no runbook for {name}"
        text = page.read_text()
        assert text.startswith(f"# {name}\n")
        assert all(section in text for section in RUNBOOK_SECTIONS), f"{page} lacks a section"
        assert tests.get(name) == (True, True), f"{name} needs a promtool test where it fires and one where it does not"


_NO_VALUE = {Alert.CHECKPOINT_WORKER_DEAD, Alert.EXPORTER_DOWN, Alert.SLI_NO_DATA}  # conditions, not quantities


def test_every_alert_carries_severity_and_the_four_annotations(alerting_rules: list[dict]) -> None:
    s = spec.load()
    for rule in alerting_rules:
        alert = Alert(rule["alert"])
        assert rule["labels"]["severity"] in {w.value for w in plan.Severity}
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url", "dashboard_url"}
        assert "{{ $labels." in annotations["description"]
        assert ("$value" in annotations["description"]) == (alert not in _NO_VALUE), alert
        assert annotations["runbook_url"] == s.runbook_url.replace("{alert}", alert.value)
        assert annotations["dashboard_url"].startswith(f"{s.grafana_url}/d/{DASHBOARD_OF[alert].value}?")


def test_dashboard_uids_are_the_agreed_ones() -> None:
    assert {d.value for d in Dashboard} == {"nvrx-slo-overview", "nvrx-slo-checkpointing", "nvrx-slo-recovery",
                                            "nvrx-slo-ranks", "nvrx-slo-fleet"}


_NVRX_NAME = re.compile(r"\bnvrx_[a-z_]+\b")
_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def _known(name: str) -> bool:
    if name in catalogue.BY_NAME:
        return True
    suffix = next((s for s in _HISTOGRAM_SERIES if name.endswith(s)), None)
    metric = catalogue.BY_NAME.get(name[: -len(suffix)] if suffix else "")
    return metric is not None and (metric.kind is catalogue.Kind.HISTOGRAM
                                   or (metric.kind is catalogue.Kind.SUMMARY and suffix != "_bucket"))


def test_rules_and_runbooks_name_only_catalogue_metrics(rendered: dict[Path, str]) -> None:
    recorded = set(re.findall(r"record: (\S+)", rendered[alert_files.RULES]))
    texts = {"rules": rendered[alert_files.RULES]} | {p.name: p.read_text() for p in RUNBOOKS.glob("*.md")}
    for where, text in texts.items():
        for name in set(_NVRX_NAME.findall(text)):
            assert _known(name) or any(name in r for r in recorded), f"{where} names {name}, not in the catalogue"


# --- accelerator idle from dcgm-exporter --------------------------------------------------------


@pytest.mark.external
def test_dcgm_pod_labels_renamed_by_prometheus_still_join_the_job(tmp_path: Path) -> None:
    """dcgm-exporter scraped without honorLabels: its pod arrives as exported_pod, the target's as pod."""
    exported = {"namespace": "exported_namespace", "pod": "exported_pod"}
    rule = {"record": "dcgm_idle", "expr": idle.dcgm_idle(exported)}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dcgm", "rules": [rule]}]}))
    target = 'namespace="gpu-operator", pod="nvidia-dcgm-exporter-x7k2p"'
    suite = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": 'nvrx_pod_ranks{namespace="ml", job_name="llama", pod="llama-0"}', "values": "1+0x5"},
            {"series": f'{idle.ENGINE_ACTIVE}{{UUID="GPU-a0", {target}, exported_namespace="ml", '
                       'exported_pod="llama-0"}', "values": "0.75+0x5"},
            {"series": f'{idle.ENGINE_ACTIVE}{{UUID="GPU-a1", {target}}}', "values": "0+0x5"},  # allocated to no pod
        ],
        "promql_expr_test": [{"expr": "dcgm_idle", "eval_time": "2m", "exp_samples": [
            {"labels": 'dcgm_idle{namespace="ml", job_name="llama"}', "value": 0.25}]}],
    }]}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    result = subprocess.run([tool("promtool"), "test", "rules", "suite.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
