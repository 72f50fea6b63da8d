"""Probe-burst benchmark: 1,000 simultaneous ``/healthz`` connections to a real sidecar, side by side
with the same HTTP server class serving only that route in a process of its own (the floor: what
the server design answers on this machine, with no journal to follow).

Each round opens ``--connections`` non-blocking connections at once from one client process and
times each to its full answer; rounds alternate between the two servers so that a noisy machine
weighs on both alike. The sidecar follows a small journal (``tests/test_sidecar_bad_input.story``)
and polls it every 0.1 s meanwhile.

Usage: .venv/bin/python bench/bench_probes.py [--connections 1000] [--rounds 5]
Target (issue 16): /healthz within 100 ms under 1,000 concurrent connections. The ratio says what
the sidecar adds over its own server; the floor says what the machine allows (the client's own
work included: it runs on the same cores).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers import burst
from sidecar_process import SidecarProcess
from test_sidecar_bad_input import write_clean

TARGET_MS = 100.0

FLOOR = """
from nvrx_slo.exporter.server import Server
import threading
server = Server("127.0.0.1", 0, {"/healthz": lambda: (200, "text/plain; charset=utf-8", b"ok\\n")})
server.start()
print(server.port, flush=True)
threading.Event().wait()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    took: dict[str, list[float]] = {"sidecar": [], "floor": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_clean(root / "journal")
        floor = subprocess.Popen([sys.executable, "-c", FLOOR], stdout=subprocess.PIPE, text=True)
        try:
            assert floor.stdout is not None
            ports = {"floor": int(floor.stdout.readline())}
            with SidecarProcess(root / "journal", root / "state.json", root / "log") as sidecar:
                sidecar.wait_ready(timeout=60)
                ports["sidecar"] = sidecar.port
                for _ in range(args.rounds):
                    for name, port in ports.items():
                        took[name] += burst(port, args.connections)
                sidecar.stop()
        finally:
            floor.kill()
            floor.wait()
    median = {name: statistics.median(t) * 1000 for name, t in took.items()}
    for name, t in took.items():
        t.sort()
        print(f"{name:8} {args.connections} connections x {args.rounds} rounds: median {median[name]:.0f} ms, "
              f"p95 {t[int(len(t) * 0.95)] * 1000:.0f} ms, max {t[-1] * 1000:.0f} ms")
    print(f"sidecar/floor median: {median['sidecar'] / median['floor']:.2f}; "
          f"target median <= {TARGET_MS:.0f} ms: {'met' if median['sidecar'] <= TARGET_MS else 'NOT met'}")


if __name__ == "__main__":
    main()
