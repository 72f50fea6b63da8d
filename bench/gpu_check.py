"""The GPU check: what the hooks cost and how right they are on a real GPU, in one command.

    python bench/gpu_check.py [--sections abcde] [--json results.json] [--keep DIR]

Five sections, each measured against ground truth taken outside the hooks (docs/gpu.md says what
to carry to an offline GPU machine and how to install it):

(a) hook overhead on a real bf16 step (4 × TransformerEncoderLayer, d 2048), in blocks interleaved
    with a bare loop (ratio of steps/s), and the hooks alone on an empty step, host clocks vs CUDA events;
(b) phase attribution against planted GPU work (12 ms compute, 4 ms optimizer as ``torch.cuda._sleep``,
    an 8 ms host wait), truth from CUDA events around the planted work, host vs CUDA timing, for a
    loop synchronised in its data phase and a GPU-bound one;
(c) blocking per save for ``dcp.save``, ``dcp.async_save`` and NVRx async (the reference
    Checkpointer) against the loop's own clock around its save and poll calls, 1 GiB of state on the GPU;
(d) restart latency by phase on CUDA: the reference job under ft_launcher, a crash (in-job) and an
    exception (in-process), read back by the sidecar's engine;
(e) NVML busy time against the journal's step phases over the same planted loop.

Without CUDA every section but (e) runs its CPU fallback: (a) a small fp32 model, host clocks, the
CUDA timer over a fake stream; (b) a fake stream on the host's real clock (the seam
``cuda_timing.DeviceEvent``), the planted work as truth; (c) 64 MiB of state on gloo; (d) two CPU
ranks. Those numbers say the check runs, not what a GPU does. Prints one table; ``--json`` writes
every number. ``tests/test_gpu_check.py`` runs it on CPU so it cannot rot. Budget: 6 minutes on one H200.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from bench_hooks import empty_step_us  # bench/, this script's directory
from torch import nn

from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.trainer.cuda_timing import cuda_events
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.journal import open_journal
from nvrx_slo.trainer.reference import demo
from nvrx_slo.trainer.reference.checkpoint import Checkpointer

CUDA = torch.cuda.is_available()
PLANT = {"data": 0.008, "compute": 0.012, "optimizer": 0.004}  # (b), (e): seconds per step


class Row(dict[str, Any]):
    """One line of the table: section, what, measured, target, verdict."""


ROWS: list[Row] = []


def row(section: str, what: str, measured: str, target: str = "", verdict: str = "measured", **numbers: Any) -> None:
    ROWS.append(Row(section=section, what=what, measured=measured, target=target, verdict=verdict, **numbers))
    print(f"  ({section}) {what}: {measured} {verdict}", flush=True)


def skip(section: str, why: str) -> None:
    row(section, "skipped", why, verdict="skipped")


# --- a stream the loops launch work on: CUDA's, or a fake one on the host's real clock ------------------


class FakeStream:
    """One GPU stream on the host's monotonic clock (the CPU fallback): work queues behind work, an
    event completes when the stream reaches it, ``elapsed_time`` is the stream's time between two."""

    def __init__(self) -> None:
        self.tail = 0.0

    def run(self, seconds: float) -> None:
        self.tail = max(self.tail, time.monotonic()) + seconds

    def synchronize(self) -> None:
        time.sleep(max(0.0, self.tail - time.monotonic()))

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream
        self.at = 0.0

    def record(self) -> None:
        self.at = max(self.stream.tail, time.monotonic())

    def query(self) -> bool:
        return time.monotonic() >= self.at

    def synchronize(self) -> None:
        time.sleep(max(0.0, self.at - time.monotonic()))

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1000.0


class CudaStream:
    """The current CUDA stream, with ``torch.cuda._sleep`` (a spinning kernel) as planted work."""

    def __init__(self) -> None:
        begin, end = self.event(), self.event()
        begin.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        self.cycles_per_s = 10_000_000 / (begin.elapsed_time(end) / 1000.0)

    def run(self, seconds: float) -> None:
        torch.cuda._sleep(int(seconds * self.cycles_per_s))

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True)


def _hooks(directory: Path, timing: str, stream: Any) -> Hooks:
    """Hooks timing steps by CUDA events (the fake stream's on CPU) or by host clocks."""
    if CUDA:
        return Hooks.start(world_size=1, journal_dir=str(directory), timing=timing)
    return Hooks(open_journal(str(directory)), stream.event if timing == "cuda" else None)


