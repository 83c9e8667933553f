"""The JSON API: ingest, batch, scheduled events, participants, health, the operator routes
and the OpenAPI document."""
