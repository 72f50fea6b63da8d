"""Rule-evaluation cost at scale: the generated rules run by a real Prometheus over a TSDB backfilled with
many pods' series, side by side with the rules of an earlier commit.

One pod's series are what a real sidecar exposes for an 8-rank pod (the collector over a synthetic
journal: ``bench/synthetic_journal.py``); ``--pods`` copies of them (jobs of ``--pods-per-job`` pods)
are written as OpenMetrics over the last ``--hours`` at ``--scrape`` s — counters growing linearly to
their final value, gauges constant — and backfilled with ``promtool tsdb create-blocks-from
openmetrics``. Each rule file then runs in its own Prometheus on its own copy of the blocks (no
scraping), every group every ``--eval`` s, and the cost read is Prometheus's own
``prometheus_rule_group_last_duration_seconds`` (median over ``--evaluations`` evaluations per group),
and the Prometheus process's CPU seconds per evaluation round (``process_cpu_seconds_total`` over the
evaluations; a run with no rules spends next to none): the durations are wall-clock and grow when other
processes take the CPU, the CPU seconds hardly do, so on a shared machine they are the steadier figure.
Both rule files are measured alternately, twice, on the same data.

What it does not capture: windows longer than ``--hours`` see only ``--hours`` of samples here, so a
rule over raw series with a 30-day window costs far more in a month-old job than this measures (its cost
grows with the samples in its range, per rank); a window over the job-level records grows too, with the
window and the jobs but not the pods (a 30-day one reads 43,200 samples of each job's record at a
1-minute evaluation, none of which this measures). Extrapolation to 1,000 pods is linear in the pods,
the least-squares line through the median at each ``--pods`` count (a rule's fixed cost is not
multiplied); each group's cost counts as often a minute as its own interval runs it (the groups over the
SLO period: every 4 minutes), though every group is evaluated every ``--eval`` s while measuring, and
the CPU of a round is shared among the groups as their durations are. Absolute seconds differ from
machine to machine and with what else runs (the load average is printed at the start and the end); the
ratio of the two rule files, measured side by side, is the figure that travels.

With ``--tiers``, the two tiers of the sharded rules instead (docs/scaling.md), each in its own
Prometheus: the local file over the pods' series as above (a shard's cost, extrapolated to
``--shard-pods``, its share of the fleet), and the global file over the job-level records the local tier sends it
and the records of its own that it reads back (the tiles and their partials), one series per job and
record, backfilled over ``--days`` (the SLO period: the global tier's windows reach back that far, and
its cost is in the samples they read) in blocks of ``--block-hours`` (as a Prometheus keeping the period
compacts them), extrapolated linearly in the jobs (least squares) through ``--jobs`` to
``--fleet-pods`` / ``--pods-per-job`` jobs; the global file side by side with ``--before``'s. With ``--per-rule N`` as
well, the global file alone, per rule: each rule's ``evaluationTime`` from ``/api/v1/rules`` (median
over its evaluations) at each ``--jobs`` count, extrapolated as above to the fleet's jobs, the N
costliest printed with their share of their group's summed rule seconds.

Usage: .venv/bin/python bench/bench_rules.py [--pods 4 16] [--before REV]
       .venv/bin/python bench/bench_rules.py --tiers --before REV [--shard-pods 1000] [--fleet-pods 10000] [--jobs 2 6]
       .venv/bin/python bench/bench_rules.py --tiers --per-rule 8 [--jobs 2 6] [--evaluations 8]
Target (issues 12, 33): <= 5 s of rule evaluation per 60 s interval at 1,000 pods x 8 ranks, and per
ruler (each local ruler at its share, the global ruler) at 10,000 pods x 8 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import yaml

from bench.rules_data import job_series, pod_series, write_job_openmetrics, write_openmetrics
from nvrx_slo.alerts import spec
from servers import free_port, stop, wait_for

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 5.0
SCALE_PODS = 1000
def rule_file(text: str, eval_s: int, dest: Path) -> list[str]:
    """The rule file with every group evaluated every ``eval_s``; returns the group names."""
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        group["interval"] = f"{eval_s}s"
    dest.write_text(yaml.safe_dump(doc))
    return [g["name"] for g in doc["groups"]]


def group_intervals_s(text: str) -> dict[str, float]:
    units = {"s": 1, "m": 60, "h": 3600}
    every = {g["name"]: g.get("interval", "1m") for g in yaml.safe_load(text)["groups"]}  # Prometheus default: 1m
    return {name: float(i[:-1]) * units[i[-1]] for name, i in every.items()}


RuleKey = tuple[str, int, str]  # (group, position in the group, record or alert name)


def rule_times(port: int, seen: dict[RuleKey, list[float]], last: dict[RuleKey, str]) -> None:
    """Adds each rule's evaluation seconds from ``/api/v1/rules``, once per evaluation of it (a new
    ``lastEvaluation``): a group's duration does not say which of its rules spent it."""
    doc = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10))
    for group in doc["data"]["groups"]:
        for i, rule in enumerate(group["rules"]):
            key = (group["name"], i, rule["name"])
            if not rule["lastEvaluation"].startswith("0001") and rule["lastEvaluation"] != last.get(key):
                last[key] = rule["lastEvaluation"]
                seen.setdefault(key, []).append(float(rule["evaluationTime"]))


