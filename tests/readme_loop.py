"""The README's loop as a user pastes it: host timing, a synchronous ``dcp.save`` every 5 steps and
the last save at the last step, launched by ``python``, ``torchrun`` or ``srun`` (gloo, CPU).

    python readme_loop.py OUT [--steps N] [--fault raise|kill --fault-rank R --fault-step S]

Its own ground truth, never through nvrx-slo, goes to ``OUT/truth/<pid>.jsonl``: each step's
start and end and each save's start and end (``time.monotonic``), before a planted fault its
instant, and when an exception leaves the loop (a peer's collective failing too) the instant it
did. A restarted incarnation (``TORCHELASTIC_RESTART_COUNT`` > 0) restores the newest checkpoint
whose ``.metadata`` DCP wrote and never faults.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from nvrx_slo import Hooks

SAVE_EVERY = 5


def _latest(ckpt: Path) -> int | None:
    """The newest step whose checkpoint DCP finished (its ``.metadata`` is written last)."""
    steps = [int(p.parent.name.split("-")[1]) for p in ckpt.glob("step-*/.metadata")]
    return max(steps, default=None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-s", type=float, default=0.0, help="sleep inside each step's compute")
    ap.add_argument("--fault", choices=("raise", "kill"))
    ap.add_argument("--fault-rank", type=int, default=0)
    ap.add_argument("--fault-step", type=int, default=0)
    args = ap.parse_args()
    distributed = "WORLD_SIZE" in os.environ or "SLURM_NTASKS" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    truth_dir = args.out / "truth"
    truth_dir.mkdir(parents=True, exist_ok=True)
    ckpt = args.out / "ckpt"
    truth = open(truth_dir / f"{os.getpid()}.jsonl", "a", buffering=1)

    def note(event: str, **fields: object) -> None:
        truth.write(json.dumps({"event": event, "rank": rank, "restart": restart, "mono": time.monotonic(),
                                **fields}) + "\n")

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    slo = Hooks.start(world_size=dist.get_world_size() if distributed else 1)
    with slo.restore() as restored:
        latest = _latest(ckpt)
        if latest is not None:
            state = {"model": model.state_dict()}
            dcp.load(state, checkpoint_id=str(ckpt / f"step-{latest:06d}"))
            model.load_state_dict(state["model"])
            restored.step = latest
    note("restored", step=restored.step)
    try:
        for step in range(restored.next_step, args.steps):
            with slo.step(step) as s:
                began = time.monotonic()
                note("step_start", step=step, mono=began)
                with s.data():
                    batch = torch.randn(32, 64)
                with s.compute():
                    loss = model(batch).pow(2).mean()
                    loss.backward()
                    if distributed:
                        for p in model.parameters():
                            dist.all_reduce(p.grad)
                    if args.step_s:
                        time.sleep(args.step_s)
                    if args.fault and restart == 0 and rank == args.fault_rank and step == args.fault_step:
                        note("fault", kind=args.fault)
                        if args.fault == "kill":
                            os.kill(os.getpid(), signal.SIGKILL)
                        raise RuntimeError(f"planted at step {step}")
                with s.optimizer():
                    opt.step()
                    opt.zero_grad()
                ended = time.monotonic()
            note("step_end", step=step, start=began, mono=ended)
            if (step + 1) % SAVE_EVERY == 0 or step == args.steps - 1:
                note("save_start", step=step)
                with slo.checkpoint(step):
                    dcp.save({"model": model.state_dict()}, checkpoint_id=str(ckpt / f"step-{step:06d}"))
                note("save_end", step=step)
    except Exception:
        note("failed")  # when this rank's loop saw its step fail (a killed peer's: its collective failing)
        raise
    slo.close()
    note("end")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
