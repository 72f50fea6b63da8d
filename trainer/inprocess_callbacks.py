"""Journaling callbacks for NVRx ``inprocess.Wrapper``, composed with the user's own.

``inprocess_wrapper_kwargs(hooks, **user_kwargs)`` returns the keyword arguments for ``Wrapper(...)``
with every callback (``abort``, ``finalize``, ``rank_assignment``, ``initialize``, ``completion``,
``terminate``) composed with the user's (or NVRx's default), so one restart leaves, in order:

========================== ================= ===============================================
event                      thread            meaning
========================== ================= ===============================================
``inprocess_abort``        monitor thread    fault detected (earliest instant; runs first)
``inprocess_finalize``     main thread       teardown done; ``cause`` = the fn's exception
``inprocess_rank_assignment`` main thread    survivors re-assigned (the rendezvous is done);
                                             ``cause`` = interruption records per rank
``inprocess_initialize``   main thread       ``iter`` > 0: restart complete, fn re-entered
``inprocess_completion``   main thread       the wrapped function finished everywhere
``inprocess_terminate``    main thread       the Wrapper gave up on this rank
========================== ================= ===============================================

Each callback journals and returns its input. None raises (a failure is counted by the
journal), none blocks, and the abort callback (monitor thread) touches nothing but the journal —
never ``torch.distributed``. Handed the hooks (not only their journal), the finalize callback
first journals the steps whose GPU work finished before the fault, with their own times
(``Hooks.interrupted``): a fault outside a step would otherwise leave them to be written after the
restart. ``inprocess_wrapper`` builds the Wrapper too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer import nvrx_compat
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.journal import Journal


def _cause(exc: BaseException | None) -> str | None:
    return None if exc is None else f"{type(exc).__name__}: {exc}"[:300]


def _fault(state: Any) -> str | None:
    return _cause(getattr(state, "fn_exception", None))


def _callbacks(ip: Any, journal: Journal, interrupted: Callable[[], None] | None) -> dict[str, Any]:
    """One journaling callback per Wrapper callback, each an instance of NVRx's base class for it."""

    def journaling(base: type, event: EventType, cause: Callable[[Any], str | None] | None = None,
                   first: Callable[[], None] | None = None) -> Any:
        class Journaling(base):  # NVRx's class, found at run time
            def __call__(self, state: Any) -> Any:
                if first is not None:
                    first()  # never raises
                journal.emit(event, **({} if cause is None else {"cause": cause(state)}))
                return state
        return Journaling()

    ra: Any = ip.rank_assignment

    class JournalRankAssignment(ra.RankAssignment):
        def __init__(self) -> None:
            self.calls = 0

        def __call__(self, ctx: Any) -> Any:
            self.calls += 1
            if self.calls > 1:  # the first call assigns the initial ranks: no restart yet
                try:
                    records = ctx.store.get_interruption_records()
                    cause = "; ".join(f"rank {r.rank}: {r.interruption.name}" for r in records) or None
                except Exception as exc:
                    cause = _cause(exc)
                journal.emit(EventType.INPROCESS_RANK_ASSIGNMENT, cause=cause)
            return ctx

    class JournalInitialize(ip.initialize.Initialize):
        def __call__(self, state: Any) -> Any:
            if state.rank is not None:
                journal.update(iter=state.iteration, rank=state.rank)
            else:
                journal.update(iter=state.iteration)
            journal.emit(EventType.INPROCESS_INITIALIZE)
            return state

    return {"abort": journaling(ip.abort.Abort, EventType.INPROCESS_ABORT),
            "finalize": journaling(ip.finalize.Finalize, EventType.INPROCESS_FINALIZE, _fault, interrupted),
            "rank_assignment": JournalRankAssignment(), "initialize": JournalInitialize(),
            "completion": journaling(ip.completion.Completion, EventType.INPROCESS_COMPLETION),
            "terminate": journaling(ip.terminate.Terminate, EventType.INPROCESS_TERMINATE, _fault)}


def inprocess_wrapper_kwargs(hooks: Hooks | Journal, **kwargs: Any) -> dict[str, Any]:
    """``inprocess.Wrapper`` keyword arguments: ``kwargs`` with journaling composed into each callback
    (``hooks``: the process's ``Hooks``, or only their journal).

    Callbacks the caller leaves out keep NVRx's defaults (``AbortTorchDistributed`` for abort,
    ``Compose(ActivateAllRanks(), ShiftRanks())`` for rank assignment, none for the rest).
    """
    ip: Any = nvrx_compat.inprocess()  # callback base classes come from the installed NVRx
    if ip is None:
        return kwargs
    journal = hooks.journal if isinstance(hooks, Hooks) else hooks
    ours = _callbacks(ip, journal, hooks.interrupted if isinstance(hooks, Hooks) else None)
    kwargs = dict(kwargs)
    ra: Any = ip.rank_assignment
    defaults = {"abort": ip.abort.AbortTorchDistributed(),
                "rank_assignment": ip.Compose(ra.ActivateAllRanks(), ra.ShiftRanks())}
    # Compose(a, b)(x) == a(b(x)): the journal runs first for abort (earliest "fault detected"),
    # last for the others ("... done").
    for name, callback in ours.items():
        user = kwargs.get(name, defaults.get(name))
        if user is None:
            kwargs[name] = callback
        elif name == "abort":
            kwargs[name] = ip.Compose(user, callback)
        else:
            kwargs[name] = ip.Compose(callback, user)
    return kwargs


def inprocess_wrapper(hooks: Hooks | Journal, **kwargs: Any) -> Any:
    """``inprocess.Wrapper(**inprocess_wrapper_kwargs(hooks, **kwargs))``, or None without ``inprocess``."""
    ip = nvrx_compat.inprocess()
    if ip is None:
        return None
    return ip.Wrapper(**inprocess_wrapper_kwargs(hooks, **kwargs))
