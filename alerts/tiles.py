"""Windows longer than the tile, summed from whole-tile partial sums: a 30-day window reads about 720
samples of each record, not 43,200 (docs/scaling.md), and ends at this evaluation, not at the last
whole tile.

The tile is the first page pair's long window (1h for a 30-day period); every window up to it reads
its record directly. For a longer one, each job-level record ``X`` (one sample per job and
evaluation, every ``e``) gets three records in the group that reads it, all of the global tier:

* the *partial*: the steps of the current tile so far, where a step is ``X``'s sample of the
  evaluation a shortest window ago (``step``): samples that old have arrived wherever ``X`` is
  recorded, by remote-write or by another ruler, so no step misses one;
* the *tile*: at a tile's first evaluation (``time() % tile < e``), the partial of the tile before,
  one sample per tile (and the staleness marker after it);
* the *head*: the partial plus ``X``'s last shortest window, what a window over the period reads in a
  group that runs less often (``Tiled.settled``).

A window of ``span`` seconds, ``(t − span, t]``, is then ``X``'s samples of the last shortest
window, read directly, plus the steps of ``(t − span + shortest, t]``: the tiles in that range, plus
the partial now, less the partial as it stood at the range's start (the part of the oldest tile
before it). Exact, with no lag: the same samples a direct window sums, if every evaluation ran. No
rule reads a record of its own evaluation: the partial now is the partial an evaluation ago plus this
step, so it runs on vmalert as on Prometheus (``sli.increase``).

Evaluations missed: inside a tile, the partial carries on from the last one (within a tile); one
missed at a tile's start merges two tiles into one, which every window reads consistently; a ruler
down for longer than a tile loses the tile it stopped in. A maximum has no partial to subtract: a
window's most includes up to one tile before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.plan import Plan

Rule = dict[str, Any]


class Agg(str, Enum):
    SUM = "sum"
    COUNT = "count"  # each evaluation's sample counts 1
    MAX = "max"


def just_under(seconds: int) -> str:
    """A range a millisecond short of ``seconds``: ``(t − seconds, t]`` on every engine, whichever end
    it bounds (``[a, b]`` before Prometheus 3.0, ``(a, b]`` since)."""
    return f"{duration.format(seconds - 1)}999ms" if seconds > 1 else "999ms"


def is_tile(record: str, plan: Plan) -> bool:
    """Whether ``record`` is a tile: one sample per tile (what a benchmark backfills so)."""
    return record.endswith(f"_tile{duration.format(plan.tile)}")


def _part(name: str, expr: str) -> str:
    return f'label_replace({expr}, "part", "{name}", "", "")'


@dataclass(frozen=True)
class Tiled:
    """``selector``'s samples (one job-level record) aggregated by ``agg`` over long windows."""

    selector: str  # e.g. namespace_job_name:nvrx_slo_sli_bad:rate5m{slo="efficiency"}
    agg: Agg

    def _name(self, plan: Plan) -> str:
        return f"{self.selector.split('{')[0]}_{self.agg.value}_tile{duration.format(plan.tile)}"

    def _matchers(self) -> str:
        return self.selector[len(self.selector.split("{")[0]):]

    def tile(self, plan: Plan) -> str:
        return self._name(plan)

    def partial(self, plan: Plan) -> str:
        return f"{self._name(plan)}_partial"

    def head(self, plan: Plan) -> str:
        return f"{self._name(plan)}_head"

    def _over(self, seconds: int, offset: int = 0) -> str:
        at = f" offset {duration.format(offset)}" if offset else ""
        return f"{self.agg.value}_over_time({self.selector}[{just_under(seconds)}]{at})"

    def _combined(self, *parts: tuple[str, str]) -> str:
        """The parts, each a vector or absent, summed (a count too) or maxed, series by series."""
        how = "max" if self.agg is Agg.MAX else "sum"
        return f"{how} without (part) ({' or '.join(_part(n, e) for n, e in parts)})"

    def _previous(self, plan: Plan) -> str:
        """The partial as the evaluation before left it: its newest within a tile."""
        e = duration.format(plan.evaluation_interval)
        return f"last_over_time({self.partial(plan)}{self._matchers()}[{just_under(plan.tile)}] offset {e})"

    def rules(self, plan: Plan) -> list[Rule]:
        """The partial, the tile and the head. A partial with no step carries on while it holds
        something; at a tile's start it restarts (0 if no step: so the next evaluation carries nothing
        of the tile before, which the tile holds)."""
        e, tile = plan.evaluation_interval, plan.tile
        step, before = self._over(e, plan.base), self._previous(plan)
        inside = f"(time() % {tile} >= bool {e})"  # 0 at a tile's first evaluation
        carried = f"{before} * {inside}"
        with_step = self._combined(("step", step), ("carried", f"{carried} and {step}"))
        partial = f"{with_step}\nor ({before} > 0) * {inside}"
        return [
            {"record": self.partial(plan), "expr": partial},
            {"record": self.tile(plan), "expr": f"{before}\nand on () (vector(time() % {tile}) < {e})"},
            # the partial's expression, not the partial read back: a ruler without read-after-write
            {"record": self.head(plan), "expr": self._combined(("partial", f"({partial})"),
                                                               ("recent", self._over(plan.base)))},
        ]

    def window(self, span: int, plan: Plan) -> str:
        """``selector`` aggregated over ``(t − span, t]``: its last shortest window directly, the rest
        from the tiles, the partial an evaluation ago and this step, less the partial at its start."""
        e, recent = plan.evaluation_interval, plan.base
        tiled = span - recent  # the steps of (t − tiled, t] hold the samples of (t − span, t − recent]
        over_tiles = "max" if self.agg is Agg.MAX else "sum"
        tiles = f"{self.tile(plan)}{self._matchers()}[{just_under(tiled - e)}] offset {duration.format(e)}"
        parts = [("recent", self._over(recent)), ("tiles", f"{over_tiles}_over_time({tiles})"),
                 ("partial", self._previous(plan)), ("step", self._over(e, recent))]
        if self.agg is not Agg.MAX:
            start = (f"last_over_time({self.partial(plan)}{self._matchers()}[{just_under(e)}]"
                     f" offset {duration.format(tiled)})")
            parts.append(("start", f"-{start}"))
        return self._combined(*parts)

    def settled(self, span: int, plan: Plan) -> str:
        """``window`` as the tiles' group made it at its last evaluation, for a group that runs less
        often, at another instant in the interval (``tiers.period_group``): the tiles to then and its
        head (no sample of ``selector`` read: the tiles' group read it before or after this instant),
        less the partial at the start. Exact where the newest head is there to read (Prometheus runs
        the two groups at different offsets in the interval); where it is not yet (vmalert writes
        asynchronously, and aligns both groups to the same instants), the one before, and the window
        is one evaluation's sample short; a tile of that evaluation there before its head is left out
        (the head before holds it)."""
        e, tiled, m = plan.evaluation_interval, span - plan.base, self._matchers()
        over_tiles = "max" if self.agg is Agg.MAX else "sum"
        parts = [("tiles", f"{over_tiles}_over_time({self.tile(plan)}{m}[{just_under(tiled)}])"),
                 ("head", f"last_over_time({self.head(plan)}{m}[{just_under(2 * e)}])")]
        if self.agg is not Agg.MAX:
            start = f"last_over_time({self.partial(plan)}{m}[{just_under(e)}] offset {duration.format(tiled)})"
            early = (f"last_over_time({self.tile(plan)}{m}[{just_under(e)}])"
                     f" unless last_over_time({self.head(plan)}{m}[{just_under(e)}])")
            parts += [("start", f"-{start}"), ("early", f"-({early})")]
        return self._combined(*parts)
