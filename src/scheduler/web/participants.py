"""Deprecated path of ``scheduler.web.api.participants``: importing it warns and gives that module (see ``scheduler.moved``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.moved import alias

if TYPE_CHECKING:
    from scheduler.web.api.participants import *  # noqa: F403 - what the old path offered, for type checkers

alias(__name__)
