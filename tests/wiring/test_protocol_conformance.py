"""ARCH-7: every implementation of a ``scheduler.types`` protocol conforms to it, and what it may
do beyond the protocol is declared, never probed.

The implementations are those of the package, the harness (its fakes and wrappers), the
benchmarks and the examples a host copies. Each table below is typed with its protocol
(``type[Clock]``, ``type[Dispatcher]``, ...), so ``mypy --strict tests`` checks every class it
lists against that protocol; at run time each listed class is the protocol's (``issubclass``:
the protocols are runtime-checkable) and each member it implements accepts the protocol's call.
A walk over the source (``ast``: nothing imported, the examples' apps included) finds every
class that implements a protocol's member or subclasses one of the declaring bases, and fails
on one the tables miss, so a new implementation is checked as soon as it is written. Then what
each dispatcher declares, read the one way the scheduler reads it (``capabilities_of``): a
plain callable, and any dispatcher that does not subclass a declaring base, declares nothing.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from bench.delivery import BlockingWebhookPublisher
from bench.drain import CountingPublisher
from sqlalchemy.orm import Session

from harness.faults import FaultyDispatcher
from harness.local_run import LocalTimeSimulation
from harness.provider import ProviderModel
from harness.simulation import Simulation
from scheduler.core.clock import DatabaseClock, ManualClock, OffsetClock, SystemClock
from scheduler.core.poll import publish_committed
from scheduler.delivery.webhook import WebhookSender
from scheduler.delivery.webpush import WebPushSender
from scheduler.nudging import decision
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.orchestrator import LoggingPublisher, RecordingPublisher
from scheduler.operations.host_outbox import _BatchOutbox, _Outbox, _RepeatableOutbox
from scheduler.types import (
    UNDECLARED,
    BatchDecisions,
    BatchDispatcher,
    BulkPublisher,
    Capabilities,
    Clock,
    DeclaredDispatcher,
    DigitalTwinEvent,
    Dispatcher,
    DispatchOutcome,
    DispatchResult,
    OutboundMessage,
    Publisher,
    Sender,
    capabilities_of,
)
from scheduler.web.inbox.hub import StreamPublisher

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = (ROOT / "examples" / "host_ci", ROOT / "examples" / "fastapi_host")
for _example in EXAMPLES:  # the examples' packages, importable as their own CI imports them
    sys.path.insert(0, str(_example))
try:
    from host_app.broken import OutsideTransactionDispatcher
    from host_app.dispatcher import DeliveryDispatcher, RefusingDispatcher
    from host_service.broken import OwnConnectionDispatcher
    from host_service.dispatcher import HostDispatcher
finally:
    for _example in EXAMPLES:
        sys.path.remove(str(_example))

# Every implementation, by protocol. The annotations are the static check: mypy --strict
# verifies each class against its protocol's members and their types.
CLOCKS: list[type[Clock]] = [SystemClock, ManualClock, OffsetClock, DatabaseClock,
                             Simulation, LocalTimeSimulation]  # a run tells its time to its actors
PUBLISHERS: list[type[Publisher]] = [LoggingPublisher, RecordingPublisher, StreamPublisher, CountingPublisher,
                                     BlockingWebhookPublisher]
BULK_PUBLISHERS: list[type[BulkPublisher]] = [StreamPublisher]
DISPATCHERS: list[type[Dispatcher]] = [NudgingPlatform, FaultyDispatcher, HostDispatcher, DeliveryDispatcher,
                                       RefusingDispatcher, OutsideTransactionDispatcher, OwnConnectionDispatcher,
                                       _Outbox, _RepeatableOutbox, _BatchOutbox]
BATCH_DISPATCHERS: list[type[BatchDispatcher]] = [NudgingPlatform, FaultyDispatcher, _BatchOutbox]
BATCH_DECISIONS: list[type[BatchDecisions]] = [decision.BatchDecisions]
SENDERS: list[type[Sender]] = [WebhookSender, WebPushSender, ProviderModel]

TABLES: dict[type, list[Any]] = {
    Clock: CLOCKS, Publisher: PUBLISHERS, BulkPublisher: BULK_PUBLISHERS, Dispatcher: DISPATCHERS,
    BatchDispatcher: BATCH_DISPATCHERS, BatchDecisions: BATCH_DECISIONS, Sender: SENDERS,
}
# Which members make a class an implementation of a protocol, as the walk reads the source
# (a dispatcher's __call__ is known by its parameters: other classes are callable too).
MEMBERS = {"now": Clock, "publish": Publisher, "publish_many": BulkPublisher, "decide_batch": BatchDispatcher,
           "write_statement": BatchDecisions, "send": Sender}
DISPATCH_PARAMETERS = ["self", "session", "event", "now"]
# The declaring bases: a class that subclasses one implements what it declares.
BASES = {"BulkPublisher": BulkPublisher, "DeclaredDispatcher": Dispatcher, "BatchDispatcher": BatchDispatcher}
SOURCES = [ROOT / "src" / "scheduler", ROOT / "src" / "harness", ROOT / "bench", *EXAMPLES]


def _module_of(path: Path) -> str:
    for base in (ROOT / "src", ROOT, *EXAMPLES):
        if path.is_relative_to(base) and (base != ROOT or path.is_relative_to(ROOT / "bench")):
            return ".".join(path.relative_to(base).with_suffix("").parts)
    raise AssertionError(path)


def found_in_source() -> Iterator[tuple[type, str]]:
    """(protocol, ``module.Class``) for every class of the sources that implements a protocol's
    member or subclasses a declaring base; protocols themselves (``Protocol`` among their
    bases) and the declaring bases (``scheduler.types``) are not implementations."""
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            module = _module_of(path)
            if "migrations" in path.parts or module == "scheduler.types":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases}
                if "Protocol" in bases:
                    continue
                name = f"{module}.{node.name}"
                for base in bases & set(BASES):
                    yield BASES[base], name
                for item in node.body:
                    if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        continue
                    if item.name in MEMBERS:
                        yield MEMBERS[item.name], name
                    if item.name == "__call__" and [a.arg for a in item.args.args] == DISPATCH_PARAMETERS:
                        yield Dispatcher, name


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def accepts(implementation: Callable[..., Any], declared: Callable[..., Any]) -> bool:
    """Whether ``implementation`` takes every call ``declared`` allows: the same positional
    parameters in order (names may differ), every keyword one, and nothing more required."""
    impl = list(inspect.signature(implementation).parameters.values())
    wanted = list(inspect.signature(declared).parameters.values())
    positional = [p for p in impl if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    taken = 0
    for parameter in wanted:
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            if taken >= len(positional) and not any(p.kind is p.VAR_POSITIONAL for p in impl):
                return False
            taken += 1
        elif parameter.kind is parameter.KEYWORD_ONLY and not any(
                p.name == parameter.name or p.kind is p.VAR_KEYWORD for p in impl):
            return False
    rest = positional[taken:] + [p for p in impl if p.kind is p.KEYWORD_ONLY]
    return all(p.default is not p.empty for p in rest)


def protocol_members(protocol: type) -> list[str]:
    """The methods a class of ``protocol`` must have (its own and its bases' up to ``object``)."""
    names = {name for base in protocol.__mro__ if base not in (object,) and base.__module__ == "scheduler.types"
             for name, value in vars(base).items() if inspect.isfunction(value) and not name.startswith("_")}
    return sorted(names | ({"__call__"} if issubclass(protocol, Dispatcher) else set()))


@pytest.mark.clause("ARCH-7")
def test_every_implementation_in_the_sources_is_in_its_protocols_table() -> None:
    """ARCH-7: the walk finds each table's classes (a guard: a walk that finds nothing would pass
    vacuously) and no implementation the tables miss."""
    found = set(found_in_source())
    listed = {(protocol, _name(cls)) for protocol, table in TABLES.items() for cls in table}
    missing = sorted(f"{name} ({protocol.__name__})" for protocol, name in found - listed)
    assert not missing, f"implementations of a scheduler.types protocol no table lists: {missing}"
    assert {name for _, name in found} >= {_name(c) for c in DISPATCHERS + PUBLISHERS}


@pytest.mark.clause("ARCH-7")
@pytest.mark.parametrize("protocol", list(TABLES), ids=lambda p: p.__name__)
def test_every_listed_class_is_its_protocols_at_run_time_and_takes_its_calls(protocol: type) -> None:
    """ARCH-7: each class is the protocol's (structurally for a runtime-checkable protocol,
    nominally for a declaring base) and each of the protocol's methods it has accepts the
    protocol's call, async where the protocol's is; a declaring base cannot be instantiated
    without its declared method."""
    for cls in TABLES[protocol]:
        if protocol is BatchDecisions:  # it has a data member: checked on an instance
            assert isinstance(cls([], decision.BatchState({}, {}, {})), protocol)
        else:
            assert issubclass(cls, protocol), cls
        for member in protocol_members(protocol):
            implementation, declared = getattr(cls, member), getattr(protocol, member)
            assert accepts(implementation, declared), (cls, member)
            # an async member stays async (and a sync one sync): the caller awaits it or not
            assert inspect.iscoroutinefunction(implementation) == inspect.iscoroutinefunction(declared), (cls, member)
    for base in (BulkPublisher, DeclaredDispatcher, BatchDispatcher):
        with pytest.raises(TypeError, match="abstract"):
            base()  # type: ignore[abstract]


def plain_dispatcher(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
    """A host's dispatcher as the README shows it: a plain function."""
    return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)


class FakeUndeclared:
    """A fake host dispatcher that carries the declarations' names without subclassing a
    declaring base: names, not declarations."""

    safe_to_repeat = True

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)

    def decide_batch(self, session: Session, events: Any, now: datetime, stop: Any = None) -> None:
        return None


