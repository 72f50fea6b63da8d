"""The metrics backends the rule tests run on loopback: Prometheus, and VictoriaMetrics (single-node
storage, vmagent, vmalert), each a real Debian binary (docs/scaling.md says which versions).

Each starter registers the process's stop with an ``ExitStack`` and returns once the server
answers, so a fixture's ``with ExitStack()`` ends everything it started, in reverse.

VictoriaMetrics runs with two settings a test needs and a production user may keep at their
defaults: ``-search.latencyOffset=0s`` (by default a query for the last 30 s is answered as of 30 s
ago, which at a 1 s evaluation is thirty evaluations late) and ``-search.disableCache`` (a run
shorter than the cache's 5-minute horizon gains nothing from it). vmalert flushes what it records
every 200 ms instead of every 5 s: its results reach storage asynchronously, so a rule reading
another rule's result reads the newest one that has arrived (docs/scaling.md).
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from needs import tool
from servers import free_port, stop, wait_for

# What a demo prints for each sidecar it starts: its pod and its address.
SIDECAR = re.compile(r"^sidecar of (\S+): http://(127\.0\.0\.1:\d+)/ \(status page\)", re.M)


def query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """``expr`` now, or at the Unix time ``at``, through the Prometheus HTTP API (both backends serve it)."""
    args = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode(args)}", timeout=10) as resp:
        answer = json.load(resp)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1) as resp:
        return resp.status == 200


def _start(stack: ExitStack, args: list[str], log: Path, ready: str, what: str) -> None:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    stack.callback(stop, proc)
    wait_for(lambda: _answers(ready), what, 30)


def prometheus(stack: ExitStack, tmp: Path, name: str, config: dict[str, Any], *flags: str) -> str:
    """A Prometheus with ``config`` and its TSDB under ``tmp``; its base URL."""
    (tmp / f"{name}.yml").write_text(json.dumps(config))
    url = f"http://127.0.0.1:{free_port()}"
    _start(stack, [tool("prometheus"), f"--config.file={tmp / f'{name}.yml'}", f"--storage.tsdb.path={tmp / name}",
                   f"--web.listen-address={url.removeprefix('http://')}", "--log.level=warn", *flags],
           tmp / f"{name}.log", f"{url}/-/ready", f"Prometheus {name} ready")
    return url


def alertmanager(stack: ExitStack, tmp: Path, config: Path) -> str:
    """An Alertmanager with ``config``, its state under ``tmp``, on loopback only; its base URL."""
    url = f"http://127.0.0.1:{free_port()}"
    _start(stack, [tool("prometheus-alertmanager"), f"--config.file={config}", f"--storage.path={tmp / 'am'}",
                   f"--web.listen-address={url[7:]}", "--cluster.listen-address=", "--log.level=warn"],
           tmp / "alertmanager.log", f"{url}/-/ready", "Alertmanager ready")
    return url


def victoria_metrics(stack: ExitStack, tmp: Path, name: str) -> str:
    """A single-node VictoriaMetrics storing under ``tmp``; its base URL (write: ``/api/v1/write``)."""
    url = f"http://127.0.0.1:{free_port()}"
    _start(stack, [tool("victoria-metrics"), f"-storageDataPath={tmp / name}", f"-httpListenAddr={url[7:]}",
                   "-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=WARN"],
           tmp / f"{name}.log", f"{url}/health", f"VictoriaMetrics {name} ready")
    return url


def vmagent(stack: ExitStack, tmp: Path, name: str, scrape: dict[str, Any] | None,
            writes: list[tuple[str, list[dict[str, Any]] | None]]) -> str:
    """A vmagent scraping ``scrape`` (a Prometheus config's ``scrape_configs`` part; ``None``: it only
    relays what is written to its ``/api/v1/write``), remote-writing to each of ``writes``: a storage's
    base URL and the relabelling applied to what goes there only. Its base URL."""
    url = f"http://127.0.0.1:{free_port()}"
    args = [tool("vmagent"), f"-httpListenAddr={url[7:]}", f"-remoteWrite.tmpDataPath={tmp / name}",
            "-promscrape.fileSDCheckInterval=1s", "-loggerLevel=WARN"]
    if scrape is not None:
        (tmp / f"{name}.yml").write_text(json.dumps(scrape))
        args.append(f"-promscrape.config={tmp / f'{name}.yml'}")
    for i, (target, relabel) in enumerate(writes):
        relabelling = tmp / f"{name}-{i}.relabel.yml"
        relabelling.write_text(json.dumps(relabel or []))
        args += [f"-remoteWrite.url={target}/api/v1/write", f"-remoteWrite.urlRelabelConfig={relabelling}"]
    _start(stack, args, tmp / f"{name}.log", f"{url}/health", f"vmagent {name} ready")
    return url


def vmalert(stack: ExitStack, tmp: Path, name: str, rules: Path, datasource: str, write: str,
            notifier: str | None = None, labels: dict[str, str] | None = None, flags: list[str] | None = None) -> str:
    """A vmalert evaluating ``rules`` against ``datasource``, writing what it records (and its alerts'
    ``ALERTS`` series) to ``write`` (a base URL), alerts to the Alertmanager at ``notifier``, every
    result with ``labels`` (a shard's external labels). Its base URL."""
    url = f"http://127.0.0.1:{free_port()}"
    args = [tool("vmalert"), f"-rule={rules}", f"-datasource.url={datasource}", f"-remoteWrite.url={write}",
            "-remoteWrite.flushInterval=200ms", f"-httpListenAddr={url[7:]}", "-loggerLevel=WARN"]
    args += [f"-notifier.url={notifier}"] if notifier else []
    args += [f"-external.label={k}={v}" for k, v in (labels or {}).items()] + (flags or [])
    _start(stack, args, tmp / f"{name}.log", f"{url}/health", f"vmalert {name} ready")
    return url


def follow(stdout: IO[str], targets: Path, out: list[str]) -> None:
    """Each sidecar a demo starts becomes a scrape target as it starts (file service discovery, as a
    PodMonitor would make it one); every line the demo prints is kept in ``out``."""
    for line in stdout:
        out.append(line)
        if match := SIDECAR.match(line):
            seen = json.loads(targets.read_text()) + [{"targets": [match.group(2)]}]
            targets.with_suffix(".tmp").write_text(json.dumps(seen))
            targets.with_suffix(".tmp").replace(targets)