def measure(blocks: Path, rules: Path, groups: list[str], evaluations: int, eval_s: int,
            work: Path, *flags: str, per_rule: dict[RuleKey, list[float]] | None = None
            ) -> tuple[dict[str, float], float]:
    """Median last-evaluation seconds per group of one Prometheus running ``rules`` over a copy of
    ``blocks``, and its CPU seconds per evaluation round (from every group's first evaluation on);
    with ``per_rule``, each rule's seconds per evaluation added to it."""
    tsdb = work / "tsdb"
    shutil.rmtree(tsdb, ignore_errors=True)
    shutil.copytree(blocks, tsdb)
    config = work / "prometheus.yml"
    config.write_text(json.dumps({"global": {"evaluation_interval": f"{eval_s}s"}, "rule_files": [str(rules)]}))
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                             "--storage.tsdb.retention.time=3650d", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn", *flags],
                            stdout=subprocess.DEVNULL, stderr=open(work / "prom.log", "wb"))
    try:
        wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1).status == 200,
                 "Prometheus ready", 120)
        seen: dict[str, list[float]] = {g: [] for g in groups}
        last: dict[str, float] = {}
        pattern = re.compile(r'prometheus_rule_group_last_duration_seconds\{rule_group="[^"]*;([^"]+)"\} (\S+)')
        deadline = time.monotonic() + eval_s * (evaluations + 3) + 120
        cpu: list[tuple[float, float]] = []  # (monotonic time, CPU seconds) once every group has run
        last_rule: dict[RuleKey, str] = {}
        while min(map(len, seen.values())) < evaluations and time.monotonic() < deadline:
            time.sleep(eval_s / 2)
            if per_rule is not None:
                rule_times(port, per_rule, last_rule)
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            used = re.search(r"^process_cpu_seconds_total (\S+)", text, re.M)
            if used and min(map(len, seen.values())) > 0:
                cpu.append((time.monotonic(), float(used[1])))
            ts = dict(re.findall(r'prometheus_rule_group_last_evaluation_timestamp_seconds\{rule_group="[^"]*;'
                                 r'([^"]+)"\} (\S+)', text))
            for group, value in pattern.findall(text):
                if group in seen and float(ts.get(group, 0)) > 0 and ts[group] != last.get(group):
                    last[group] = float(ts[group])
                    seen[group].append(float(value))
        rounds = (cpu[-1][0] - cpu[0][0]) / eval_s if len(cpu) > 1 else 0.0
        return ({g: statistics.median(v) if v else float("nan") for g, v in seen.items()},
                (cpu[-1][1] - cpu[0][1]) / rounds if rounds else float("nan"))
    finally:
        stop(proc)


def per_minute(run: dict[str, float], intervals: dict[str, float]) -> float:
    """Seconds of rule evaluation per 60 s of wall: each group's cost times its evaluations a minute."""
    return sum(d * 60.0 / intervals[g] for g, d in run.items())


