"""NVRx async checkpoint vs synchronous DCP save of the same state: training-blocking time, side by side.

    .venv/bin/python bench/bench_checkpoint.py [--mb 256] [--rounds 3]

One gloo rank, the same ``--mb`` of fp32 tensors saved alternately by ``Checkpointer(mode="sync")``
(``torch.distributed.checkpoint.save``) and ``Checkpointer(mode="async")`` (NVRx, with the CPU
staging copy), to the same disk. Blocking time is read back from the journal by the exporter's
engine: (scheduled − start) + the loop's polls of the writer. The async writer is started and
readied first, as the reference job does at start-up. Target: async blocking ≤ 10% of sync.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.reference.checkpoint import Checkpointer


def _blocking(journal_dir: Path) -> dict[str, float]:
    """Each save's blocking as the sidecar's engine derives it: its block and the loop's waits on it."""
    engine = Engine(reorder_window_s=0.0, keep_history=True)
    tail = JournalTail(journal_dir)
    try:
        tail.poll(lambda events: [engine.ingest(e) for e in events])
    finally:
        tail.close()
    return {c.ckpt: c.blocking_s for c in engine.history().checkpoints if c.blocking_s is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="state size in MiB (default 256)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tensors = max(1, args.mb // 4)
    state = {f"layer{i}": torch.randn(1024 * 1024) for i in range(tensors)}  # 4 MiB each
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        root = Path(tmp)
        hooks = {mode: Hooks.start(1, str(root / f"journal-{mode}")) for mode in ("sync", "async")}
        ckpts = {mode: Checkpointer(hooks[mode], root / mode, mode) for mode in ("sync", "async")}
        ckpts["async"].start()
        ckpts["async"].ready(state)
        for step in range(1, args.rounds + 1):
            for mode in ("sync", "async"):
                t0 = time.monotonic()
                ckpts[mode].save(state, step)
                returned = time.monotonic() - t0
                while ckpts[mode].in_flight:  # training goes on while the async write runs
                    state["layer0"] += 1.0
                    time.sleep(0.05)
                    ckpts[mode].poll()
                print(f"round {step} {mode:5s}: save returned after {returned:.3f} s", flush=True)
        ckpts["async"].close()
        for mode in ("sync", "async"):
            hooks[mode].close()
        blocking = {mode: _blocking(root / f"journal-{mode}") for mode in ("sync", "async")}
    sync = statistics.median(blocking["sync"].values())
    async_ = statistics.median(blocking["async"].values())
    print(f"state {tensors * 4} MiB, {args.rounds} rounds, median blocking: sync {sync:.3f} s, "
          f"async {async_:.3f} s, ratio {async_ / sync:.3f} (target <= 0.10); the first async save "
          f"blocked {blocking['async']['step-000001']:.3f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
