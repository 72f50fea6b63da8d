"""`nvrx-slo generate alerts`: the SLO spec -> Prometheus rules, PrometheusRule, Alertmanager config.

Everything is rendered in memory first; files are written only once the spec has loaded and every
output has rendered, so a bad spec changes nothing on disk. Run it from the repository root (or
pass --root); tests/test_alerts_generate.py checks the committed files equal a fresh generation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nvrx_slo import generated
from nvrx_slo.alerts import alertmanager, sli
from nvrx_slo.alerts.plain import plain_group
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.rules import slo_group
from nvrx_slo.alerts.signals import signals_group
from nvrx_slo.alerts.spec import DEFAULT_PATH, Spec, SpecError, load
from nvrx_slo.alerts.tiers import Tier

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
    slis = sli.build(spec, plan)
    groups = [slo_group(s, spec, plan) for s in slis.values()] + [signals_group(plan), plain_group(spec, plan)]
    return [part for part in (g.part(tiers) for g in groups) if part is not None]


def _yaml(document: dict[str, Any], source: str) -> str:
    return generated.header("nvrx-slo generate alerts", source) + generated.yaml_document(document)


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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nvrx-slo generate alerts", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=DEFAULT_PATH, help="SLO spec (default: alerts/slo.yaml)")
    parser.add_argument("--root", type=Path, default=Path("."), help="write under this directory (default: .)")
    args = parser.parse_args(argv)
    try:
        spec = load(args.spec)
    except SpecError as err:
        print(f"nvrx-slo generate alerts: {err}", file=sys.stderr)
        return 2
    source = "alerts/slo.yaml" if args.spec == DEFAULT_PATH else str(args.spec)
    for path, text in render(spec, spec.plan(), source).items():
        target = args.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(target)
    return 0
