"""The host's own facts contract: what its reminders carry, and all its dispatcher reads.

``SchedulerService(facts_contract=ReminderFacts)`` replaces the built-in contract (its
``facts_version`` and ``scenario``, which the shipped rule engine reads and this host's
dispatcher never does) for the POST, the batch route, the import and ``schedule_async``; a
refusal is a 422 like every other (``facts.commitment``: the field named), and the host's one
``/openapi.json`` describes ``facts`` as this model.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ReminderFacts(BaseModel):
    """What a participant committed to, and how long it takes."""

    commitment: str = Field(min_length=1, description="the commitment, in the participant's words")
    minutes: int | None = Field(default=None, ge=1, description="how long it takes, if the participant said")
