"""A database row as JSON: every column as it is, its times in ISO 8601.

The one conversion of a row mapping to what the API, the inbox's stream and the audit trail
send; the models of ``scheduler.web.http.answers`` validate the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping


def row_as_json(row: Mapping[str, Any] | RowMapping) -> dict[str, Any]:
    """``row`` as a dict of JSON-ready values: a ``datetime`` becomes its ISO 8601 text."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


__all__ = ["row_as_json"]
