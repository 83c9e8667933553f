"""Whether to trace, from the standard ``OTEL_*`` environment, and wiring a service for it.

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``console``, ``otlp``, or
both, comma-separated) and ``OTEL_SDK_DISABLED`` is not true. Unset or ``none``: off, and
OpenTelemetry is never imported (installing the ``otel`` extra alone changes nothing; DEC-17
in specs/decisions.md). Asking for an exporter without the extra installed is a
configuration error naming the extra.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from scheduler.config import ConfigError
from scheduler.observability.observer import Observer

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from starlette.applications import Starlette

    from scheduler.core.loop import Scheduler

EXPORTERS = ("console", "otlp")
_TRUE = {"1", "true", "yes", "on"}


def traces_exporters(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The exporters ``OTEL_TRACES_EXPORTER`` asks for; empty when tracing is off."""
    env = os.environ if env is None else env
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() in _TRUE:
        return ()
    raw = env.get("OTEL_TRACES_EXPORTER") or ""
    names = tuple(dict.fromkeys(n.strip().lower() for n in raw.split(",") if n.strip()))
    unknown = [n for n in names if n not in (*EXPORTERS, "none")]
    if unknown:
        raise ConfigError(f"OTEL_TRACES_EXPORTER must be console, otlp or none (comma-separated), got {raw!r}")
    return () if "none" in names else names


def observer_from_env(env: Mapping[str, str] | None = None) -> Observer:
    """A tracing observer if the environment asks for one, else the default (no spans)."""
    exporters = traces_exporters(env)
    if not exporters:
        return Observer()
    try:
        from scheduler.observability.otel import TracingObserver
    except ImportError as exc:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={','.join(exporters)} needs the otel extra "
            f"(pip install 'nudging-scheduler[otel]'): {exc}"
        ) from None
    return TracingObserver.from_env(exporters, env)


def observe(observer: Observer, *, app: Starlette | None, engines: Sequence[Engine], loop: Scheduler,
            replica_id: str) -> Observer:
    """Wire ``observer`` into a built service's parts (the composition root hands them over):
    the loop's observer, spans for the app's requests and the engines' statements (when
    tracing), and the replica id in the loop's log lines (its polls'; OBS-8)."""
    loop.observer = observer
    loop.replica_id = replica_id
    observer.instrument(app, engines)
    return observer
