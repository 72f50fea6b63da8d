"""What the hooks cost: per journal event, and per training step of the reference model.

    .venv/bin/python bench/bench_hooks.py [--events 50000] [--steps 300]

1. Journal event cost: the median wall time of one call, for the per-step ``step`` record and for a
   five-field checkpoint record, appending to a file in the working directory's file system
   (the sidecar's ``emptyDir`` is node disk too). Target: median <= 5 us.
2. What a CPU job's steps cost with the default timing (``Hooks.start``: host clocks, chosen at the
   first step) against the host-clock timer itself, alternating in one process: the ratio.
3. The CUDA timer's own host cost per step, ``Hooks.start`` over the simulated device of the tests
   (``tests/sim_cuda.py``: ``FreeCuda``, whose methods return at once, so the figure is the hooks'
   own Python: one stream lookup, four events, a query and four ``elapsed_time`` calls a step),
   beside the host-clock timer, alternating in one process. Target: <= 15 us a step. What the CUDA
   calls themselves cost on a GPU is ``bench/gpu_check.py``'s.
4. Per-step overhead on the reference model (TinyLM, FSDP2 ``fully_shard`` on one gloo rank):
   steps alternate instrumented (``hooks.step`` with its three phases, journal enabled) and bare,
   so both see the same machine; the ratio of steps/s is instrumented / bare. A 2-core machine
   shared with other work makes a single step's time noisy, so the hook cost measured alone (the
   same calls around an empty step) is reported beside it, with the ratio it implies. Target >= 0.999.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.journal import Journal, Writer, open_journal
from nvrx_slo.trainer.reference.model import ModelConfig, TinyLM, loss_fn, synthetic_batch


def _median_us(fn, n: int) -> float:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples) / 1000


def empty_step_us(hooks: Hooks, n: int) -> float:
    """The median cost of the hooks alone: a step with its three phases, empty, and its record."""

    def empty_step() -> None:
        with hooks.step(0) as s:
            with s.data():
                pass
            with s.compute():
                pass
            with s.optimizer():
                pass

    return _median_us(empty_step, n)


def default_timing(directory: str, rounds: int = 6, n: int = 20000) -> None:
    """What a CPU job gets from ``Hooks.start`` (``timing="auto"``: host clocks, decided at its first
    step) against the host-clock timer built directly, in alternating rounds of one process."""
    hooks = {"auto": Hooks.start(world_size=1, journal_dir=os.path.join(directory, "auto")),
             "host": Hooks(open_journal(os.path.join(directory, "host")))}
    samples: dict[str, list[float]] = {name: [] for name in hooks}
    for round_ in range(rounds):
        for name in sorted(hooks, reverse=bool(round_ % 2)):
            samples[name].append(empty_step_us(hooks[name], n))
    auto, host = statistics.median(samples["auto"]), statistics.median(samples["host"])
    print(f"hooks alone on the CPU, {rounds} alternating rounds of {n}: Hooks.start (timing='auto') {auto:.2f} us, "
          f"host-clock timer {host:.2f} us per step, ratio {auto / host:.3f}")
    for h in hooks.values():
        h.close()


def cuda_path(directory: str, rounds: int = 6, n: int = 20000) -> None:
    """The CUDA timer's host cost on the simulated device, its methods near-free, beside host clocks."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from sim_cuda import FreeCuda, installed

    with installed(FreeCuda()):
        hooks = {"cuda": Hooks.start(world_size=1, journal_dir=os.path.join(directory, "cuda")),
                 "host": Hooks(open_journal(os.path.join(directory, "host")))}
        empty_step_us(hooks["cuda"], 1)  # the first step chooses the timer
        timer = type(hooks["cuda"]._step).__name__
        samples: dict[str, list[float]] = {name: [] for name in hooks}
        for round_ in range(rounds):
            for name in sorted(hooks, reverse=bool(round_ % 2)):
                samples[name].append(empty_step_us(hooks[name], n))
        for h in hooks.values():
            h.close()
    cuda, host = statistics.median(samples["cuda"]), statistics.median(samples["host"])
    print(f"hooks alone, {rounds} alternating rounds of {n}: CUDA path ({timer} on the simulated device, its "
          f"methods near-free) {cuda:.2f} us, host clocks {host:.2f} us per step (target <= 15 us)")


def journal_events(n: int, directory: str) -> None:
    journal = Journal(directory, Writer.from_env())
    step = _median_us(lambda: journal.step(41, 1234.5, 0.001, 0.08, 0.01), n)
    end = _median_us(lambda: journal.emit(EventType.CHECKPOINT_END, ckpt="step-000040", step=40, ok=True,
                                          written=1234.5, error=None), n)
    journal.close()
    print(f"journal event, median of {n}: step {step:.2f} us, checkpoint_end {end:.2f} us (target <= 5 us)")


def step_overhead(steps: int, directory: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    cfg = ModelConfig()
    model = TinyLM(cfg)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    hooks = Hooks.start(world_size=1, journal_dir=directory)

    def bare(step: int) -> None:
        tokens = synthetic_batch(cfg, 0, step, 0, torch.device("cpu"))
        loss_fn(model, tokens).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    def instrumented(step: int) -> None:
        with hooks.step(step) as s:
            with s.data():
                tokens = synthetic_batch(cfg, 0, step, 0, torch.device("cpu"))
            with s.compute():
                loss_fn(model, tokens).backward()
            with s.optimizer():
                optim.step()
                optim.zero_grad(set_to_none=True)

    for step in range(10):  # warm-up
        bare(step)
    times: dict[str, list[float]] = {"bare": [], "instrumented": []}
    for step in range(steps):
        for name, fn in (("bare", bare), ("instrumented", instrumented))[:: 1 if step % 2 else -1]:
            t0 = time.perf_counter()
            fn(step)
            times[name].append(time.perf_counter() - t0)

    hook_us = empty_step_us(hooks, 20000)
    bare_s, inst_s = sum(times["bare"]), sum(times["instrumented"])
    median_bare = statistics.median(times["bare"])
    print(f"reference model, {steps} interleaved pairs: bare {steps / bare_s:.2f} steps/s, instrumented "
          f"{steps / inst_s:.2f} steps/s, ratio {bare_s / inst_s:.4f} (median step {median_bare * 1e3:.1f} ms)")
    print(f"hook cost alone (step + 3 phases + journal record), median: {hook_us:.2f} us per step; "
          f"implied ratio {median_bare / (median_bare + hook_us / 1e6):.5f} (target >= 0.999)")
    hooks.close()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50000)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        journal_events(args.events, tmp)
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        default_timing(tmp)
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        cuda_path(tmp)
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        step_overhead(args.steps, tmp)


if __name__ == "__main__":
    main()
