"""The text SLO report: breakdown sums to 100%, latencies by level and phase, SLO verdicts both sides."""

from __future__ import annotations

import re

from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter.views import cost, slo_report
from snapshot_fixtures import TARGETS, rank, snapshot


def shares(text: str) -> dict[str, float]:
    section = text.split("Where the time went")[1].split("\n\n")[0]
    return {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^  (.+?)\s+[\d.]+ s\s+([\d.]+)%$", section,
                                                                       re.M)}


def test_the_breakdown_sums_to_100_percent_with_productive():
    text = slo_report.render(snapshot(3), TARGETS)
    got = shares(text)
    total = got.pop("total")
    assert total == 100.0 and abs(sum(got.values()) - 100.0) < 0.05
    assert got["productive"] == 90.0 and len(got) == len(Category) - 1  # a pod has no absent ranks
    assert "Efficiency (productive / wall): 90.00%" in text


def test_restart_latency_by_level_and_phase():
    text = slo_report.render(snapshot(2), TARGETS)
    assert "injob     1 restart(s), mean 3.00 s" in text
    assert "inprocess none" in text and "pod       none" in text
    assert re.search(r"    rendezvous\s+mean 0.50 s over 1", text)
    assert "killed: SIGKILL" in text


def test_the_cost_table_splits_the_caused_categories_by_cause_and_prices_accelerator_hours():
    """Restart seconds by cause (what no cause holds yet: a restart still open), every other badput
    category whole; accelerator-hours are rank-seconds × accelerators per rank / 3600, the cost
    those × the price. The error budget is 1% of the wall's accelerator-hours."""
    snap = snapshot(2)
    text = slo_report.render(snap, TARGETS, cost.Pricing(accelerators_per_rank=8, price=3.5, currency="USD",
                                                         source="--price"))
    section = text.split("What badput cost")[1].split("\n\n")[0]
    assert "(8 accelerator(s) per rank; 3.50 USD per accelerator-hour (--price)):" in section
    rows = {(m[1].strip(), m[2]): (float(m[3]), float(m[4]), m[5]) for m in re.finditer(
        r"^  (.+?)\s{2}(\S+)\s+([\d.]+)\s+([\d.]+)\s+(\S+ USD)$", section, re.M)}
    assert rows[("restart", "killed")] == (6.0, round(6.0 * 8 / 3600, 4), f"{6.0 * 8 / 3600 * 3.5:.4f} USD")
    assert rows[("restart", "(open)")][0] == 2.0  # 4.0 restart seconds a rank, 3.0 of them caused
    assert rows[("checkpoint blocking", "—")][0] == 4.0 and rows[("init", "—")][0] == 4.0
    assert "productive" not in section and "unprotected" not in section
    wall_hours = 200.0 * 8 / 3600
    assert f"error budget: 1% of {wall_hours:.4f} accelerator-hours of wall is {wall_hours / 100:.4f}" in section


def test_without_a_price_the_table_has_accelerator_hours_and_says_how_to_price():
    text = slo_report.render(snapshot(2), TARGETS, cost.Pricing())
    assert "no price: give --price or a cost section in the SLO spec" in text
    assert "   —\n" in text.split("What badput cost")[1]


def test_slo_verdicts_on_both_sides_of_each_threshold():
    failing = slo_report.render(snapshot(2), TARGETS)
    assert "FAIL     training efficiency: 90.00%" in failing
    assert "PASS     recovery latency" in failing and "PASS     checkpoint blocking" in failing
    good = snapshot(2, ranks=tuple(rank(r, wall=1000.0, productive=995.0, unprotected=1.0) for r in range(2)))
    assert "PASS     training efficiency: 99.50%" in slo_report.render(good, TARGETS)
