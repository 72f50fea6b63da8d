"""NVRx async checkpoint vs synchronous DCP save of the same state: training-blocking time, side by side.

    .venv/bin/python bench/bench_checkpoint.py [--mb 256] [--rounds 3]

One gloo rank, the same ``--mb`` of fp32 tensors saved alternately by ``Checkpointer(mode="sync")``
(``torch.distributed.checkpoint.save``) and ``Checkpointer(mode="async")`` (NVRx, with the CPU
staging copy), to the same disk. Blocking time is read back from the journal exactly as the
exporter computes it: (scheduled − start) + finalize spans. The async writer is warmed up first
(a real job does that at start-up). Target: async blocking ≤ 10% of sync.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from nvrx_slo.contracts import schema
from nvrx_slo.trainer.checkpoint import Checkpointer
from nvrx_slo.trainer.hooks import Hooks


def _blocking(journal_file: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    start: dict[str, float] = {}
    for line in journal_file.read_bytes().splitlines():
        r = schema.decode(line)
        if r["type"] == "checkpoint_start":
            start[r["ckpt"]] = r["mono"]
        elif r["type"] == "checkpoint_scheduled":
            out[r["ckpt"]] = r["mono"] - start[r["ckpt"]]
            print(f"  {journal_file.parent.name} {r['ckpt']}: plan {r['plan_s']:.3f} s, stage {r['stage_s']:.3f} s")
        elif r["type"] == "checkpoint_finalize":
            out[r["ckpt"]] += r["mono"] - r["start"]
    return out


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
        ckpts["async"].save({"warm": torch.ones(1)}, 0)
        ckpts["async"].poll(blocking=True)
        for step in range(1, args.rounds + 1):
            for mode in ("sync", "async"):
                t0 = time.monotonic()
                ckpts[mode].save(state, step)
                returned = time.monotonic() - t0
                while ckpts[mode]._pending:  # training goes on while the async write runs
                    state["layer0"] += 1.0
                    time.sleep(0.05)
                    ckpts[mode].poll()
                print(f"round {step} {mode:5s}: save returned after {returned:.3f} s", flush=True)
        ckpts["async"].close()
        blocking = {mode: _blocking(hooks[mode].journal.path()) for mode in ("sync", "async")}
    sync = statistics.median(blocking["sync"].values())
    async_ = statistics.median(v for k, v in blocking["async"].items() if k != "step-000000")
    print(f"state {tensors * 4} MiB, {args.rounds} rounds, median blocking: sync {sync:.3f} s, "
          f"async {async_:.3f} s, ratio {async_ / sync:.3f} (target <= 0.10); the first async save, "
          f"which allocates the staging buffers, blocked {blocking['async']['step-000001']:.3f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
