"""The SLO plan: the windows the spec's period, shortest window and evaluation interval make, computed
once from the spec (``plan_for``, pure, as sloth computes its plan) and handed to every rule and
dashboard builder, so no builder derives a window of its own.

Multi-window, multi-burn-rate alerting: the policy as data (Google SRE Workbook, ch. 5; the same
four pairs Sloth and kubernetes-mixin use), written for a 30-day period. A pair fires when the error
budget burns ``factor`` times faster than the period allows over *both* its long window (enough
budget is gone to matter) and its short window (it is still burning, so the alert resolves soon
after the burn stops). ``factor × long / period`` is the share of the whole budget the long window
has consumed when it fires: 2% (14.4 × 1h), 5% (6 × 6h), 10% (3 × 1d and 1 × 3d).

For another period every window scales by ``period / 30d`` and the factors stay, so the shares
stay. That is what lets a test run the same alerts over an hour. Windows are rounded to whole
seconds and raised to ``min_window``: ``rate()`` needs a few scrapes inside its window, so a
one-hour period scraped every second needs ``min_window`` of a few seconds. Only windows that
would be shorter than that move, which for a 30-day period and ``min_window`` ≤ 5m is none.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from nvrx_slo.alerts import duration

REFERENCE_PERIOD = 30 * 86400
PERIOD_EVERY = 240  # seconds between evaluations of the windows over a 30-day period


class Severity(str, Enum):
    """The ``severity`` label: Alertmanager pages on ``critical`` and files a ticket on ``warning``."""

    PAGE = "critical"
    TICKET = "warning"


@dataclass(frozen=True)
class BurnWindow:
    severity: Severity
    long: int  # seconds
    short: int  # seconds
    factor: float  # burn rate: error ratio / error budget


POLICY: tuple[BurnWindow, ...] = (
    BurnWindow(Severity.PAGE, duration.parse("1h"), duration.parse("5m"), 14.4),
    BurnWindow(Severity.PAGE, duration.parse("6h"), duration.parse("30m"), 6.0),
    BurnWindow(Severity.TICKET, duration.parse("1d"), duration.parse("2h"), 3.0),
    BurnWindow(Severity.TICKET, duration.parse("3d"), duration.parse("6h"), 1.0),
)


@dataclass(frozen=True)
class Plan:
    """What the rules and dashboards read their windows from; made by ``plan_for``."""

    period: int  # seconds
    evaluation_interval: int  # seconds; every generated group runs at it but the period's (``period_interval``)
    burn_windows: tuple[BurnWindow, ...]  # ``POLICY`` for the period
    windows: tuple[int, ...]  # each a ratio is recorded over: the pairs', shortest first, then the period

    @property
    def base(self) -> int:
        """The shortest window: the only one whose rules read the pods' series; every longer one
        averages the job-level rates recorded over it."""
        return self.windows[0]

    @property
    def tile(self) -> int:
        """The first page pair's long window: every window up to it reads its records directly, every
        longer one sums whole tiles of it (``alerts/tiles.py``)."""
        return self.burn_windows[0].long

    @property
    def period_interval(self) -> int:
        """How often the windows over the whole period run (their own groups): 4 minutes for a 30-day
        period, scaled with it, in whole evaluations. The period's window then moves by 4/43,200 of
        itself at a time, and stays under Prometheus's 5-minute lookback, so its readers see no gap."""
        e = self.evaluation_interval
        return max(scale(PERIOD_EVERY, self.period, e) // e, 1) * e

    def evaluations(self, window: int) -> int:
        """The evaluations a full ``window`` holds."""
        return window // self.evaluation_interval


def scale(seconds: int, period: int, min_window: int) -> int:
    """One window of the 30-day policy, for ``period``: proportional, whole seconds, ≥ ``min_window``."""
    return max(round(seconds * period / REFERENCE_PERIOD), min_window, 1)


def plan_for(period: int, min_window: int, evaluation_interval: int) -> Plan:
    """The plan of a spec's numbers. Raises ``ValueError`` if ``min_window`` swallows a long window."""
    pairs = tuple(
        BurnWindow(w.severity, scale(w.long, period, min_window), scale(w.short, period, min_window), w.factor)
        for w in POLICY
    )
    for original, pair in zip(POLICY, pairs, strict=True):
        if pair.short >= pair.long:
            raise ValueError(
                f"for a period of {duration.format(period)} the {duration.format(original.long)} window becomes "
                f"{duration.format(pair.long)}, no longer than its short window {duration.format(pair.short)}: "
                f"lower min_window ({duration.format(min_window)}) or lengthen the period"
            )
    spans = sorted({w for pair in pairs for w in (pair.long, pair.short)})
    return Plan(period, evaluation_interval, pairs, (*spans, period))
