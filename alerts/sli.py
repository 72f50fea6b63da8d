"""The four SLIs as PromQL over the exporter's series, job-level, with every name from the catalogue.

Each SLI is a ratio of *bad* to *total* over a window (``[w]``), summed by (namespace, job_name)
across pods and ranks. Two kinds:

* **time** SLIs count rank-seconds against wall rank-seconds (efficiency, checkpoint blocking).
  Only *settled* time counts as bad: unprotected work (the ``nvrx_unprotected_work_seconds``
  gauge) is neither good nor bad yet. If a fault rolls it back, the exporter moves all of it to
  ``lost`` at that moment, so the burn appears at the fault, possibly more than a window's worth
  at once (an error ratio above 1 is then correct: that much budget went in that window).
* **event** SLIs count restarts (recovery) or checkpoint seconds (overlap); a window without
  events has no ratio rather than a ratio of zero, since nothing was measured.

Only time SLIs get the young-job rule (see ``nvrx_slo.alerts.rules``): their denominator is the whole window
at the most ranks the window saw, so time before the job existed counts as healthy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import (
    ABSENT_RANKS,
    BADPUT_INCREASE,
    BY_JOB,
    BY_POD,
    ON_JOB,
    SLO_LABEL,
    TARGET_CATEGORY,
    VANISHED_AT_RISK,
    evaluations,
    le_regex,
    pod_restarts_record,
    sli_total_record,
    wall_rate_record,
)
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.contracts import catalogue as cat


@dataclass(frozen=True)
class Sli:
    slo: Slo
    time_based: bool
    bad: Callable[[str], str]  # window ("5m") -> PromQL, one series per job
    total: Callable[[str], str]
    title: str  # for humans: alert summaries
    goal: str  # the objective in words; "{good}" and "{bad}" take the target and the budget as percentages
    records: tuple[tuple[str, str], ...] = ()  # (name, PromQL) its group records first, for ``bad``/``total``

    def objective_text(self, target: float) -> str:
        return self.goal.format(good=f"{target * 100:.4g}%", bad=f"{(1 - target) * 100:.4g}%")


def _matching(metric: str, label: str, regex: str) -> str:
    return f'{metric}{{{label}=~"{regex}"}}'


def job_rate(selector: str, window: str) -> str:
    return f"sum {BY_JOB} (rate({selector}[{window}]))"


def share_of_wall(selector: str, window: int) -> str:
    """The rate of ``selector`` (rank-seconds) over the job's wall rate: a share of its rank-seconds.
    The wall rate is the one ``wall_rate_record`` holds, which a group reading this records first."""
    return f"{job_rate(selector, duration.format(window))}\n/ {ON_JOB} group_left\n  {wall_rate_record(window)}"


def _or_zero(expr: str, present: str) -> str:
    """``expr``, or 0 for each job ``present`` has: a category never seen yet has no series, not zero.
    ``present`` is a job-level series the group has at hand (its recorded total, or the other term
    of a sum), not the pods' series read once more: rule cost is per series read."""
    return f"({expr} or {ON_JOB} 0 * {present})"


def _total(slo: Slo, plan: Plan) -> str:
    """The SLI's recorded total, which its group records before its bad rate."""
    return f'{sli_total_record(plan.base)}{{{SLO_LABEL}="{slo.value}"}}'


def _added(parts: dict[str, str]) -> str:
    """The parts' sum per job, a part without a series counting as 0: each part is told apart by a
    ``part`` label, so ``or`` keeps them all. No part needs the others' presence, so a job's last
    increases still count once its pods are gone (the rates still see them for a window)."""
    tagged = " or ".join(f'label_replace({expr}, "part", "{name}", "", "")' for name, expr in parts.items())
    return f"sum {BY_JOB} ({tagged})"


def _time_sli(slo: Slo, title: str, goal: str, categories: tuple[cat.Category, ...], plan: Plan) -> Sli:
    time = _matching(cat.TIME.name, "category", "|".join(c.value for c in categories))

    def total(w: str) -> str:
        return job_rate(cat.WALL.name, w)

    return Sli(slo, True, lambda w: _or_zero(job_rate(time, w), _total(slo, plan)), total, title, goal)