@pytest.mark.clause("ARCH-7")
@pytest.mark.clause("DEC-1.4")
def test_a_plain_callable_is_a_dispatcher_that_declares_neither_repeat_nor_batch() -> None:
    """ARCH-6, DEC-1.4: a plain function is a ``Dispatcher`` (statically and at run time) that
    declares nothing, and so is a class carrying ``safe_to_repeat`` and ``decide_batch`` without
    subclassing a declaring base; each dispatcher of the sources declares what it says."""
    dispatcher: Dispatcher = plain_dispatcher
    assert isinstance(dispatcher, Dispatcher)
    assert Capabilities(safe_to_repeat=False, batch=None) == UNDECLARED
    assert capabilities_of(dispatcher) is UNDECLARED
    assert capabilities_of(FakeUndeclared()) is UNDECLARED
    platform = NudgingPlatform.__new__(NudgingPlatform)
    assert capabilities_of(platform) == Capabilities(safe_to_repeat=True, batch=platform)
    for host in (HostDispatcher(), DeliveryDispatcher(), RefusingDispatcher(), OutsideTransactionDispatcher(),
                 OwnConnectionDispatcher()):
        assert capabilities_of(host) is UNDECLARED, host
    # the simulation's wrapper declares what it wraps: repeatable with the platform, not with a host's
    wrapped, hosted = FaultyDispatcher(platform, 0), FaultyDispatcher(DeliveryDispatcher(), 0)
    assert capabilities_of(wrapped) == Capabilities(safe_to_repeat=True, batch=wrapped)
    assert capabilities_of(hosted) == Capabilities(safe_to_repeat=False, batch=hosted)


