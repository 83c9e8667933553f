"""What operators and senders do to scheduled events, whatever the adapter (API, console, CLI, harness)."""
