"""The inprocess.Wrapper callbacks compose with the user's, journal in the right order, never raise.

Real NVRx callback classes, State and Compose; the Wrapper's store is the seam (only
``get_interruption_records`` is called on it). Whole restarts run in test_reference_job.py.
"""

from __future__ import annotations

import dataclasses

import pytest
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.inprocess.attribution import Interruption, InterruptionRecord

from fake_gpu import FakeGpu
from nvrx_slo.contracts import schema
from nvrx_slo.trainer import inprocess_callbacks
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.inprocess_callbacks import inprocess_wrapper_kwargs
from nvrx_slo.trainer.journal import Journal, Writer
from nvrx_slo.trainer.reference import cpu_shims
from virtual_clock import CLOCK

pytestmark = [pytest.mark.torch, pytest.mark.nvrx]

CALLBACKS = ("abort", "finalize", "rank_assignment", "initialize", "completion", "terminate")


def _state(iteration: int = 0, exc: BaseException | None = None):
    state = inprocess.state.State(rank=1, world_size=2, initial_rank=1, initial_world_size=2)
    state.iteration, state.fn_exception = iteration, exc
    return state.freeze()


class Store:
    def __init__(self, records):
        self.records = records

    def get_interruption_records(self):
        if isinstance(self.records, Exception):
            raise self.records
        return self.records


def _user_callbacks(journal: Journal, seen: list):
    """One user callback per kind; each notes how many events the journal held when it ran."""
    bases = {"abort": inprocess.abort.Abort, "finalize": inprocess.finalize.Finalize,
             "initialize": inprocess.initialize.Initialize, "completion": inprocess.completion.Completion,
             "terminate": inprocess.terminate.Terminate, "rank_assignment": inprocess.rank_assignment.RankAssignment}

    def make(name):
        def call(self, arg):
            seen.append((name, journal.written))
            return arg
        return type(f"User{name.title()}", (bases[name],), {"__call__": call})()

    return {name: make(name) for name in CALLBACKS}


def _records(journal):
    return [schema.decode(line) for line in journal.path().read_bytes().splitlines()]


def test_journal_callbacks_wrap_the_users_own_in_the_order_that_timestamps_the_phases(tmp_path):
    journal = Journal(tmp_path, Writer.from_env({"RANK": "1"}))
    seen: list = []
    kwargs = inprocess_wrapper_kwargs(journal, **_user_callbacks(journal, seen), soft_timeout="passed through")
    assert kwargs["soft_timeout"] == "passed through"
    ctx = inprocess.rank_assignment.RankAssignmentCtx(_state(), Store([InterruptionRecord(1, Interruption.EXCEPTION)]),
                                                      set())

    assert kwargs["rank_assignment"](ctx) is ctx  # the initial assignment: no restart, no event
    assert kwargs["abort"](_state()).rank == 1
    kwargs["finalize"](_state(exc=RuntimeError("boom")))
    kwargs["rank_assignment"](ctx)
    kwargs["initialize"](_state(iteration=1))
    kwargs["completion"](_state(iteration=1))

    # abort: the journal first (earliest "fault detected"); the others: the user's first ("... done")
    assert seen == [("rank_assignment", 0), ("abort", 1), ("finalize", 1), ("rank_assignment", 2),
                    ("initialize", 3), ("completion", 4)]
    records = _records(journal)
    assert [r["type"] for r in records] == ["inprocess_abort", "inprocess_finalize", "inprocess_rank_assignment",
                                            "inprocess_initialize", "inprocess_completion"]
    assert records[1]["cause"] == "RuntimeError: boom" and records[2]["cause"] == "rank 1: EXCEPTION"
    assert [r["iter"] for r in records] == [0, 0, 0, 1, 1]


