"""SLO overview: the page an on-call engineer opens first — efficiency against its objective,
the error budget and how fast it burns, where the badput went, and what is firing."""

from __future__ import annotations

from grafanalib import core as g

from dashboards import panels as p
from dashboards import queries as q
from exporter import catalogue as cat

UID = "nvrx-slo-overview"

_OBJECTIVE = f"{q.EFFICIENCY_OBJECTIVE:.0%}"
_SETTLED = cat.SETTLED_CATEGORIES


def _efficiency_panels() -> list[object]:
    below_objective = ((None, p.RED), (q.EFFICIENCY_OBJECTIVE, p.GREEN))
    return [
        p.stat("Efficiency since job start", f"productive / wall rank-seconds since the job's first process start "
               f"(rank-average). Objective {_OBJECTIVE}. Work since the last durable checkpoint is not counted "
               "until a save lands, so this dips between checkpoints.",
               [p.Query(q.efficiency(None))], p.RATIO, steps=below_objective, decimals=2),
        p.stat("Error budget remaining", f"Share of the {q.SLO_PERIOD} error budget (1 − {_OBJECTIVE} of wall time) "
               "not yet spent: 1 − (1 − efficiency over the period) / budget. Negative once overspent.",
               [p.Query(q.budget_remaining())], p.RATIO,
               steps=((None, p.RED), (0.0, p.YELLOW), (0.25, p.GREEN)), decimals=1),
        p.stat("Burn rate (1h)", "Error-budget burn rate over the last hour (1 = spending exactly the budget). "
               f"Pages at {max(q.PAGE_BURN_RATES)}× over 1h and 5m.", [p.Query(q.burn_rate("1h"))], p.COUNT,
               steps=((None, p.GREEN), (1.0, p.YELLOW), (max(q.PAGE_BURN_RATES), p.RED)), decimals=1),
        p.stat("Unprotected work", "Rank-seconds of training since the last durable checkpoint, summed over the job: "
               "lost if a fault comes now.", [p.Query(q.by((), q.series(cat.UNPROTECTED_WORK)))], p.SECONDS),
        p.timeseries("Efficiency vs objective", f"productive / wall (rank-average), since job start and over the "
                     f"rate window, with the {_OBJECTIVE} objective drawn as a line.",
                     [p.Query(q.efficiency(None), "since job start"),
                      p.Query(q.efficiency(q.RATE_INTERVAL), "over rate window")],
                     p.RATIO, steps=below_objective, w=12),
        p.timeseries("Burn rates", "Error-budget burn rate per alert window (1 = on budget). Dashed lines: the page "
                     "thresholds (both windows of a pair must exceed theirs to page).",
                     [p.Query(q.burn_rate(w), w) for pair in q.PAGE_BURN_RATES.values() for w in pair],
                     p.COUNT, steps=((None, p.GREEN), *((f, p.RED) for f in sorted(q.PAGE_BURN_RATES))), w=12),
    ]


def _time_panels() -> list[object]:
    return [
        p.timeseries("Where the time went (since job start)", "Each settled category's share of wall rank-seconds "
                     "since the job started, plus the provisional unprotected slice; the stack sums to 100%.",
                     [p.Query(q.category_share(_SETTLED, None), "{{category}}"),
                      p.Query(q.unprotected_share(), cat.Category.UNPROTECTED.value)],
                     p.RATIO, stack=True, w=12),
        p.timeseries("Badput breakdown (rate window)", "Share of wall rank-seconds per badput category over the "
                     "rate window, stacked: what is eating the budget now.",
                     [p.Query(q.category_share(cat.BADPUT_CATEGORIES, q.RATE_INTERVAL), "{{category}}")],
                     p.RATIO, stack=True, w=12),
        p.table("Firing alerts", "Prometheus ALERTS for this job that are firing, by alert and severity "
                "(from the generated nvrx-slo rules, or any rule that keeps the job's labels).",
                p.Query(q.alerts_firing()), w=12, h=7),
        p.stat("Restarts since job start", "Restarts by level (in-process, in-job via ft_launcher, pod) since the "
               "job's first start.", [p.Query(q.by(q.LEVEL_LABEL, q.series(cat.RESTARTS)), "{{level}}")],
               p.COUNT, w=6, h=7),
        p.stat("Checkpoint age", "Seconds since the latest durable checkpoint finished, per pod.",
               [p.Query(f"time() - {q.series(cat.CKPT_LAST_SUCCESS)}", "{{pod}}")], p.SECONDS, w=6, h=7),
    ]


def dashboard() -> g.Dashboard:
    return p.dashboard(
        uid=UID, title="nvrx-slo / SLO overview", module="overview",
        description=f"Training efficiency SLO ({_OBJECTIVE} of accelerator time trains the model) for one job.",
        panels=[p.row("Efficiency SLO"), *_efficiency_panels(), p.row("Time accounting and alerts"), *_time_panels()],
    )
