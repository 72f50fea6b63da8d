"""The text SLO report: breakdown sums to 100%, latencies by level and phase, SLO verdicts both sides."""

from __future__ import annotations

import re

from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter.views import slo_report
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
    assert "cause: SIGKILL" in text


def test_slo_verdicts_on_both_sides_of_each_threshold():
    failing = slo_report.render(snapshot(2), TARGETS)
    assert "FAIL     training efficiency: 90.00%" in failing
    assert "PASS     recovery latency" in failing and "PASS     checkpoint blocking" in failing
    good = snapshot(2, ranks=tuple(rank(r, wall=1000.0, productive=995.0, unprotected=1.0) for r in range(2)))
    assert "PASS     training efficiency: 99.50%" in slo_report.render(good, TARGETS)
