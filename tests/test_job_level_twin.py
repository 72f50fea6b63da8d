"""The job-level numbers are derived twice, once per side, and held to each other here: in Python by
the job roll-up the report and the demo call (``exporter/offline/rollup.py``), and in PromQL by the
generated rules (``alerts/sli.py``, ``alerts/signals.py``). Each story's journals go to both: the
roll-up reads them replayed as the report does; promtool evaluates the generated rules over the
series each pod's sidecar would have served, scraped every second from the story's start to a few
evaluations after its end. A formula changed on one side alone fails here until the other follows.

Compared, to 1e-9: checkpoint overlap and the blocking cost of a save (the signals over the SLO
period), and the efficiency SLI's error over the period as rank-seconds (its error ratio times the
job's world size and the period's evaluations) against the roll-up's badput (wall less productive
and unprotected). The stories start every pod at once: the rules sample ranks no pod ran at each
evaluation, the roll-up counts them to the instant, so a pod starting between two evaluations would
differ by design, not by formula.

The rules are generated from the default spec over a one-hour period evaluated every second
(``tests/promtool/hour``), each story's wall clock set to its monotonic one so that promtool's clock
is the journal's. promtool is asked for each value by a test that expects none: its failure report
prints what the expression gave, to the last digit.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import stories
from alert_suites import SUITES, spec_for
from journal_builder import Pod
from journal_fixtures import write_per_process
from needs import tool
from nvrx_slo.alerts import files as alert_files
from nvrx_slo.alerts.conventions import SLO_LABEL, Signal, error_ratio_record, over_period
from nvrx_slo.alerts.spec import Slo
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.engine.snapshot import Snapshot
from nvrx_slo.exporter.events import as_event
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.offline import rollup
from nvrx_slo.exporter.offline.replay import Replay
from nvrx_slo.exporter.views.collector import families
from nvrx_slo.exporter.views.view import View

pytestmark = pytest.mark.external

SPEC = spec_for(SUITES / "hour")
PLAN = SPEC.plan()
HOLD = PLAN.base + 1  # evaluations after the end: every window that saw the last increase has closed
TIMES = ("mono", "wall", "start", "written")  # the record fields that are instants

STORIES: dict[str, Callable[[], Pod]] = {
    "healthy": stories.healthy,
    "crash with rollback": stories.crash_with_rollback,
    "in-process restart": stories.inprocess_restart,
    "killed from outside": stories.killed_from_outside,
    "an exception left a step": lambda: stories.killed_from_outside(raised=True),
    "sixty steps, three saves": stories.inprocess_job,
}


def _pods(pod: Pod, split: bool) -> dict[str, list[dict]]:
    """The story's records by pod, dated from its first whole second (wall = mono): one pod, or a pod
    per rank each with a copy of the launcher's records."""
    origin = math.floor(min(r["mono"] for r in pod.records))
    records = [{**r, **{k: r[k] - origin for k in TIMES if isinstance(r.get(k), float)}} for r in pod.records]
    records = [{**r, "wall": r["mono"]} for r in records]
    if not split:
        return {"pod-0": records}
    ranks = sorted({r["rank"] for r in records if r["rank"] is not None})
    return {f"pod-{k}": [{**r, "pod": f"pod-{k}"} for r in records if r["rank"] in (k, None)] for k in ranks}


def _scraped(name: str, records: list[dict], end: int) -> dict[tuple, dict[int, float]]:
    """Every sample the pod's sidecar serves at each second to ``end`` (its collector's families), having
    read what was written by then."""
    engine, identity = Engine(), PodIdentity(namespace="ns", pod=name, node="", job_name="job")
    ordered, read = sorted(records, key=lambda r: r["mono"]), 0
    out: dict[tuple, dict[int, float]] = {}
    for t in range(end + 1):
        while read < len(ordered) and ordered[read]["mono"] <= t:
            engine.ingest(as_event(ordered[read]))
            read += 1
        view = View.of(engine.snapshot(float(t), float(t)), {})
        for family in families(view, identity, per_rank=True, max_ranks=64):
            for sample in family.samples:
                out.setdefault((sample.name, tuple(sorted(sample.labels.items()))), {})[t] = sample.value
    return out


