"""What a run's badput cost: accelerator-hours, and money where a price is known, per category and
per cause: the report's cost table, as text, as a section of the HTML report, and as CSV.

Every number is one of the snapshot's (rank-seconds per category, and per cause of the lost,
restart and absent seconds: ``Snapshot.caused``) times the accelerators each rank holds and the
price of one accelerator-hour; nothing is decided again here. The table's rows are every badput
category, the fault-caused ones (lost, restart, absent) split by cause; seconds of those categories
that no cause holds yet (a restart still open) are a row without a cause. Unprotected work is not
badput (yet) and not in the table.

The CSV's columns follow the FinOps FOCUS specification where one fits (``ConsumedQuantity``,
``ConsumedUnit``, ``EffectiveCost``, ``BillingCurrency``, ``ChargePeriodStart``/``End``,
``ResourceName``), with ``x_`` columns for what FOCUS has no column for (category, cause, ...):
one row per row of the table, so a FinOps tool can load a training run's badput beside its bill.
"""

from __future__ import annotations

import csv
import datetime
import html as html_module
import io
from dataclasses import dataclass

from nvrx_slo.contracts.catalogue import Category, FaultCause
from nvrx_slo.contracts.targets import Targets
from nvrx_slo.exporter.engine.snapshot import Snapshot
from nvrx_slo.exporter.printable import printable
from nvrx_slo.exporter.views.status_page import CATEGORY_STYLES, breakdown

UNIT = "Accelerator-Hours"
CAUSED = (Category.LOST, Category.RESTART, Category.ABSENT)


@dataclass(frozen=True)
class Pricing:
    """How a report prices a run: accelerators per rank, and one accelerator-hour's price."""

    accelerators_per_rank: float = 1.0
    price: float | None = None  # per accelerator-hour; None: accelerator-hours only
    currency: str | None = None
    source: str = ""  # what set the price, for the reader: "--price", "the SLO spec"

    @classmethod
    def of(cls, price: float | None, targets: Targets) -> Pricing:
        """``--price`` if given, else the spec's default price (a report cannot tell the model)."""
        spec = targets.price
        if price is not None:
            return cls(price=price, currency=spec.currency if spec else None, source="--price")
        if spec is not None and spec.default is not None:
            return cls(price=spec.default, currency=spec.currency, source="the SLO spec's default")
        return cls()


@dataclass(frozen=True)
class Row:
    category: Category
    cause: FaultCause | None  # None: a category no fault causes, or its seconds no cause holds yet
    rank_seconds: float
    accelerator_hours: float
    cost: float | None


@dataclass(frozen=True)
class Table:
    rows: tuple[Row, ...]
    pricing: Pricing
    wall_accelerator_hours: float
    budget: float  # the efficiency SLO's error budget, a share of wall

    @property
    def accelerator_hours(self) -> float:
        return sum(r.accelerator_hours for r in self.rows)

    @property
    def cost(self) -> float | None:
        return None if self.pricing.price is None else sum(r.cost or 0.0 for r in self.rows)

    @property
    def budget_accelerator_hours(self) -> float:
        return self.budget * self.wall_accelerator_hours


def table(snap: Snapshot, pricing: Pricing, targets: Targets) -> Table:
    """The cost of ``snap``'s badput, largest first."""
    per_hour = pricing.accelerators_per_rank / 3600.0

    def row(category: Category, cause: FaultCause | None, seconds: float) -> Row:
        hours = seconds * per_hour
        return Row(category, cause, seconds, hours, None if pricing.price is None else hours * pricing.price)

    rows = []
    for category, seconds in breakdown(snap).items():
        if category in (Category.PRODUCTIVE, Category.UNPROTECTED) or seconds <= 0:
            continue
        causes = {cause: s for (c, cause), s in snap.caused.items() if c is category} if category in CAUSED else {}
        rows += [row(category, cause, s) for cause, s in causes.items()]
        rest = seconds - sum(causes.values())
        if rest > 1e-6 * max(seconds, 1.0):
            rows.append(row(category, None, rest))
    rows.sort(key=lambda r: -r.rank_seconds)
    return Table(tuple(rows), pricing, snap.wall_s * per_hour, 1.0 - targets.efficiency)


def _money(value: float | None, currency: str | None) -> str:
    """Cents, or four decimals below one unit (a short run's badput costs less than a cent)."""
    if value is None:
        return "—"
    return f"{value:,.2f} {currency or ''}".rstrip() if abs(value) >= 1 else f"{value:.4f} {currency or ''}".rstrip()


def _cause(row: Row) -> str:
    if row.cause is not None:
        return row.cause.value
    return "(open)" if row.category in CAUSED else "—"


