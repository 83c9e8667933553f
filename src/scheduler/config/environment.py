"""What is read before and around the settings: the environment as pydantic-settings' source
(blank values unset) and the log format to start logging in."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

from pydantic_settings import BaseSettings, EnvSettingsSource

Environment = Literal["development", "production"]
LogFormat = Literal["text", "json"]


def log_format_of(env: Mapping[str, str]) -> str:
    """The log format to start logging in, before the settings are validated: a value that
    is not ``text`` or ``json`` logs as text (``Settings.from_env`` then refuses it)."""
    raw = (env.get("SCHEDULER_LOG_FORMAT") or "").strip().lower()
    return raw if raw in get_args(LogFormat) else "text"


class EnvironmentSource(EnvSettingsSource):
    """pydantic-settings' environment source, over a given mapping instead of ``os.environ``
    (tests pass their own), with blank values treated as unset."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls, case_sensitive=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {name: value.strip() for name, value in self._environ.items() if value and value.strip()}
