"""The pod watcher: the real kubernetes client against a fake API server on loopback (the HTTP seam)."""

from __future__ import annotations

import json
import logging
import threading
from email.message import Message
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.ingest import podwatch
from nvrx_slo.exporter.ingest.podwatch import ContainerStatus, restart_deltas
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from servers import HttpStub

IDENT = PodIdentity(namespace="train", pod="llm-0", node="n", job_name="llm")


def pod(trainer_restarts: int, reason: str | None, sidecar_restarts: int = 0) -> dict:
    def status(name: str, count: int, why: str | None) -> dict:
        last = {"terminated": {"reason": why, "exitCode": 137}} if why else {}
        return {"name": name, "restartCount": count, "ready": True, "image": "x", "imageID": "x",
                "lastState": last, "state": {"running": {}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llm-0", "namespace": "train"},
            "status": {"containerStatuses": [status("trainer", trainer_restarts, reason)],
                       "initContainerStatuses": [status("nvrx-slo-sidecar", sidecar_restarts, None)]}}


class FakeApi:
    """Answers the watch on pods with a scripted stream of events, then closes it."""

    def __init__(self, events: list[dict]) -> None:
        self.events = events
        self.queries: list[dict] = []
        self._stub = HttpStub(self._answer)

    def _answer(self, method: str, path: str, headers: Message, body: bytes) -> tuple[int, str, bytes]:
        url = urlsplit(path)
        self.queries.append({"path": url.path, **parse_qs(url.query)})
        reply = b"".join(json.dumps({"type": "MODIFIED", "object": e}).encode() + b"\n" for e in self.events)
        self.events = []  # the next watch (a reconnect) gets nothing new
        return 200, "application/json", reply

    def api_client(self) -> client.ApiClient:
        return client.ApiClient(client.Configuration(host=self._stub.url))

    def close(self) -> None:
        self._stub.close()


def test_restarts_are_counted_by_container_and_reason_once(tmp_path):
    api = FakeApi([pod(0, None), pod(1, "OOMKilled"), pod(1, "OOMKilled"), pod(3, "Error", sidecar_restarts=1)])
    live = Live(Engine(), JournalTail(tmp_path))
    reports = threading.Semaphore(0)

    def observe(statuses: list[ContainerStatus]) -> None:
        live.observe_containers(statuses)
        reports.release()

    watcher = podwatch.start(IDENT, observe, api_client=api.api_client())
    try:
        for _ in range(4):
            assert reports.acquire(timeout=20)
    finally:
        watcher.stop()
        api.close()
    assert dict(live.view().pod_restarts) == {("trainer", "OOMKilled"): 1, ("trainer", "Error"): 2,
                                              ("nvrx-slo-sidecar", "Unknown"): 1}
    query = api.queries[0]
    assert query["path"] == "/api/v1/namespaces/train/pods" and query["fieldSelector"] == ["metadata.name=llm-0"]
    assert query["watch"] == ["true"]


def test_what_was_seen_survives_a_sidecar_restart(tmp_path):
    live = Live(Engine(), JournalTail(tmp_path))
    live.observe_containers([ContainerStatus("trainer", 2, "OOMKilled")])
    resumed = Live(Engine(), JournalTail(tmp_path))
    resumed.load_state(live.to_state())
    resumed.observe_containers([ContainerStatus("trainer", 3, "Error")])
    assert dict(resumed.view().pod_restarts) == {("trainer", "OOMKilled"): 2, ("trainer", "Error"): 1}


def test_a_new_pod_under_the_same_name_starts_counting_again():
    seen, new = restart_deltas({"trainer": 5}, [ContainerStatus("trainer", 1, "Error")])
    assert seen == {"trainer": 1} and dict(new) == {("trainer", "Error"): 1}


def test_outside_a_cluster_it_is_off_with_one_line(caplog, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with caplog.at_level(logging.INFO, "nvrx_slo.podwatch"):
        assert podwatch.start(IDENT, lambda s: None) is None
    mine = [r.getMessage() for r in caplog.records  # not an earlier test's watcher thread, still retrying
            if r.name == "nvrx_slo.podwatch" and r.thread == threading.get_ident()]
    assert mine == ["pod watcher off: not running in a Kubernetes cluster (KUBERNETES_SERVICE_HOST unset)"]


def test_in_cluster_env_without_a_token_is_off_too(caplog, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with caplog.at_level(logging.INFO, "nvrx_slo.podwatch"):
        assert podwatch.start(IDENT, lambda s: None) is None
    mine = [r.getMessage() for r in caplog.records  # not an earlier test's watcher thread, still retrying
            if r.name == "nvrx_slo.podwatch" and r.thread == threading.get_ident()]
    assert len(mine) == 1 and "pod watcher off" in mine[0]
