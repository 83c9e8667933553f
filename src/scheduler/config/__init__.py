"""The settings: each declared once (its variable, type, default, bounds and meaning), validated
on every construction. A bad value is a ``ConfigError`` naming the variable.

``Settings(...)`` is a value built in code (tests, embedding): the declared defaults and the
arguments, nothing read from the environment. ``Settings.from_env()`` reads the environment
(``scheduler serve`` and every other command do). The README's configuration table is written
from this declaration: ``python -m scheduler.config --markdown`` prints it, ``--write-readme``
puts it in README.md, and a test fails when the two drift.

The package: ``settings`` (the declaration), ``environment`` (what it is read from), ``checks``
(a value's checks beyond its type and bounds), ``errors`` (the messages) and ``readme`` (the
README's table).
"""

from scheduler.config.checks import SYSTEM_SCHEMAS, database_url_problem, schema_problem
from scheduler.config.environment import Environment, LogFormat, log_format_of
from scheduler.config.errors import ConfigError, DatabaseUnusable
from scheduler.config.settings import Settings, env_name

__all__ = ["SYSTEM_SCHEMAS", "ConfigError", "DatabaseUnusable", "Environment", "LogFormat", "Settings",
           "database_url_problem", "env_name", "log_format_of", "schema_problem"]
