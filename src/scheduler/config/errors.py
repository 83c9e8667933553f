"""What a bad setting is: a ``ConfigError`` whose message names the variable (pydantic's
errors, one line per setting, a secret's value never shown), and a ``DatabaseUnusable``."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


class DatabaseUnusable(Exception):
    """The database cannot be used as it is (cannot be migrated, reached, or started); the
    message says why in one sentence. The CLI prints it and exits 2."""


def explain(exc: ValidationError, fields: Mapping[str, FieldInfo]) -> str:
    """pydantic's errors as one line per setting, each naming its variable (``fields``, the
    declaration: each field's ``validation_alias``)."""
    return "; ".join(_explain_one(error, fields) for error in exc.errors())


def _env(fields: Mapping[str, FieldInfo], field: str) -> str:
    alias = fields[field].validation_alias
    assert isinstance(alias, str), field
    return alias


class _NotShown:
    def __repr__(self) -> str:
        return "a value not shown (a secret)"

    __str__ = __repr__


def _explain_one(error: ErrorDetails, fields: Mapping[str, FieldInfo]) -> str:
    key = str(error["loc"][0]) if error["loc"] else "settings"
    by_env = {_env(fields, name): name for name in fields}
    field = key if key in fields else by_env.get(key)
    if field is None:
        return f"unknown setting {key!r}"
    name, raw, kind, ctx = _env(fields, field), error.get("input"), error["type"], error.get("ctx", {})
    if fields[field].repr is False:  # a URL with a password, a secret: never in a message
        if kind == "value_error":
            return f"{name} {str(error['msg']).removeprefix('Value error, ')}"
        raw = _NotShown()
    if kind in {"int_parsing", "int_from_float", "int_type"}:
        return f"{name} must be a whole number, got {raw!r}"
    if kind in {"float_parsing", "float_type"}:
        unit = "a number of seconds" if field.endswith("_seconds") else "a number"
        return f"{name} must be {unit}, got {raw!r}"
    if kind in {"bool_parsing", "bool_type"}:
        return f"{name} must be true or false, got {raw!r}"
    if kind == "greater_than_equal":
        return f"{name} must be at least {ctx['ge']}, got {raw}"
    if kind == "greater_than":
        return f"{name} must be more than {ctx['gt']}, got {raw}"
    if kind == "less_than_equal":
        return f"{name} must be at most {ctx['le']}, got {raw}"
    if kind == "string_pattern_mismatch":
        return (f"{name} must be a lower-case PostgreSQL name (letters, digits, underscores; at most 63), "
                f"got {raw!r}")
    if kind == "value_error":
        return f"{name} {str(error['msg']).removeprefix('Value error, ')}, got {raw!r}"
    if kind in {"literal_error", "enum"}:
        choices = str(ctx.get("expected", "")).replace("'", "")
        return f"{name} must be {choices}, got {raw!r}"
    return f"{name}: {error['msg']}, got {raw!r}"