def _steps(directory: Path) -> list[dict[str, Any]]:
    return [r for r in demo.read_journal(directory) if r["type"] == "step"]


def _engine(*journals: Path) -> Engine:
    """The sidecar's engine over finished journals, everything settled (one derivation of each number)."""
    engine = Engine(reorder_window_s=0.0, keep_history=True)
    for journal in journals:
        tail = JournalTail(journal)
        try:
            tail.poll(lambda events: [engine.ingest(e) for e in events])
        finally:
            tail.close()
    return engine


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
    stream = None if CUDA else FakeStream()
    timers = {"host clocks": Hooks(open_journal(str(work / "a-host"))),
              "CUDA events": Hooks(open_journal(str(work / "a-cuda")), cuda_events() if CUDA else stream.event)}
    for name, timed in timers.items():
        us = empty_step_us(timed, 5000)
        timed.close()
        what = name if CUDA or name == "host clocks" else "CUDA timer over a fake stream (Python cost only)"
        row("a", f"hooks alone, empty step, {what}", f"{us:.1f} us per step", "", "measured", us=us, timer=name)


# --- (b) phases against planted work ------------------------------------------------------------------


def _planted_loop(hooks: Hooks, stream: Any, steps: int, sync_in_data: bool) -> list[dict[str, float]]:
    """Steps of planted work; returns, per step, the truth the stream's own events give."""
    truth = []
    prev_end = None
    for step in range(steps):
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


def phases(work: Path, stream: Any) -> None:
    for loop, sync_in_data in (("sync in data phase", True), ("GPU-bound", False)):
        for timing in ("host", "cuda"):
            directory = work / f"b-{loop.split()[0]}-{timing}"
            hooks = _hooks(directory, timing, stream)
            truth = _planted_loop(hooks, stream, 40, sync_in_data)
            hooks.close()
            journal = _steps(directory)[5:-5]  # steady steps: the first and last wait on nothing or on close
            truth = truth[5:-5]
            errors = {}
            for phase in ("data", "compute", "optimizer"):
                measured = statistics.fmean(r[f"{phase}_s"] for r in journal)
                true = statistics.fmean(t[phase] for t in truth if t[phase] is not None)
                errors[phase] = 1e3 * (measured - true)
            ok = all(abs(e) <= 0.5 for e in errors.values())
            verdict = ("ok" if ok else "OFF") if timing == "cuda" else "the misbooking CUDA timing avoids"
            row("b", f"{loop}, {timing} timing: journal - truth per step (data / compute / optimizer)",
                " / ".join(f"{e:+.2f}" for e in errors.values()) + " ms", "each within 0.5 ms (CUDA timing)",
                verdict, loop=loop, timing=timing, errors_ms=errors)


# --- (c) blocking per save ----------------------------------------------------------------------------


