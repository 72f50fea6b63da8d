"""Container restarts the journal cannot see (OOMKilled, a crashed container), from the Kubernetes API.

Inside a cluster the sidecar watches its own pod (``list_namespaced_pod`` filtered to its name,
with the in-cluster service-account config) and reports each container's ``restartCount`` and
last termination reason. ``restart_deltas`` turns successive reports into restarts by
(container, reason); the caller persists what it has seen, so a restarted sidecar neither
recounts old restarts nor misses those that happened while it was down. Outside a cluster
``start`` logs one line and returns ``None``.

The ``kubernetes`` package is imported only when a watcher starts (it is slow to import).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.ingest.ratelog import BoundedLog

log = logging.getLogger("nvrx_slo.podwatch")

UNKNOWN_REASON = "Unknown"


class ContainerStatus(NamedTuple):
    container: str
    restart_count: int
    last_reason: str  # why the previous instance terminated (OOMKilled, Error, Completed, …)


def restart_deltas(seen: Mapping[str, int], statuses: Iterable[ContainerStatus]
                   ) -> tuple[dict[str, int], Counter[tuple[str, str]]]:
    """New restarts since ``seen`` (container -> restartCount), attributed to the last reason.

    A container seen for the first time has all its restarts counted (under its last reason:
    Kubernetes keeps no older ones). A count that went down means a new pod under the same
    name; its count is new restarts.
    """
    now = dict(seen)
    new: Counter[tuple[str, str]] = Counter()
    for s in statuses:
        before = seen.get(s.container, 0)
        delta = s.restart_count - before if s.restart_count >= before else s.restart_count
        if delta > 0:
            new[(s.container, s.last_reason)] += delta
        now[s.container] = s.restart_count
    return now, new


def container_statuses(pod: Any) -> list[ContainerStatus]:
    """The init (sidecar) and regular container statuses of a ``V1Pod``."""
    status = pod.status
    if status is None:
        return []
    out = []
    for cs in (status.init_container_statuses or []) + (status.container_statuses or []):
        terminated = cs.last_state.terminated if cs.last_state is not None else None
        reason = (terminated.reason or UNKNOWN_REASON) if terminated is not None else UNKNOWN_REASON
        out.append(ContainerStatus(cs.name, int(cs.restart_count or 0), reason))
    return out


class Watcher:
    """Watches one pod in a daemon thread; ``on_statuses`` gets every status report."""

    def __init__(self, api_client: Any, namespace: str, pod: str,
                 on_statuses: Callable[[list[ContainerStatus]], None], *, retry_s: float = 5.0) -> None:
        self._api_client = api_client
        self._namespace = namespace
        self._pod = pod
        self._on_statuses = on_statuses
        self._retry_s = retry_s
        self._stopped = threading.Event()
        self._log = BoundedLog(log)
        self._thread = threading.Thread(target=self._run, name="podwatch", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()  # the thread ends at its next event or request timeout; it is a daemon

    def _run(self) -> None:
        from kubernetes import client, watch

        api = client.CoreV1Api(self._api_client)
        while not self._stopped.is_set():
            try:
                stream = watch.Watch().stream(
                    api.list_namespaced_pod, self._namespace, field_selector=f"metadata.name={self._pod}",
                    timeout_seconds=300, _request_timeout=330)
                for event in stream:
                    if self._stopped.is_set():
                        return
                    self._on_statuses(container_statuses(event["object"]))
            except Exception as exc:  # API down, RBAC missing, …: keep the sidecar up, retry
                self._log.warning("watch", "pod watcher: %s: %s (retrying in %.0f s)",
                                  type(exc).__name__, exc, self._retry_s)
                self._stopped.wait(self._retry_s)


def start(identity: PodIdentity, on_statuses: Callable[[list[ContainerStatus]], None],
          api_client: Any = None) -> Watcher | None:
    """Watch the sidecar's own pod; ``None`` (with one log line) outside a cluster."""
    if api_client is None:
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):  # what the in-cluster config checks first
            log.info("pod watcher off: not running in a Kubernetes cluster (KUBERNETES_SERVICE_HOST unset)")
            return None
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException as exc:
            log.info("pod watcher off: not running in a Kubernetes cluster (%s)", exc)
            return None
        api_client = client.ApiClient()
    if not identity.namespace:
        log.info("pod watcher off: namespace unknown (set POD_NAMESPACE from the Downward API)")
        return None
    log.info("pod watcher on: %s/%s", identity.namespace, identity.pod)
    return Watcher(api_client, identity.namespace, identity.pod, on_statuses).start()
