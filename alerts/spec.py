"""The SLO spec: a typed model, and the loader that maps the versioned YAML onto it.

The wire format (``alerts/slo.yaml`` documents it) is kept apart from the model: ``load`` parses
YAML, checks the version, reads every key through ``_Section`` (which knows the path it is at,
so each error names the key: ``objectives.efficiency.target: must be a number in (0, 1), got 1.5``), then
validates the whole. Every key is required and unknown keys are errors, so the spec file is the
one place a value is set. Nothing is written anywhere until a spec has loaded cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.plan import Plan, plan_for
from nvrx_slo.contracts import catalogue
from nvrx_slo.contracts.targets import Price, Targets

VERSION = 1
DEFAULT_PATH = Path(__file__).with_name("slo.yaml")


class SpecError(ValueError):
    """A spec that cannot be used; the message names the file and the key."""


class Slo(str, Enum):
    EFFICIENCY = "efficiency"
    RECOVERY = "recovery"
    CHECKPOINT_BLOCKING = "checkpoint_blocking"
    CHECKPOINT_OVERLAP = "checkpoint_overlap"


@dataclass(frozen=True)
class Objective:
    slo: Slo
    target: float  # share of good (seconds or events) over the period
    page: bool  # fast burn pages; otherwise every burn is a ticket

    @property
    def budget(self) -> float:
        return 1.0 - self.target


@dataclass(frozen=True)
class PlainAlerts:
    stalled_after: int
    checkpoint_stale_after: int
    worker_dead_for: int
    restart_storm_restarts: int
    restart_storm_within: int
    restart_budget_remaining: int
    exporter_scrape_job: str
    exporter_down_for: int
    no_data_for: int
    idle_ratio: float
    idle_over: int
    idle_for: int
    straggler_skew: float
    straggler_for: int
    unattributed_ratio: float
    unattributed_over: int
    unattributed_for: int


@dataclass(frozen=True)
class Routing:
    pager_url: str
    ticket_url: str
    group_wait: int
    group_interval: int
    page_repeat_interval: int
    ticket_repeat_interval: int


@dataclass(frozen=True)
class Spec:
    period: int  # seconds
    min_window: int  # seconds
    evaluation_interval: int  # seconds; every generated group runs at it
    objectives: dict[Slo, Objective]
    recovery_threshold: float  # seconds; a bucket bound of the restart histogram
    alerts: PlainAlerts
    runbook_url: str  # contains "{alert}"
    grafana_url: str
    release: str
    routing: Routing
    price: Price | None = None  # the optional ``cost`` section

    @property
    def targets(self) -> Targets:
        """What the status page and the SLO reports judge against (they may not import this room)."""
        o = self.objectives
        return Targets(efficiency=o[Slo.EFFICIENCY].target, recovery=o[Slo.RECOVERY].target,
                       recovery_threshold_s=self.recovery_threshold,
                       checkpoint_blocking=o[Slo.CHECKPOINT_BLOCKING].target,
                       checkpoint_overlap=o[Slo.CHECKPOINT_OVERLAP].target, price=self.price)

    def plan(self) -> Plan:
        """The windows of this spec (``plan.plan_for``): generation makes it once and hands it to every builder."""
        return plan_for(self.period, self.min_window, self.evaluation_interval)


class _Section:
    """One mapping of the YAML document, read key by key; ``done()`` rejects keys nobody read."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise SpecError(f"{path or 'the document'}: must be a mapping, got {type(data).__name__}")
        self._data, self._path = data, path
        self._read: set[str] = set()

    def _where(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def _get(self, key: str) -> Any:
        if key not in self._data:
            raise SpecError(f"{self._where(key)}: missing")
        self._read.add(key)
        return self._data[key]

    def section(self, key: str) -> _Section:
        return _Section(self._get(key), self._where(key))

    def string(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, str) or not value:
            raise SpecError(f"{self._where(key)}: must be a non-empty string, got {value!r}")
        return value

    def boolean(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise SpecError(f"{self._where(key)}: must be true or false, got {value!r}")
        return value

    def number(self, key: str, low: float, high: float | None = None) -> float:
        """A number in the open interval (low, high), or above low if high is None."""
        value = self._get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not (value > low and (high is None or value < high)):
            bounds = f"in ({low:g}, {high:g})" if high is not None else f"greater than {low:g}"
            raise SpecError(f"{self._where(key)}: must be a number {bounds}, got {value!r}")
        return float(value)

    def count(self, key: str, minimum: int) -> int:
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise SpecError(f"{self._where(key)}: must be a whole number ≥ {minimum}, got {value!r}")
        return value

    def duration(self, key: str) -> int:
        value = self._get(key)
        try:
            return duration.parse(value if isinstance(value, str) else repr(value))
        except ValueError as err:
            raise SpecError(f"{self._where(key)}: {err}") from None

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(f"{self._where(key)}: {message}")

    def done(self) -> None:
        unknown = sorted(set(map(str, self._data)) - self._read)
        if unknown:
            raise SpecError(f"{self._where(unknown[0])}: unknown key (known: {', '.join(sorted(self._read))})")


def _restart_bucket(s: _Section, key: str) -> float:
    """A duration that is a bucket bound of the restart histogram, so the SLI can count ``le`` directly."""
    seconds = float(s.duration(key))
    if seconds not in catalogue.RESTART_BUCKETS:
        bounds = ", ".join(f"{b:g}s" for b in catalogue.RESTART_BUCKETS)
        raise s.error(key, f"must be a bucket bound of {catalogue.RESTART_DURATION.name} ({bounds}), got {seconds:g}s")
    return seconds


MAX_PRICE = 1e6  # per accelerator-hour: more is a typo (a monthly price, cents)


def _price(root: _Section) -> Price | None:
    """The optional ``cost`` section: a currency and each model's price per accelerator-hour."""
    if "cost" not in root._data:
        return None
    cost = root.section("cost")
    currency = cost.string("currency")
    if not (currency.isalpha() and currency.isupper() and len(currency) == 3):
        raise cost.error("currency", f"must be an ISO 4217 code such as USD, got {currency!r}")
    prices = cost.section("accelerator_hour")
    by_model = {str(model): prices.number(str(model), 0.0, MAX_PRICE) for model in list(prices._data)}
    prices.done()
    cost.done()
    if not by_model:
        raise cost.error("accelerator_hour", "must price at least one model, or default")
    default = by_model.pop("default", None)
    return Price(currency, default, by_model)


def _plain(s: _Section) -> PlainAlerts:
    stalled, stale = s.section("training_stalled"), s.section("checkpoint_stale")
    dead = s.section("checkpoint_worker_dead")
    storm, budget, down = s.section("restart_storm"), s.section("restart_budget_low"), s.section("exporter_down")
    no_data, idle = s.section("sli_no_data"), s.section("accelerator_idle")
    straggler, unattributed = s.section("straggler"), s.section("unattributed")
    plain = PlainAlerts(
        stalled_after=stalled.duration("after"),
        checkpoint_stale_after=stale.duration("after"),
        worker_dead_for=dead.duration("for"),
        restart_storm_restarts=storm.count("restarts", 1),
        restart_storm_within=storm.duration("within"),
        restart_budget_remaining=budget.count("remaining", 0),
        exporter_scrape_job=down.string("scrape_job"),
        exporter_down_for=down.duration("for"),
        no_data_for=no_data.duration("for"),
        idle_ratio=idle.number("ratio", 0.0, 1.0),
        idle_over=idle.duration("over"),
        idle_for=idle.duration("for"),
        straggler_skew=straggler.number("skew", 1.0),
        straggler_for=straggler.duration("for"),
        unattributed_ratio=unattributed.number("ratio", 0.0, 1.0),
        unattributed_over=unattributed.duration("over"),
        unattributed_for=unattributed.duration("for"),
    )
    for section in (stalled, stale, dead, storm, budget, down, no_data, idle, straggler, unattributed, s):
        section.done()
    return plain


def from_dict(data: Any) -> Spec:
    """Map a parsed YAML document onto the model; raises ``SpecError`` naming the first bad key."""
    root = _Section(data, "")
    version = root._get("version")
    if version != VERSION:
        raise SpecError(f"version: this nvrx-slo reads spec version {VERSION}, got {version!r}")
    objectives_section = root.section("objectives")
    objectives: dict[Slo, Objective] = {}
    recovery_threshold = 0.0
    for slo in Slo:
        s = objectives_section.section(slo.value)
        objectives[slo] = Objective(slo, s.number("target", 0.0, 1.0), s.boolean("page"))
        if slo is Slo.RECOVERY:
            recovery_threshold = _restart_bucket(s, "threshold")
        s.done()
    objectives_section.done()
    links, kubernetes, am = root.section("links"), root.section("kubernetes"), root.section("alertmanager")
    spec = Spec(
        period=root.duration("period"),
        min_window=root.duration("min_window"),
        evaluation_interval=root.duration("evaluation_interval"),
        objectives=objectives,
        recovery_threshold=recovery_threshold,
        alerts=_plain(root.section("alerts")),
        runbook_url=links.string("runbook_url"),
        grafana_url=links.string("grafana_url").rstrip("/"),
        release=kubernetes.string("release"),
        routing=Routing(
            pager_url=am.string("pager_url"),
            ticket_url=am.string("ticket_url"),
            group_wait=am.duration("group_wait"),
            group_interval=am.duration("group_interval"),
            page_repeat_interval=am.duration("page_repeat_interval"),
            ticket_repeat_interval=am.duration("ticket_repeat_interval"),
        ),
        price=_price(root),
    )
    for section in (links, kubernetes, am, root):
        section.done()
    if "{alert}" not in spec.runbook_url:
        raise links.error("runbook_url", f"must contain {{alert}}, got {spec.runbook_url!r}")
    try:
        spec.plan()  # refuses a min_window that swallows a long window
    except ValueError as err:
        raise root.error("period", str(err)) from None
    return spec


def load(path: Path = DEFAULT_PATH) -> Spec:
    """Read and validate a spec file; every error names ``path`` and the key."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from None
    try:
        return from_dict(data)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None
