"""Observability: JSON logs, W3C trace context, OpenTelemetry messaging spans and ``/metrics`` (read from PostgreSQL)."""
