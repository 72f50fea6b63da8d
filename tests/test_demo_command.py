"""The README's first command, end to end: the job, the real sidecar beside it, the SLO report.

The printed report is the sidecar's own (written on SIGTERM, as in a pod); it is checked against
what the journal itself says happened, read independently by ``journal_truth.summarize``.
"""

from __future__ import annotations

import re

import pytest

from journal_truth import read_journal, summarize

pytestmark = [pytest.mark.torch, pytest.mark.nvrx]


def _restart_latencies(report: str) -> dict[str, float]:
    section = report.split("most recent:")[1].split("MTBF")[0]
    return {level: float(secs) for level, secs in re.findall(r"^\s+(inprocess|injob)\s+([\d.]+) s", section, re.M)}


@pytest.mark.slow
def test_the_demo_prints_an_slo_report_consistent_with_the_journal(demo_command):
    out = demo_command.stdout
    assert demo_command.result.returncode == 0, demo_command.stderr[-3000:]
    assert "nvrx-slo SLO report" in out and "finished" in out.split("nvrx-slo SLO report")[1].splitlines()[0]

    # The badput breakdown plus productive sums to 100% of wall.
    total = re.search(r"^\s+total\s+([\d.]+) s\s+([\d.]+)%$", out, re.M)
    assert total and float(total.group(2)) == 100.0
    rows = re.findall(r"^  (\S.*?)\s{2,}([\d.]+) s\s+([\d.]+)%$",
                      out.split("Where the time went")[1].split("Checkpoints:")[0], re.M)
    parts = {label: float(secs) for label, secs, _ in rows if label != "total"}
    assert abs(sum(parts.values()) - float(total.group(1))) < 0.05 * len(parts)
    efficiency = float(re.search(r"Efficiency \(productive / wall\): ([\d.]+)%", out).group(1))
    # each printed to 0.01: productive and total each off by up to 0.005 s, the percentage by 0.005
    wall, productive = float(total.group(1)), parts["productive"]
    slack = 100 * (0.005 / wall + productive * 0.005 / wall**2) + 0.005
    assert abs(efficiency - 100 * productive / wall) <= slack + 1e-9

    # One in-job and one in-process restart, each with the latency the journal's own timestamps give.
    journal = summarize(read_journal(demo_command.result.journal_dir))
    by_level = {"in-job": "injob", "in-process": "inprocess"}
    expected = {by_level[r["level"]]: r["latency"] for r in journal["restarts"]}
    assert set(expected) == {"injob", "inprocess"}
    reported = _restart_latencies(out)
    assert set(reported) == set(expected)
    for level, latency in expected.items():
        assert abs(reported[level] - latency) < 0.5, (level, reported[level], latency)

    # Every default SLO is judged, and the HTML report was written where the demo says.
    verdicts = re.findall(r"^\s+(PASS|FAIL|no data)\s+(.+?):", out, re.M)
    assert {name for _, name in verdicts} >= {"training efficiency", "recovery latency", "checkpoint blocking"}
    html = re.search(r"HTML report with a timeline: (\S+)", out).group(1)
    assert html.endswith("report.html") and "<svg" in open(html).read()


@pytest.mark.slow
def test_the_demos_sigkill_is_killed_and_its_exception_is_an_exception_and_each_has_its_cost(demo_command):
    """The causes come from what the real parts journaled (the exit the launcher saw, the exception
    that left the step), not from the demo's own fault_injected marks: the in-job restart is the
    SIGKILL's (``killed``), the in-process one the exception's; the cost table splits the lost and
    restart seconds between them and adds up to the breakdown's."""
    out = demo_command.stdout
    assert demo_command.result.returncode == 0, demo_command.stderr[-3000:]
    recent = dict(re.findall(r"^\s+(inprocess|injob)\s+[\d.]+ s  (\w+): ", out.split("most recent:")[1], re.M))
    assert recent == {"injob": "killed", "inprocess": "exception"}
    section = out.split("What badput cost")[1].split("\n\n")[0]
    rows = {(m[1].strip(), m[2]): float(m[3])
            for m in re.finditer(r"^  (.+?)\s{2}(\S+)\s+([\d.]+)\s+[\d.]+\s+\S+ USD$", section, re.M)}
    caused = {cause for (category, cause) in rows if category.startswith(("lost", "restart"))}
    assert caused == {"killed", "exception"}, rows
    breakdown = dict(re.findall(r"^  (\S.*?)\s{2,}([\d.]+) s\s+[\d.]+%$", out.split("Where the time went")[1], re.M))
    for category in ("lost (rolled back)", "restart"):
        by_cause = sum(v for (c, _), v in rows.items() if c == category)
        assert by_cause == pytest.approx(float(breakdown[category]), abs=0.02), category


@pytest.mark.slow
def test_the_demo_and_every_process_it_starts_keep_the_pynvml_shims_warning_quiet(demo_command):
    """The launchers, ranks and NVRx's writers each import torch, which warns that the ``pynvml``
    shim NVRx requires is deprecated: nothing a user can act on, in every process's log."""
    assert demo_command.result.returncode == 0, demo_command.stderr[-3000:]
    logs = {path.name: path.read_text(errors="replace") for path in demo_command.result.run_dir.rglob("*.log")}
    # the launchers' and ranks' output is there (the elastic agent's line: NVRx 0.4.1 prefixes its lines
    # with "ft_launcher<pid>", 0.6.0 with "launcher.py:<line>")
    assert "demo.log" in logs and "starting workers for entrypoint" in logs["demo.log"]
    assert not {name for name, text in logs.items() if "pynvml package is deprecated" in text}
    assert "pynvml package is deprecated" not in demo_command.stderr