def text(t: Table) -> list[str]:
    """The table as the text SLO report's lines."""
    p = t.pricing
    priced = (f"{_money(p.price, p.currency)} per accelerator-hour ({p.source})" if p.price is not None
              else "no price: give --price or a cost section in the SLO spec")
    lines = [f"What badput cost ({p.accelerators_per_rank:g} accelerator(s) per rank; {priced}):"]
    if not t.rows:
        return [*lines, "  nothing yet"]
    width = max(len(CATEGORY_STYLES[r.category].label) for r in t.rows)
    lines.append(f"  {'category':<{width}}  {'cause':<12} {'rank-s':>10} {'accel-h':>10} {'cost':>14}")
    for r in t.rows:
        lines.append(f"  {CATEGORY_STYLES[r.category].label:<{width}}  {_cause(r):<12} {r.rank_seconds:10.2f} "
                     f"{r.accelerator_hours:10.4f} {_money(r.cost, p.currency):>14}")
    lines.append(f"  {'total':<{width}}  {'':<12} {sum(r.rank_seconds for r in t.rows):10.2f} "
                 f"{t.accelerator_hours:10.4f} {_money(t.cost, p.currency):>14}")
    budget = t.budget_accelerator_hours
    worth = "" if p.price is None else f", worth {_money(budget * p.price, p.currency)}"
    lines.append(f"  error budget: {100 * t.budget:g}% of {t.wall_accelerator_hours:.4f} accelerator-hours of wall is "
                 f"{budget:.4f}{worth}; {t.accelerator_hours:.4f} spent "
                 f"({100 * t.accelerator_hours / budget if budget > 0 else 0:.0f}%)")
    return lines


COLUMNS = ("ChargePeriodStart", "ChargePeriodEnd", "ResourceName", "ConsumedQuantity", "ConsumedUnit",
           "BillingCurrency", "EffectiveCost", "x_Category", "x_Cause", "x_RankSeconds", "x_AcceleratorsPerRank",
           "x_PricePerAcceleratorHour")


def _iso(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def to_csv(t: Table, snap: Snapshot) -> str:
    """The table as CSV, one row per table row (FOCUS column names where one fits)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    start = snap.job_start_wall if snap.job_start_wall is not None else snap.now_wall
    p = t.pricing
    for r in t.rows:
        writer.writerow([_iso(start), _iso(snap.now_wall), printable(snap.job), f"{r.accelerator_hours:.10g}", UNIT,
                         p.currency or "", "" if r.cost is None else f"{r.cost:.10g}", r.category.value,
                         "" if r.cause is None else r.cause.value, f"{r.rank_seconds:.10g}",
                         f"{p.accelerators_per_rank:g}", "" if p.price is None else f"{p.price:g}"])
    return out.getvalue()


def html(t: Table) -> str:
    """The table as a card of the HTML report; each number carries its value (``data-value``) for tests."""
    p = t.pricing
    e = _escape

    def num(name: str, value: float | None, shown: str) -> str:
        return f'<span id="{name}" data-value="{value!r}">{e(shown)}</span>' if value is not None else e(shown)

    rows = "".join(
        f'<tr data-category="{r.category.value}" data-cause="{"" if r.cause is None else r.cause.value}">'
        f'<td><span class="swatch c-{r.category.value}"></span>{e(CATEGORY_STYLES[r.category].label)}</td>'
        f"<td>{e(_cause(r))}</td><td class=\"num\">{r.rank_seconds:.2f}</td>"
        f'<td class="num">{r.accelerator_hours:.4f}</td><td class="num">{e(_money(r.cost, p.currency))}</td></tr>'
        for r in t.rows)
    priced = (e(f"{_money(p.price, p.currency)} per accelerator-hour ({p.source})") if p.price is not None
              else "no price given (<code>--price</code>, or a <code>cost</code> section in the SLO spec)")
    return (f'<section class="card wide"><h2>What badput cost</h2>'
            f'<p class="sub">{p.accelerators_per_rank:g} accelerator(s) per rank; {priced}. '
            f"Lost, restart and absent time by the cause of the fault that cost it.</p>"
            f'<table class="split"><tr><th>category</th><th>cause</th><th class="num">rank-seconds</th>'
            f'<th class="num">accelerator-hours</th><th class="num">cost</th></tr>{rows}'
            f'<tr><th>total</th><th></th><th></th>'
            f'<th class="num">{num("badput-accelerator-hours", t.accelerator_hours, f"{t.accelerator_hours:.4f}")}</th>'
            f'<th class="num">{num("badput-cost", t.cost, _money(t.cost, p.currency))}</th></tr></table></section>')


def _escape(value: object) -> str:
    return html_module.escape(str(value), quote=True)
