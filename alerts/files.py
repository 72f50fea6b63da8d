"""`nvrx-slo generate alerts` (``nvrx_slo/generate.py``): the SLO spec and its plan -> Prometheus rule
files (for one Prometheus, and split in two tiers for more), the PrometheusRule, the Alertmanager
config and its AlertmanagerConfig.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nvrx_slo import file_format
from nvrx_slo.alerts import alertmanager, sli
from nvrx_slo.alerts.cost import budget_rules, cost_groups, efficiency_rules
from nvrx_slo.alerts.plain import plain_group
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.rules import slo_group, slo_period_group
from nvrx_slo.alerts.signals import signals_groups
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.alerts.tiers import Group, Tier, tiered

RULES = Path("alerts/generated/rules.yaml")
# The same rules for more than one Prometheus (docs/scaling.md): the pods' tier and the jobs' tier.
LOCAL_RULES = Path("alerts/generated/sharded/local.yaml")
GLOBAL_RULES = Path("alerts/generated/sharded/global.yaml")
ALERTMANAGER = Path("alerts/generated/alertmanager.yaml")
PROMETHEUS_RULE = Path("deploy/base/generated/prometheusrule.yaml")
ALERTMANAGER_CONFIG = Path("deploy/base/generated/alertmanagerconfig.yaml")
PROMETHEUS_RULE_NAME = "nvrx-slo"


def rule_groups(spec: Spec, plan: Plan, tiers: frozenset[Tier] = frozenset(Tier)) -> list[dict[str, Any]]:
    """Every group with its rules of ``tiers`` (all: the one-Prometheus file), groups without any left out."""
    groups: list[Group] = []
    for s in sli.build(spec, plan).values():
        every, period = slo_group(s, spec, plan), slo_period_group(s, spec, plan)
        if s.slo is Slo.EFFICIENCY:  # what its badput and budget cost, after its own records
            every = Group(every.name, every.interval, (*every.rules, *efficiency_rules(spec, plan)))
            budget = tiered(Tier.GLOBAL, budget_rules(spec, plan))
            period = Group(period.name, period.interval, (*period.rules, *budget))
        groups += [every, period]
    groups += [*signals_groups(plan), plain_group(spec, plan), *cost_groups(spec, plan)]
    return [part for part in (g.part(tiers) for g in groups) if part is not None]


def _yaml(document: dict[str, Any], source: str) -> str:
    return file_format.header("nvrx-slo generate alerts", source) + file_format.yaml_document(document)


def render(spec: Spec, plan: Plan, source: str) -> dict[Path, str]:
    """Every output file (path relative to the repository root) and its text."""
    groups = rule_groups(spec, plan)
    prometheus_rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": PROMETHEUS_RULE_NAME, "labels": {"release": spec.release}},
        "spec": {"groups": groups},
    }
    return {
        RULES: _yaml({"groups": groups}, source),
        LOCAL_RULES: _yaml({"groups": rule_groups(spec, plan, frozenset({Tier.LOCAL}))}, source),
        GLOBAL_RULES: _yaml({"groups": rule_groups(spec, plan, frozenset({Tier.GLOBAL}))}, source),
        ALERTMANAGER: _yaml(alertmanager.config(spec), source),
        PROMETHEUS_RULE: _yaml(prometheus_rule, source),
        ALERTMANAGER_CONFIG: _yaml(alertmanager.crd(spec), source),
    }
