"""The one database both the host and the scheduler use (``DATABASE_URL``)."""

from __future__ import annotations

import os


def database_url() -> str:
    """``DATABASE_URL`` for SQLAlchemy with psycopg 3 (a bare ``postgresql://`` URL included)."""
    url = os.environ["DATABASE_URL"]
    return url.replace("postgresql://", "postgresql+psycopg://", 1) if url.startswith("postgresql://") else url