def vanished_at_risk(hold: int, interval: int) -> str:
    """``_vanished`` of each pod's work at risk: what the efficiency SLI and the cost rules count."""
    return _vanished(cat.WORK_AT_RISK.name, hold, interval)


def _vanished(metric: str, hold: int, interval: int) -> str:
    """Each pod's last ``metric`` at the one evaluation whose interval saw its series go ``hold``
    seconds ago, with no sample since. Prometheus marks a target's series stale when a scrape
    fails, so a failed scrape or a restarting sidecar, back within ``hold``, is not a pod gone; a
    replacement pod is another series (another address), even under the same name."""
    return (f"sum {BY_JOB} (last_over_time({metric}[5m] offset {duration.format(hold)})\n"
            f"  and {metric} offset {duration.format(hold + interval)}\n"
            f"  unless {metric} offset {duration.format(hold)}\n"
            f"  unless last_over_time({metric}[{duration.format(hold)}]))")


def _target_categories(selector: str, interval: int) -> str:
    """Each target's sum over its ranks of ``selector``'s newest samples within two evaluations, by
    category: a finished pod's final scrapes are fresh for less than an evaluation interval at the
    deploy defaults (two 15 s scrapes, 1 m evaluations), and an instant selector stops at the
    staleness marker its sidecar's exit leaves, losing the job's last settlement; a range selector
    skips the marker. Two intervals, not one: a sample stamped just before an evaluation may be
    stored just after it. By category: the cost rules (alerts/cost.py) price each category."""
    return f"sum without ({cat.RANK_LABEL}) (last_over_time({selector}[{duration.format(2 * interval)}]))"


BASE_LOOKBACK = 300  # how far back an increment looks for its base: a failed scrape or a few missed evaluations


def increase(record: str, now: str, by: str, values: tuple[str, ...], plan: Plan, known: str = "") -> str:
    """Each target's increase, by ``by`` (one of ``values``), since the evaluation an interval ago:
    its sum ``now`` (``record``'s expression) less ``record`` then (up to ``BASE_LOOKBACK`` back,
    across a failed scrape), its base. A target's sums, not each counter: the sidecar exports every
    category of every rank from 0, and a failed scrape loses nothing (the base is the last
    evaluation that read the target). ``now`` is the expression, never ``record`` read back, and
    every rule that needs an increment computes it here: vmalert writes what it records
    asynchronously, so a rule reading a record of its own evaluation reads the one before, or
    nothing (read-after-write, docs/scaling.md); the increments then lose or repeat a burst.

    A target with no base counts from 0 (all its counters hold is new) if it is young (``_young``)
    or ``known`` has it (a target there before, for a label value it had not exported yet): 0 for
    each of ``values``, so ``now`` is read once."""
    e = plan.evaluation_interval
    then = f"last_over_time({record}[{duration.format(BASE_LOOKBACK)}] offset {duration.format(e)})"
    fresh = _young(e) + (f" or {known}" if known else "")
    zero = " or ".join(f'label_replace(0 * ({fresh}), "{by}", "{value}", "", "")' for value in values)
    return f"clamp_min({now} - ignoring ({SLO_LABEL}) ({then} or ignoring ({SLO_LABEL}) ({zero})), 0)"


def _young(interval: int) -> str:
    """Each target whose pod began (``nvrx_job_start_timestamp_seconds``: its own origin, where its
    counters start) less than ``BASE_LOOKBACK`` and an interval ago: no evaluation before the ones
    its base looks back to can have read it, so a young target with no base was never counted (a
    replacement pod's init and restore). An old one with no base was, maybe: back after a longer
    gap (a scrape outage, a restarted Prometheus), its counters are not counted again; a new pod
    first read more than that after it began loses what it held then. By the start, not the wall
    counter: a finished pod's wall stops growing, and a scrape is older than the evaluation."""
    recent = f"last_over_time({cat.JOB_START_TIMESTAMP.name}[{duration.format(2 * interval)}])"
    return f"{recent} > time() - {BASE_LOOKBACK + interval}"


