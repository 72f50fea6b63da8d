"""``nvrx-slo train``: the reference FSDP2 job — instrumented, checkpointed, restartable, breakable.

Run it under ft_launcher (in-job restarts) and/or with ``--inprocess`` (NVRx ``inprocess.Wrapper``,
in-process restarts)::

    NVRX_SLO_JOURNAL_DIR=runs/x/journal nvrx-slo ft-launcher --nproc-per-node 2 --max-restarts 3 \\
        -m nvrx_slo.trainer.reference.job --steps 60 --checkpoint-dir runs/x/ckpt --inprocess --crash-at 25

CPU + gloo by default, CUDA + NCCL when a GPU is visible. Every incarnation resumes from the newest
complete checkpoint. Faults (``--crash-at``, ``--raise-at``, ``--hang-at``, ``--slow-storage``)
fire once per checkpoint directory; ``--checkpoint-mode sync`` is the synchronous baseline.

The spawned NVRx checkpoint worker re-imports ``__main__``: keep the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

from nvrx_slo import Hooks, inprocess_wrapper
from nvrx_slo.trainer import nvrx_compat
from nvrx_slo.trainer.reference import cpu_shims
from nvrx_slo.trainer.reference.checkpoint import Checkpointer
from nvrx_slo.trainer.reference.faults import Fault, FaultInjector
from nvrx_slo.trainer.reference.model import ModelConfig, TinyLM, loss_fn, synthetic_batch
from nvrx_slo.trainer.reference.restore import restore

log = logging.getLogger("nvrx_slo.reference.job")


@dataclasses.dataclass(frozen=True)
class JobConfig:
    steps: int
    checkpoint_dir: Path
    checkpoint_every: int
    checkpoint_mode: str
    journal_dir: str | None
    inprocess: bool
    collective_timeout_s: float
    faults: tuple[Fault, ...]
    fault_rank: int
    slow_storage_s: float
    seed: int
    model: ModelConfig


def parse_args(argv: list[str]) -> JobConfig:
    p = argparse.ArgumentParser(prog="nvrx-slo train", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="train until this many steps are done")
    p.add_argument("--checkpoint-dir", type=Path, required=True, help="where step-NNNNNN/ checkpoints go")
    p.add_argument("--checkpoint-every", type=int, default=10, help="save after every N steps (0: never)")
    p.add_argument("--checkpoint-mode", choices=("async", "sync"), default="async",
                   help="NVRx async save, or the synchronous DCP baseline")
    p.add_argument("--journal-dir", default=None, help="journal directory (default: $NVRX_SLO_JOURNAL_DIR)")
    p.add_argument("--inprocess", action="store_true", help="run under NVRx inprocess.Wrapper")
    p.add_argument("--collective-timeout", type=float, default=None,
                   help="process-group timeout in seconds (default: 3 with --inprocess on CPU, else 600); "
                        "an in-process restart on gloo takes about this long")
    p.add_argument("--crash-at", type=int, action="append", default=[], help="SIGKILL the fault rank at this step")
    p.add_argument("--raise-at", type=int, action="append", default=[], help="raise an exception at this step")
    p.add_argument("--hang-at", type=int, action="append", default=[], help="hang forever at this step")
    p.add_argument("--fault-rank", type=int, default=1, help="the rank that injects faults (rank 0 hosts the store)")
    p.add_argument("--slow-storage", type=float, default=0.0, help="seconds added to every checkpoint write")
    p.add_argument("--seed", type=int, default=0)
    for field in dataclasses.fields(ModelConfig):
        p.add_argument(f"--{field.name.replace('_', '-')}", type=int, default=field.default, help="model size")
    a = p.parse_args(argv)
    for flag, value in (("--steps", a.steps), ("--checkpoint-every", a.checkpoint_every),
                        ("--slow-storage", a.slow_storage)):
        if value < 0:
            p.error(f"{flag} must be >= 0, got {value}")
    timeout = a.collective_timeout
    if timeout is None:
        timeout = 3.0 if a.inprocess and not torch.cuda.is_available() else 600.0
    faults = [Fault("crash", s) for s in a.crash_at] + [Fault("exception", s) for s in a.raise_at] \
        + [Fault("hang", s) for s in a.hang_at]
    return JobConfig(
        steps=a.steps, checkpoint_dir=a.checkpoint_dir, checkpoint_every=a.checkpoint_every,
        checkpoint_mode=a.checkpoint_mode, journal_dir=a.journal_dir, inprocess=a.inprocess,
        collective_timeout_s=timeout, faults=tuple(faults), fault_rank=a.fault_rank,
        slow_storage_s=a.slow_storage, seed=a.seed,
        model=ModelConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ModelConfig)}),
    )


def _init_process_group(cfg: JobConfig, iteration: int | None) -> torch.device:
    """env:// under ft_launcher/torchrun; under inprocess.Wrapper a fresh group per iteration."""
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.set_float32_matmul_precision("high")  # TF32 matmuls: a GPU's fp32 rate is a fraction of it
    timeout = datetime.timedelta(seconds=cfg.collective_timeout_s)
    if iteration is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                              is_master=rank == 0, multi_tenant=True, wait_for_workers=True, use_libuv=True)
        dist.init_process_group(backend, store=dist.PrefixStore(f"iter-{iteration}", store), rank=rank,
                                world_size=world, timeout=timeout)
    return device


