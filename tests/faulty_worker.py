"""A training loop instrumented with nvrx-slo's hooks, for tests that fault it from outside or inside.

    python faulty_worker.py OUT MODE      # MODE: "raise" (a plain RuntimeError mid-step) or "wait" (to be killed)

It writes its own ground truth to ``OUT/truth-<restart>.jsonl`` (never through nvrx-slo): when its
first step starts and, for "raise", the instant it raises. The first incarnation faults or runs
until killed; a restarted one (by its launcher, or in a restarted container: ``OUT/ran`` exists)
runs a few steps and exits.
"""

from __future__ import annotations

import json
import os
import sys
import time

from nvrx_slo.trainer.hooks import Hooks

STEP_S = 0.4  # long steps, so a fault mid-step is far from the last record
FAULT_STEP = 4


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    again = os.path.exists(os.path.join(out, "ran"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) or int(again)
    open(os.path.join(out, "ran"), "a").close()
    slo = Hooks.start(world_size=1)
    with open(os.path.join(out, f"truth-{restart}.jsonl"), "a") as truth:
        def note(event: str) -> None:
            truth.write(json.dumps({"event": event, "mono": time.monotonic(), "wall": time.time()}) + "\n")
            truth.flush()

        for step in range(4 if restart else 1000):
            if step == 0:
                note("first_step")
            with slo.step(step) as s, s.compute():
                time.sleep(STEP_S * 0.75)
                if restart == 0 and mode == "raise" and step == FAULT_STEP:
                    note("raise")
                    raise RuntimeError("planted mid-step")
                time.sleep(STEP_S * 0.25)
    slo.close()


if __name__ == "__main__":
    main()
