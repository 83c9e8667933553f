"""Observability: traces (OpenTelemetry, the optional ``otel`` extra), JSON logs, log context.

Nothing here imports OpenTelemetry unless tracing is configured: ``tracing.py`` decides from
the ``OTEL_*`` environment and only then imports ``otel.py``; everything else is standard
library. The hooks into the rest of the service are few and marked "observability":
``observe(...)`` in the composition root (scheduler.service: the Starlette and SQLAlchemy
instrumentation), a span around each poll and each event's dispatch in the loop
(scheduler.core.loop), the ``traceparent`` a POST stores and the live ingest's span
(scheduler.web.api.intake), and the log format (scheduler.cli).
"""
