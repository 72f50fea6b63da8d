"""Where each generated rule can run once one Prometheus is not enough (docs/scaling.md has the plan).

A rule group is one list of rules; each rule is one of two tiers:

* ``LOCAL``: it reads the pods' series (or records of them), so it runs in the Prometheus that
  scrapes every pod of the job: the job-level rates of each SLI and signal, the evaluation counter
  the windows divide by, and the plain alerts (none reads a window longer than 30 minutes). Its
  job-level rates are the interface: one series per job, what the other tier reads.
* ``GLOBAL``: the windows over those rates up to the SLO period (error ratios, burn rates, budgets,
  burn-rate alerts, the period-long signals). They read only the job-level rates, so they run
  wherever those arrive (a Thanos or Mimir ruler, or a Prometheus receiving them by remote-write),
  over storage kept for the whole period, which a local Prometheus need not keep.

One Prometheus runs both tiers of a group as one group, in order (``rules.yaml``); more than one
runs the same rules split in two files, each group keeping its name and its rules' order
(``sharded/local.yaml`` and ``sharded/global.yaml``). A group's global rules come after the local
rules they read, so in one group they read this evaluation's records. The windows over the whole
period run in groups of their own, less often (``period_group``; docs/scaling.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.plan import Plan

Rule = dict[str, Any]


class Tier(str, Enum):
    LOCAL = "local"
    GLOBAL = "global"


@dataclass(frozen=True)
class Group:
    """One rule group, every rule with its tier; ``part`` renders the group as a rule file holds it."""

    name: str
    interval: int  # seconds
    rules: tuple[tuple[Tier, Rule], ...]

    def part(self, tiers: frozenset[Tier]) -> dict[str, Any] | None:
        """The group with only the rules of ``tiers``, in order; ``None`` if it has none of them."""
        rules = [rule for tier, rule in self.rules if tier in tiers]
        if not rules:
            return None
        return {"name": self.name, "interval": duration.format(self.interval), "rules": rules}


def tiered(tier: Tier, rules: Iterable[Rule]) -> list[tuple[Tier, Rule]]:
    return [(tier, rule) for rule in rules]


def period_group(name: str, plan: Plan, rules: Iterable[Rule]) -> Group:
    """The rules over the whole period of the group ``name``, in a group of their own every
    ``plan.period_interval``: global, they read the job-level rates and the tiles' records, through
    what the tiles' group made at its last evaluation (``tiles.Tiled.settled``)."""
    return Group(f"{name}-period", plan.period_interval, tuple(tiered(Tier.GLOBAL, rules)))
