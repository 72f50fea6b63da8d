"""The GPU check: what the hooks cost and how right they are on a real GPU, in one command.

    python bench/gpu_check.py [--sections abcde] [--json results.json] [--keep DIR]

Five sections, each measured against ground truth taken outside the hooks (docs/gpu.md says what
to carry to an offline GPU machine and how to install it):

(a) hook overhead on a real bf16 step (4 × TransformerEncoderLayer, d 2048), in blocks interleaved
    with a bare loop (ratio of steps/s), and the hooks alone on an empty step, host clocks vs CUDA events;
(b) phase attribution against planted GPU work (12 ms compute, 4 ms optimizer as ``torch.cuda._sleep``,
    an 8 ms host wait), truth from CUDA events around the planted work, for ``Hooks.start``'s
    default timing and for host clocks, a loop synchronised in its data phase and a GPU-bound one,
    and the default timing with CUDA first used after the first step (in a fresh process on a GPU);
(c) blocking per save for ``dcp.save``, ``dcp.async_save``, NVRx async (the reference Checkpointer)
    and the README's NVRx pattern (polls wrapped, handed over, unwrapped) against the loop's own
    clock around its save and poll calls, 1 GiB of state on the GPU (``gpu_check_saves.py``);
(d) restart latency by phase on CUDA: the reference job under ft_launcher, a crash (in-job) and an
    exception (in-process), read back by the sidecar's engine;
(e) NVML busy time against the journal's step phases over the same planted loop.

Without CUDA every section but (e) runs its CPU fallback: (a) a small fp32 model, host clocks, the
CUDA path over the tests' simulated device with its methods near-free; (b) the simulated device
on the host's real clock (``tests/sim_cuda.py``), the planted work as truth; (c) 64 MiB of state
on gloo; (d) two CPU ranks. Those numbers say the check runs, not what a GPU does. Prints one
table; ``--json`` writes every number. ``tests/test_gpu_check.py`` runs it on CPU so it cannot
rot. Budget: 6 minutes on one H200.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from bench_hooks import empty_step_us  # bench/, this script's directory
from gpu_check_parts import CUDA, PLANT, ROWS, CudaStream, SimStream, new_stream, row, skip, steps_of
from gpu_check_saves import restarts, saves
from torch import nn

from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.journal import open_journal
from sim_cuda import FreeCuda, installed  # tests/, on the path gpu_check_parts made

# --- (a) hook overhead --------------------------------------------------------------------------------


def overhead(work: Path) -> None:
    if CUDA:
        layers = [nn.TransformerEncoderLayer(2048, 16, 8192, dropout=0.0, batch_first=True, norm_first=True)
                  for _ in range(4)]
        model = nn.Sequential(*layers).cuda().to(torch.bfloat16)
        x = torch.randn(8, 512, 2048, device="cuda", dtype=torch.bfloat16)
        blocks, per_block = 10, 20
    else:
        model = nn.Sequential(*[nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
                                for _ in range(2)])
        x = torch.randn(8, 64, 256)
        blocks, per_block = 6, 10
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    hooks = Hooks.start(world_size=1, journal_dir=str(work / "a"))  # timing="auto", as the README's snippet

    def bare(step: int) -> None:
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def instrumented(step: int) -> None:
        with hooks.step(step) as s:
            with s.data():
                pass
            with s.compute():
                model(x).float().pow(2).mean().backward()
            with s.optimizer():
                opt.step()
                opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if CUDA else (lambda: None)
    for step in range(5):
        bare(step)
        instrumented(step)
    spent = {"bare": 0.0, "instrumented": 0.0}
    for block in range(blocks):
        for name, fn in (("bare", bare), ("instrumented", instrumented))[:: 1 if block % 2 else -1]:
            sync()
            t0 = time.perf_counter()
            for step in range(per_block):
                fn(step)
            sync()
            spent[name] += time.perf_counter() - t0
    hooks.close()
    steps = blocks * per_block
    ratio = spent["bare"] / spent["instrumented"]
    kind = "bf16 4 x d2048 on the GPU" if CUDA else "fp32 2 x d256 on the CPU (fallback)"
    row("a", f"steps/s instrumented / bare, {steps} steps each, {kind}",
        f"{ratio:.4f} ({1e3 * spent['bare'] / steps:.1f} ms/step bare)", ">= 0.999 or within noise",
        "measured", ratio=ratio, step_ms=1e3 * spent["bare"] / steps)
    with contextlib.nullcontext() if CUDA else installed(FreeCuda()):
        timers = {"host clocks": Hooks(open_journal(str(work / "a-host"))),
                  "CUDA events": Hooks.start(world_size=1, journal_dir=str(work / "a-cuda"), timing="cuda")}
        for name, timed in timers.items():
            us = empty_step_us(timed, 5000)
            timed.close()
            what = name if CUDA or name == "host clocks" else "CUDA path on the simulated device (Python cost only)"
            row("a", f"hooks alone, empty step, {what}", f"{us:.1f} us per step", "<= 15 us (CUDA path)",
                "measured", us=us, timer=name)


# --- (b) phases against planted work ------------------------------------------------------------------


def _planted_loop(hooks: Hooks, stream: Any, steps: range, sync_in_data: bool) -> list[dict[str, float]]:
    """Steps of planted work; returns, per step, the truth the stream's own events give."""
    truth = []
    prev_end = None
    for step in steps:
        marks = {}
        with hooks.step(step) as s:
            with s.data():
                if sync_in_data:
                    stream.synchronize()  # what an .item() or .to(device) of the last batch's result does
                time.sleep(PLANT["data"] if sync_in_data else PLANT["data"] / 4)  # the loader
            for phase in ("compute", "optimizer"):
                with getattr(s, phase)():
                    begin, end = stream.event(), stream.event()
                    begin.record()
                    stream.run(PLANT[phase])
                    end.record()
                    marks[phase] = (begin, end)
        truth.append({"marks": marks, "prev": prev_end})
        prev_end = marks["optimizer"][1]
    stream.synchronize()
    out = []
    for t in truth:
        (cb, ce), (ob, oe) = t["marks"]["compute"], t["marks"]["optimizer"]
        out.append({"compute": cb.elapsed_time(ce) / 1000, "optimizer": ob.elapsed_time(oe) / 1000,
                    "data": None if t["prev"] is None else t["prev"].elapsed_time(cb) / 1000})
    return out


