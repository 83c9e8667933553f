"""The channels a sent notification leaves the process through (specs/delivery.md, DELIV-*):
self-contained leaves that the delivery worker calls, each knowing nothing of the tables.

A ``Sender`` (``scheduler.types``) sends one ``OutboundDelivery`` and answers a ``SendResult``:
``Delivered``, ``Retry``, ``Undeliverable`` or, for a dead push subscription, ``Gone``.

One concept per module:

- ``outcome``: what an HTTP answer or an exception means (the one classification, with the
  strict ``Retry-After`` parser);
- ``backoff``: the retry policy and its exponential backoff with jitter, from an injected
  ``random.Random``;
- ``record``: what one attempt's result makes of the delivery's row (status, attempts,
  ``next_attempt_at``, ``last_error``);
- ``attempt``: one send of any ``Sender`` under the per-send timeout, never raising;
- ``http``: one POST with the timeout over the whole exchange and a bounded read of the answer;
- ``signing``: Standard Webhooks signatures (``whsec_`` secrets, ``sign_headers``, ``verify``);
- ``webhook``: the notification's JSON and the ``WebhookSender``;
- ``encryption``: RFC 8291 message encryption (aes128gcm, RFC 8188, one record);
- ``vapid``: RFC 8292 VAPID keys and the ``Authorization: vapid`` header;
- ``hosts``: the push endpoints' host allow-list and the one check of an endpoint URL;
- ``subscription``: the W3C ``PushSubscription`` JSON parsed strictly;
- ``webpush``: the push payload and the ``WebPushSender``;
- ``channels``: the built-in senders a deployment's settings turn on.

This package imports nothing of ``scheduler`` but ``types`` and ``whole_numbers``: it sits below
``config`` in the layers, which validates its settings with ``signing``, ``vapid`` and
``hosts``; ``channels`` reads ``Settings`` through a protocol of its own.
"""
