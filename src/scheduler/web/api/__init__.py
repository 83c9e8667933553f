"""The JSON API: the intake (one event stored, or a live one sent) and the bulk store,
scheduled events, participants, health, the operator routes and the OpenAPI document."""
