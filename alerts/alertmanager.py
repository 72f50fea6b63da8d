"""Alertmanager routing for the generated alerts, as a plain config and as an AlertmanagerConfig CRD.

Policy: group by job (one notification per job, however many of its alerts fire); ``critical``
goes to the pager, ``warning`` to the ticket queue (anything else too, so nothing is dropped);
while any page fires for a job, that job's tickets are held back — someone is already on it, and
they come through if still firing when the page resolves. Receivers are webhooks: put your pager
and ticket system's URLs in the spec, or swap the receivers for their native configs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import JOB_LABELS, SEVERITY_LABEL
from nvrx_slo.alerts.plan import Severity
from nvrx_slo.alerts.spec import Spec

PAGER, TICKET = "pager", "ticket"
CRD_NAME = "nvrx-slo"


def _is(severity: Severity) -> str:
    return f'{SEVERITY_LABEL}="{severity.value}"'


def _crd_matcher(severity: Severity) -> dict[str, str]:
    return {"name": SEVERITY_LABEL, "value": severity.value, "matchType": "="}


def _routing(spec: Spec, matcher: Callable[[Severity], Any]) -> dict[str, Any]:
    """The policy, written once in alertmanager.yml's keys; ``matcher`` writes a severity matcher as
    the reader of the result wants it."""
    r = spec.routing
    return {
        "route": {
            "receiver": TICKET,
            "group_by": list(JOB_LABELS),
            "group_wait": duration.format(r.group_wait),
            "group_interval": duration.format(r.group_interval),
            "repeat_interval": duration.format(r.ticket_repeat_interval),
            "routes": [
                {"matchers": [matcher(Severity.PAGE)], "receiver": PAGER,
                 "repeat_interval": duration.format(r.page_repeat_interval)},
                {"matchers": [matcher(Severity.TICKET)], "receiver": TICKET},
            ],
        },
        "receivers": [
            {"name": PAGER, "webhook_configs": [{"url": r.pager_url, "send_resolved": True}]},
            {"name": TICKET, "webhook_configs": [{"url": r.ticket_url, "send_resolved": True}]},
        ],
        "inhibit_rules": [
            {"source_matchers": [matcher(Severity.PAGE)], "target_matchers": [matcher(Severity.TICKET)],
             "equal": list(JOB_LABELS)},
        ],
    }


def config(spec: Spec) -> dict[str, Any]:
    """alertmanager.yml: `amtool check-config` accepts it."""
    return _routing(spec, _is)


_CRD_KEYS = {"source_matchers": "sourceMatch", "target_matchers": "targetMatch"}  # not plain camelCase


def _camel(value: Any) -> Any:
    """``value`` with every key as the CRD spells it: camelCase, but for ``_CRD_KEYS``."""
    if isinstance(value, dict):
        return {_CRD_KEYS.get(k) or k.split("_")[0] + "".join(w.title() for w in k.split("_")[1:]): _camel(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value


def crd(spec: Spec) -> dict[str, Any]:
    """The same routing as a prometheus-operator AlertmanagerConfig (the operator scopes it to its namespace)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1alpha1",
        "kind": "AlertmanagerConfig",
        "metadata": {"name": CRD_NAME, "labels": {"release": spec.release}},
        "spec": _camel(_routing(spec, _crd_matcher)),
    }
