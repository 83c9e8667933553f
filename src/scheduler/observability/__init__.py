"""Observability: traces (OpenTelemetry, the optional ``otel`` extra), JSON logs, log context.

Nothing here imports OpenTelemetry unless tracing is configured: ``tracing.py`` decides from
the ``OTEL_*`` environment and only then imports ``otel.py``; everything else is standard
library. The hooks into the rest of the service are few and marked "observability":
``observe(service)`` where the app is built, a span around each poll and each event's
dispatch in the loop (``LoopObserver``), and the ``traceparent`` a POST stores.
"""
