"""The CLI's free-text arguments, parsed strictly in one place: ``--actor``, ``--reason`` and
the ID of ``events show``, ``history``, ``reset`` and ``cancel`` (OPS-29).

Both are stored: the actor in every changed row's history and in the audit trail (columns
of ``NAME_LENGTH`` characters), the reason in the audit trail (the commands keep
``MAX_REASON`` characters of it). An argument the database could not store (too long, or
bytes that are not UTF-8: Python hands them over as lone surrogates) is refused by argparse
with one sentence and exit 2, before any database is opened; the value itself is never
echoed (it may not be printable).
"""

from __future__ import annotations

import argparse


def _utf8(raw: str) -> None:
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("is not valid UTF-8 (check the terminal's encoding)") from None


def text_argument(raw: str) -> str:
    """An argparse type: text the database can be asked about (an event's id or key): valid UTF-8."""
    _utf8(raw)
    return raw


def actor_argument(raw: str) -> str:
    """An argparse type: who acts, as the history and the audit trail record it: valid UTF-8,
    at most ``NAME_LENGTH`` characters. (Control characters are stored and shown escaped,
    OPS-25; an empty one means the default, ``cli:$USER``.)"""
    from scheduler.database.models import NAME_LENGTH

    _utf8(raw)
    if len(raw) > NAME_LENGTH:
        raise argparse.ArgumentTypeError(f"is {len(raw)} characters long; at most {NAME_LENGTH} are recorded")
    return raw


def reason_argument(raw: str) -> str:
    """An argparse type: why, as the audit trail records it: valid UTF-8, at most
    ``MAX_REASON`` characters (a longer one is refused, not cut)."""
    from scheduler.application.commands import MAX_REASON

    _utf8(raw)
    if len(raw.strip()) > MAX_REASON:
        raise argparse.ArgumentTypeError(f"is {len(raw.strip())} characters long; at most {MAX_REASON} are recorded")
    return raw