def _errors_ms(directory: Path, truth: list[dict[str, float]]) -> dict[str, float]:
    """Journal minus truth per steady step (the first and last wait on nothing or on close), by phase."""
    journal, truth = steps_of(directory)[-len(truth):][5:-5], truth[5:-5]
    errors = {}
    for phase in ("data", "compute", "optimizer"):
        measured = statistics.fmean(r[f"{phase}_s"] for r in journal)
        true = statistics.fmean(t[phase] for t in truth if t[phase] is not None)
        errors[phase] = 1e3 * (measured - true)
    return errors


def _phase_row(what: str, errors: dict[str, float], timing: str, **numbers: Any) -> None:
    ok = all(abs(e) <= 0.5 for e in errors.values())
    verdict = ("ok" if ok else "OFF") if timing == "auto" else "the misbooking CUDA timing avoids"
    row("b", f"{what}: journal - truth per step (data / compute / optimizer)",
        " / ".join(f"{e:+.2f}" for e in errors.values()) + " ms", "each within 0.5 ms (default timing)",
        verdict, timing=timing, errors_ms=errors, **numbers)


def late_cuda(directory: Path) -> dict[str, float]:
    """The default timing where CUDA is first used after the first step (a warm-up on the CPU), in a
    process that has not used CUDA yet: host clocks, then CUDA events from the step after."""
    stream = SimStream() if not CUDA else None
    with contextlib.nullcontext() if stream is None else stream.device():
        hooks = Hooks.start(world_size=1, journal_dir=str(directory))
        with hooks.step(0) as s:
            with s.compute():
                time.sleep(0.01)  # CPU work: CUDA not used yet
        planted = stream or CudaStream()  # the model moves to the GPU
        truth = _planted_loop(hooks, planted, range(1, 41), sync_in_data=True)
        hooks.close()
    return _errors_ms(directory, truth)