def test_without_user_callbacks_nvrx_defaults_stay_in_place(tmp_path):
    journal = Journal(tmp_path, Writer.from_env({"RANK": "0"}))
    kwargs = inprocess_wrapper_kwargs(journal)
    assert set(CALLBACKS) <= set(kwargs)
    assert any(isinstance(i, inprocess.abort.AbortTorchDistributed) for i in kwargs["abort"].instances)
    ctx = inprocess.rank_assignment.RankAssignmentCtx(_state(), Store([]), set())
    out = kwargs["rank_assignment"](ctx)  # NVRx's ActivateAllRanks + ShiftRanks, then ours
    assert out.state.active_rank == 1 and out.state.active_world_size == 2


@pytest.mark.usefixtures("virtual_time")
def test_handed_the_hooks_finalize_first_journals_the_steps_the_gpu_finished_with_their_own_times(tmp_path):
    """A fault outside a step (a collective between steps): the steps the GPU finished before it are
    journaled at finalize with their own times, before the restart's records (fake GPU on a virtual clock)."""
    gpu = FakeGpu()
    hooks = Hooks(Journal(tmp_path, Writer.from_env({"RANK": "1"})), gpu.event)
    ends = []
    for step in range(3):
        with hooks.step(step) as s:
            with s.compute():
                gpu.run(0.05)
        ends.append(gpu.tail)
    CLOCK.sleep(0.5)  # the collective waits for the dead peer; the GPU finishes meanwhile
    kwargs = inprocess_wrapper_kwargs(hooks)
    kwargs["abort"](_state())
    assert [r["type"] for r in _records(hooks.journal)] == ["inprocess_abort"]
    kwargs["finalize"](_state(exc=RuntimeError("peer gone")))
    records = _records(hooks.journal)
    assert [r["type"] for r in records] == ["inprocess_abort", "step", "step", "step", "inprocess_finalize"]
    assert [r["mono"] for r in records[1:4]] == pytest.approx(ends, abs=1e-4)


@pytest.mark.parametrize("name", CALLBACKS)
def test_a_callback_never_raises_even_when_the_journal_and_the_store_fail(tmp_path, name):
    blocker = tmp_path / "file"
    blocker.write_text("")
    journal = Journal(blocker / "journal", Writer.from_env({"RANK": "0"}))
    kwargs = inprocess_wrapper_kwargs(journal)
    if name == "rank_assignment":
        ctx = inprocess.rank_assignment.RankAssignmentCtx(_state(), Store(ConnectionError("store gone")), set())
        kwargs[name](ctx)
        assert dataclasses.is_dataclass(kwargs[name](ctx))
    else:  # (NVRx's default abort does nothing while torch.distributed is not initialized)
        assert kwargs[name](_state(exc=ValueError("x"))).rank == 1
    assert journal.errors >= 1 and journal.written == 0


class UserCheck(inprocess.health_check.HealthCheck):
    def __call__(self, state):
        return state


@pytest.mark.parametrize("user_check", [None, UserCheck()], ids=["no user check", "a user check"])
def test_a_wrapper_built_on_a_host_without_gpu_keeps_only_the_users_restart_health_check(tmp_path, monkeypatch,
                                                                                          user_check):
    """From NVRx 0.5 the Wrapper chains GPU/NVLink/NIC checks into ``restart_health_check`` when
    LOCAL_RANK is set; without a driver they fail and the rank would terminate instead of restarting
    (the reference job's CPU shim)."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    journal = Journal(tmp_path, Writer.from_env({"RANK": "0"}))
    wrapper = inprocess_callbacks.inprocess_wrapper(journal, health_check=user_check)
    built = cpu_shims.without_gpu_health_checks(wrapper)
    assert isinstance(built, inprocess.Wrapper)
    plain = inprocess.Wrapper(**inprocess_wrapper_kwargs(journal, health_check=user_check))
    if hasattr(plain, "restart_health_check"):  # the releases that build one (0.5+)
        assert plain.restart_health_check is not None, "NVRx chains its GPU checks: the case the fit is for"
        assert built.restart_health_check is user_check
