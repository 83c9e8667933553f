"""Fakes of the services the delivery channels talk to, for this project's tests and a
host's own (shipped in the wheel; nothing in the service imports them): each a real HTTP
server on 127.0.0.1, a free port, for the length of an ``async with``.

- ``loopback``: the small HTTP/1.1 server under both, and the answers it can be told to give
  (any status with its headers, or to hang until it stops);
- ``push_service``: a Web Push service that plays the browser too: it makes a subscription's
  keys, checks each push's VAPID token, decrypts its payload with the subscription's private
  key and auth secret (RFC 8291, computed independently of ``scheduler.delivery``) and
  records what it got;
- ``webhook_receiver``: a webhook endpoint that checks the Standard Webhooks signature and
  records each message.
"""