def fit(by_pods: dict[int, list[float]]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through the median cost at each pod (or job)
    count: with more than two counts, one count's noisy run does not set the slope alone."""
    if len(by_pods) == 1:
        (count, costs), = by_pods.items()
        return statistics.median(costs) / count, 0.0
    line = statistics.linear_regression(list(by_pods), [statistics.median(c) for c in by_pods.values()])
    return line.slope, line.intercept


def cpu_per_minute(round_cpu: float, run: dict[str, float], intervals: dict[str, float]) -> float:
    """A round's CPU seconds (every group evaluated once) per 60 s at the groups' own intervals: shared
    among the groups as their durations are, each share as often a minute as its group runs."""
    spent = sum(run.values())
    return round_cpu * per_minute(run, intervals) / spent if spent else float("nan")


def at_scale(by_pods: dict[int, list[float]], scale: int = SCALE_PODS) -> float:
    """The cost at ``scale`` pods (or jobs), on the least-squares line through the measured counts."""
    slope, intercept = fit(by_pods)
    return intercept + slope * scale


def fitted(by_pods: dict[int, list[float]], scale: int) -> str:
    slope, intercept = fit(by_pods)
    return f"{slope * 1000:.3f} ms each + {intercept * 1000:.1f} ms -> {at_scale(by_pods, scale):.2f} s at {scale}"


Costs = dict[str, dict[int, list[float]]]


def backfill(work: Path, write: Callable[[Path, int], int], count: int, block: str) -> None:
    """``work / "blocks"``: the TSDB blocks of what ``write`` writes for ``count`` pods or jobs."""
    t0 = time.monotonic()
    samples = write(work / "in.om", count)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q",
                    f"--max-block-duration={block}", str(work / "in.om"), str(work / "blocks")], check=True)
    (work / "in.om").unlink()
    print(f"{count}: {samples:,} samples, backfilled in {time.monotonic() - t0:.0f} s")


def measure_over(texts: dict[str, str], counts: list[int], write: Callable[[Path, int], int],
                 args: argparse.Namespace, *flags: str, block: str = "2h") -> tuple[Costs, Costs]:
    """Each rule file's evaluation seconds per 60 s, and its Prometheus's CPU seconds per 60 s, over
    the data ``write`` backfills for each count (of pods or jobs), the files alternating twice."""
    cost: Costs = {name: {} for name in texts}
    cpu: Costs = {name: {} for name in texts}
    for count in sorted(set(counts)):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            backfill(work, write, count, block)
            for _ in range(2):  # alternating: a noisy stretch weighs on both
                for name, text in texts.items():
                    groups = rule_file(text, args.eval, work / f"{name}.yaml")
                    run, round_cpu = measure(work / "blocks", work / f"{name}.yaml", groups, args.evaluations,
                                             args.eval, work, *flags)
                    intervals = group_intervals_s(text)
                    cost[name].setdefault(count, []).append(per_minute(run, intervals))
                    cpu[name].setdefault(count, []).append(cpu_per_minute(round_cpu, run, intervals))
                    print(f"  {name:6}: " + "; ".join(f"{g} {d * 1000:.1f} ms" for g, d in run.items())
                          + f"; CPU {round_cpu * 1000:.1f} ms a round")
    return cost, cpu