def saves(work: Path, stream: Any, state_mib: int) -> None:
    device = "cuda" if CUDA else "cpu"
    dist.init_process_group("nccl" if CUDA else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        state = {f"t{i}": torch.randn(4 * 1024 * 1024, device=device) for i in range(state_mib // 16)}  # 16 MiB each
        for path in ("dcp.save", "dcp.async_save", "NVRx async"):
            _save_path(work / f"c-{path}", path, state, stream)
    finally:
        dist.destroy_process_group()


def _save_path(directory: Path, path: str, state: dict[str, torch.Tensor], stream: Any) -> None:
    """Three saves along ``path``, each after 10 steps, a poll (or a wait on the previous upload) after
    every step. The truth charges every wait to the oldest save in flight, as the hooks do."""
    hooks = Hooks.start(world_size=1, journal_dir=str(directory / "journal"))
    ckpt = Checkpointer(hooks, directory / "ckpt", "async") if path == "NVRx async" else None
    group = dist.new_group(backend="gloo") if path == "dcp.async_save" else None
    uploads: list[Any] = []  # dcp.async_save's responses not waited for yet
    in_flight: list[str] = []
    truth: dict[str, float] = {}
    if ckpt is not None:
        ckpt.start()
        ckpt.ready(state)

    def timed(fn: Callable[[], Any], charge: str | None) -> None:
        if CUDA:
            torch.cuda.synchronize()  # the steps' queued work is theirs (the hooks fence there too)
        t0 = time.monotonic()
        fn()
        if charge is not None:
            truth[charge] += time.monotonic() - t0

    def wait_upload() -> None:
        with hooks.checkpoint_wait():
            getattr(uploads[0], "upload_completion", uploads[0]).result()
        uploads.pop(0)

    def save(step: int, ckpt_id: str) -> None:
        if ckpt is not None:
            ckpt.save(state, step)
        elif group is None:
            with hooks.checkpoint(step, ckpt_id):
                dcp.save(state, checkpoint_id=str(directory / "ckpt" / ckpt_id))
        else:
            with hooks.checkpoint(step, ckpt_id, mode="async") as s:
                uploads.append(s.track(dcp.async_save(state, checkpoint_id=str(directory / "ckpt" / ckpt_id),
                                                      process_group=group)))

    def finish_waits(blocking: bool) -> None:
        """The loop's waits after a step: charged to the oldest save in flight, which they may end."""
        if ckpt is not None:
            timed(lambda: ckpt.poll(blocking=blocking), in_flight[0] if in_flight else None)
            del in_flight[:max(0, len(in_flight) - ckpt.in_flight)]
        elif uploads and (blocking or len(uploads) > 1):  # wait before a second one is made
            timed(wait_upload, in_flight.pop(0))

    for step in range(30):
        with hooks.step(step) as s:
            with s.compute():
                stream.run(0.01)
                if not CUDA:
                    stream.synchronize()  # the fake's steps take the host's time too
        finish_waits(blocking=False)
        if (step + 1) % 10 == 0:
            ckpt_id = f"step-{step:06d}"
            truth[ckpt_id] = 0.0
            timed(lambda: save(step, ckpt_id), ckpt_id)  # noqa: B023 (called at once)
            if group is not None or ckpt is not None:
                in_flight.append(ckpt_id)
    while in_flight:
        finish_waits(blocking=True)
    if ckpt is not None:
        ckpt.close()
    with hooks.step(30):  # carries the last wait
        pass
    hooks.close()
    journaled = {c.ckpt: c.blocking_s for c in _engine(directory / "journal").history().checkpoints}
    errors = [1e3 * (journaled[c] - t) for c, t in truth.items()]
    # the median save: what a definition gets wrong (polls left out) moves every save, while the
    # scheduler preempting the loop between its clock and the hooks' moves one (-5.4 ms once, CPU, load 3)
    typical = statistics.median(errors)
    row("c", f"{path}: blocking per save, journal vs the loop's clock ({len(errors)} saves)",
        f"{1e3 * statistics.fmean(truth.values()):.1f} ms per save; journal - loop: "
        + ", ".join(f"{e:+.2f}" for e in errors) + " ms", "median save within 5 ms",
        "ok" if abs(typical) <= 5 else "OFF",
        path=path, errors_ms=errors, blocking_ms=[1e3 * t for t in truth.values()])


# --- (d) restart latency by phase ---------------------------------------------------------------------


def restarts(work: Path) -> None:
    device = demo.CPU
    if CUDA:
        device = demo.DemoDevice("cuda", torch.cuda.device_count(), 50, 10, demo.DEFAULT_FAULTS, timeout_s=300)
    result = demo.run_demo(work / "d", device=device, steps=device.steps, checkpoint_every=device.checkpoint_every,
                           faults=device.faults, timeout_s=device.timeout_s)
    if result.returncode != 0:
        row("d", "the reference job", f"exit {result.returncode}; see {result.log_path}", "exit 0", "OFF")
        return
    for record in _engine(result.journal_dir).history().restarts:
        parts = ", ".join(f"{phase.value} {seconds:.2f}" for phase, seconds in record.phases.items())
        row("d", f"{record.level.value} restart on {device.ranks} {device.kind} rank(s)",
            f"{record.duration_s:.2f} s ({parts})", "recovery SLO: < 10 s", "measured",
            level=record.level.value, seconds=record.duration_s,
            phases={phase.value: seconds for phase, seconds in record.phases.items()})


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
    hooks = _hooks(work / "e", "cuda", stream)
    with _nvml_busy() as totals:
        _planted_loop(hooks, stream, 400, sync_in_data=True)  # ~10 s
    hooks.close()
    journal = _steps(work / "e")
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
        stream: Any = CudaStream() if CUDA else FakeStream()
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
