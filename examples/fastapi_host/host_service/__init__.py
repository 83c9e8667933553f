"""A host's notification service that embeds the scheduler (docs/embedding.md)."""
