"""The data ``bench/bench_rules.py`` backfills: the series one real pod exposes, copied for many pods,
and the job-level records the sharded rules' global tier reads, written as OpenMetrics for
``promtool tsdb create-blocks-from openmetrics``. Needs ``tests/`` on ``sys.path`` (as bench_rules sets it)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bench import synthetic_journal
from fleet import groups as rule_groups
from fleet import reads
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.tiles import is_tile
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from nvrx_slo.exporter.views.collector import SnapshotCollector
from nvrx_slo.exporter.views.exposition import TextRenderer

GROWING = ("counter", "histogram", "summary")


def pod_series(ranks: int) -> list[tuple[str, dict[str, str], float, bool]]:
    """(name, labels, final value, grows) of every sample one real pod's /metrics holds."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = Path(tmp) / "journal"
        synthetic_journal.write(journal, ranks, 200, checkpoint_every=20, restart_at=100)
        live = Live(Engine(), JournalTail(journal))
        live.poll()
        live.tail.close()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(live.view, PodIdentity(namespace="bench", pod="pod", node="node",
                                                                job_name="job")))
        text = TextRenderer().generate(registry).decode()
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            grows = family.type in GROWING and not s.name.endswith(("_created", "_timestamp_seconds"))
            out.append((s.name, dict(s.labels), float(s.value), grows))
    return out


def write_openmetrics(path: Path, series: list[tuple[str, dict[str, str], float, bool]], pods: int,
                      per_job: int, hours: float, scrape_s: int) -> int:
    """The pods' series over the last ``hours``; returns the number of samples written."""
    end = int(time.time()) - 60
    times = list(range(end - int(hours * 3600), end + 1, scrape_s))
    n = 0
    with path.open("w") as f:
        for name in dict.fromkeys(s[0] for s in series):
            f.write(f"# TYPE {name} unknown\n")
            for pod in range(pods):
                for sname, labels, value, grows in series:
                    if sname != name:
                        continue
                    labels = {**labels, "pod": f"pod-{pod}", "job_name": f"job-{pod // per_job}",
                              "namespace": "bench", "job": "nvrx-slo", "instance": f"pod-{pod}:9400"}
                    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    for i, t in enumerate(times):
                        v = value * (i + 1) / len(times) if grows else value
                        f.write(f"{name}{{{text}}} {v!r} {t}\n")
                    n += len(times)
        f.write("# EOF\n")
    return n


def job_series(local_text: str, global_text: str) -> list[tuple[str, dict[str, str], bool]]:
    """(record, labels, one per job) of every record the global file reads: as the local file records
    it, and as the global file itself records what it reads of its own evaluations before (the
    tiles and their partials, ``alerts/tiles.py``)."""
    wanted = {n for rules in rule_groups(global_text).values() for r in rules for n in reads(r)}
    out = {}
    for text in (local_text, global_text):
        for rules in rule_groups(text).values():
            for r in rules:
                if r.get("record") in wanted:
                    labels = dict(r.get("labels", {}))
                    out[(r["record"], tuple(sorted(labels.items())))] = (r["record"], labels, r["record"].startswith(
                        "namespace_job_name:"))
    return list(out.values())


def write_job_openmetrics(path: Path, series: list[tuple[str, dict[str, str], bool]], jobs: int, days: float,
                          step_s: int, plan: Plan) -> int:
    """The job-level records of ``jobs`` jobs (and the evaluation counters) over the last ``days``, one
    sample per ``step_s`` (the evaluation interval; a tile, one per tile), values varying as rates
    do, so the chunks compress as real ones; returns the number of samples written."""
    end = int(time.time()) - 60
    n = 0
    with path.open("w") as f:
        for name in dict.fromkeys(s[0] for s in series):
            every = plan.tile if is_tile(name, plan) else step_s
            times = [t for t in range(end - int(days * 86400), end + 1, step_s) if t % every < step_s]
            f.write(f"# TYPE {name} unknown\n")
            for sname, labels, per_job in series:
                for job in range(jobs) if per_job else [None]:
                    if sname != name:
                        continue
                    extra = {"namespace": "bench", "job_name": f"job-{job}"} if job is not None else {}
                    text = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, **extra}.items()))
                    if per_job:
                        f.writelines(f"{name}{{{text}}} {0.5 + 0.01 * (i % 17)!r} {t}\n" for i, t in enumerate(times))
                    else:
                        f.writelines(f"{name}{{{text}}} 1.0 {t}\n" for t in times)
                    n += len(times)
        f.write("# EOF\n")
    return n
