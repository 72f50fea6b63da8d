"""A ledger's pool decides its steps by slicing when they are in order (``Pool.take``): exactly what
deciding each entry on its own (``Pool._take_any``) gives, to the bit, whatever the pool holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nvrx_slo.exporter.engine.pool import Pool

works = st.floats(0.0, 10.0, allow_nan=False)


@st.composite
def pools(draw: st.DrawFn) -> Pool:
    steps = draw(st.lists(st.integers(0, 12), max_size=12))
    if draw(st.booleans()):
        steps.sort()  # a process's loop: the fast path
    n = len(steps)
    work = draw(st.lists(works, min_size=n, max_size=n))
    first = sorted(draw(st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=n, max_size=n)))
    return Pool(steps, work, first, [f + draw(works) for f in first], sum(work))


def _held(pool: Pool) -> tuple[object, ...]:
    return pool.steps, pool.work, pool.first, pool.last, pool.sum


@given(pools(), st.one_of(st.none(), st.integers(-1, 13)), st.booleans())
def test_taking_in_order_decides_as_entry_by_entry(pool: Pool, keep_upto: int | None, drop_rest: bool) -> None:
    other = pool.copy()
    assert pool.take(keep_upto, drop_rest) == other._take_any(keep_upto, drop_rest)
    assert _held(pool) == _held(other)


def test_steps_in_order_keep_a_prefix_and_the_rest_waits() -> None:
    pool = Pool([1, 2, 2, 5], [1.0, 2.0, 3.0, 4.0], [10.0, 11.0, 12.0, 13.0], [10.0, 11.0, 12.0, 13.0], 10.0)
    kept, lost, verdicts = pool.take(2, False)
    assert (kept, lost, verdicts) == ([1.0, 2.0, 3.0], [], [(10.0, 10.0, True), (11.0, 11.0, True), (12.0, 12.0, True)])
    assert _held(pool) == ([5], [4.0], [13.0], [13.0], 4.0)
    assert pool.take(None, True) == ([], [4.0], [(13.0, 13.0, False)])
    assert _held(pool) == ([], [], [], [], 0)