def _input_series(pods: dict[str, list[dict]], end: int) -> list[dict[str, str]]:
    series: dict[tuple, dict[int, float]] = {}
    for name, records in pods.items():
        series.update(_scraped(name, records, end))
    return [{"series": f"{name}{{{','.join(f'{k}={v!r}'.replace(chr(39), chr(34)) for k, v in labels)}}}",
             "values": " ".join(repr(values[t]) if t in values else "_" for t in range(end + 1))}
            for (name, labels), values in sorted(series.items())]


def _rolled_up(pods: dict[str, list[dict]], tmp_path: Path) -> Snapshot:
    """The job as the report reads it: each pod's journal replayed, then rolled up."""
    snapshots = []
    for name, records in pods.items():
        (tmp_path / name).mkdir()
        write_per_process(records, tmp_path / name, name)
        with Replay(tmp_path / name) as replay:
            replay.read_all()
        snapshots.append(replay.view().snapshot)
    return rollup.job_snapshot(snapshots)


EXPRESSIONS = {
    "overlap": over_period(Signal.OVERLAP, PLAN),
    "blocking per save": over_period(Signal.COST, PLAN),
    "efficiency error": f'{error_ratio_record(PLAN.period)}{{{SLO_LABEL}="{Slo.EFFICIENCY.value}"}}',
}


def _promql(inputs: list[dict[str, str]], at: int, tmp_path: Path) -> dict[str, float | None]:
    """Each of ``EXPRESSIONS`` at ``at`` seconds, as promtool evaluates it over the generated rules."""
    (tmp_path / "rules.yaml").write_text(alert_files.render(SPEC, PLAN, "test")[alert_files.RULES])
    asked = [{"expr": e, "eval_time": f"{at}s", "exp_samples": []} for e in EXPRESSIONS.values()]
    tests = [{"interval": "1s", "input_series": inputs, "promql_expr_test": asked}]
    suite = {"rule_files": ["rules.yaml"], "evaluation_interval": "1s", "tests": tests}
    (tmp_path / "twin.yaml").write_text(yaml.safe_dump(suite))
    result = subprocess.run([tool("promtool"), "test", "rules", "twin.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    report = result.stdout + result.stderr
    got: dict[str, float | None] = dict.fromkeys(EXPRESSIONS)
    for name, expr in EXPRESSIONS.items():  # an expression that gave nothing passed: no value, no line
        match = re.search(re.escape(f"expr: {json.dumps(expr)},") + r" time: \d+s,\s*exp: nil\s*got: \{[^}]*\} (\S+)",
                          report)
        if match:
            got[name] = float(match.group(1))
    assert result.returncode == 0 or any(v is not None for v in got.values()), report
    return got


@pytest.mark.parametrize("split", [False, True], ids=["one pod", "a pod per rank"])
@pytest.mark.parametrize("story", sorted(STORIES))
def test_the_rules_and_the_roll_up_derive_the_same_job(story: str, split: bool, tmp_path: Path) -> None:
    pods = _pods(STORIES[story](), split)
    end = math.ceil(max(r["mono"] for records in pods.values() for r in records)) + HOLD
    rules = _promql(_input_series(pods, end), end, tmp_path)
    job = _rolled_up(pods, tmp_path)

    assert job.world_size is not None and job.efficiency is not None
    badput = job.wall_s * (1 - job.efficiency) - job.unprotected_s  # rank-seconds no longer good
    evaluations = PLAN.evaluations(PLAN.period)
    error = rules["efficiency error"]
    assert error is not None
    assert error * job.world_size * evaluations * PLAN.evaluation_interval == pytest.approx(badput, abs=1e-9)
    assert rules["overlap"] == pytest.approx(job.checkpoints.overlap_ratio, abs=1e-9)
    assert rules["blocking per save"] == pytest.approx(job.checkpoints.blocking.mean, abs=1e-9)
