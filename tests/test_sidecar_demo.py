"""The real sidecar over the real reference job's journal (2 gloo ranks, real NVRx, an injected crash
and an in-process exception): what /metrics says, checked against the journal's own timestamps."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest

from journal_truth import read_journal
from needs import tool
from nvrx_slo.contracts import schema
from sidecar_process import SidecarProcess, counters, value

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.nvrx]


class Facts:
    """What the journal itself says, computed here without the engine."""

    def __init__(self, records: list[dict]) -> None:
        ranks = [r for r in records if r["rank"] is not None]
        steps = [r for r in ranks if r["type"] == "step"]
        self.ranks = sorted({r["rank"] for r in ranks})
        self.steps = {k: sum(1 for s in steps if s["rank"] == k) for k in self.ranks}
        self.data_s = {k: sum(s["data_s"] for s in steps if s["rank"] == k) for k in self.ranks}
        self.work_s = {k: sum(s["mono"] - s["start"] - s["data_s"] for s in steps if s["rank"] == k)
                       for k in self.ranks}
        # steps an exception left: lost work when the rank's loop stopped there (a peer's crash broke
        # its collective), not when a restart was already under way
        self.partial_s = {k: sum(r["mono"] - r["start"] for r in ranks if r["type"] == "step_failed" and r["rank"] == k)
                          for k in self.ranks}
        begins = [r.get("start", r["mono"]) if r["type"] in ("step", "restore", "checkpoint_finalize") else r["mono"]
                  for r in records]
        self.wall_s = max(r["mono"] for r in records) - min(begins)
        # each restart once: an incarnation (restart, iter) other than the first (one that hung before
        # its first step too). Its latency: from the fault the dead incarnation journaled (the earliest
        # rank's) to the last rank's first step start. A restart with no injected fault (a timeout on a
        # loaded machine) is counted, and its level's latency left unchecked (no journaled fault instant).
        first_step: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
        for s in sorted(steps, key=lambda s: s["start"]):
            first_step[(s["restart"], s["iter"])].setdefault(s["rank"], s["start"])
        faults: dict[tuple[int, int], float] = {}
        for f in (r for r in ranks if r["type"] == "fault_injected"):
            key = (f["restart"], f["iter"])
            faults[key] = min(faults.get(key, f["mono"]), f["mono"])
        incarnations = sorted({(r["restart"], r["iter"]) for r in ranks})
        self.restarts: dict[str, int] = {"injob": 0, "inprocess": 0}
        self.latency: dict[str, list[float] | None] = {"injob": [], "inprocess": []}
        for before, (restart, it) in pairwise(incarnations):
            level = "inprocess" if restart == before[0] else "injob"
            self.restarts[level] += 1
            latencies = self.latency[level]
            if before in faults and (restart, it) in first_step and latencies is not None:
                latencies.append(max(first_step[(restart, it)].values()) - faults[before])
            else:
                self.latency[level] = None


@pytest.fixture(scope="module")
def facts(demo_run) -> Facts:
    return Facts(read_journal(Path(demo_run.journal_dir)))


@pytest.fixture(scope="module")
def scraped(demo_run, tmp_path_factory) -> tuple[dict, bytes]:
    tmp = tmp_path_factory.mktemp("demo-sidecar")
    with SidecarProcess(Path(demo_run.journal_dir), tmp / "state.json", tmp / "log") as proc:
        proc.wait_ready()
        samples = proc.scrape()
        body = proc.get("/metrics")[1]
        assert proc.stop()[0] == 0
    return samples, body


def test_each_restart_is_counted_once_with_the_journals_latency(facts, scraped):
    samples, _ = scraped
    assert facts.restarts["injob"] >= 1 and facts.restarts["inprocess"] >= 1, "the demo injects both kinds of fault"
    for level, count in facts.restarts.items():
        assert value(samples, "nvrx_restarts_total", level=level) == count, level
    checked = {level: latencies for level, latencies in facts.latency.items() if latencies is not None}
    assert checked, "no restart with an injected fault"
    for level, latencies in checked.items():
        got = value(samples, "nvrx_restart_duration_seconds_sum", level=level)
        assert abs(got - sum(latencies)) <= 0.5 * len(latencies), (level, got, latencies)
    assert value(samples, "nvrx_restarts_total", level="pod") == 0


def test_efficiency_and_badput_split_agree_with_the_journal(facts, scraped):
    samples, _ = scraped
    for rank in facts.ranks:
        r = str(rank)
        seconds = {dict(ls)["category"]: v for (n, ls), v in samples.items()
                   if n == "nvrx_time_seconds_total" and dict(ls)["rank"] == r}
        unprotected = value(samples, "nvrx_unprotected_work_seconds", rank=r)
        wall = value(samples, "nvrx_wall_seconds_total", rank=r)
        assert wall == pytest.approx(facts.wall_s, abs=0.01)  # the job finished: wall stopped at its end
        assert sum(seconds.values()) + unprotected == pytest.approx(wall, abs=1e-6)
        assert value(samples, "nvrx_steps_total", rank=r) == facts.steps[rank]
        # steps split into data wait and work; work is productive, lost or still unprotected
        assert seconds["data_wait"] == pytest.approx(facts.data_s[rank], abs=0.05)
        work = seconds["productive"] + seconds["lost"] + unprotected
        assert facts.work_s[rank] - 0.05 <= work <= facts.work_s[rank] + facts.partial_s[rank] + 0.05
        assert seconds["lost"] > 0  # the crash rolled back work done after the last save
        assert seconds["restart"] > 0 and seconds["checkpoint_restore"] > 0


@pytest.mark.external
def test_promtool_accepts_the_demo_scrape(scraped):
    lint = subprocess.run([tool("promtool"), "check", "metrics"], input=scraped[1], capture_output=True, timeout=60)
    assert lint.returncode == 0 and lint.stdout + lint.stderr == b"", lint.stdout + lint.stderr


@pytest.fixture(scope="module")
def replay(demo_run, tmp_path_factory) -> tuple[list[dict], dict, dict]:
    """The demo's lines appended in time order, in slices cut anywhere (mid-line too), to a fresh
    directory that a steady sidecar and a SIGKILLed-and-restarted one both follow. The demo's
    minute is replayed in seconds, its monotonic instants moved to start now: like a live
    writer's, no line is stamped before it is written."""
    tmp_path = tmp_path_factory.mktemp("demo-replay")
    source = Path(demo_run.journal_dir)
    records = sorted(((schema.decode(line), path.name) for path in source.glob("*.jsonl")
                     for line in path.read_bytes().splitlines() if _valid(line)), key=lambda t: t[0]["mono"])
    shift = time.monotonic() - records[0][0]["mono"]
    stream = [(name, schema.encode({k: v + shift if k in ("mono", "start", "written") else v for k, v in r.items()}))
              for r, name in records]
    journal = tmp_path / "journal"
    journal.mkdir()
    slices = 12

    carry: list[tuple[str, bytes]] = []  # the rest of a line cut at a slice's end

    def write(name: str, data: bytes) -> None:
        with open(journal / name, "ab") as f:
            f.write(data)

    def append(i: int) -> None:
        for name, rest in carry:
            write(name, rest)
        carry.clear()
        chunk = stream[len(stream) * i // slices: len(stream) * (i + 1) // slices]
        for j, (name, line) in enumerate(chunk):
            if j == len(chunk) - 1 and i < slices - 1:
                write(name, line[: len(line) // 2])
                carry.append((name, line[len(line) // 2:]))
            else:
                write(name, line)

    seen = []
    with SidecarProcess(journal, tmp_path / "steady.json", tmp_path / "steady.log") as steady:
        first = SidecarProcess(journal, tmp_path / "state.json", tmp_path / "first.log", "--state-interval", "0.1")
        steady.wait_ready()
        first.wait_ready()
        for i in range(slices // 2):
            append(i)
            time.sleep(0.3)
            seen.append(first.scrape())
        first.stop(signal.SIGKILL)
        with SidecarProcess(journal, tmp_path / "state.json", tmp_path / "second.log") as second:
            second.wait_ready()
            for i in range(slices // 2, slices):
                seen.append(second.scrape())
                append(i)
                time.sleep(0.3)
            time.sleep(0.5)
            seen.append(final := second.scrape())
            assert second.stop()[0] == 0
        uninterrupted = steady.scrape()
        assert steady.stop()[0] == 0
    return seen, final, uninterrupted


def test_replayed_live_with_a_sigkill_midway_it_ends_as_an_uninterrupted_sidecar(replay, scraped):
    seen, final, uninterrupted = replay
    assert counters(final) == counters(uninterrupted)
    # fed live in slices or read at once: the same totals (up to rounding: the replay's clock is moved)
    assert counters(final) == pytest.approx(counters(scraped[0]), rel=1e-9, abs=1e-9)
    for before, after in pairwise(seen):
        for key, v in counters(before).items():
            assert counters(after).get(key, v) >= v, key


def _valid(line: bytes) -> bool:
    try:
        schema.decode(line)
        return True
    except schema.JournalError:
        return False
