"""Publishers: where a delivered notification goes once its transaction has committed."""

from __future__ import annotations

import logging
import threading

from scheduler.types import OutboundMessage

logger = logging.getLogger(__name__)


class LoggingPublisher:
    """The default: logs each push. A browser push channel plugs in here."""

    def publish(self, message: OutboundMessage) -> None:
        logger.info(
            "notification %s (%s) for %s: %s", message.notification_id, message.kind, message.user_id, message.title
        )


class RecordingPublisher:
    """A fake for tests and the simulation: remembers what was pushed, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages: list[OutboundMessage] = []

    def publish(self, message: OutboundMessage) -> None:
        with self._lock:
            self.messages.append(message)
