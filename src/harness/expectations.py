"""A host's expectation of its events: asked of the host's ``expect`` hook when an event is
posted, and held against every dispatch (SIM-HOST-2, SIM-HOST-5).

The built-in platform has no expectation (the model predicts it from the event's fault
alone). With a host's dispatcher, ``expect(event)`` returns ``harness.Expected`` or
``None``; the model keeps it with the row's content (``model.Content``), and each dispatch
step and loop run step checks the outcome against it: a status the model did not expect,
or a failure whose ``last_error`` does not name the host's reason, is a SIM-4 violation.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.actors import Replica
from harness.host import Expected, HostDispatcher
from harness.model import Model
from harness.types import Violation
from scheduler.types import DigitalTwinEvent


class HostExpectations:
    """The host's ``expect`` hook, and the SIM-4 check of an outcome against what it said."""

    def __init__(self, host: HostDispatcher | None, model: Model, fail: Callable[[str, str], Violation],
                 count: Callable[[str], None]) -> None:
        self.host = host
        self.model = model
        self.fail = fail  # the run's violation of a clause at this step
        self.count = count  # one check more of a clause, for the summary

    def expect(self, event: DigitalTwinEvent) -> Expected | None:
        """What the host expects of ``event`` (None: the built-in platform, or no opinion)."""
        if self.host is None or self.host.expect is None:
            return None
        expected = self.host.expect(event)
        if expected is not None and not isinstance(expected, Expected):
            raise TypeError(f"the host's expect hook returned {expected!r}, not a harness.Expected or None")
        return expected

    def check(self, r: Replica, event_id: str, status: str, error: str | None) -> None:
        """SIM-4, for a host's dispatcher: the event ended as the host (and its fault) said,
        and a failure the host predicted names its reason."""
        if self.host is None:
            return
        self.count("SIM-4")
        row = self.model.rows.get(event_id)
        if row is None:
            return
        content = row.content
        if status != content.expected_status:
            raise self.fail("SIM-4", f"{r.name}: {event_id} ended {status}, expected {content.expected_status} "
                                     f"({error or 'no error'})")
        reason = content.expected_reason
        if reason is not None and reason not in (error or ""):
            raise self.fail("SIM-4", f"{r.name}: {event_id} failed with {error!r}, which does not "
                                     f"name the host's reason {reason!r}")
