"""The W3C ``traceparent`` header, parsed strictly in one place (standard library only).

https://www.w3.org/TR/trace-context/#traceparent-header. A header that does not parse is
ignored, as the recommendation asks: the request is served, the row keeps no trace context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FIELDS = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
MAX_HEADER_LENGTH = 512  # a future version may append fields; nothing sane is longer


@dataclass(frozen=True)
class TraceParent:
    """A valid trace context: the trace, the parent span in it, and the trace flags."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 0x01)

    def header(self) -> str:
        """The version-00 header (55 characters), as stored in ``scheduled_events.traceparent``."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"


def parse(value: str | None) -> TraceParent | None:
    """The trace context of a ``traceparent`` value, or ``None`` if absent or invalid.

    Version 00 has exactly four fields; a later version may append more after a dash, and its
    first four are read (the recommendation's forward compatibility). Version ``ff``, an
    all-zero trace or span id, and upper-case hex are invalid.
    """
    if value is None:
        return None
    value = value.strip(" \t")
    if len(value) > MAX_HEADER_LENGTH:
        return None
    match = _FIELDS.match(value)
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex = match.groups()
    rest = value[match.end():]
    if version == "ff" or (version == "00" and rest) or (rest and not rest.startswith("-")):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, int(flags_hex, 16))


def normalized(value: str | None) -> str | None:
    """The stored form of a header: its version-00 rendering, or ``None`` if invalid."""
    parsed = parse(value)
    return parsed.header() if parsed else None
