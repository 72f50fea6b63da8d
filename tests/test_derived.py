"""Derived signals: the formulas, checked against hand-computed values."""

import math

import pytest

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
