"""The HTTP kit every product of the web edge shares: bounded bodies and answers
(``plumbing``), strict query parameters (``params``), the filter of scheduled events
(``event_filter``), the wire schemas (``schemas``), error answers (``errors``), bearer tokens
and permissions (``auth``), browser sessions (``sessions``) and streams (``sse``).

This package stands where the module ``scheduler.web.http`` was (now ``plumbing``): the
names that module offered still resolve here, with a DeprecationWarning (ARCH-3).
"""

from scheduler.moved import forward

__getattr__ = forward(__name__)
