"""One attempt of any ``Sender`` (DELIV-7), the call the delivery worker makes: the per-send
timeout bounds it (a host's sender too), and whatever it raises is a ``Retry`` naming the
error, so one bad send never stops the worker. A sender that answers something that is not
a ``SendResult`` is a ``Retry`` as well (a bug in it may be fixed before the last attempt)."""

from __future__ import annotations

import anyio

from scheduler.delivery.outcome import classify_error
from scheduler.types import (
    Delivered,
    Gone,
    OutboundDelivery,
    Retry,
    Sender,
    SendResult,
    Undeliverable,
)


async def attempt(sender: Sender, delivery: OutboundDelivery, *, timeout: float) -> SendResult:
    """``sender.send(delivery)`` within ``timeout`` seconds, as a ``SendResult`` whatever happens."""
    try:
        with anyio.fail_after(timeout):
            result = await sender.send(delivery)
    except TimeoutError:
        return Retry(reason=f"timeout: the {delivery.channel!r} sender took more than {timeout:g} s")
    except Exception as exc:  # noqa: BLE001 - per-delivery isolation: the worker records it and goes on
        return classify_error(exc)
    if not isinstance(result, Delivered | Retry | Undeliverable | Gone):
        return Retry(reason=f"error: the {delivery.channel!r} sender answered {type(result).__name__}, "
                            "not a SendResult")
    return result