def phases(work: Path, stream: Any) -> None:
    for loop, sync_in_data in (("sync in data phase", True), ("GPU-bound", False)):
        for timing in ("host", "auto"):
            directory = work / f"b-{loop.split()[0]}-{timing}"
            with stream.device():
                hooks = Hooks.start(world_size=1, journal_dir=str(directory), timing=timing)
                truth = _planted_loop(hooks, stream, range(40), sync_in_data)
                hooks.close()
            _phase_row(f"{loop}, timing={timing!r}", _errors_ms(directory, truth), timing, loop=loop)
    directory = work / "b-late"
    if CUDA:  # a process that has not used CUDA yet
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            errors = pool.apply(late_cuda, (directory,))
    else:
        errors = late_cuda(directory)
    _phase_row("sync in data phase, timing='auto', CUDA first used after step 0", errors, "auto",
               loop="late CUDA")


# --- (e) NVML against the journal ---------------------------------------------------------------------


@contextlib.contextmanager
def _nvml_busy() -> Iterator[list[float]]:
    """Samples NVML's utilisation of GPU 0 four times a second; yields [busy seconds, seconds]."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    totals = [0.0, 0.0]
    done = threading.Event()

    def sample() -> None:
        last = time.monotonic()
        while not done.wait(0.25):
            now = time.monotonic()
            totals[0] += (now - last) * pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
            totals[1] += now - last
            last = now

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield totals
    finally:
        done.set()
        sampler.join()
        pynvml.nvmlShutdown()


def nvml(work: Path, stream: Any) -> None:
    if not CUDA:
        skip("e", "no CUDA device: NVML has nothing to sample (the sidecar's NVML path is tested on a fake library)")
        return
    try:
        import pynvml  # noqa: F401  (nvidia-ml-py)
    except ImportError:
        skip("e", "nvidia-ml-py is not installed (docs/gpu.md lists it)")
        return
    hooks = Hooks.start(world_size=1, journal_dir=str(work / "e"))
    with _nvml_busy() as totals:
        _planted_loop(hooks, stream, range(400), sync_in_data=True)  # ~10 s
    hooks.close()
    journal = steps_of(work / "e")
    span = journal[-1]["mono"] - journal[0]["start"]
    busy_journal = sum(r["compute_s"] + r["optimizer_s"] for r in journal) / span
    busy_nvml = totals[0] / totals[1]
    row("e", "GPU busy share: NVML vs the journal's compute + optimizer (CUDA timing)",
        f"{100 * busy_nvml:.1f}% vs {100 * busy_journal:.1f}%", "within 2 pp",
        "ok" if abs(busy_nvml - busy_journal) <= 0.02 else "OFF", nvml=busy_nvml, journal=busy_journal)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="abcde", help="which sections to run (default: abcde)")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--keep", type=Path, help="keep journals and checkpoints here (default: a temporary directory)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    device = torch.cuda.get_device_name(0) if CUDA else "no CUDA device: CPU fallbacks"
    print(f"nvrx-slo GPU check on {device} (torch {torch.__version__})", flush=True)
    with contextlib.ExitStack() as stack:
        work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-check-")))
        work.mkdir(parents=True, exist_ok=True)
        stream = new_stream()
        sections: dict[str, Callable[[], None]] = {
            "a": lambda: overhead(work), "b": lambda: phases(work, stream),
            "c": lambda: saves(work, stream, 1024 if CUDA else 64), "d": lambda: restarts(work),
            "e": lambda: nvml(work, stream)}
        for name in args.sections:
            print(f"({name}) ...", flush=True)
            sections[name]()
    print("\nsection | verdict | what | measured | target")
    for r in ROWS:
        print(f"({r['section']}) | {r['verdict']} | {r['what']} | {r['measured']} | {r['target'] or '-'}")
    print(f"\n{time.monotonic() - started:.0f} s on {device}")
    if args.json:
        args.json.write_text(json.dumps({"cuda": CUDA, "device": device, "rows": ROWS}, indent=1))
    return 1 if any(r["verdict"] == "OFF" for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