class FakeRecordingPublishers:
    """Fakes at the publishing edge: one that declares the batch call (a ``BulkPublisher``) and
    one that carries a ``publish_many`` without declaring it; both record the calls they get."""

    class Bulk(BulkPublisher):
        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []

        def publish_many(self, messages: Sequence[OutboundMessage]) -> None:
            self.calls.append(("publish_many", len(messages)))

    class Undeclared:
        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []

        def publish(self, message: OutboundMessage) -> None:
            self.calls.append(("publish", int(message.notification_id)))

        def publish_many(self, messages: Sequence[OutboundMessage]) -> None:
            self.calls.append(("publish_many", len(messages)))


@pytest.mark.clause("ARCH-7")
def test_a_publisher_gets_a_batch_in_one_call_only_when_it_declares_it() -> None:
    """ARCH-7: a committed batch's messages go to a ``BulkPublisher`` in one ``publish_many``
    call, and to any other publisher one ``publish`` each, a ``publish_many`` it carries unread;
    a ``BulkPublisher``'s ``publish`` is a batch of one."""
    messages = [OutboundMessage(str(i), "u", None, "web", "reminder", "t", "b", "r") for i in (1, 2)]
    bulk, undeclared = FakeRecordingPublishers.Bulk(), FakeRecordingPublishers.Undeclared()
    publish_committed(bulk, messages, "replica")
    publish_committed(undeclared, messages, "replica")
    assert bulk.calls == [("publish_many", 2)]
    assert undeclared.calls == [("publish", 1), ("publish", 2)]
    bulk.publish(messages[0])
    assert bulk.calls[-1] == ("publish_many", 1)
