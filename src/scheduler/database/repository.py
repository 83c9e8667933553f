"""What every repository is: the statements of one schema, run on the caller's session."""

from __future__ import annotations

from typing import Self

from scheduler.database.queries import DEFAULT_SCHEMA, Statements


class Repository:
    """The statements of one concern, run on a session the caller hands in (the caller owns
    the transaction). Built by ``Database`` from its ``Statements``."""

    def __init__(self, statements: Statements) -> None:
        self.statements = statements

    @classmethod
    def of(cls, schema: str = DEFAULT_SCHEMA) -> Self:
        """This concern's repository for ``schema`` (a ``Database`` builds its own)."""
        return cls(Statements.of(schema))

    @property
    def schema(self) -> str:
        return self.statements.schema

    def __repr__(self) -> str:
        return f"{type(self).__name__}(schema={self.schema!r})"