def tiers(args: argparse.Namespace, series: list[tuple[str, dict[str, str], float, bool]]) -> None:
    """Each tier in its own Prometheus: a local ruler at its share of the fleet, the global ruler at all
    of it, the global file side by side with ``--before``'s."""
    local = (ROOT / "alerts/generated/sharded/local.yaml").read_text()
    globals_ = {"now": (ROOT / "alerts/generated/sharded/global.yaml").read_text(),
                "before": _at(args.before, "alerts/generated/sharded/global.yaml")}
    before_local = _at(args.before, "alerts/generated/sharded/local.yaml")
    records = list({(r[0], tuple(sorted(r[1].items()))): r for r in job_series(local, globals_["now"])
                    + job_series(before_local, globals_["before"])}.values())
    step = int(min(group_intervals_s(local).values()))
    print(f"local tier: {len(series)} series per pod of {args.ranks} ranks; global tier: {len(records)} job-level "
          f"records, {sum(r[2] for r in records)} of them per job, over {args.days:g} days at {step} s, in "
          f"{args.block_hours:g} h blocks")
    # the backfilled blocks stay as they are: compacting them would take the CPU being measured
    block = f"{args.block_hours:g}h"

    def write_jobs(path: Path, jobs: int) -> int:
        return write_job_openmetrics(path, records, jobs, args.days, step, spec.load().plan())

    if args.per_rule:
        rule_profile(args, globals_["now"], write_jobs, block)
        return
    local_cost, local_cpu = measure_over({"local": local}, args.pods, lambda path, pods: write_openmetrics(
        path, series, pods, args.pods_per_job, args.hours, args.scrape), args)
    global_cost, global_cpu = measure_over(globals_, args.jobs, write_jobs, args,
                                           f"--storage.tsdb.max-block-duration={block}", block=block)
    print("load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    jobs = args.fleet_pods // args.pods_per_job
    shards = -(-args.fleet_pods // args.shard_pods)
    for name, cost, cpu, scale, what in (
            ("local", local_cost["local"], local_cpu["local"], args.shard_pods, f"pods (one of {shards} shards)"),
            *((f"global ({n})", global_cost[n], global_cpu[n], jobs, "jobs") for n in globals_)):
        at = at_scale(cost, scale)
        line = ", ".join(f"{n}: {min(c):.3f}–{max(c):.3f} s" for n, c in sorted(cost.items()))
        print(f"{name} ruler, evaluation per 60 s: {line}; at {scale} {what}, {args.fleet_pods} pods x {args.ranks} "
              f"ranks in all: {at:.2f} s (target <= {TARGET_S:g} s: {'met' if at <= TARGET_S else 'NOT met'}); "
              f"CPU {at_scale(cpu, scale):.2f} s\n  least squares, evaluation: {fitted(cost, scale)}; "
              f"CPU: {fitted(cpu, scale)}")
    ratio, cpu_ratio = (at_scale(c["now"], jobs) / at_scale(c["before"], jobs) for c in (global_cost, global_cpu))
    print(f"global now / before at {jobs} jobs: {ratio:.2f} (CPU: {cpu_ratio:.2f})")


def rule_profile(args: argparse.Namespace, text: str, write: Callable[[Path, int], int], block: str) -> None:
    """The global file's costliest rules at the fleet's jobs: each rule's median seconds per evaluation
    at each ``--jobs`` count, extrapolated linearly in the jobs as the groups' costs are."""
    by_rule: dict[RuleKey, dict[int, list[float]]] = {}
    for count in sorted(set(args.jobs)):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            backfill(work, write, count, block)
            seen: dict[RuleKey, list[float]] = {}
            groups = rule_file(text, args.eval, work / "global.yaml")
            run, round_cpu = measure(work / "blocks", work / "global.yaml", groups, args.evaluations, args.eval, work,
                                     f"--storage.tsdb.max-block-duration={block}", per_rule=seen)
            intervals = group_intervals_s(text)
            print("  " + "; ".join(f"{g} {d * 1000:.1f} ms" for g, d in run.items())
                  + f"; CPU {round_cpu * 1000:.1f} ms a round; per 60 s at the groups' intervals: evaluation "
                  f"{per_minute(run, intervals):.3f} s, CPU {cpu_per_minute(round_cpu, run, intervals):.3f} s")
            for key, times in seen.items():
                by_rule.setdefault(key, {})[count] = times
    jobs, most = args.fleet_pods // args.pods_per_job, max(args.jobs)
    at = {key: at_scale(c, jobs) for key, c in by_rule.items()}
    group_at: dict[str, float] = {}
    group_most: dict[str, float] = {}  # the share's denominator: measured, so never a noisy extrapolation
    for key, seconds in at.items():
        group_at[key[0]] = group_at.get(key[0], 0.0) + seconds
        group_most[key[0]] = group_most.get(key[0], 0.0) + statistics.median(by_rule[key].get(most, [0.0]))
    print("load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    intervals = group_intervals_s(text)
    total = per_minute(group_at, intervals)
    minute: dict[int, list[float]] = {}  # the rules' seconds per 60 s at each count, for the fit
    for key, c in by_rule.items():
        for n, v in c.items():
            minute.setdefault(n, [0.0])[0] += statistics.median(v) * 60.0 / intervals[key[0]]
    print(f"global ruler, summed over its {len(at)} rules, per 60 s at the groups' intervals, least squares: "
          f"{fitted(minute, jobs)}")
    print(f"global ruler, summed over its {len(at)} rules: at {jobs} jobs {total:.2f} s per 60 s; per group per "
          f"evaluation, at {jobs} jobs and ({most} measured): "
          + ", ".join(f"{g} {s:.3f} s ({group_most[g] * 1000:.1f} ms)" for g, s in group_at.items()))
    print(f"{'s/eval':>7} {'share':>6}  group  rule  (share: of the group's rule seconds at {most} jobs; "
          "median ms per evaluation at each --jobs)")
    for key, seconds in sorted(at.items(), key=lambda kv: -kv[1])[:args.per_rule]:
        measured = ", ".join(f"{n}: {statistics.median(v) * 1000:.2f}" for n, v in sorted(by_rule[key].items()))
        share = statistics.median(by_rule[key].get(most, [0.0])) / group_most[key[0]]
        print(f"{seconds:7.3f} {share:6.1%}  {key[0]}  {key[2]}  ({measured})")


def _at(rev: str, path: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, nargs="+", default=[4, 16], help="pod counts to measure (two or more: "
                   "the extrapolation uses the slope between the smallest and the largest)")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--pods-per-job", type=int, default=8)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--scrape", type=int, default=30, help="seconds between backfilled samples")
    p.add_argument("--eval", type=int, default=10, help="seconds between rule evaluations while measuring")
    p.add_argument("--evaluations", type=int, default=4)
    p.add_argument("--before", default="5ab4e680", help="the commit whose generated rules are the baseline "
                   "(default: the last with a plain rate() over raw series for every window)")
    p.add_argument("--tiers", action="store_true", help="measure the two tiers of the sharded rules instead")
    p.add_argument("--shard-pods", type=int, default=1000, help="--tiers: the pods one local ruler evaluates")
    p.add_argument("--fleet-pods", type=int, default=10000, help="--tiers: the fleet the global ruler serves")
    p.add_argument("--jobs", type=int, nargs="+", default=[2, 6], help="--tiers: job counts the global tier is "
                   "measured at")
    p.add_argument("--per-rule", type=int, default=0, metavar="N", help="--tiers: instead, the global file's N "
                   "costliest rules at --fleet-pods (each rule's evaluationTime from /api/v1/rules)")
    p.add_argument("--days", type=float, default=30.0, help="--tiers: days of job-level records (the SLO period)")
    p.add_argument("--block-hours", type=float, default=54.0, help="--tiers: the global tier's TSDB blocks (54: "
                   "what Prometheus compacts a 30-day retention into, at most 10%% of it; 2: none compacted)")
    args = p.parse_args()
    series = pod_series(args.ranks)
    print("load average at the start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.tiers:
        tiers(args, series)
        return
    texts = {"now": (ROOT / "alerts/generated/rules.yaml").read_text(),
             "before": _at(args.before, "alerts/generated/rules.yaml")}
    cost, cpu = measure_over(texts, args.pods, lambda path, pods: write_openmetrics(
        path, series, pods, args.pods_per_job, args.hours, args.scrape), args)
    print("load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    scaled = {name: at_scale(by_pods) for name, by_pods in cost.items()}
    for name, by_pods in cost.items():
        rules = sum(len(g["rules"]) for g in yaml.safe_load(texts[name])["groups"])
        line = ", ".join(f"{n} pods {min(c):.3f}–{max(c):.3f} s" for n, c in sorted(by_pods.items()))
        print(f"{name:6} ({rules} rules), evaluation per 60 s: {line}; at {SCALE_PODS} pods (linear in the pods): "
              f"{scaled[name]:.1f} s (target <= {TARGET_S:g} s: {'met' if scaled[name] <= TARGET_S else 'NOT met'}); "
              f"CPU {at_scale(cpu[name]):.1f} s")
    print(f"now / before at {SCALE_PODS} pods: {scaled['now'] / scaled['before']:.2f} "
          f"(CPU: {at_scale(cpu['now']) / at_scale(cpu['before']):.2f})")


if __name__ == "__main__":
    main()
