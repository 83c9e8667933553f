"""Publishing after commit: what a committed batch delivered leaves the process here."""

from __future__ import annotations

import logging

from scheduler.types import OutboundMessage, Publisher

logger = logging.getLogger(__name__)


def publish_committed(publisher: Publisher | None, messages: list[OutboundMessage], name: str) -> None:
    """Push ``messages`` (their batch has committed); a failure is logged, never retried."""
    if publisher is None or not messages:
        return
    publish_many = getattr(publisher, "publish_many", None)
    if publish_many is not None:
        # One call for the batch (the inbox numbers a whole batch in one transaction);
        # it isolates its own per-message failures.
        try:
            publish_many(messages)
        except Exception:
            logger.exception("%s: publishing %d notifications failed", name, len(messages))
        return
    for message in messages:
        try:
            publisher.publish(message)
        except Exception:
            # Already committed and recorded: a push that fails is logged, not retried.
            logger.exception("%s: publishing notification %s failed", name, message.notification_id)