def target_category_increase(plan: Plan) -> str:
    """Each scrape target's badput rank-seconds by category since the evaluation before, from its
    counters now and its ``TARGET_CATEGORY`` then (``increase``): the efficiency SLI sums it, and
    the cost rules (alerts/cost.py) price it per target."""
    now = _target_categories(_badput(), plan.evaluation_interval)
    return increase(TARGET_CATEGORY, now, "category", tuple(c.value for c in cat.BADPUT_CATEGORIES), plan)


def _badput() -> str:
    return _matching(cat.TIME.name, "category", "|".join(c.value for c in cat.BADPUT_CATEGORIES))


def _ran_ranks(hold: int) -> str:
    """The job's ranks its pods ran ``hold`` seconds ago. A pod ran then if it was scraped then and
    since (a pod gone stopped accounting at its last scrape, before the scrape that found it gone;
    a finished pod says it runs none). By then every pod that ran is scraped: a pod first scraped
    since (Prometheus discovers a target seconds after it starts; even one gone again) ran from its
    origin (``nvrx_job_start_timestamp_seconds``), whose time its own counters hold, so no second
    is both absent and its ranks' init; with the most ranks it was seen running since, not its
    newest count (a pod that has finished since says it runs none). Before the job's first scrape
    its world is the one its pods say now, once its first pod had started (``absent_ranks``)."""
    ago = duration.format(hold)
    on_pod = f"on ({', '.join(cat.IDENTITY_LABELS)})"
    ran = {"scraped": f"{cat.POD_RANKS.name} offset {ago}"
                      f" and {on_pod} last_over_time({cat.POD_RANKS.name}[{ago}])",
           "started": f"max_over_time({cat.POD_RANKS.name}[{ago}])"
                      f" and {on_pod} (last_over_time({cat.JOB_START_TIMESTAMP.name}[{ago}]) <= time() - {hold})"
                      f" unless {on_pod} {cat.POD_RANKS.name} offset {ago}"}
    return _added(ran)


def absent_ranks(hold: int) -> str:
    """The job's world size ``hold`` seconds ago less the ranks its pods ran then (``_ran_ranks``,
    read once: ``> 0`` both keeps the jobs that ran some and is what is subtracted); none if they ran
    none: every pod had finished (or none was known), so no rank is missing. The cost rules price it."""
    ago = duration.format(hold)
    begun = f"min {BY_JOB} ({cat.JOB_START_TIMESTAMP.name}) <= time() - {hold}"
    world = (f"(max {BY_JOB} ({cat.JOB_WORLD_SIZE.name} offset {ago})"
             f" or (max {BY_JOB} ({cat.JOB_WORLD_SIZE.name}) and {ON_JOB} ({begun})))")
    return f"clamp_min({world} - {ON_JOB} ({_ran_ranks(hold)} > 0), 0)"


