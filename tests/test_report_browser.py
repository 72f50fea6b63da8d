"""The offline report of the real demo journal, made by the real CLI and rendered by headless
Chromium: one lane per rank, one marker per checkpoint and per restart, each counted from the
journal itself (not from the engine the report uses). A screenshot lands in ``test-artifacts/``.

And the colours Chromium computes for what the report and the status page draw: every category
and timeline span in a colour of its own, each with its legend swatch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from journal_fixtures import split_by_rank, write_journal
from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.events import Event
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from nvrx_slo.exporter.offline import report
from nvrx_slo.exporter.views import status_page
from pages import ARTIFACTS, assert_inert, dump_dom, screenshot
from snapshot_fixtures import TARGETS
from stories import inprocess_job

# Run after the page was parsed and styled: what Chromium computed for every drawn shape and swatch.
_PROBE = """<script>
document.body.insertAdjacentHTML("beforeend", "<pre id='probe'></pre>");
document.getElementById("probe").textContent = JSON.stringify(
  [...document.querySelectorAll("svg rect, svg path, span.swatch")].map(el => ({
    cls: el.getAttribute("class") || "", fill: getComputedStyle(el).fill,
    background: getComputedStyle(el).backgroundColor, where: el.closest(".tl-legend") ? "legend"
      : el.closest("table") ? "table" : el.closest("svg.breakdown") ? "breakdown" : el.closest("svg.timeline")
      ? "timeline" : "other"})));
</script>"""
BLACK, NONE = "rgb(0, 0, 0)", "rgba(0, 0, 0, 0)"


def computed(document: str, path: Path, profile: Path) -> list[dict[str, str]]:
    """``document`` with the probe appended, as Chromium styled it: one dict per shape and swatch."""
    path.write_text(document.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    dom = dump_dom(path.as_uri(), profile)
    probe = re.search(r"<pre id=\"probe\">(.*?)</pre>", dom, re.S)
    assert probe, dom[-2000:]
    return json.loads(probe.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def rgb(colour: str) -> str:
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def assert_every_category_drawn_is_coloured(shapes: list[dict[str, str]]) -> set[str]:
    """Each breakdown segment is in its category's colour, never the default black, and the table
    beside it has that category's swatch in the same colour; returns the categories drawn."""
    drawn = {m.group(1) for s in shapes if s["where"] == "breakdown"
             for m in [re.fullmatch(r"seg c-(\w+)", s["cls"])] if m}
    assert drawn
    swatches = {s["cls"].removeprefix("swatch c-"): s["background"] for s in shapes if s["where"] == "table"}
    for s in shapes:
        if s["where"] == "breakdown":
            category = Category(s["cls"].removeprefix("seg c-"))
            assert s["fill"] == rgb(status_page.CATEGORY_STYLES[category].colour) != BLACK, s
    for category in drawn:
        assert swatches[category] == rgb(status_page.CATEGORY_STYLES[Category(category)].colour), category
    return drawn


@pytest.mark.external
def test_every_category_and_span_the_report_and_status_page_draw_has_a_colour_and_a_legend_swatch(tmp_path):
    """A job of two pods, each running one rank of a world of three (the third rank is absent),
    whose ranks restart in-process, save, evaluate (a user span) and shut down."""
    pod = inprocess_job(world_size=3, eval_s=0.4)
    dirs = split_by_rank(pod, tmp_path / "job")
    shapes = computed(report.build(dirs, TARGETS), tmp_path / "report.html", tmp_path / "profile")
    drawn = assert_every_category_drawn_is_coloured(shapes)
    assert {"shutdown", "user_span", "absent", "productive", "lost", "restart", "init"} <= drawn
    legend = {s["cls"] for s in shapes if s["where"] == "legend"}
    spans = [s for s in shapes if s["where"] == "timeline" and s["cls"] not in ("tl-lanebg", "tl-restart-band")]
    assert {s["cls"] for s in spans} >= {"tl-step", "tl-lost", "tl-init", "tl-blocking", "tl-restore"}
    for s in spans:
        assert s["fill"] not in (BLACK, NONE, ""), s
        kind = s["cls"].split()[-1]
        assert any(kind in key.split() for key in legend), s  # the legend shows each kind drawn

    write_journal(inprocess_job(eval_s=0.4), tmp_path / "pod", evil=False)
    live = Live(Engine(), JournalTail(tmp_path / "pod"), mono=lambda: 2000.0, wall=lambda: 1.7e9 + 2000.0)
    live.poll()
    page = status_page.render(live.view(), TARGETS)
    drawn = assert_every_category_drawn_is_coloured(computed(page, tmp_path / "status.html", tmp_path / "profile"))
    assert {"shutdown", "user_span", "productive", "lost"} <= drawn


def journal_facts(journal_dir) -> dict[str, int]:
    """Ranks, save attempts and restarts, counted straight from the records: each in-job restart
    starts processes with a new ``restart`` count, each in-process restart bumps ``iter``, and a
    checkpoint id saved again after a rollback is another attempt."""
    records: list[Event] = []
    tail = JournalTail(journal_dir)
    tail.poll(records.extend)
    tail.close()
    ranked = [r for r in records if r.rank is not None]
    return {
        "ranks": len({r.rank for r in ranked}),
        "checkpoints": len({(r.ckpt, r.restart, r.iter) for r in records if r.type == "checkpoint_start"}),
        "restarts": len({(r.restart, r.iter) for r in ranked}) - 1,
    }


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
@pytest.mark.external
def test_the_report_of_the_demo_renders_its_timeline(demo_run, tmp_path):
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "nvrx_slo", "report", str(demo_run.journal_dir), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size < 500_000

    dom = dump_dom(out.as_uri(), tmp_path / "profile")
    screenshot(out.as_uri(), ARTIFACTS / "report.png", tmp_path / "profile", height=1300)
    assert_inert(dom)
    facts = journal_facts(demo_run.journal_dir)
    assert facts["ranks"] == 2 and facts["restarts"] >= 2 and facts["checkpoints"] >= 2  # the demo's story
    assert dom.count('class="tl-lane"') == facts["ranks"]
    assert dom.count('data-kind="checkpoint"') == facts["checkpoints"]
    assert dom.count('data-kind="restart"') == facts["restarts"]
    assert 'class="tl-lost"' in dom  # the crash rolled work back
    for kind in ("step", "blocking", "background", "restore"):
        assert f'class="tl-{kind}"' in dom, kind
