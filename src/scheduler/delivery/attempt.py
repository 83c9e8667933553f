"""One attempt of any ``Sender`` (DELIV-7), the call the delivery worker makes: the per-send
timeout bounds it (a host's sender too), and whatever it raises is a ``Retry`` naming the
error, so one bad send never stops the worker. A sender that answers something that is not
a ``SendResult`` is a ``Retry`` as well (a bug in it may be fixed before the last attempt).
``attempt_all`` runs a claimed batch's attempts with bounded concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

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
        async with asyncio.timeout(timeout):  # asyncio's own: cheaper than anyio's cancel scope
            result = await sender.send(delivery)
    except TimeoutError:
        return Retry(reason=f"timeout: the {delivery.channel!r} sender took more than {timeout:g} s")
    except Exception as exc:  # noqa: BLE001 - per-delivery isolation: the worker records it and goes on
        return classify_error(exc)
    if not isinstance(result, Delivered | Retry | Undeliverable | Gone):
        return Retry(reason=f"error: the {delivery.channel!r} sender answered {type(result).__name__}, "
                            "not a SendResult")
    return result


async def attempt_all(deliveries: Sequence[OutboundDelivery], senders: Mapping[str, Sender], *,
                      concurrency: int, timeout: float) -> list[SendResult]:
    """One attempt of each delivery through its channel's sender, at most ``concurrency`` at
    once (``SCHEDULER_DELIVERY_CONCURRENCY``: one replica's share), each under ``timeout``; the
    results in the deliveries' order. A channel without a sender is ``Undeliverable``."""
    if concurrency < 1:
        raise ValueError(f"at least one send at a time, got {concurrency}")
    limiter = anyio.CapacityLimiter(concurrency)
    results: list[SendResult | None] = [None] * len(deliveries)

    async def one(index: int, delivery: OutboundDelivery) -> None:
        sender = senders.get(delivery.channel)
        if sender is None:
            results[index] = Undeliverable(reason=f"no sender for the channel {delivery.channel!r}")
            return
        async with limiter:
            results[index] = await attempt(sender, delivery, timeout=timeout)

    async with anyio.create_task_group() as group:
        for index, delivery in enumerate(deliveries):
            group.start_soon(one, index, delivery)
    return [result for result in results if result is not None]
