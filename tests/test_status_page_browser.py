"""The live status page in a real browser: headless Chromium loads ``/`` from a real sidecar
process following the real demo run's journal, and the numbers it rendered equal the same
sidecar's ``/metrics`` parsed by prometheus-client. The demo has finished by the time the
sidecar starts (one demo run is shared by the whole suite), so its wall clock has stopped and
the two answers must agree exactly. A screenshot lands in ``test-artifacts/``.
"""

from __future__ import annotations

import pytest

from journal_fixtures import write_journal
from pages import ARTIFACTS, assert_inert, dump_dom, inventory, screenshot
from sidecar_process import SidecarProcess
from stories import EVIL, inprocess_job


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum of every series of ``name`` with ``labels`` (per-rank series or one rank="all")."""
    hits = [v for (n, ls), v in samples.items() if n == name and all(dict(ls).get(k) == w for k, w in labels.items())]
    assert hits, (name, labels)
    return sum(hits)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
@pytest.mark.external
def test_the_live_page_shows_what_metrics_says(demo_run, tmp_path):
    with SidecarProcess(demo_run.journal_dir, tmp_path / "state.json", tmp_path / "sidecar.log") as sidecar:
        sidecar.wait_ready()
        url = f"http://127.0.0.1:{sidecar.port}/"
        dom = dump_dom(url, tmp_path / "profile")
        samples = sidecar.scrape()
        screenshot(url, ARTIFACTS / "status_page.png", tmp_path / "profile")
        sidecar.stop()

    page = assert_inert(dom)
    num = {k: float(v["data-value"]) for k, v in page.by_id.items() if v.get("data-value")}
    assert "finished" in "".join(page.text)  # the wall clock stopped: the two reads must agree exactly
    wall = total(samples, "nvrx_wall_seconds_total")
    assert num["wall-seconds"] == pytest.approx(wall, rel=1e-9)
    for (name, labels), _ in samples.items():
        if name == "nvrx_time_seconds_total":
            category = dict(labels)["category"]
            assert num[f"seconds-{category}"] == pytest.approx(total(samples, name, category=category), rel=1e-9,
                                                               abs=1e-9)
    assert num["seconds-unprotected"] == pytest.approx(total(samples, "nvrx_unprotected_work_seconds"), abs=1e-9)
    assert num["efficiency"] == pytest.approx(total(samples, "nvrx_time_seconds_total", category="productive") / wall)
    for level in ("inprocess", "injob", "pod"):
        assert num[f"restarts-{level}"] == total(samples, "nvrx_restarts_total", level=level)
    assert num["restarts-total"] >= 2  # the demo's crash and its in-process exception
    assert num["steps-total"] == total(samples, "nvrx_steps_total")
    assert num["checkpoint-failures"] == total(samples, "nvrx_checkpoint_failures_total")
    assert num["checkpoint-in-flight"] == total(samples, "nvrx_checkpoint_in_flight")
    background = total(samples, "nvrx_checkpoint_background_seconds_sum")
    saves = total(samples, "nvrx_checkpoint_blocking_seconds_sum") + background
    assert num["checkpoint-overlap"] == pytest.approx(background / saves)
    assert num["events-accepted"] == total(samples, "nvrx_exporter_events_total")
    assert num["rejected"] == sum(v for (n, _), v in samples.items() if n == "nvrx_exporter_rejected_events_total")
    for category in ("productive", "lost", "restart", "checkpoint_blocking"):  # drawn in the chart, too
        assert num[f"seconds-{category}"] > 0 and f'class="seg c-{category}"' in dom


@pytest.mark.external
def test_journal_strings_cannot_script_the_live_page(tmp_path):
    write_journal(inprocess_job(), tmp_path / "journal", live=True)
    with SidecarProcess(tmp_path / "journal", tmp_path / "state.json", tmp_path / "sidecar.log") as sidecar:
        sidecar.wait_ready()
        dom = dump_dom(f"http://127.0.0.1:{sidecar.port}/", tmp_path / "profile")
        sidecar.stop()
    page = assert_inert(dom)  # after the browser ran the page: nothing was injected
    text = "".join(page.text)
    assert EVIL in text and "RuntimeError: injected " + EVIL in text
    assert inventory(dom).by_id["checkpoint-saves"]["data-value"] == "3"