def train(cfg: JobConfig, hooks: Hooks, ckpt: Checkpointer, iteration: int | None = None) -> None:
    """One incarnation: join the group, build, restore, train to ``cfg.steps``, finish the saves."""
    device = _init_process_group(cfg, iteration)
    try:
        ckpt.start()  # the writer starts while the model is built and restored
        torch.manual_seed(cfg.seed)
        model = TinyLM(cfg.model).to(device)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def state() -> dict[str, Any]:
            model_sd, optim_sd = get_state_dict(model, optim)
            return {"model": model_sd, "optim": optim_sd}

        def load(path: Path) -> None:
            sd = state()
            torch.distributed.checkpoint.load(sd, checkpoint_id=str(path))
            set_state_dict(model, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])

        restored = restore(hooks, cfg.checkpoint_dir, load)
        ckpt.ready(state)  # initialisation, not the first save, pays the writer's start and first plan
        first = 0 if restored is None else restored + 1
        faults = FaultInjector(list(cfg.faults), dist.get_rank(), cfg.fault_rank, cfg.checkpoint_dir / ".faults")
        for step in range(first, cfg.steps):
            faults.before_step(hooks, step)
            with hooks.step(step) as s:
                with s.data():
                    tokens = synthetic_batch(cfg.model, cfg.seed, step, dist.get_rank(), device)
                with s.compute():
                    loss = loss_fn(model, tokens)
                    loss.backward()
                with s.optimizer():
                    optim.step()
                    optim.zero_grad(set_to_none=True)
            ckpt.poll()
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                ckpt.save(state, step)  # gathered inside the save: its time is the save's
        ckpt.close()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run_inprocess(cfg: JobConfig, hooks: Hooks, ckpt: Checkpointer) -> None:
    ip = nvrx_compat.inprocess()
    if ip is None:
        train(cfg, hooks, ckpt)
        return
    port = int(os.environ["MASTER_PORT"]) + 1  # the Wrapper's own store; MASTER_PORT is the training group's
    timeout = datetime.timedelta(seconds=max(30.0, 10 * cfg.collective_timeout_s))
    finalize_base: Any = ip.finalize.Finalize  # NVRx is imported at run time, feature-detected

    class AbandonSaves(finalize_base):
        """Saves in flight cannot finish once the process group is gone: give them up before the
        restart, on every rank (the main thread, after NVRx stopped interrupting it)."""

        def __call__(self, state: Any) -> Any:
            cause = state.fn_exception
            ckpt.abandon(f"in-process restart after {type(cause).__name__}: {cause}"[:300] if cause
                         else "in-process restart after another rank's fault")
            return state

    wrapped = cpu_shims.without_gpu_health_checks(inprocess_wrapper(
        hooks,
        finalize=AbandonSaves(),
        store_kwargs={"port": port, "timeout": timeout},
        soft_timeout=datetime.timedelta(seconds=60), hard_timeout=datetime.timedelta(seconds=90),
        heartbeat_timeout=datetime.timedelta(seconds=30), barrier_timeout=datetime.timedelta(seconds=120),
    ))

    def incarnation(call_wrapper: Any = None) -> None:
        train(cfg, hooks, ckpt, iteration=call_wrapper.iteration)

    incarnation.__annotations__ = {"call_wrapper": ip.CallWrapper}  # NVRx injects by annotation
    wrapped(incarnation)()


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rank" + os.environ.get("RANK", "?")
                        + " %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    # on a GPU the first step finds CUDA in use and times steps by CUDA events
    hooks = Hooks.start(world_size=int(os.environ.get("WORLD_SIZE", 1)), journal_dir=cfg.journal_dir)
    ckpt = Checkpointer(hooks, cfg.checkpoint_dir, cfg.checkpoint_mode, slow_storage_s=cfg.slow_storage_s)
    try:
        if cfg.inprocess:
            _run_inprocess(cfg, hooks, ckpt)
        else:
            train(cfg, hooks, ckpt)
    except BaseException:
        ckpt.kill()
        raise
    hooks.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