def _efficiency(plan: Plan) -> Sli:
    """Badput rank-seconds, plus the rank-seconds of ranks no pod ran, over the job's world size.

    A lost pod exports nothing, so its ranks' time would be in no series at all: every pod exports
    the job's world size and its own rank count, and the group records the difference at each
    evaluation, as it stood the shortest window ago (``absent_ranks``). Time before the job
    existed stays healthy, as the young-job rule wants; the rank count the time SLI divides by is
    the world size (a job without it falls back to its wall rate).

    Badput is recorded as increments (``increase``): settled seconds come in bursts (a reorder
    window, a restart settled at its end), and ``rate()`` extrapolates a burst at a series' start
    and end, counting part of it. A lost pod's unsettled time never reaches its counters (its
    sidecar died with it): the work at risk it last exported counts once its series are gone for
    the shortest window (``_vanished``). The shortest window sums each record's samples as ranks
    for one interval, over the evaluations a full window holds.
    """
    world = f"max {BY_JOB} ({cat.JOB_WORLD_SIZE.name})"
    hold, e = plan.base, plan.evaluation_interval
    records = ((ABSENT_RANKS, absent_ranks(hold)),
               (VANISHED_AT_RISK, vanished_at_risk(hold, e)),
               (TARGET_CATEGORY, _target_categories(_badput(), e)),
               (BADPUT_INCREASE, f"sum {BY_JOB} ({target_category_increase(plan)})"))

    def bad(w: str) -> str:
        every = evaluations(Slo.EFFICIENCY.value, duration.parse(w), plan, own=True)

        def ranks(record: str) -> str:  # its samples as ranks for one evaluation each
            return f"sum {BY_JOB} (sum_over_time({record}[{w}])) / {every}"

        # rank-seconds at one evaluation: ranks for one interval
        return _added({"badput": f"{ranks(BADPUT_INCREASE)} / {e}", "absent": ranks(ABSENT_RANKS),
                       "vanished": f"{ranks(VANISHED_AT_RISK)} / {e}",
                       "none": f"0 * {_total(Slo.EFFICIENCY, plan)}"})

    return Sli(Slo.EFFICIENCY, True, bad, lambda w: f"({world} or {job_rate(cat.WALL.name, w)})",
               "training efficiency", "productive ≥ {good} of wall rank-seconds", records)


def busiest_pod_rate(expr: str, window: str) -> str:
    """The job's rate of events ``expr`` counts, as the pod that counted most saw it (see ``_recovery``)."""
    return f"max {BY_JOB} (sum {BY_POD} (rate({expr}[{window}])))"


def _recovery(spec: Spec, plan: Plan) -> Sli:
    """Restarts back within the threshold, job-level. Every pod of a job in lock step records each
    fault (the failed pod's restart, the survivors' restarts for the new rendezvous), so their sum
    counts one fault N times; the job waits for its slowest pod. So both counts are the pod that
    counted most's: one restart per fault, bad if any pod's share of it was slow (its slowest pod
    counts one slow restart). Faults of different pods in one window are undercounted instead."""
    restarts = f"{cat.RESTART_DURATION.name}_count"
    fast = _matching(f"{cat.RESTART_DURATION.name}_bucket", "le", le_regex(spec.recovery_threshold))
    per_pod, on_pod = pod_restarts_record(plan.base), f"on ({', '.join(cat.IDENTITY_LABELS)})"

    def bad(w: str) -> str:
        slow = f"{per_pod} - {on_pod} (sum {BY_POD} (rate({fast}[{w}])) or {on_pod} 0 * {per_pod})"
        return f"max {BY_JOB} ({slow})"

    return Sli(Slo.RECOVERY, False, bad, lambda w: f"max {BY_JOB} ({per_pod})", "restart latency",
               f"{{good}} of restarts back to training within {spec.recovery_threshold:g}s",
               ((per_pod, f"sum {BY_POD} (rate({restarts}[{duration.format(plan.base)}]))"),))


def build(spec: Spec, plan: Plan) -> dict[Slo, Sli]:
    blocking = f"{cat.CKPT_BLOCKING.name}_sum"
    background = f"{cat.CKPT_BACKGROUND.name}_sum"

    def saves_total(w: str) -> str:
        return f"({job_rate(blocking, w)} + {_or_zero(job_rate(background, w), job_rate(blocking, w))})"

    return {
        Slo.EFFICIENCY: _efficiency(plan),
        Slo.RECOVERY: _recovery(spec, plan),
        Slo.CHECKPOINT_BLOCKING: _time_sli(
            Slo.CHECKPOINT_BLOCKING, "checkpoint blocking", "checkpoint blocking ≤ {bad} of wall rank-seconds",
            (cat.Category.CHECKPOINT_BLOCKING,), plan,
        ),
        Slo.CHECKPOINT_OVERLAP: Sli(
            Slo.CHECKPOINT_OVERLAP, False, lambda w: job_rate(blocking, w), saves_total,
            "checkpoint overlap", "checkpoint overlap ≥ {good} (background / (blocking + background) seconds)",
        ),
    }
