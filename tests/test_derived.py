"""Derived signals: the formulas, checked against hand-computed values."""

import math
import re
from pathlib import Path

import pytest
import yaml

from nvrx_slo.exporter.engine import derived


@pytest.mark.parametrize("elapsed, faults, expected", [
    (3600.0, 4, 900.0),
    (3600.0, 0, None),  # no fault yet: no MTBF, not infinity
    (0.0, 3, None),
])
def test_mtbf_is_elapsed_time_over_faults(elapsed, faults, expected):
    assert derived.mtbf(elapsed, faults) == expected


def test_young_daly_interval_is_sqrt_of_twice_cost_times_mtbf():
    assert derived.young_daly_interval(0.5, 3600.0) == pytest.approx(60.0)
    assert derived.young_daly_interval(None, 3600.0) is None
    assert derived.young_daly_interval(0.5, None) is None


def test_ettr_matches_the_kokolis_formula():
    # 1 save / 600 s blocking 2 s, restarts cost 60 s, one fault per 6 h:
    # (1 - (60 + 300) / 21600) / (1 + 2 / 600)
    expected = (1 - 360 / 21600) / (1 + 2 / 600)
    assert derived.ettr(600.0, 2.0, 60.0, 21600.0) == pytest.approx(expected)


def test_ettr_without_a_fault_is_the_checkpoint_term_alone():
    assert derived.ettr(100.0, 1.0, None, None) == pytest.approx(1 / 1.01)


def test_ettr_needs_a_measured_interval_and_cost_and_stays_a_ratio():
    assert derived.ettr(None, 1.0, 1.0, 100.0) is None
    assert derived.ettr(100.0, None, 1.0, 100.0) is None
    assert derived.ettr(10_000.0, 1.0, 500.0, 100.0) == 0.0  # faults faster than saves: nothing left


def test_the_young_daly_interval_maximises_the_ettr_model():
    cost, restart, mtbf = 5.0, 30.0, 7200.0
    best = derived.young_daly_interval(cost, mtbf)
    around = [derived.ettr(best * f, cost, restart, mtbf) for f in (0.5, 0.8, 1.0, 1.25, 2.0)]
    assert max(around) == around[2]
    assert math.isclose(best, math.sqrt(2 * cost * mtbf))


def test_skew_is_each_ranks_mean_over_the_median():
    assert derived.skew_ratios({0: 1.0, 1: 1.0, 2: 2.0, 3: 1.0}) == {0: 1.0, 1: 1.0, 2: 2.0, 3: 1.0}
    assert derived.skew_ratios({}) == {}
    assert derived.skew_ratios({0: 0.0}) == {}


def test_the_rules_young_daly_and_ettr_are_these_formulas():
    """The job-level signals are recorded in PromQL (``alerts/signals.py``) and computed here in
    Python for the report: the values the promtool suite holds the rules to (run by
    tests/test_alerts_promtool.py) are these functions' values on that suite's own measured inputs."""
    suite = yaml.safe_load((Path(__file__).parent / "promtool" / "default" / "signals.yaml").read_text())
    expected = {}
    for case in suite["tests"][0]["promql_expr_test"]:
        match = re.fullmatch(r"round\((?:(\d+) \* )?namespace_job_name:nvrx_(\w+):mean30d\)", case["expr"])
        if match and case["eval_time"] == "62m":
            expected[match.group(2)] = case["exp_samples"][0]["value"] / int(match.group(1) or 1)
    cost = expected["checkpoint_blocking_seconds_per_save"]
    mtbf, interval = expected["mtbf_seconds"], expected["checkpoint_interval_seconds"]
    restart = expected["restart_seconds_per_restart"]
    assert round(100 * derived.young_daly_interval(cost, mtbf)) / 100 == expected["checkpoint_interval_optimal_seconds"]
    assert round(10000 * derived.ettr(interval, cost, restart, mtbf)) / 10000 == expected["efficiency_predicted"]
