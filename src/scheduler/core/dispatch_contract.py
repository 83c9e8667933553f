"""What a host's dispatcher must be and return, checked where it is handed in and called.

A ``Dispatcher`` is called once per event per poll unless it declares itself safe to call
again for an event whose first call was rolled back (``safe_to_repeat = True``, as the
built-in platform does, whose every effect is a row in the transaction it is handed):
``repeatable`` says which (DEC-1.4).

A ``Dispatcher`` is called synchronously, in the loop's worker thread (or a request's), on a
sync ``Session``: an ``async def`` one would hand back a coroutine that nobody awaits, and
its work would never happen. So such a dispatcher is refused when the service or scheduler
is built (``refuse_async_dispatcher``), with a sentence that says why.

Whatever a dispatcher returns goes through ``checked_result`` before anything reads it:
a value that is not a ``DispatchResult`` (``None``, a coroutine) raises ``NotADispatchResult``
inside the per-event isolation, so that one event fails with the reason in ``last_error``
and the batch goes on (REQ-0067); on the live path it is a 500 whose log line says why.
"""

from __future__ import annotations

import inspect

from scheduler.types import DispatchResult


class NotADispatchResult(TypeError):
    """A dispatcher returned something other than a ``DispatchResult``."""


class AsyncDispatcherRefused(TypeError):
    """A dispatcher that is a coroutine function (``async def``) was handed to the service."""


def _describe(value: object) -> str:
    if value is None:
        return "None"
    if inspect.iscoroutine(value):
        return "a coroutine (is it an async def? dispatchers are called synchronously)"
    return f"a {type(value).__name__}"


def checked_result(value: object) -> DispatchResult:
    """``value`` if it is a ``DispatchResult``; else ``NotADispatchResult`` naming what it
    is. A coroutine is closed first, so no "never awaited" warning follows it."""
    if isinstance(value, DispatchResult):
        return value
    description = _describe(value)
    if inspect.iscoroutine(value):
        value.close()
    raise NotADispatchResult(f"dispatcher returned {description}; expected a DispatchResult")


def refuse_async_dispatcher(dispatcher: object) -> None:
    """Raise ``AsyncDispatcherRefused`` when calling ``dispatcher`` (or its ``decide_batch``)
    would return a coroutine: an ``async def`` function, or an object whose ``__call__`` is one."""
    # an object's own __call__, looked up on its type as the call itself does
    call = None if inspect.isroutine(dispatcher) else next(
        (vars(base)["__call__"] for base in type(dispatcher).__mro__ if "__call__" in vars(base)), None)
    decide = getattr(dispatcher, "decide_batch", None)
    if (inspect.iscoroutinefunction(dispatcher) or inspect.iscoroutinefunction(call)
            or inspect.iscoroutinefunction(decide)):
        raise AsyncDispatcherRefused(
            f"the dispatcher {dispatcher!r} is asynchronous (async def); a dispatcher is called "
            "synchronously, in the loop's worker thread on a sync Session, and must return a "
            "DispatchResult: make it a plain def (run async work after the commit, in a Publisher)")


def repeatable(dispatcher: object) -> bool:
    """Whether ``dispatcher`` declares that calling it again for an event whose first call was
    rolled back is safe (a ``safe_to_repeat`` attribute that is ``True``): only such a
    dispatcher runs a batch optimistically with a replay after a failure (DEC-1.4)."""
    return getattr(dispatcher, "safe_to_repeat", False) is True
